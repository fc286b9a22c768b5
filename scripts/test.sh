#!/usr/bin/env bash
# Installs dependencies, builds, and runs the whole test suite (ctest).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/install_deps.sh"
"$root/scripts/build.sh"
cd "$root/build"
ctest --output-on-failure -j 2 --timeout 600
