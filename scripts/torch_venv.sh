#!/usr/bin/env bash
# Makes sure a virtual environment with a current torch 2.x (from PyPI), numpy, pytest and
# PyTorch Lightning exists, and prints its path (the only thing written to stdout). The Python tests run against
# it as well as against Debian's torch 1.13 (scripts/test.sh).
#
# The venv lives outside the checkout, at ${RAILSHARD_TORCH_VENV:-/opt/railshard-torch-venv},
# and is reused across runs: it is (re)created only when missing or broken (no importable
# torch >= 2, numpy or pytest). The torch wheel is large (the default PyPI one pulls CUDA
# libraries, several GB); RAILSHARD_TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
# installs the much smaller CPU-only build instead. The venv is made by the python3 on PATH
# (RAILSHARD_VENV_PYTHON overrides it).
#
# --system-torch: instead, a venv over Debian's own packages (its torch 1.13, numpy, pytest)
# that adds only expecttest and hypothesis, at ${RAILSHARD_SUITE_VENV:-/opt/railshard-deb-venv}:
# PyPI's torch is not installed. PyTorch's distributed test base (tests/python/torch_suite.py)
# imports expecttest, which Debian does not package; this is how that base runs under 1.13.
#
# Needs network access the first time: when pip fails it says so and exits non-zero
# (scripts/test.sh then fails; RAILSHARD_SKIP_TORCH2=1 skips that pass on a machine without
# network).
set -euo pipefail

system_torch=0
[ "${1:-}" = "--system-torch" ] && system_torch=1
if [ $system_torch = 1 ]; then
  venv=${RAILSHARD_SUITE_VENV:-/opt/railshard-deb-venv}
  python=/usr/bin/python3
  venv_flags=(--system-site-packages)
  packages=(expecttest hypothesis)
  extras=(expecttest hypothesis)
  torch_check='int(torch.__version__.split(".")[0]) >= 1'
  wants="Debian's torch, numpy or pytest"
else
  venv=${RAILSHARD_TORCH_VENV:-/opt/railshard-torch-venv}
  python=${RAILSHARD_VENV_PYTHON:-python3}
  venv_flags=()
  packages=("torch>=2" numpy pytest expecttest hypothesis pytorch-lightning)
  # pytorch-lightning: tests/python/test_lightning.py trains with its DDPStrategy.
  extras=(expecttest hypothesis pytorch-lightning)
  torch_check='int(torch.__version__.split(".")[0]) >= 2'
  wants="torch >= 2, numpy or pytest"
fi

say() { echo "torch_venv: $*" >&2; }

usable() {
  [ -x "$venv/bin/python" ] && "$venv/bin/python" - >/dev/null 2>&1 <<EOF
import sys
import numpy, pytest, torch, torch.distributed as dist
sys.exit(0 if $torch_check and dist.is_available() else 1)
EOF
}

# PyTorch's own distributed test base (tests/python/torch_suite.py) needs expecttest and
# hypothesis beside torch, the torch 2.x venv also PyTorch Lightning: added to a venv that has
# torch but not them, without recreating it.
extras_ok() {
  local modules=expecttest,hypothesis
  [ $system_torch = 1 ] || modules+=,pytorch_lightning
  "$venv/bin/python" -c "import $modules" >/dev/null 2>&1
}
add_extras() {
  extras_ok || "$venv/bin/python" -m pip install --disable-pip-version-check --no-input \
    --quiet "${extras[@]}" >&2 || say "could not install ${extras[*]}"
}

if usable; then
  add_extras
  echo "$venv"
  exit 0
fi

# One creator at a time (two test runs sharing the cache).
mkdir -p "$(dirname "$venv")"
exec 9>"$venv.lock"
if command -v flock >/dev/null 2>&1; then
  flock 9
  if usable; then  # made by whoever held the lock
    echo "$venv"
    exit 0
  fi
fi

if [ -e "$venv" ] && [ ! -f "$venv/pyvenv.cfg" ] && [ -n "$(ls -A "$venv" 2>/dev/null)" ]; then
  say "$venv exists and is not a virtual environment; refusing to overwrite it" \
      "(set RAILSHARD_TORCH_VENV or RAILSHARD_SUITE_VENV to another path)"
  exit 1
fi

if [ -e "$venv" ]; then
  say "$venv is missing $wants: recreating it"
else
  say "creating $venv"
fi
if ! "$python" -m venv --clear "${venv_flags[@]}" "$venv" >&2; then
  say "'$python -m venv' failed (Debian's python3 needs the python3-venv package)"
  exit 1
fi

index=()
if [ -n "${RAILSHARD_TORCH_INDEX_URL:-}" ] && [ $system_torch = 0 ]; then
  index=(--index-url "$RAILSHARD_TORCH_INDEX_URL" --extra-index-url https://pypi.org/simple)
fi
say "installing ${packages[*]} with pip$([ $system_torch = 1 ] || echo " (a large download the first time)")"
if ! "$venv/bin/python" -m pip install --disable-pip-version-check --no-input --quiet \
       "${index[@]}" "${packages[@]}" >&2; then
  say "pip install failed -- no network access to the package index?"
  if [ $system_torch = 0 ]; then
    say "the torch 2.x test pass needs it once (the venv is cached afterwards); set"
    say "RAILSHARD_SKIP_TORCH2=1 to skip that pass on this machine"
  fi
  exit 1
fi
if ! usable || ! extras_ok; then
  say "$venv was created but lacks $wants or one of ${extras[*]}"
  exit 1
fi
say "ready: $("$venv/bin/python" -c 'import torch; print("torch", torch.__version__)')"
echo "$venv"
