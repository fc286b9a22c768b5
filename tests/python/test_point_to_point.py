"""Point-to-point (send/recv/isend/irecv with tags, batch_isend_irecv), all_to_all_single (even
and uneven splits), all_to_all, all_gather_coalesced and sequence numbers of the "railshard"
backend on 2 and 3 real processes (conftest.run_cases: one spawned world per world size).

References: every received value is compared with what the same exchange delivers over the
gloo group of the same processes (`ctx.gloo`), where that torch's gloo has the call, and
always with the sender's input regenerated from its rank (the inputs are a deterministic
function of rank, tag and dtype). Error cases each run in a world of their own, because an
error poisons railshard's communicator (as NCCL's) and every later call would fail too.
"""

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402

import conftest  # noqa: E402
from conftest import expect  # noqa: E402

WORLD_SIZES = [2, 3]
DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.int64, torch.int8, torch.uint8,
          torch.bool, torch.float16]
TORCH2 = int(torch.__version__.split(".")[0]) >= 2


def value(src, dst, tag, dtype, numel):
    """What rank `src` sends to `dst` with `tag`: distinct per triple, exact in every dtype."""
    base = torch.arange(numel, dtype=torch.int64) * 7 + src * 131 + dst * 17 + tag * 3
    if dtype == torch.bool:
        return (base % 3) == 0
    if dtype in (torch.int8, torch.uint8):
        return (base % 100).to(dtype)
    if dtype in (torch.bfloat16, torch.float16):
        return (base % 200).to(dtype)  # small integers: exact in 16-bit floats
    return base.to(dtype)


def same(got, want, what):
    expect(got.dtype == want.dtype and got.shape == want.shape and torch.equal(got, want),
           f"{what}: got {got.dtype}{list(got.shape)} {got.flatten()[:6].tolist()}, want "
           f"{want.dtype}{list(want.shape)} {want.flatten()[:6].tolist()}")


def _send_recv_tags(ctx):
    """Every rank sends to every other (tag = sender's rank) and receives from each in turn,
    over railshard and over gloo; both must deliver exactly the sender's bytes."""
    n, me = ctx.world_size, ctx.rank
    for dtype in DTYPES:
        for numel in (1, 1000, 70001):
            for group in (None, ctx.gloo):
                for step in range(1, n):
                    dst, src = (me + step) % n, (me - step) % n
                    out = torch.empty(numel, dtype=dtype)
                    # Alternate who sends first so blocking calls cannot deadlock.
                    if me < dst:
                        dist.send(value(me, dst, me, dtype, numel), dst, group=group, tag=me)
                        dist.recv(out, src, group=group, tag=src)
                    else:
                        dist.recv(out, src, group=group, tag=src)
                        dist.send(value(me, dst, me, dtype, numel), dst, group=group, tag=me)
                    which = "gloo" if group is not None else "railshard"
                    same(out, value(src, me, src, dtype, numel),
                         f"{which} recv {numel} {dtype} from {src}")


def _isend_irecv_ring(ctx):
    """Both directions posted before either is waited (a ring): the receive must not hold up
    the send behind it. Several messages per pair in flight, waited in reverse order."""
    n, me = ctx.world_size, ctx.rank
    nxt, prv = (me + 1) % n, (me - 1) % n
    outs = [torch.empty(4097 * (k + 1)) for k in range(4)]
    recvs = [dist.irecv(outs[k], prv, tag=k) for k in range(4)]
    sends = [dist.isend(value(me, nxt, k, torch.float32, 4097 * (k + 1)), nxt, tag=k)
             for k in range(4)]
    for w in reversed(sends + recvs):
        w.wait()
        expect(w.is_completed(), "is_completed() after wait()")
    for k in range(4):
        same(outs[k], value(prv, me, k, torch.float32, 4097 * (k + 1)), f"irecv {k} from {prv}")


