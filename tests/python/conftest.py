"""Shared harness for railshard's torch.distributed tests.

Finding the extension
    RAILSHARD_INSTALLED=1: railshard is pip-installed in this interpreter's environment
    (scripts/test.sh's torch 2.x pass): nothing is added to sys.path, and the tools are the
    environment's console commands. Otherwise the package lives in <build>/python/railshard. The
    build's python directory is taken from RAILSHARD_BUILD_PYTHON when set (put first on
    sys.path); otherwise, unless PYTHONPATH is set (then it decides), from <repo>/build/python. If `import railshard` fails the whole suite is
    skipped with the import error as the reason -- unless RAILSHARD_REQUIRE_MODULE=1 (ctest sets
    it), which turns that into a failure: a build that registered the tests must pass them.

Real processes
    run_world(fn, world_size) starts `world_size` fresh interpreters (multiprocessing "spawn"),
    each of which joins one rendezvous (tcp://127.0.0.1:<free port>) twice: the default group with
    the backend under test, and a gloo group (`ctx.gloo`) used as the reference. fn(ctx) runs
    on every rank; the return values come back as a list indexed by rank. A rank's exception
    comes back as its traceback and fails the test; a rank still running past `timeout`
    (or `stall_timeout` without progress, or `exit_timeout` after reporting, i.e. hung at
    shutdown) gets SIGABRT -- faulthandler prints all its threads' Python stacks, shown with
    the failed test -- then SIGKILL, and the test fails. Nothing can hang the suite.

    run_cases(module, builder, args, world_size) runs many small named checks in ONE world
    (process start-up dominates otherwise) and returns {case name: None or the failure text}.
    Checks use expect()/soft comparisons so that a rank that finds a wrong value still makes
    the same collective calls as its peers. RAILSHARD_TEST_ONLY=<regex> runs only the matching
    cases (debugging).

Harness development only
    RAILSHARD_TEST_BACKEND=gloo runs everything with gloo as the backend "under test" (no
    railshard module needed): that checks the harness and the references themselves. Tests
    that need railshard's own behaviour (error kinds, messages) skip in that mode.
"""

import datetime
import faulthandler
import importlib
import multiprocessing
import multiprocessing.connection
import os
import pickle
import re
import signal
import socket
import sys
import time
import traceback
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BACKEND = os.environ.get("RAILSHARD_TEST_BACKEND", "railshard")
UNDER_TEST_IS_RAILSHARD = BACKEND == "railshard"


def _build_python_dir():
    explicit = os.environ.get("RAILSHARD_BUILD_PYTHON")
    if explicit:
        return Path(explicit).resolve(), True
    return REPO / "build" / "python", False


INSTALLED = os.environ.get("RAILSHARD_INSTALLED") == "1"
BUILD_PYTHON, _EXPLICIT = _build_python_dir()
if not INSTALLED and (_EXPLICIT or not os.environ.get("PYTHONPATH")):
    if str(BUILD_PYTHON) not in sys.path:
        sys.path.insert(0, str(BUILD_PYTHON))


