"""Every command of README.md and examples/README.md, run as the README shows it.

Each command of a ```sh block (continuation lines joined, comments dropped) must match a rule
below, or the test of that document fails naming it: a new README command is either run here
or skipped with a reason. Rules run the command as written, or with a stated substitution where
the README writes a placeholder (`./my_program`, `node0`, `10.0.0.1`): `./my_program` is the
README's own C++ snippet ("Using the library") built with its own CMake snippet against
`cmake --install build`. Every run is bounded in time and checked for its exit status and the
output the README promises (a JSON file, a report, a line).

Commands run in the checkout, as the README says (a copy elsewhere would be another source
tree to CMake: `./scripts/quickstart.sh` there reconfigures the build for it), with the current
interpreter's environment first on PATH (an activated venv: `python`, `torchrun`, the console
commands). What they write outside build/ (steps.json, trace/, report.html, ...) is removed
afterwards, and a file of that name that was there before is put back. They need the CMake
build at <repo>/build and the pip-installed package, so they run in scripts/test.sh's torch 2.x
pass (RAILSHARD_INSTALLED=1), where both exist.
"""

import os
import re
import select
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from conftest import INSTALLED, REPO

BUILD = REPO / "build"
DOCS = ("README.md", "examples/README.md")

pytestmark = [
    pytest.mark.skipif(not INSTALLED, reason=(
        "runs in scripts/test.sh's torch 2.x pass (RAILSHARD_INSTALLED=1): the README's "
        "PyTorch commands assume the pip-installed package")),
    pytest.mark.skipif(not (BUILD / "CMakeCache.txt").exists(),
                       reason=f"no CMake build at {BUILD} (scripts/build.sh makes it)"),
]


@dataclass
class Command:
    doc: str
    line: int
    text: str
    exports: list = field(default_factory=list)  # `export` lines before it in its block

    def __str__(self):
        return f"{self.doc}:{self.line}: {self.text}"


def commands(doc):
    """The commands of doc's ```sh blocks: continuations joined, comments and blanks dropped."""
    out, in_block, exports, pending, start = [], False, [], "", 0
    for number, raw in enumerate((REPO / doc).read_text().splitlines(), 1):
        if raw.startswith("```"):
            in_block, exports = raw.strip() == "```sh", []
            continue
        if not in_block:
            continue
        line = re.sub(r"(^|\s+)#(\s.*)?$", "", raw).rstrip()
        if not pending and not line.strip():
            continue
        if not pending:
            start = number
        if line.endswith("\\"):
            pending += line[:-1].strip() + " "
            continue
        text = (pending + line.strip()).strip()
        pending = ""
        out.append(Command(doc, start, text, list(exports)))
        if text.startswith("export "):
            exports.append(text)
    return out


# ---------------------------------------------------------------------------------------------
# How each command runs. A rule is (regex on the command, action); the first match decides.


@dataclass
class Run:
    """Run as shown (after `subs`, each stated in `why`); expect: regexes on the output; files:
    paths (relative to the checkout, or absolute) the command must write."""
    timeout: int = 120
    expect: tuple = ()
    files: tuple = ()
    subs: tuple = ()
    why: str = ""
    background: bool = False  # `cmd &`: runs until its first line, then is stopped
    with_next: str = ""  # a regex: the next command of the block runs at the same time (two hosts)
    file_text: str = ""  # a regex each file of `files` must match


@dataclass
class Skip:
    reason: str


PROGRAM_SUB = ("./my_program", "{program}")
# A program alone moves nothing to count: two ranks under the launcher.
LAUNCHED_SUB = ("./my_program", "build/launcher/tools/railshard-launch -n 2 {program}")
LAUNCHED = "./my_program is the README's C++ snippet, as two ranks under railshard-launch"
HERE_SUB = ("10.0.0.1", "127.0.0.1")
LEDGER_OK = r"samples, each processed exactly once \(0 missing, 0 duplicated\)"

