"""The console commands of railshard's pip package (railshard-launch, railshard-store,
railshard-topo, railshard-report): each execs the C++ tool installed inside the package
(railshard/bin, which finds librailshard at ../lib).

A module of its own, outside the railshard package, because importing anything under
railshard runs railshard/__init__.py, which imports torch (seconds) and loads the extension:
a launcher needs neither. The package is located without being imported.
"""

import importlib.util
import os
import sys


def _exec(tool):
    spec = importlib.util.find_spec("railshard")
    if spec is None or not spec.submodule_search_locations:
        sys.exit(f"{tool}: the railshard package is not installed for {sys.executable}")
    path = os.path.join(list(spec.submodule_search_locations)[0], "bin", tool)
    if not os.access(path, os.X_OK):
        sys.exit(f"{tool}: {path} is missing (reinstall railshard: pip install --force-reinstall)")
    # exec, not a child: the launcher's pid, signals and exit status are the command's own.
    os.execv(path, [tool] + sys.argv[1:])


def launch():
    _exec("railshard-launch")


def store():
    _exec("railshard-store")


def topo():
    _exec("railshard-topo")


def report():
    _exec("railshard-report")
