"""Error paths of the "railshard" backend: each failure must reach Python as an exception
carrying railshard's message, within a bound, on every rank that is still alive -- never a
hang. Every scenario runs in its own world (an error poisons a railshard communicator).

Bounds: RAILSHARD_TIMEOUT is set far above the bound each test asserts (60 s vs 20 s), so
only real failure detection -- not the collective deadline -- can make a test pass.
"""

import datetime
import os
import re
import signal
import threading
import time

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402

import conftest  # noqa: E402

pytestmark = pytest.mark.railshard_only

R = dist.ReduceOp
DETECT_BOUND_S = 20.0  # a lost/stopped peer or a mismatch must surface within this
SLOW_TIMEOUT = {"RAILSHARD_TIMEOUT": "60"}
# dtypes torch.distributed hands to a backend unchanged that railshard has no kernels or
# stand-ins for (torch 2.x; torch 1.13 has none of them).
UNSUPPORTED_DTYPES = [n for n in ("uint32", "uint16", "float8_e4m3fn") if hasattr(torch, n)]


def _describe(e):
    return {"type": type(e).__name__, "mro": [c.__name__ for c in type(e).__mro__],
            "is_runtime_error": isinstance(e, RuntimeError), "message": str(e)}


def _loop_until_error(ctx, make, max_seconds, async_op=False):
    """Calls all_reduce on fresh tensors until one raises; returns what happened."""
    start = time.monotonic()
    i = 0
    while time.monotonic() - start < max_seconds:
        t = make(i)
        call_start = time.monotonic()
        try:
            if async_op:
                dist.all_reduce(t, async_op=True).wait()
            else:
                dist.all_reduce(t)
        except Exception as e:  # noqa: BLE001
            return {"raised": True, "iteration": i, "at": time.monotonic(),
                    "call_s": time.monotonic() - call_start, **_describe(e)}
        i += 1
    return {"raised": False, "iteration": i}


def _after_error(ctx):
    """A call on the poisoned communicator must raise too, at once."""
    t0 = time.monotonic()
    try:
        dist.all_reduce(torch.ones(4))
    except Exception as e:  # noqa: BLE001
        return {"raised": True, "s": time.monotonic() - t0, **_describe(e)}
    return {"raised": False, "s": time.monotonic() - t0}


def _peer_dies(ctx, victim, how, death_file, count, async_op):
    """Every rank loops over all_reduce; `victim` dies after a few, as `how` says."""
    if ctx.rank == victim:
        if how == "sigkill_mid_transfer":
            # Die from another thread while (most likely) inside a large all_reduce.
            def killer():
                time.sleep(0.4)
                with open(death_file, "w") as f:
                    f.write(repr(time.monotonic()))
                os.kill(os.getpid(), signal.SIGKILL)
            threading.Thread(target=killer, daemon=True).start()
            while True:
                dist.all_reduce(torch.ones(count))
        for _ in range(20):
            dist.all_reduce(torch.ones(count))
        with open(death_file, "w") as f:
            f.write(repr(time.monotonic()))
        if how == "exit":
            os._exit(0)  # no shutdown, no goodbye
        if how == "sigstop":
            os.kill(os.getpid(), signal.SIGSTOP)  # alive, sockets open, silent
            time.sleep(3600)
        os.kill(os.getpid(), signal.SIGKILL)
    outcome = _loop_until_error(ctx, lambda i: torch.ones(count), 50.0, async_op=async_op)
    if outcome["raised"]:
        outcome["after"] = _after_error(ctx)
    return outcome


def _read_death(path):
    with open(path) as f:
        return float(f.read())


@pytest.mark.parametrize("world_size,how,count,async_op,shutdown", [
    pytest.param(3, "sigkill", 1000, False, "destroy", id="w3-sigkill-between-calls"),
    pytest.param(2, "sigkill_mid_transfer", 4 * 1024 * 1024, False, "exit",
                 id="w2-sigkill-mid-transfer"),
    pytest.param(2, "exit", 1000, True, "exit", id="w2-os_exit-async"),
])
def test_killed_peer_raises_not_hangs(tmp_path, world_size, how, count, async_op, shutdown):
    victim = 1
    death_file = str(tmp_path / "death")
    results = conftest.run_world(
        _peer_dies, world_size, victim, how, death_file, count, async_op, env=SLOW_TIMEOUT,
        expect_dead=[victim], timeout=120, shutdown=shutdown)
    died = _read_death(death_file)
    for rank, out in enumerate(results):
        if rank == victim:
            continue
        assert out["raised"], f"rank {rank}: no exception after {out['iteration']} calls"
        delay = out["at"] - died
        msg = out["message"]
        assert out["is_runtime_error"], f"rank {rank}: {out['type']} is no RuntimeError: {msg}"
        assert delay < DETECT_BOUND_S, f"rank {rank}: exception {delay:.1f} s after the death"
        assert "PeerLostError" in msg, f"rank {rank}: message lacks PeerLostError: {msg}"
        if world_size == 2:  # the only peer it had: it must name it
            assert f"rank {victim}" in msg, \
                f"rank {rank}: message does not name rank {victim}: {msg}"
        after = out["after"]
        assert after["raised"], f"rank {rank}: a call after the error succeeded"
        assert after["s"] < 5, f"rank {rank}: a call after the error took {after['s']:.1f} s"


