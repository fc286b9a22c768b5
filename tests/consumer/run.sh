#!/usr/bin/env bash
# Installs the build into a scratch prefix, builds tests/consumer against it with
# find_package(railshard), and runs it as 2 ranks under the installed railshard-launch.
set -euo pipefail
build_dir=$1
source_dir=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cmake --install "$build_dir" --prefix "$work/prefix" >/dev/null
cmake -S "$source_dir" -B "$work/build" -DCMAKE_PREFIX_PATH="$work/prefix" >/dev/null
cmake --build "$work/build" >/dev/null
export LD_LIBRARY_PATH="$work/prefix/lib:${LD_LIBRARY_PATH:-}"
out=$("$work/prefix/bin/railshard-launch" -n 2 "$work/build/consumer")
echo "$out"
grep -q "consumer rank 0 of 2 ok" <<<"$out"
grep -q "consumer rank 1 of 2 ok" <<<"$out"