def _probe_import():
    """Imports railshard in a child interpreter first: a module built for another torch can
    abort the whole process while loading (a C++ exception during static initialization),
    which must not take pytest down with it. Returns None or the failure text."""
    import subprocess

    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    try:
        proc = subprocess.run([sys.executable, "-c", "import torch, railshard"], env=env,
                              capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired:
        return "`import railshard` did not finish in 120 s (in a child interpreter)"
    if proc.returncode == 0:
        return None
    how = (f"killed by {signal.Signals(-proc.returncode).name}" if proc.returncode < 0
           else f"exit code {proc.returncode}")
    return (f"`import railshard` failed in a child interpreter ({how}):\n"
            f"{(proc.stdout + proc.stderr).strip()}")


IMPORT_ERROR = None
railshard = None
try:
    import torch  # noqa: F401  (railshard needs it first anyway; a missing torch is the reason)
    import torch.distributed as dist

    if UNDER_TEST_IS_RAILSHARD:
        # Spawned ranks import this file too: the parent already probed (same interpreter).
        if os.environ.get("_RAILSHARD_IMPORT_PROBED") != "1":
            IMPORT_ERROR = _probe_import()
            os.environ["_RAILSHARD_IMPORT_PROBED"] = "1"
        if IMPORT_ERROR is None:
            railshard = importlib.import_module("railshard")
except Exception:  # noqa: BLE001  (any import failure means: nothing here can run)
    IMPORT_ERROR = traceback.format_exc()

if railshard is not None:
    MODULE_DIR = Path(railshard.__file__).resolve().parent.parent
else:
    MODULE_DIR = BUILD_PYTHON

REQUIRE_MODULE = os.environ.get("RAILSHARD_REQUIRE_MODULE") == "1"


# ---------------------------------------------------------------------------------------------
# pytest hooks


def pytest_report_header(config):
    lines = [f"railshard tests: backend under test = {BACKEND!r}"]
    try:
        import torch as _t

        lines.append(f"torch {_t.__version__} at {Path(_t.__file__).parent}")
    except Exception:  # noqa: BLE001
        lines.append("torch: not importable")
    if railshard is not None:
        lines.append(f"railshard module: {railshard.__file__}")
    elif UNDER_TEST_IS_RAILSHARD:
        lines.append(f"railshard module: NOT importable (looked in {BUILD_PYTHON} first)")
        lines.append(IMPORT_ERROR.rstrip())
    return lines


def pytest_configure(config):
    config.addinivalue_line("markers", "railshard_only: needs the real railshard backend")
    if IMPORT_ERROR is not None and REQUIRE_MODULE:
        raise pytest.UsageError(
            "RAILSHARD_REQUIRE_MODULE=1 but `import railshard` failed "
            f"(sys.path starts with {sys.path[:3]}):\n{IMPORT_ERROR}")


def pytest_collection_modifyitems(config, items):
    if IMPORT_ERROR is not None:
        reason = ("`import railshard` failed (set RAILSHARD_BUILD_PYTHON=<build>/python or "
                  "PYTHONPATH): " + IMPORT_ERROR.strip().splitlines()[-1])
        print(f"\nrailshard python tests skipped; the import error was:\n{IMPORT_ERROR}",
              file=sys.stderr)
        for item in items:
            item.add_marker(pytest.mark.skip(reason=reason))
        return
    if not UNDER_TEST_IS_RAILSHARD:
        for item in items:
            if item.get_closest_marker("railshard_only"):
                item.add_marker(pytest.mark.skip(
                    reason=f"RAILSHARD_TEST_BACKEND={BACKEND}: needs the railshard backend"))


# ---------------------------------------------------------------------------------------------
# ports, environment


def free_port():
    """A TCP port that was free a moment ago (the rendezvous store binds it right after)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def child_env(extra=None):
    """The environment for a subprocess rank: this interpreter's module path first (an
    installed package is found by the interpreter itself)."""
    env = dict(os.environ)
    if not INSTALLED:
        env["PYTHONPATH"] = os.pathsep.join(
            [str(MODULE_DIR)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
        env["RAILSHARD_BUILD_PYTHON"] = str(MODULE_DIR)
    env.setdefault("OMP_NUM_THREADS", "1")
    if extra:
        env.update({k: str(v) for k, v in extra.items()})
    return env


def launch_env(extra=None):
    """child_env() for a job a launcher starts (railshard-launch gives the ranks their own
    RANK, WORLD_SIZE, ...): whatever of those this process inherited is left out."""
    env = child_env(extra)
    for name in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK",
                 "RAILSHARD_JOIN", "RAILSHARD_RANK", "RAILSHARD_WORLD_SIZE"):
        env.pop(name, None)
    return env


def tool(name):
    """The path of a railshard tool (railshard-launch, railshard-store, ...): RAILSHARD_LAUNCH
    for the launcher when set; the environment's console command when the package is installed;
    else next to the module's build, then <repo>/build. The first that exists, or the last
    candidate (callers skip on .exists())."""
    candidates = []
    if name == "railshard-launch" and os.environ.get("RAILSHARD_LAUNCH"):
        candidates.append(Path(os.environ["RAILSHARD_LAUNCH"]))
    if INSTALLED:
        candidates.append(Path(sys.executable).parent / name)
    else:
        candidates += [MODULE_DIR.parent / "launcher" / "tools" / name,
                       REPO / "build" / "launcher" / "tools" / name]
    for c in candidates:
        if c.is_file() and os.access(c, os.X_OK):
            return c
    return candidates[-1]


def railshard_launch_binary():
    """railshard-launch (see tool()), or None."""
    launch = tool("railshard-launch")
    return str(launch) if launch.exists() else None


# ---------------------------------------------------------------------------------------------
# one world of real processes


class Ctx:
    """What a rank's function gets."""

    def __init__(self, rank, world_size, backend, gloo, conn, deadline):
        self.rank = rank
        self.world_size = world_size
        self.backend = backend
        self.gloo = gloo  # a gloo group over the same ranks: the reference
        self._conn = conn
        self.deadline = deadline  # time.monotonic() value the parent kills us at

    def progress(self, text):
        """Tells the parent what this rank is doing (shown if the world times out)."""
        self._conn.send_bytes(pickle.dumps(("progress", str(text))))