def test_stopped_peer_caught_by_heartbeat(tmp_path):
    """A SIGSTOPped rank keeps its sockets open: only the heartbeat can tell."""
    death_file = str(tmp_path / "death")
    env = dict(SLOW_TIMEOUT, RAILSHARD_HEARTBEAT_TIMEOUT="3")
    results = conftest.run_world(_peer_dies, 2, 1, "sigstop", death_file, 1000, False, env=env,
                                 expect_dead=[1], timeout=120, shutdown="abort")
    out = results[0]
    assert out["raised"], f"no exception after {out['iteration']} calls"
    delay = out["at"] - _read_death(death_file)
    assert 1.0 < delay < 3 + 5, f"exception {delay:.1f} s after SIGSTOP (heartbeat 3 s)"
    assert "PeerLostError" in out["message"], out["message"]


# ---------------------------------------------------------------------------------------------


def _mismatch(ctx, kind):
    r = ctx.rank
    t0 = time.monotonic()
    try:
        if kind == "count":
            dist.all_reduce(torch.ones(10 if r == 0 else 20))
        elif kind == "dtype":
            dist.all_reduce(torch.ones(10, dtype=torch.float32 if r == 0 else torch.float64))
        elif kind == "op":
            dist.all_reduce(torch.ones(10), op=R.SUM if r == 0 else R.MAX)
        elif kind == "root":
            dist.broadcast(torch.ones(10), src=0 if r == 0 else 1)
        elif kind == "collective":
            if r == 0:
                dist.all_reduce(torch.ones(10))
            else:
                dist.broadcast(torch.ones(10), src=0)
        else:
            raise ValueError(kind)
    except Exception as e:  # noqa: BLE001
        return {"raised": True, "s": time.monotonic() - t0, **_describe(e)}
    return {"raised": False, "s": time.monotonic() - t0}


@pytest.mark.parametrize("kind", ["count", "dtype", "op", "root", "collective"])
def test_mismatch_raises(kind):
    """Ranks that call different collectives get MismatchError, not a hang or garbage."""
    results = conftest.run_world(_mismatch, 2, kind, env=SLOW_TIMEOUT, timeout=120,
                                 shutdown="abort")
    for rank, out in enumerate(results):
        assert out["raised"], f"rank {rank}: the mismatched call returned ({kind})"
        assert out["is_runtime_error"], out
        assert out["s"] < DETECT_BOUND_S, f"rank {rank}: took {out['s']:.1f} s: {out['message']}"
        assert "mismatch" in out["message"].lower(), f"rank {rank}: {out['message']}"


# ---------------------------------------------------------------------------------------------


def _refusals(ctx):
    """Arguments railshard refuses: each call must raise at once, naming what is wrong, and
    (an argument error being local and the same on every rank) leave the group usable."""
    out = {}

    def attempt(label, call):
        t0 = time.monotonic()
        try:
            call()
        except Exception as e:  # noqa: BLE001
            out[label] = {"raised": True, "s": time.monotonic() - t0, **_describe(e)}
            return
        out[label] = {"raised": False, "s": time.monotonic() - t0}

    for name in ("BAND", "BOR", "BXOR"):
        attempt(f"all_reduce {name}", lambda op=getattr(R, name): dist.all_reduce(
            torch.ones(8, dtype=torch.int32), op=op))
    attempt("reduce_scatter BAND", lambda: dist.reduce_scatter(
        torch.empty(4, dtype=torch.int64),
        [torch.ones(4, dtype=torch.int64) for _ in range(ctx.world_size)], op=R.BAND))
    attempt("all_reduce AVG bool", lambda: dist.all_reduce(torch.ones(8, dtype=torch.bool),
                                                           op=R.AVG))
    # (complex dtypes are not refused: torch.distributed passes them as view_as_real.)
    for name in UNSUPPORTED_DTYPES:
        attempt(f"all_reduce {name}",
                lambda d=getattr(torch, name): dist.all_reduce(torch.zeros(8).to(d)))
    # Still usable?
    t = torch.full((5,), float(ctx.rank + 1))
    try:
        dist.all_reduce(t)
        out["usable after"] = {"raised": False, "value": t.tolist()}
    except Exception as e:  # noqa: BLE001
        out["usable after"] = {"raised": True, **_describe(e)}
    return out


