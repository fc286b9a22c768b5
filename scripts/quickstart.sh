#!/usr/bin/env bash
# Installs dependencies, builds, and runs the main job: a 4-rank all-reduce sweep on this host.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/install_deps.sh"
"$root/scripts/build.sh"
exec "$root/build/launcher/tools/railshard-launch" -n 4 \
  "$root/build/benchmarks/allreduce_perf" -b 8 -e 64M -f 4