def _batch_isend_irecv(ctx):
    n, me = ctx.world_size, ctx.rank
    nxt, prv = (me + 1) % n, (me - 1) % n
    send = value(me, nxt, 5, torch.int64, 333)
    from_prev = torch.empty(333, dtype=torch.int64)
    send_back = value(me, prv, 6, torch.int64, 12)
    from_next = torch.empty(12, dtype=torch.int64)
    ops = [dist.P2POp(dist.irecv, from_prev, prv, tag=5), dist.P2POp(dist.isend, send, nxt, tag=5),
           dist.P2POp(dist.isend, send_back, prv, tag=6),
           dist.P2POp(dist.irecv, from_next, nxt, tag=6)]
    for w in dist.batch_isend_irecv(ops):
        w.wait()
    same(from_prev, value(prv, me, 5, torch.int64, 333), "batch_isend_irecv from previous")
    same(from_next, value(nxt, me, 6, torch.int64, 12), "batch_isend_irecv from next")


def _recv_any_source(ctx):
    """Rank 0 receives from whichever rank sends first (src=None), as torch's own
    test_send_recv_any_source does; every other rank sends twice."""
    n, me = ctx.world_size, ctx.rank
    if me == 0:
        senders = []
        for _ in range(2 * (n - 1)):
            out = torch.full((10,), -1.0)
            if len(senders) % 2 == 0:
                sender = dist.recv(out)
            else:
                work = dist.irecv(out)
                work.wait()
                sender = work._source_rank()
            expect(torch.equal(out, torch.full((10,), float(sender))),
                   f"any-source message from {sender}: {out.tolist()}")
            senders.append(sender)
        expect(sorted(senders) == sorted(list(range(1, n)) * 2), f"senders {senders}")
    else:
        for _ in range(2):
            dist.send(torch.full((10,), float(me)), 0)
    dist.barrier()


def _p2p_between_collectives(ctx):
    """Messages and collectives interleaved in the same order on both ranks of a pair."""
    n, me = ctx.world_size, ctx.rank
    for k in range(5):
        t = torch.full((9,), float(me + k))
        dist.all_reduce(t)
        same(t, torch.full((9,), float(sum(range(n)) + n * k)), f"all_reduce {k}")
        if me == 0:
            dist.send(value(0, 1, k, torch.float64, 50), 1, tag=k)
        elif me == 1:
            out = torch.empty(50, dtype=torch.float64)
            dist.recv(out, 0, tag=k)
            same(out, value(0, 1, k, torch.float64, 50), f"recv {k} between all_reduces")


def _a2a_splits(n, me, rows_from):
    """(input splits, output splits) with rows_from(src, dst) rows going src -> dst."""
    return [rows_from(me, d) for d in range(n)], [rows_from(s, me) for s in range(n)]


def _a2a_input(me, n, rows_from, width, dtype):
    return torch.cat([value(me, d, 0, dtype, rows_from(me, d) * width).reshape(-1, width)
                      for d in range(n)]) if width else torch.empty(0)


def _all_to_all_single(ctx):
    n, me = ctx.world_size, ctx.rank
    patterns = {
        "even": lambda s, d: 3,
        "uneven": lambda s, d: (s * 2 + d * 3) % 5,  # includes empty blocks
        "one_sided": lambda s, d: 4 if s == 0 else 0,
    }
    for dtype in (torch.float32, torch.int64, torch.bfloat16, torch.uint8):
        for label, rows_from in patterns.items():
            width = 6
            inp = _a2a_input(me, n, rows_from, width, dtype)
            in_splits, out_splits = _a2a_splits(n, me, rows_from)
            want = torch.cat([value(s, me, 0, dtype, rows_from(s, me) * width).reshape(-1, width)
                              for s in range(n)])
            out = torch.empty(sum(out_splits), width, dtype=dtype)
            if label == "even":
                dist.all_to_all_single(out, inp)
            else:
                dist.all_to_all_single(out, inp, out_splits, in_splits)
            same(out, want, f"all_to_all_single {label} {dtype}")
            if dtype != torch.bfloat16 or TORCH2:  # torch 1.13's gloo has no bfloat16
                ref = torch.empty_like(out)
                dist.all_to_all_single(ref, inp, out_splits, in_splits, group=ctx.gloo)
                same(out, ref, f"all_to_all_single {label} {dtype} vs gloo")