def test_unsupported_arguments_raise_clearly():
    results = conftest.run_world(_refusals, 2, env=SLOW_TIMEOUT, timeout=120, shutdown="abort")
    for rank, out in enumerate(results):
        for label, words in [("all_reduce BAND", ["BAND"]), ("all_reduce BOR", ["BOR"]),
                             ("all_reduce BXOR", ["BXOR"]), ("reduce_scatter BAND", ["BAND"]),
                             ("all_reduce AVG bool", ["AVG", "bool"])] + [
                                 (f"all_reduce {name}", ["not supported"])
                                 for name in UNSUPPORTED_DTYPES]:
            got = out[label]
            assert got["raised"], f"rank {rank}: {label} did not raise"
            assert got["is_runtime_error"] or got["type"] in ("ValueError", "TypeError"), got
            assert got["s"] < 5, f"rank {rank}: {label} took {got['s']:.1f} s to raise"
            for w in words:
                assert w.lower() in got["message"].lower(), \
                    f"rank {rank}: {label}: message lacks {w!r}: {got['message']}"
        usable = out["usable after"]
        assert not usable["raised"], \
            f"rank {rank}: refused arguments broke the group: {usable['message']}"
        assert usable["value"] == [3.0] * 5, usable


# ---------------------------------------------------------------------------------------------


def _late_rank(ctx, late_s):
    """Rank 1 arrives `late_s` seconds late: rank 0 must time out (RAILSHARD_TIMEOUT), and the
    late rank, when it finally calls, must raise too (the error was broadcast)."""
    if ctx.rank == 1:
        time.sleep(late_s)
    t0 = time.monotonic()
    try:
        dist.all_reduce(torch.ones(100))
    except Exception as e:  # noqa: BLE001
        return {"raised": True, "s": time.monotonic() - t0, **_describe(e)}
    return {"raised": False, "s": time.monotonic() - t0}


def test_timeout_when_a_rank_never_arrives():
    timeout_s, late_s = 4, 12
    results = conftest.run_world(_late_rank, 2, late_s,
                                 env={"RAILSHARD_TIMEOUT": str(timeout_s)}, timeout=120,
                                 shutdown="abort")
    first, late = results
    assert first["raised"], f"rank 0 waited {first['s']:.1f} s and returned"
    assert timeout_s - 0.5 < first["s"] < timeout_s + 5, f"rank 0 raised after {first['s']:.1f} s"
    assert "TimeoutError" in first["message"], first["message"]
    # Worded as torch's own backends do, which torch's tests and handlers match.
    assert "railshard TimeoutError: Timed out waiting 4000ms: " in first["message"], first
    assert re.search(" (Timed out|closed|timeout) ", first["message"]), first["message"]
    assert first["is_runtime_error"], first
    assert late["raised"], "the late rank's call succeeded after its peer timed out"
    assert late["s"] < 5, f"the late rank's call took {late['s']:.1f} s to raise"


# ---------------------------------------------------------------------------------------------


def test_exception_classes():
    rs = conftest.railshard
    assert issubclass(rs.Error, RuntimeError)
    for name in ("TimeoutError", "PeerLostError", "MismatchError", "InvalidArgument"):
        cls = getattr(rs, name)
        assert issubclass(cls, rs.Error), f"railshard.{name} is not a railshard.Error"
        assert issubclass(cls, RuntimeError)


# ---------------------------------------------------------------------------------------------


def _destroy_in_flight(ctx, how):
    """Rank 0 queues collectives on tensors it drops at once (the backend's worker then holds
    their last references) and shuts down while they are still waiting for rank 1."""
    if ctx.rank == 0:
        for k in range(4):
            dist.all_reduce(torch.full((1000,), float(k)), async_op=True)  # work and tensor dropped
    else:
        time.sleep(1.0)
        for k in range(4):
            dist.all_reduce(torch.full((1000,), float(k)))
    if how == "destroy":
        dist.destroy_process_group()
    return True