class _ChildOptions:
    def __init__(self, init_method, backend, timeout, shutdown, init_timeout, gloo_group,
                 deadline):
        self.deadline = deadline
        self.init_method = init_method
        self.backend = backend
        self.timeout = timeout
        self.shutdown = shutdown
        self.init_timeout = init_timeout
        self.gloo_group = gloo_group


def _child_main(fn, args, rank, world_size, opts, conn):
    # A rank the parent gives up on gets SIGABRT first: faulthandler then prints every
    # thread's Python stack to stderr (shown with the failed test) before the process dies.
    faulthandler.enable(all_threads=True)
    try:
        import torch
        import torch.distributed as dist

        torch.set_num_threads(1)
        if opts.backend == "railshard":
            importlib.import_module("railshard")
        dist.init_process_group(
            opts.backend, init_method=opts.init_method, rank=rank,
            world_size=world_size, timeout=datetime.timedelta(seconds=opts.init_timeout))
        gloo = dist.new_group(backend="gloo") if opts.gloo_group else None
        ctx = Ctx(rank, world_size, opts.backend, gloo, conn, opts.deadline)
        result = fn(ctx, *args)
        conn.send_bytes(pickle.dumps(("ok", result)))
    except BaseException:  # noqa: BLE001  (report everything, SystemExit included)
        try:
            conn.send_bytes(pickle.dumps(("error", traceback.format_exc())))
        finally:
            sys.stderr.flush()
            os._exit(3)
    if opts.shutdown == "destroy":
        import torch.distributed as dist

        dist.destroy_process_group()
    elif opts.shutdown == "abort":
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    # "destroy" and "exit": a normal interpreter exit (destructors run; a hang there fails).


class WorldError(AssertionError):
    pass


