"""`cmake --install BUILD --prefix P` as the README shows it: everything lands under P (nothing in
the interpreter's own directories), the Python package in P/lib/python3.X/site-packages imports
from there and finds librailshard relative to itself, and the installed tools run."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import INSTALLED, MODULE_DIR

BUILD = MODULE_DIR.parent

pytestmark = [
    pytest.mark.skipif(INSTALLED, reason="railshard is pip-installed here (test_install.py)"),
    pytest.mark.skipif(not (BUILD / "CMakeCache.txt").exists(),
                       reason=f"{BUILD} is not a CMake build directory"),
]


def test_cmake_install_puts_everything_under_the_prefix_and_it_runs_from_there(tmp_path):
    prefix = tmp_path / "prefix"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "DESTDIR")}
    proc = subprocess.run(["cmake", "--install", str(BUILD), "--prefix", str(prefix)], env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    installed = [Path(line) for line in (BUILD / "install_manifest.txt").read_text().split()]
    outside = [str(p) for p in installed if not p.is_relative_to(prefix)]
    assert not outside, f"installed outside the prefix {prefix}: {outside[:5]}"

    # The install says where the package went; that is where it is, and it imports from there.
    said = re.search(r"the Python package is in (\S+); import it with PYTHONPATH=(\S+)",
                     proc.stdout)
    assert said, proc.stdout
    site = Path(said.group(2))
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    assert site == prefix / "lib" / f"python{version}" / "site-packages"
    probe = subprocess.run(
        [sys.executable, "-c", "import railshard, torch.distributed as dist\n"
         "print(railshard.__file__)\nprint(hasattr(dist.Backend, 'RAILSHARD'))"],
        env=dict(env, PYTHONPATH=str(site)), capture_output=True, text=True, timeout=120, cwd="/")
    assert probe.returncode == 0, probe.stdout + probe.stderr
    where, registered = probe.stdout.split()[:2]
    assert Path(where).is_relative_to(site), where
    assert registered == "True", probe.stdout

    launch = subprocess.run([str(prefix / "bin" / "railshard-launch"), "--version"], env=env,
                            capture_output=True, text=True, timeout=60)
    assert launch.returncode == 0, launch.stderr
    assert launch.stdout.startswith("railshard-launch (railshard) "), launch.stdout