@pytest.mark.parametrize("how", ["destroy", "exit"])
def test_shutdown_with_work_in_flight(how):
    """Shutting down (destroy_process_group, or just exiting) while queued work still holds
    the only references to its tensors must not hang (e.g. on the GIL)."""
    conftest.run_world(_destroy_in_flight, 2, how, env={"RAILSHARD_TIMEOUT": "20"},
                       timeout=50, exit_timeout=20, shutdown="exit")


# ---------------------------------------------------------------------------------------------
# a timeout is on time with torch's FileStore too


def _two_missing(ctx):
    if ctx.rank != 0:
        time.sleep(8)  # past rank 0's deadline
        return None
    t0 = time.monotonic()
    try:
        dist.all_reduce(torch.ones(10))
    except Exception as e:  # noqa: BLE001
        return {"s": time.monotonic() - t0, "message": str(e)}
    return {"s": time.monotonic() - t0, "message": None}


@pytest.mark.railshard_only
def test_timeout_with_a_file_rendezvous_is_on_time_whatever_the_missing_ranks():
    """The who-is-missing look at a timeout asks the store without waiting: with file:// a
    wait of any length is rounded up to whole seconds by torch's FileStore, which made each
    timeout about a second late per missing rank."""
    conftest.skip_unless_railshard()
    got = conftest.run_world(_two_missing, 3, env={"RAILSHARD_TIMEOUT": "2"}, timeout=90,
                             rendezvous="file", shutdown="abort")
    first = got[0]
    assert first["message"] is not None, first
    assert "TimeoutError" in first["message"] and "ranks 1,2 never entered" in first["message"], \
        first["message"]
    assert 1.9 < first["s"] < 2.6, f"timed out after {first['s']:.2f} s, deadline 2 s"


# ---------------------------------------------------------------------------------------------
# monitored_barrier (torch 2.x lets any CPU backend have one; 1.13 only gloo)


def _monitored(ctx, absent, wait_all):
    if ctx.rank in absent:
        time.sleep(3)
        return None
    try:
        dist.monitored_barrier(timeout=datetime.timedelta(seconds=1), wait_all_ranks=wait_all)
    except Exception as e:  # noqa: BLE001
        # torch's tests catch RuntimeError (railshard.TimeoutError is one).
        return f"{'RuntimeError' if isinstance(e, RuntimeError) else type(e).__name__}: {e}"
    return "passed"


def _monitored_all_arrive(ctx):
    for _ in range(3):
        dist.monitored_barrier(timeout=datetime.timedelta(seconds=20))
    t = torch.ones(4)
    dist.all_reduce(t)  # the group is still the one the collectives use
    return t.tolist()


def _monitored_zero(ctx):
    if ctx.rank != 0:
        return None
    try:
        dist.monitored_barrier(timeout=datetime.timedelta(seconds=0))
    except Exception as e:  # noqa: BLE001
        return f"{type(e).__name__}: {e}"
    return "passed"


@pytest.mark.railshard_only
def test_monitored_barrier_names_the_ranks_that_did_not_arrive():
    conftest.skip_unless_railshard()
    if int(torch.__version__.split(".")[0]) < 2:
        pytest.skip("torch 1.13's monitored_barrier accepts the gloo backend only")
    got = conftest.run_world(_monitored_all_arrive, 3, timeout=60)
    assert got == [[3.0] * 4] * 3, got
    got = conftest.run_world(_monitored, 3, [2], False, timeout=60)
    assert "RuntimeError" in got[0] and "Rank 2 failed to pass monitoredBarrier in 1000 ms" in \
        got[0], got[0]
    # The rank that arrived learns from rank 0 who did not (torch's tests match the first part).
    assert "Rank 1 successfully reached monitoredBarrier, but received errors while waiting " \
        "for send/recv from rank 0: rank 0 reports: Rank 2 failed to pass monitoredBarrier" \
        in got[1], got[1]
    got = conftest.run_world(_monitored, 3, [1, 2], True, timeout=60)
    assert "Ranks 1, 2 failed to pass monitoredBarrier in 1000 ms" in got[0], got[0]
    got = conftest.run_world(_monitored, 3, [1, 2], False, timeout=60)
    assert "Rank 1 failed to pass monitoredBarrier" in got[0], got[0]
    got = conftest.run_world(_monitored_zero, 2, timeout=60)
    assert "Rank 0 timed out in monitoredBarrier" in got[0], got[0]