RULES = [
    (r"^\./scripts/quickstart\.sh$",
     Run(timeout=900, expect=(r"proportional is [0-9.]+x faster per step than equal",),
         files=("build/quickstart.png",))),
    (r"^\./scripts/test\.sh$",
     Skip("CI's command (.ci/run runs it); this test runs inside it")),
    (r"^\./scripts/install_deps\.sh$", Run(timeout=600)),
    (r"^pip install \.$",
     Skip("scripts/test.sh builds this package with `pip wheel .` and installs the wheel into "
          "the venv these commands run in (test_install.py checks what it installed)")),
    (r"^cmake -S \. -B build ",
     Run(timeout=600, expect=(r"(?m)^\[\d+/\d+\]|no work to do|Built target",))),
    (r"railshard-launch -n 3 build/benchmarks/dispatch_bench --speeds 1,2,4$",
     Run(expect=(r"proportional",))),
    (r"--slowdown 2:2:15 --json steps\.json$", Run(files=("steps.json",))),
    (r"--kill 2:12 --policies proportional$", Run(expect=(LEDGER_OK,))),
    (r"--kill 2:12 --grow --policies proportional$", Run(expect=(LEDGER_OK,))),
    (r"--trace trace/ .*allreduce_perf", Run(timeout=300, expect=(r"MB",), files=("trace",))),
    (r"allreduce_perf -b 8 -e 64M -f 4$", Run(timeout=300, expect=(r"67108864",))),
    (r"^build/launcher/tools/railshard-report trace/ --html report\.html$",
     Run(timeout=300, files=("report.html",))),
    (r"--link-gbps 25 -J results\.json$", Run(timeout=300, files=("results.json",))),
    (r"^build/launcher/tools/railshard-store --port 29400 &$",
     Run(background=True, expect=(r"RAILSHARD_STORE_ADDR=\S+:29400",))),
    (r"^RAILSHARD_RANK=0 .*\./my_program$",
     Run(subs=(HERE_SUB, PROGRAM_SUB), with_next="RAILSHARD_RANK=1",
         why="./my_program is the README's C++ snippet; both ranks on this host (rank 1 as "
             "the comment says: one rank per host, the same variables with RAILSHARD_RANK=1)")),
    (r"^export RAILSHARD_TOKEN=\$\(openssl rand -hex 16\)$", Run(timeout=30)),
    (r"--node-rank 0 --master node0:29400 \./my_program$",
     Run(timeout=300, subs=(("node0", "127.0.0.1"), PROGRAM_SUB), with_next="--node-rank 1",
         why="node0 is node 0's address: here both nodes are this host")),
    (r"--node-rank 1 --master node0:29400 \./my_program$",
     Skip("runs together with node 0's line above (two hosts at once)")),
    (r"^build/launcher/tools/railshard-topo$", Run(expect=(r"host",))),
    (r"--dump-topology job\.json \./my_program$", Run(subs=(PROGRAM_SUB,), files=("job.json",))),
    (r"^RAILSHARD_PROBE=1 \.\.\.$",
     Skip("the README elides the command; the probe runs in ctest "
          "(NetnsTestbed.DiscoveryFindsBothRailsAndTheProbeMeasuresTheirShaping)")),
    (r"^RAILSHARD_METRICS_PORT=9400 \./my_program$", Run(subs=(LAUNCHED_SUB,), why=LAUNCHED)),
    (r"^RAILSHARD_METRICS=/tmp/railshard-\{rank\}\.prom \./my_program$",
     Run(subs=(LAUNCHED_SUB,), why=LAUNCHED,
         files=("/tmp/railshard-0.prom", "/tmp/railshard-1.prom"),
         file_text=r"(?m)^railshard_collectives_total\{.*\} [1-9]")),
    (r"^torchrun --nproc-per-node 3 examples/train\.py --backend railshard$",
     Run(timeout=300, expect=(r"step",))),
    (r"^torchrun --nproc-per-node 4 examples/train\.py$", Run(timeout=300, expect=(r"step",))),
    (r"^/usr/bin/torchrun .*examples/train\.py$", Run(timeout=300, expect=(r"step",))),
    (r"^railshard-launch -n 4 python examples/train\.py$", Run(timeout=300, expect=(r"step",))),
    (r"^mpirun -np 4 python examples/train\.py --backend railshard$",
     Run(timeout=300, expect=(r"step",),
         subs=(("mpirun -np", "mpirun --allow-run-as-root --oversubscribe -np"),),
         why="as root and with more ranks than cores, as the comment beside it says")),
    (r"^PYTHONPATH=build/python build/launcher/tools/railshard-launch -n 4 /usr/bin/python3 "
     r"examples/train\.py$", Run(timeout=300, expect=(r"step",))),
    (r"--elastic --steps 60 --kill 2:12$",
     Run(timeout=300, expect=(r"rank 2 kills itself after step 12", r"step +59 "))),
    (r"^export PYTHONPATH=build/python$", Run(timeout=30)),
    (r"--slow-rank 1 --slow-factor 3 --steps 20$", Run(timeout=300, expect=(r"step",))),
    (r"compare_peers\.py --build build -b 16 -e 256M -f 4 --reps 3$",
     Run(timeout=300, subs=(("-e 256M -f 4 --reps 3", "-e 64K -f 4 --reps 1"),),
         files=("build/compare/medians.csv",),
         why="sizes up to 64K once (the whole sweep is a benchmark of many minutes)")),
]


