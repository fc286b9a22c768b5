"""The pip package as a user gets it: the wheel `pip wheel .` built (RAILSHARD_WHEEL, made by
scripts/test.sh's torch 2.x pass) installed into a fresh venv, imported, its console commands
run, and uninstalled without a trace.

The fresh venv sees the running interpreter's torch through a .pth file (a copy of torch would
be gigabytes); everything railshard installs lands in the venv itself, which is what the
before/after comparison checks.
"""

import os
import re
import subprocess
import venv
from pathlib import Path

import pytest

from conftest import REPO

WHEEL = os.environ.get("RAILSHARD_WHEEL")

pytestmark = pytest.mark.skipif(
    not WHEEL, reason="RAILSHARD_WHEEL not set (scripts/test.sh builds the wheel with `pip wheel .` "
    "in its torch 2.x pass and sets it)")

TOOLS = ("railshard-launch", "railshard-store", "railshard-topo", "railshard-report")


def _files(root):
    """Every file and directory under root, relative to it."""
    out = set()
    for dirpath, dirnames, filenames in os.walk(root):
        rel = Path(dirpath).relative_to(root)
        for name in dirnames + filenames:
            out.add(str(rel / name))
    return out


def _run(cmd, **kwargs):
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "RAILSHARD_BUILD_PYTHON", "RAILSHARD_LAUNCH")}
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env, **kwargs)


@pytest.fixture(scope="module")
def fresh_venv(tmp_path_factory):
    root = tmp_path_factory.mktemp("venv") / "v"
    venv.EnvBuilder(with_pip=True).create(root)
    python = root / "bin" / "python"
    site = _run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"])
    assert site.returncode == 0, site.stderr
    import torch

    torch_site = Path(torch.__file__).resolve().parent.parent
    (Path(site.stdout.strip()) / "torch_from_test.pth").write_text(f"{torch_site}\n")
    return root


def test_the_wheel_installs_imports_runs_its_tools_and_uninstalls_without_a_trace(fresh_venv):
    python = fresh_venv / "bin" / "python"
    before = _files(fresh_venv)
    # --no-index --no-deps: the wheel alone (torch is there through the .pth).
    inst = _run([str(python), "-m", "pip", "install", "--no-index", "--no-deps", WHEEL])
    assert inst.returncode == 0, inst.stdout + inst.stderr

    # Importing registers the backend; the version is CMakeLists.txt's, in every place.
    cmake_version = re.search(r"project\(railshard VERSION ([0-9.]+)",
                              (REPO / "CMakeLists.txt").read_text()).group(1)
    probe = _run([str(python), "-c",
                  "import importlib.metadata, railshard, torch.distributed as dist\n"
                  "print(railshard.__file__)\n"
                  "print(railshard.__version__, importlib.metadata.version('railshard'))\n"
                  "print('railshard' in dist.Backend.backend_list)\n"], cwd="/")
    assert probe.returncode == 0, probe.stdout + probe.stderr
    where, versions, registered = probe.stdout.split("\n")[:3]
    assert Path(where).is_relative_to(fresh_venv), where  # the venv's copy, not a build tree's
    assert versions == f"{cmake_version} {cmake_version}"
    assert registered == "True"

    for tool in TOOLS:
        command = fresh_venv / "bin" / tool
        assert command.is_file(), f"no console command {command}"
        out = _run([str(command), "--help"])
        assert out.returncode == 0, out.stdout + out.stderr
        assert out.stdout.startswith(f"usage: {tool}"), out.stdout[:200]
    version = _run([str(fresh_venv / "bin" / "railshard-launch"), "--version"])
    assert version.stdout.strip() == f"railshard-launch (railshard) {cmake_version}", version.stdout

    # The library is found relative to the package, not through a build tree or the system.
    package = Path(where).parent
    for binary in [package / "bin" / "railshard-launch", *package.glob("_C*.so")]:
        ldd = _run(["ldd", str(binary)])
        assert "not found" not in ldd.stdout, ldd.stdout
        lib = [line for line in ldd.stdout.splitlines() if "librailshard.so" in line]
        assert lib, ldd.stdout
        found = Path(lib[0].split("=>")[1].split("(")[0].strip())
        assert found.resolve() == (package / "lib" / "librailshard.so").resolve(), ldd.stdout

    uninst = _run([str(python), "-m", "pip", "uninstall", "-y", "railshard"])
    assert uninst.returncode == 0, uninst.stdout + uninst.stderr
    after = _files(fresh_venv)
    assert after - before == set(), f"left behind by pip uninstall: {sorted(after - before)}"
    assert before - after == set(), f"removed by install + uninstall: {sorted(before - after)}"
