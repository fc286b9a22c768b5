#!/usr/bin/env bash
# Installs dependencies, builds, and runs the whole test suite (ctest: C++ tests, plus the
# Python tests under Debian's torch 1.13 when the PyTorch extension is built), then the
# Python tests again under a current torch 2.x:
#   - scripts/torch_venv.sh makes sure the cached venv with torch 2.x exists (outside the
#     checkout; created only when missing, which needs network access once);
#   - `pip wheel .` builds the pip package against that torch (only the library, the extension
#     and the tools), scripts/pip_venv.sh installs it into a fresh venv;
#   - pytest runs tests/python with that venv's interpreter against the installed package.
# RAILSHARD_SKIP_TORCH2=1 skips the torch 2.x pass (a machine without network). Both passes
# always run; the script fails if either fails.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/install_deps.sh"
"$root/scripts/build.sh"

status=0
# PyTorch's own test base under Debian's torch 1.13 needs expecttest (not packaged):
# test_torch_suite.py runs the base with this interpreter, or skips saying why.
if suite_venv=$("$root/scripts/torch_venv.sh" --system-torch); then
  export RAILSHARD_SUITE_PYTHON="$suite_venv/bin/python"
else
  echo "test.sh: no venv for torch 1.13's test base (see above); that test will skip" >&2
fi
# The RDMA suite's qemu guest (Debian packages, cached outside the checkout; built once).
if ! "$root/benchmarks/testbed/rdma/guest.sh" build; then
  echo "test.sh: no RDMA guest image (see above): RdmaGuest.SuiteOverSoftRoce will skip" >&2
fi
(cd "$root/build" && ctest --output-on-failure -j 2 --timeout 600) || status=1

if [ "${RAILSHARD_SKIP_TORCH2:-0}" = "1" ]; then
  echo "test.sh: RAILSHARD_SKIP_TORCH2=1: skipping the Python tests under torch 2.x"
  exit $status
fi

echo "test.sh: Python tests under torch 2.x"
if ! venv=$("$root/scripts/torch_venv.sh"); then
  echo "test.sh: no torch 2.x venv (see above); the torch 2.x pass FAILED" >&2
  exit 1
fi
# The package as PyTorch users install it: `pip wheel .` against that venv's torch (pip's own
# build isolation; pyproject.toml says how the torch is matched), then the wheel installed into
# a fresh venv that sees the cached torch through a .pth file (scripts/pip_venv.sh). The tests
# run against that install: no build tree on PYTHONPATH, the tools are the venv's commands.
dist="$root/build-pip/dist"
rm -rf "$root/build-pip"
if ! "$venv/bin/python" -m pip wheel --no-deps --quiet -w "$dist" "$root"; then
  echo "test.sh: pip wheel . FAILED (see above)" >&2
  exit 1
fi
wheel=$(ls "$dist"/railshard-*.whl)
pkg_venv=$("$root/scripts/pip_venv.sh" "$venv" "$root/build-pip/venv" "$wheel")
# From tests/python with no cache and no bytecode: nothing is left in the source tree.
(cd "$root/tests/python" &&
  RAILSHARD_INSTALLED=1 RAILSHARD_REQUIRE_MODULE=1 RAILSHARD_WHEEL="$wheel" \
  PYTHONDONTWRITEBYTECODE=1 OMP_NUM_THREADS=1 \
  "$pkg_venv/bin/python" -m pytest -q -rfEs -p no:cacheprovider .) || status=1
if [ $status -ne 0 ]; then
  echo "test.sh: FAILED (see above)" >&2
fi
exit $status