def rule_for(cmd):
    for pattern, action in RULES:
        if re.search(pattern, cmd.text):
            return action
    return None


ALL = [c for doc in DOCS for c in commands(doc)]


def test_every_command_has_a_rule():
    """A README command nobody classified would go unchecked: each must run here or be skipped
    with a reason."""
    unclassified = [str(c) for c in ALL if rule_for(c) is None]
    assert not unclassified, "README commands without a rule in this file:\n" + "\n".join(
        unclassified)
    assert len(ALL) >= 30, f"only {len(ALL)} commands found: is the parser still right?"


# ---------------------------------------------------------------------------------------------
# ./my_program


def snippet(doc, lang, contains):
    """The first ```lang block of doc that contains `contains`."""
    blocks = re.findall(r"```" + lang + r"\n(.*?)```", (REPO / doc).read_text(), re.S)
    found = [b for b in blocks if contains in b]
    assert found, f"no ```{lang} block with {contains!r} in {doc}"
    return found[0]


@pytest.fixture(scope="module")
def program(tmp_path_factory):
    """./my_program: README's C++ snippet, built by a project made of its CMake snippet,
    against `cmake --install build --prefix P`."""
    work = tmp_path_factory.mktemp("my_program")
    prefix = work / "prefix"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "DESTDIR")}
    run = subprocess.run(["cmake", "--install", str(BUILD), "--prefix", str(prefix)], env=env,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    src = work / "src"
    src.mkdir()
    (src / "main.cc").write_text(snippet("README.md", "cpp", "railshard::init()"))
    # The snippet's two lines, in the smallest project around them.
    (src / "CMakeLists.txt").write_text(
        "cmake_minimum_required(VERSION 3.22)\nproject(app LANGUAGES CXX)\n"
        "set(CMAKE_CXX_STANDARD 20)\nadd_executable(app main.cc)\n"
        + snippet("README.md", "cmake", "find_package(railshard"))
    for args in (["cmake", "-S", str(src), "-B", str(work / "build"),
                  f"-DCMAKE_PREFIX_PATH={prefix}"],
                 ["cmake", "--build", str(work / "build")]):
        run = subprocess.run(args, env=env, capture_output=True, text=True, timeout=300)
        assert run.returncode == 0, " ".join(args) + "\n" + run.stdout + run.stderr
    return work / "build" / "app"


# ---------------------------------------------------------------------------------------------
# Running one command


def shell_env():
    """As in a shell where the venv is activated: its bin first on PATH, no PYTHONPATH."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "RAILSHARD_INSTALLED", "RAILSHARD_WHEEL")}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    # test.sh sets it for pytest; a user's shell has none (and nproc would say 1 under it).
    env.pop("OMP_NUM_THREADS", None)
    return env


def substituted(text, action, program_path, strict=True):
    for old, new in action.subs:
        assert old in text or not strict, f"substitution {old!r} no longer applies to {text}"
        text = text.replace(old, new.format(program=program_path))
    return text


def run_shell(script, cwd, timeout):
    """bash -c script in its own process group, killed as a group at the deadline."""
    proc = subprocess.Popen(["bash", "-c", script], cwd=cwd, env=shell_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail(f"did not finish in {timeout} s:\n$ {script}\n{out[-4000:]}")
    return proc.returncode, out


def run_background(script, cwd, timeout):
    """`cmd &`: started, its first line read, then stopped (it would serve until killed)."""
    proc = subprocess.Popen(["bash", "-c", f"exec {script.rstrip('& ')}"], cwd=cwd,
                            env=shell_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    try:
        ready, _, _ = select.select([proc.stdout], [], [], timeout)
        assert ready, f"printed nothing in {timeout} s"
        first = proc.stdout.readline()
        assert proc.poll() is None, f"exited at once:\n{first}{proc.stdout.read()}"
        return 0, first
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=timeout)


def partner(cmd, action):
    """The command that runs at the same time as cmd (the other host's line)."""
    block = [c for c in ALL if c.doc == cmd.doc and c.line > cmd.line]
    for c in block:
        if re.search(action.with_next, c.text):
            return c
    pytest.fail(f"{cmd}: no following command matches {action.with_next!r}")


def script_for(cmd, action, program_path):
    first = substituted(cmd.text, action, program_path)
    if not action.with_next:
        return first
    if action.with_next == "RAILSHARD_RANK=1":  # the README shows rank 0 only
        second = first.replace("RAILSHARD_RANK=0", "RAILSHARD_RANK=1")
    else:
        second = substituted(partner(cmd, action).text, action, program_path, strict=False)
    # Both at once, as on two hosts; the script fails if either does.
    return (f"( {first} ) & a=$!\n( {second} ) & b=$!\n"
            "wait $a; ra=$?\nwait $b; rb=$?\nexit $(( ra != 0 ? ra : rb ))")


def _params():
    return [pytest.param(c, id=f"{c.doc}:{c.line}") for c in ALL if rule_for(c) is not None]


@pytest.fixture(scope="module")
def outputs(tmp_path_factory):
    """What the commands write outside build/, removed when the module ends (a later command
    reads an earlier one's: railshard-report reads trace/); a file or directory of that name
    that was there before is put back then."""
    taken = {}  # target -> backup or None
    keep = tmp_path_factory.mktemp("before")

    def take(action):
        targets = []
        for f in action.files:
            target = Path(f) if f.startswith("/") else REPO / f
            targets.append(target)
            if target not in taken and not target.is_relative_to(BUILD):
                backup = None
                if target.exists():
                    backup = keep / str(len(taken))
                    shutil.move(target, backup)
                taken[target] = backup
            elif target.is_dir():
                shutil.rmtree(target)
            elif target.exists():
                target.unlink()
        return targets

    yield take
    for target, backup in taken.items():
        if target.is_dir() and not target.is_symlink():
            shutil.rmtree(target)
        elif target.exists() or target.is_symlink():
            target.unlink()
        if backup is not None:
            shutil.move(backup, target)


@pytest.mark.parametrize("cmd", _params())
def test_readme_command_runs_as_shown(cmd, request, outputs):
    action = rule_for(cmd)
    if isinstance(action, Skip):
        pytest.skip(action.reason)
    program_path = request.getfixturevalue("program") if any(
        "{program}" in new for _, new in action.subs) else None
    body = script_for(cmd, action, program_path)
    script = "\n".join(cmd.exports + [body])
    written = outputs(action)
    if action.background:
        rc, out = run_background(script, REPO, action.timeout)
    else:
        rc, out = run_shell(script, REPO, action.timeout)
    shown = f"$ {body}\n{out[-6000:]}" + (f"\n(substituted: {action.why})" if action.why else "")
    assert rc == 0, f"exit status {rc}:\n{shown}"
    for pattern in action.expect:
        assert re.search(pattern, out), f"no match for {pattern!r} in the output:\n{shown}"
    for target in written:
        assert target.exists(), f"{target} was not written:\n{shown}"
        if target.is_file():
            assert target.stat().st_size > 0, f"{target} is empty:\n{shown}"
            if action.file_text:
                assert re.search(action.file_text, target.read_text()), \
                    f"{target} does not match {action.file_text!r}:\n{target.read_text()[:3000]}"
