#!/usr/bin/env bash
# Installs dependencies, builds, and runs the main job: three ranks of speeds 1:2:4 share each
# training step's batch, proportionally and then equally, in one run (benchmarks/dispatch_bench).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/install_deps.sh"
"$root/scripts/build.sh"
exec "$root/build/launcher/tools/railshard-launch" -n 3 \
  "$root/build/benchmarks/dispatch_bench" --speeds 1,2,4
