#!/usr/bin/env bash
# Installs dependencies, builds, and runs the main job: three ranks that really compute at
# speeds 1:2:4 (railshard-launch --emulate-speeds: a CPU quota per rank) train a real model
# (examples/train.py: DDP, real forward and backward passes), first with equal shares of every
# global batch, then with ThroughputSampler's shares -- in one run -- and print step times,
# shares, eval loss and the speed-up, with a plot of shares and step times in
# build/quickstart.png.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/install_deps.sh"
"$root/scripts/build.sh"
launch="$root/build/launcher/tools/railshard-launch"
export PYTHONPATH="$root/build/python"
if ! "$launch" -n 1 --emulate-speeds 1 true 2>/dev/null; then
  # No writable cgroup cpu controller (not root, or a container without one): the same
  # comparison with speeds emulated by waiting, as a GPU's host would.
  echo "quickstart: no CPU quotas here (needs root and cgroup cpu); speeds emulated by sleeping" >&2
  exec "$launch" -n 3 "$root/build/benchmarks/dispatch_bench" --speeds 1,2,4
fi
# The interpreter whose torch the build's extension is for (CMake's RAILSHARD_PYTHON).
python=$(sed -n 's/^RAILSHARD_PYTHON:FILEPATH=//p' "$root/build/CMakeCache.txt")
exec "$launch" -n 3 --emulate-speeds 1,2,4 "${python:-/usr/bin/python3}" "$root/examples/train.py" \
  --compare equal,proportional --steps 30 --batch 1024 --sample-ms 0 \
  --plot "$root/build/quickstart.png"
