#!/usr/bin/env bash
# Makes a fresh venv at DIR that uses the torch of the venv TORCH_VENV (through a .pth file: no
# second copy of torch's gigabytes) and pip-installs railshard into it: the WHEEL given, or
# else this checkout (`pip install .`, which builds it). Prints DIR (the only thing on stdout).
#
#   scripts/pip_venv.sh TORCH_VENV DIR [WHEEL]
# scripts/test.sh uses it for the torch 2.x pass; by hand it gives a throwaway environment in
# which to try the package as a user would.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
[ $# -ge 2 ] || { echo "usage: $0 TORCH_VENV DIR [WHEEL]" >&2; exit 2; }
torch_venv=$1 dir=$2 wheel=${3:-}
torch_site=$("$torch_venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
rm -rf "$dir"
"$torch_venv/bin/python" -m venv "$dir"
site=$("$dir/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
echo "$torch_site" > "$site/torch_from_$(basename "$torch_venv").pth"
# torch's console command as pip makes it in a venv that has torch itself: torchrun run by this
# venv's interpreter, which its workers then run too (they must import this venv's railshard).
cat >"$dir/bin/torchrun" <<EOF
#!$dir/bin/python
import sys
from torch.distributed.run import main
sys.exit(main())
EOF
chmod +x "$dir/bin/torchrun"
if [ -n "$wheel" ]; then
  "$dir/bin/python" -m pip install --quiet --no-index --no-deps "$wheel" >&2
else
  "$dir/bin/python" -m pip install --quiet "$root" >&2
fi
echo "$dir"