def _all_to_all_lists(ctx):
    n, me = ctx.world_size, ctx.rank
    inputs = [value(me, d, 1, torch.float64, 2 + d + me) for d in range(n)]
    outputs = [torch.empty(2 + me + s, dtype=torch.float64) for s in range(n)]
    dist.all_to_all(outputs, inputs)
    for s in range(n):
        same(outputs[s], value(s, me, 1, torch.float64, 2 + me + s), f"all_to_all from {s}")


def _all_gather_coalesced(ctx):
    n, me = ctx.world_size, ctx.rank
    inputs = [value(me, 0, k, torch.int32, 3 + k).reshape(-1) for k in range(3)]
    outputs = [[torch.empty(3 + k, dtype=torch.int32) for k in range(3)] for _ in range(n)]
    dist.all_gather_coalesced(outputs, inputs)
    for r in range(n):
        for k in range(3):
            same(outputs[r][k], value(r, 0, k, torch.int32, 3 + k), f"coalesced {k} from {r}")


def _sequence_numbers(ctx):
    """The group's collective count is the same on every rank and moves by one per
    collective (point-to-point messages do not count: only two ranks take part)."""
    pg = dist.distributed_c10d._get_default_group()
    if TORCH2:
        pg = pg._get_backend(torch.device("cpu"))
    before = pg._get_sequence_number_for_group()
    dist.barrier()
    t = torch.ones(3)
    dist.all_reduce(t)
    after = pg._get_sequence_number_for_group()
    expect(after == before + 2, f"sequence {before} -> {after} over two collectives")
    seen = [None] * ctx.world_size
    dist.all_gather_object(seen, after, group=ctx.gloo)
    expect(len(set(seen)) == 1, f"sequence numbers differ between ranks: {seen}")


def build_cases(world_size):
    return [
        ("send_recv_tags", _send_recv_tags),
        ("isend_irecv_ring", _isend_irecv_ring),
        ("batch_isend_irecv", _batch_isend_irecv),
        ("recv_any_source", _recv_any_source),
        ("p2p_between_collectives", _p2p_between_collectives),
        ("all_to_all_single", _all_to_all_single),
        ("all_to_all_lists", _all_to_all_lists),
        ("all_gather_coalesced", _all_gather_coalesced),
        ("sequence_numbers", _sequence_numbers),
    ]


_RESULTS = {}


@pytest.mark.parametrize("world_size,case", [
    pytest.param(w, name, id=f"w{w}-{name}") for w in WORLD_SIZES for name, _ in build_cases(w)])
def test_point_to_point(world_size, case):
    if world_size not in _RESULTS:
        try:
            _RESULTS[world_size] = conftest.run_cases("test_point_to_point", "build_cases",
                                                      (world_size,), world_size, timeout=300)
        except conftest.WorldError as e:
            _RESULTS[world_size] = e
    results = _RESULTS[world_size]
    if isinstance(results, Exception):
        pytest.fail(f"the world running this case failed:\n{results}", pytrace=False)
    if results[case] is not None:
        if results[case].startswith("skip:"):
            pytest.skip(results[case][5:].strip())
        pytest.fail(results[case], pytrace=False)


# ---------------------------------------------------------------------------------------------
# bad input: each in its own 2-rank world, every rank reports what it raised


def _raised(fn):
    """What fn() and then a barrier raised. The barrier: a sender whose message was already on
    its way when the receiver found the mismatch learns of it at its next call."""
    try:
        fn()
        dist.barrier()
    except Exception as e:  # noqa: BLE001
        return f"{type(e).__name__}: {e}"
    return None


def _size_mismatch(ctx):
    if ctx.rank == 0:
        return _raised(lambda: dist.send(torch.zeros(10), 1, tag=3))
    return _raised(lambda: dist.recv(torch.zeros(12), 0, tag=3))


def _dtype_mismatch(ctx):
    if ctx.rank == 0:
        return _raised(lambda: dist.send(torch.zeros(10), 1))
    return _raised(lambda: dist.recv(torch.zeros(10, dtype=torch.int32), 0))


def _tag_mismatch(ctx):
    if ctx.rank == 0:
        return _raised(lambda: dist.send(torch.zeros(4), 1, tag=7))
    return _raised(lambda: dist.recv(torch.zeros(4), 0, tag=8))