def run_world(fn, world_size, *args, timeout=120, stall_timeout=None, exit_timeout=30,
              env=None, backend=None, expect_dead=(), shutdown="destroy", init_timeout=60,
              gloo_group=True, rendezvous="tcp", _retries=1):
    """Runs fn(ctx, *args) on `world_size` spawned ranks; returns their results by rank.

    timeout: seconds for the whole world; stall_timeout: seconds a rank may go without a
    ctx.progress() message (None: no such limit); exit_timeout: seconds a rank may take to
    exit after reporting its result. A rank past any of them gets SIGABRT (its stacks are
    printed) and then SIGKILL, and the call fails.
    env: extra environment for the ranks (set before they import anything).
    expect_dead: ranks allowed to end without a result (a test that kills them).
    shutdown: "destroy" (destroy_process_group, then exit), "exit" (plain interpreter exit
    with the group alive) or "abort" (os._exit right after reporting).
    rendezvous: "tcp" (tcp://127.0.0.1:<port>) or "file" (file:// in a fresh temporary
    directory: torch's FileStore).
    """
    backend = backend or BACKEND
    port = free_port()
    begin = time.monotonic()
    deadline = begin + timeout
    if rendezvous == "file":
        import tempfile
        init_method = f"file://{tempfile.mkdtemp(prefix='rs-rdzv-')}/store"
    else:
        init_method = f"tcp://127.0.0.1:{port}"
    opts = _ChildOptions(init_method, backend, timeout, shutdown, init_timeout, gloo_group,
                         deadline)
    mp_ctx = multiprocessing.get_context("spawn")
    procs, conns = [], []
    saved = dict(os.environ)
    os.environ.update(child_env(env))
    try:
        for rank in range(world_size):
            parent_conn, child_conn = mp_ctx.Pipe(duplex=False)
            p = mp_ctx.Process(target=_child_main,
                               args=(fn, args, rank, world_size, opts, child_conn),
                               name=f"rank{rank}", daemon=True)
            p.start()
            child_conn.close()
            procs.append(p)
            conns.append(parent_conn)
    finally:
        os.environ.clear()
        os.environ.update(saved)

    results, errors, progress = {}, {}, {}
    last_heard = {r: begin for r in range(world_size)}
    reported_at = {}
    open_conns = {conns[r]: r for r in range(world_size)}
    why = {}  # rank -> why it was given up on
    try:
        while True:
            now = time.monotonic()
            if now >= deadline:
                for r, p in enumerate(procs):
                    if p.is_alive():
                        why[r] = f"still running after the world's {timeout} s"
                break
            if stall_timeout is not None:
                for c, r in open_conns.items():
                    if now - last_heard[r] > stall_timeout:
                        why[r] = (f"no progress for {stall_timeout} s (last: "
                                  f"{progress.get(r, '(none)')})")
            for r, t in reported_at.items():
                if procs[r].is_alive() and now - t > exit_timeout:
                    why[r] = (f"reported its result but did not exit within {exit_timeout} s "
                              f"(hang at shutdown={shutdown!r})")
            needed = [r for r in range(world_size) if r not in expect_dead]
            if why or all(not procs[r].is_alive() and conns[r] not in open_conns
                          for r in needed):
                break  # (ranks in expect_dead still running then, e.g. SIGSTOPped, are killed)
            waitables = list(open_conns) + [p.sentinel for p in procs if p.is_alive()]
            ready = multiprocessing.connection.wait(waitables, timeout=0.5)
            for c in ready:
                if c not in open_conns:
                    continue  # a process sentinel: handled by is_alive() above
                rank = open_conns[c]
                try:
                    kind, payload = pickle.loads(c.recv_bytes())
                except (EOFError, OSError):
                    del open_conns[c]  # died without a result
                    continue
                last_heard[rank] = time.monotonic()
                if kind == "progress":
                    progress[rank] = payload
                    continue
                (results if kind == "ok" else errors)[rank] = payload
                reported_at[rank] = time.monotonic()
                del open_conns[c]
    finally:
        alive = [p for p in procs if p.is_alive()]
        for p in alive:
            os.kill(p.pid, signal.SIGABRT)  # faulthandler prints the stacks
        stop = time.monotonic() + 3
        for p in alive:
            p.join(max(0.0, stop - time.monotonic()))
        for p in procs:
            if p.is_alive():
                p.kill()
        for p in procs:
            p.join(10)
        for c in conns:
            c.close()
    for p in alive:
        rank = procs.index(p)
        if rank not in expect_dead:
            why.setdefault(rank, "still running when the world was stopped")

    if _retries and any("Address already in use" in e or "EADDRINUSE" in e
                        for e in errors.values()):
        return run_world(fn, world_size, *args, timeout=timeout, stall_timeout=stall_timeout,
                         exit_timeout=exit_timeout, env=env, backend=backend,
                         expect_dead=expect_dead, shutdown=shutdown, init_timeout=init_timeout,
                         gloo_group=gloo_group, rendezvous=rendezvous, _retries=_retries - 1)

    problems = []
    for rank in range(world_size):
        code = procs[rank].exitcode
        if rank in errors:
            problems.append(f"rank {rank} raised (exit code {code}):\n{errors[rank]}")
        elif rank in why:
            if rank in expect_dead and rank not in results:
                continue
            problems.append(f"rank {rank}: {why[rank]}; killed")
        elif rank in results:
            if code != 0 and rank not in expect_dead:
                problems.append(f"rank {rank} finished but exited with code {code}"
                                f"{signal_name(code)}")
        elif rank in expect_dead:
            continue
        else:
            problems.append(f"rank {rank} died without a result (exit code {code}"
                            f"{signal_name(code)}); last progress: {progress.get(rank, '(none)')}")
    if problems:
        raise WorldError(f"{backend} world of {world_size} failed after "
                         f"{time.monotonic() - begin:.1f} s:\n" + "\n".join(problems))
    return [results.get(r) for r in range(world_size)]


