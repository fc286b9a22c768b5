#!/usr/bin/env bash
# Builds the libFuzzer targets of fuzz/ with clang into ./build-fuzz and runs each on its seed
# corpus (fuzz/corpus/<target>) for RAILSHARD_FUZZ_SECONDS seconds (default 60). A crash, a
# sanitizer report, a leak or a timeout fails the run; the input that caused it is left in
# build-fuzz/artifacts/ (add it to fuzz/corpus/<target>/ once fixed: the corpus is replayed by
# tests/fuzz_regression_test.cc).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build="$root/build-fuzz"
seconds=${RAILSHARD_FUZZ_SECONDS:-60}
"$root/scripts/install_deps.sh"
cmake -S "$root" -B "$build" -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo -DRAILSHARD_FUZZ=ON -DRAILSHARD_BUILD_TESTS=OFF \
  -DRAILSHARD_BUILD_BENCHMARKS=OFF -DRAILSHARD_WITH_TORCH=OFF -DRAILSHARD_WITH_CUDA=OFF \
  -DRAILSHARD_WITH_NCCL=OFF >/dev/null
cmake --build "$build" -j "$(nproc)" --target railshard_fuzzers

mkdir -p "$build/artifacts"
failed=()
for target in store_protocol_fuzz frame_fuzz store_server_fuzz message_book_fuzz; do
  # New inputs go to a scratch directory, never into the checked-in seeds.
  work=$(mktemp -d)
  log="$build/artifacts/$target.log"
  echo "ci_fuzz: $target for ${seconds} s"
  if "$build/fuzz/$target" -max_total_time="$seconds" -timeout=30 -rss_limit_mb=4096 \
    -print_final_stats=1 -artifact_prefix="$build/artifacts/$target-" \
    "$work" "$root/fuzz/corpus/$target" >"$log" 2>&1; then
    { grep -E "^#[0-9]+[[:space:]]+DONE" "$log" || true; } | tail -1 | sed "s/^/ci_fuzz: $target: /"
  else
    echo "ci_fuzz: $target FAILED; last lines of $log:"
    tail -40 "$log"
    failed+=("$target")
  fi
  rm -rf "$work"
done
if [ ${#failed[@]} -ne 0 ]; then
  echo "ci_fuzz: failed: ${failed[*]}"
  exit 1
fi