def _recv_without_send(ctx):
    if ctx.rank == 1:
        return _raised(lambda: dist.recv(torch.zeros(4), 0, tag=9))
    import time
    time.sleep(4)  # past rank 1's deadline: it must time out, not see this rank leave
    return None


def _split_mismatch(ctx):
    # Rank 0 believes it receives 2 rows from rank 1, rank 1 sends 3 (splits index the peer).
    out_splits = [1, 2] if ctx.rank == 0 else [1, 1]
    in_splits = [1, 1] if ctx.rank == 0 else [3, 1]
    out = torch.empty(sum(out_splits), 2)
    inp = torch.zeros(sum(in_splits), 2)
    return _raised(lambda: dist.all_to_all_single(out, inp, out_splits, in_splits))


def _bad_splits(ctx):
    return _raised(lambda: dist.all_to_all_single(torch.empty(4), torch.empty(4), [1, 1], [1, 2]))


@pytest.mark.railshard_only
def test_size_dtype_and_tag_mismatches_are_mismatch_errors_on_both_ranks():
    conftest.skip_unless_railshard()
    for fn, words in [(_size_mismatch, "count 10"), (_dtype_mismatch, "int32"),
                      (_tag_mismatch, "tag 8")]:
        got = conftest.run_world(fn, 2, timeout=60, env={"RAILSHARD_TIMEOUT": "20"})
        for rank, text in enumerate(got):
            assert text is not None and "MismatchError" in text, (fn.__name__, rank, text)
        assert words in got[1], (fn.__name__, got[1])


@pytest.mark.railshard_only
def test_recv_with_no_send_times_out_naming_the_peer_and_tag():
    conftest.skip_unless_railshard()
    got = conftest.run_world(_recv_without_send, 2, timeout=60,
                             env={"RAILSHARD_TIMEOUT": "2"})
    assert got[1] is not None and "TimeoutError" in got[1], got[1]
    assert "from rank 0" in got[1] and "tag 9" in got[1], got[1]
    assert "timed out" in got[1].lower(), got[1]


@pytest.mark.railshard_only
def test_all_to_all_split_disagreement_and_bad_splits():
    conftest.skip_unless_railshard()
    got = conftest.run_world(_split_mismatch, 2, timeout=60, env={"RAILSHARD_TIMEOUT": "20"})
    assert any(t and "MismatchError" in t and "split sizes disagree" in t for t in got), got
    assert all(t and ("MismatchError" in t) for t in got), got
    got = conftest.run_world(_bad_splits, 2, timeout=60)
    for text in got:
        assert text is not None and "InvalidArgument" in text, text
        assert "split sizes add up to 3 rows, the input tensor has 4" in text, text


def _detail_debug(ctx):
    t = torch.full((5,), float(ctx.rank + 1))
    dist.all_reduce(t)
    b = torch.full((3,), float(ctx.rank))
    dist.broadcast(b, src=1)
    dist.barrier()
    return t.tolist() + b.tolist()


def test_collectives_work_under_torch_distributed_debug_detail():
    """DETAIL wraps the group in torch's ProcessGroupWrapper, which checks every collective's
    sequence number across ranks (it used to fail every call: no sequence numbers)."""
    got = conftest.run_world(_detail_debug, 2, env={"TORCH_DISTRIBUTED_DEBUG": "DETAIL"},
                             timeout=90)
    assert got == [[3.0] * 5 + [1.0] * 3] * 2, got


def _names(ctx):
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 2))
    model(torch.ones(3, 4)).sum().backward()
    logged = model._get_ddp_logging_data().get("backend_name")
    t = torch.ones(2)
    dist.all_reduce(t)
    return logged, dist.get_backend(), t.tolist()


def test_backend_name_is_railshard_wherever_torch_asks():
    """dist.get_backend() and DDP's logging data (torch 2.x names a group after its backend
    type, which for an out-of-tree backend is "custom" unless the group names itself)."""
    got = conftest.run_world(_names, 2, timeout=90)
    for logged, backend, t in got:
        assert backend == conftest.BACKEND and t == [2.0, 2.0], got
        assert logged == conftest.BACKEND, got