def signal_name(code):
    if code is not None and code < 0:
        try:
            return f", {signal.Signals(-code).name}"
        except ValueError:
            return ""
    return ""


# ---------------------------------------------------------------------------------------------
# many named checks in one world

SOFT_FAILURES = []


def expect(condition, message):
    """A check that records its failure and lets the case go on: inside run_cases, a rank
    that stopped at its first wrong value would skip the collectives its peers still make,
    and the world would hang. The case fails at its end with everything recorded."""
    if not condition:
        SOFT_FAILURES.append(str(message))
    return bool(condition)


def _run_cases_rank(ctx, module_name, builder_name, builder_args):
    """Runs every case on this rank; returns {name: None | failure text}."""
    module = importlib.import_module(module_name)
    cases = getattr(module, builder_name)(*builder_args)
    out = {}
    broken = None
    only = os.environ.get("RAILSHARD_TEST_ONLY")  # debugging: a regex of case names to run
    for name, check in cases:
        if only and not re.search(only, name):
            out[name] = "skip: not selected by RAILSHARD_TEST_ONLY"
            continue
        if broken is not None:
            out[name] = f"not run: the backend raised in an earlier case ({broken})"
            continue
        ctx.progress(name)
        SOFT_FAILURES.clear()
        try:
            check(ctx)
            out[name] = (None if not SOFT_FAILURES else
                         f"rank {ctx.rank}: " + f"\nrank {ctx.rank}: ".join(SOFT_FAILURES[:20]))
        except pytest.skip.Exception as e:  # pytest.skip() inside a case: same on every rank
            out[name] = f"skip: {e.msg}"
        except AssertionError as e:
            out[name] = f"rank {ctx.rank}: {e}"
        except Exception:  # noqa: BLE001  (a backend error poisons the rest of the world)
            out[name] = f"rank {ctx.rank} raised:\n{traceback.format_exc()}"
            if ctx.backend == "railshard":
                broken = name  # railshard poisons its communicator after an error

    return out


def run_cases(module_name, builder_name, builder_args, world_size, stall_timeout=90, **kwargs):
    """Builds the cases with module.builder(*builder_args) on every rank and runs them in order
    in one world. Returns {name: None if every rank passed, else the ranks' failure texts}."""
    per_rank = run_world(_run_cases_rank, world_size, module_name, builder_name, builder_args,
                         stall_timeout=stall_timeout, **kwargs)
    merged = {}
    for name in per_rank[0]:
        failures = [r[name] for r in per_rank if r.get(name)]
        if failures and all(f.startswith("skip:") for f in failures):
            merged[name] = failures[0]
        else:
            merged[name] = "\n".join(failures) if failures else None
    return merged


def skip_unless_railshard():
    if not UNDER_TEST_IS_RAILSHARD:
        pytest.skip(f"RAILSHARD_TEST_BACKEND={BACKEND}: needs the railshard backend")
