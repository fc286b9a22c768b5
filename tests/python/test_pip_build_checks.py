"""The pip build's checks (cmake/python_package_checks.cmake), each a one-line reason before
anything compiles: no torch for the interpreter, a torch older than 2.0, no C++ compiler.
Configure only, in a scratch directory: each case fails within seconds."""

import os
import shutil
import subprocess
import sys
import venv
from pathlib import Path

import pytest

from conftest import REPO

CMAKE = shutil.which("cmake")
pytestmark = pytest.mark.skipif(CMAKE is None, reason="no cmake on PATH")


def _configure(tmp_path, python, env=None):
    cmd = [CMAKE, "-S", str(REPO), "-B", str(tmp_path / "build"), "-DRAILSHARD_PYTHON_PACKAGE=ON",
           f"-DPython_EXECUTABLE={python}"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120,
                          env=env if env is not None else dict(os.environ))
    return proc.returncode, proc.stdout + proc.stderr


def _first_railshard_line(text):
    return next((line for line in text.splitlines() if line.startswith("railshard: ")), "")


def test_an_interpreter_without_torch_is_named_in_one_line(tmp_path):
    bare = tmp_path / "bare"
    venv.EnvBuilder(with_pip=False).create(bare)  # no site packages: no torch
    rc, out = _configure(tmp_path, bare / "bin" / "python")
    assert rc != 0, out
    line = _first_railshard_line(out)
    assert "torch is not importable by" in line and "pip install torch" in line, out
    assert "Building" not in out  # nothing compiled


@pytest.mark.skipif(not Path("/usr/bin/python3").exists(), reason="no /usr/bin/python3")
def test_a_torch_older_than_2_is_named_in_one_line(tmp_path):
    probe = subprocess.run(["/usr/bin/python3", "-c", "import torch; print(torch.__version__)"],
                           capture_output=True, text=True, timeout=120)
    if probe.returncode != 0 or not probe.stdout.startswith("1."):
        pytest.skip("/usr/bin/python3 has no torch 1.x (Debian's python3-torch)")
    rc, out = _configure(tmp_path, "/usr/bin/python3")
    assert rc != 0, out
    line = _first_railshard_line(out)
    assert f"torch {probe.stdout.strip().split('+')[0]} is installed" in line, out
    assert "needs torch >= 2.0" in line, out


def test_no_compiler_is_named_in_one_line(tmp_path):
    import torch

    if int(torch.__version__.split(".")[0]) < 2:
        pytest.skip(f"torch {torch.__version__} here: the torch check fails before the compiler's")
    # A PATH with only the interpreter's directory: no c++, g++ or clang++ to find.
    env = {k: v for k, v in os.environ.items() if k not in ("CXX", "CC")}
    env["PATH"] = str(Path(sys.executable).parent)
    rc, out = _configure(tmp_path, sys.executable, env)
    assert rc != 0, out
    line = _first_railshard_line(out)
    assert "no C++ compiler" in line and "apt-get install g++" in line, out
