#!/usr/bin/env bash
# The CUDA kernels' part of the GPU-machine check (issue #11): configure and build only what
# it needs into BUILD_DIR, then run
#   cuda_kernels_test                 -> $OUT/cuda_kernels_test.txt (gtest output)
#   cuda_kernels_test under compute-sanitizer memcheck, small lengths (when installed)
#                                     -> $OUT/cuda_kernels_memcheck.txt
#   cuda_kernels_bench up to 1 GiB    -> $OUT/cuda_kernels_bench.txt and .json
# plus configure/build logs and `ldd librailshard.so` (must show no libcudart/libcuda).
# Every step is bounded with `timeout`; a failed step is reported and the others still run.
#
#   bash scripts/gpu_check_kernels.sh BUILD_DIR
#
# OUT defaults to BUILD_DIR/gpu_check. JOBS (default: cores, at most 16) sets build
# parallelism; CUDA_ARCHS overrides RAILSHARD_CUDA_ARCHITECTURES (default: the shipped set).
# Exit status: 0 when every step passed, 1 otherwise (the summary at the end names them).
set -uo pipefail

if [[ $# -ne 1 ]]; then
  echo "usage: bash scripts/gpu_check_kernels.sh BUILD_DIR" >&2
  exit 2
fi
root=$(cd "$(dirname "$0")/.." && pwd)
build=$(mkdir -p "$1" && cd "$1" && pwd)
out=${OUT:-$build/gpu_check}
mkdir -p "$out"
cores=$(nproc)
jobs=${JOBS:-$((cores < 16 ? cores : 16))}
export PATH="$PATH:/usr/local/cuda/bin"

failed=()
# step NAME LOG TIMEOUT_S COMMAND...: runs COMMAND with its output in LOG, records the result.
step() {
  local name=$1 log=$2 limit=$3
  shift 3
  local start=$SECONDS
  echo "== $name (limit ${limit}s) -> $log"
  timeout --kill-after=10 "$limit" "$@" >"$log" 2>&1
  local rc=$?
  echo "== $name: rc=$rc in $((SECONDS - start))s"
  if [[ $rc -ne 0 ]]; then
    failed+=("$name (rc=$rc)")
    tail -n 30 "$log"
  fi
  return $rc
}

nvidia-smi >"$out/nvidia_smi.txt" 2>&1 || true

archs=()
if [[ -n "${CUDA_ARCHS:-}" ]]; then
  archs=("-DRAILSHARD_CUDA_ARCHITECTURES=$CUDA_ARCHS")
fi
step configure "$out/cuda_configure.txt" 300 \
  cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DRAILSHARD_WITH_CUDA=ON \
  -DRAILSHARD_WITH_TORCH=OFF -DRAILSHARD_BUILD_TESTS=ON -DRAILSHARD_BUILD_BENCHMARKS=ON \
  "${archs[@]}" || { echo "configure failed"; exit 1; }

step build "$out/cuda_build.txt" 900 \
  cmake --build "$build" -j "$jobs" --target railshard cuda_kernels_test cuda_kernels_bench ||
  { echo "build failed"; exit 1; }

# The static runtime: librailshard.so must not need libcudart.so or libcuda.so.
lib="$build/librailshard.so"
{
  echo "# ldd $lib"
  ldd "$lib"
  echo "# exported cuda* symbols (expected: none)"
  nm -D --defined-only "$lib" | grep -c ' cuda' || true
  echo "# size"
  ls -l "$lib"
} >"$out/cuda_ldd.txt" 2>&1
if grep -Eq 'libcudart|libcuda\.so' "$out/cuda_ldd.txt"; then
  failed+=("ldd: librailshard.so depends on libcudart/libcuda")
fi

test_bin="$build/tests/cuda_kernels_test"
step cuda_kernels_test "$out/cuda_kernels_test.txt" 600 \
  "$test_bin" --gtest_color=no --gtest_output="xml:$out/cuda_kernels_test.xml"
if grep -q "SKIPPED" "$out/cuda_kernels_test.txt" && grep -q "no usable CUDA device" \
  "$out/cuda_kernels_test.txt"; then
  failed+=("cuda_kernels_test: device tests skipped (no usable device)")
fi

sanitizer=$(command -v compute-sanitizer || true)
if [[ -n "$sanitizer" ]]; then
  step memcheck "$out/cuda_kernels_memcheck.txt" 420 \
    env RAILSHARD_TEST_CUDA_MAX_COUNT=255 "$sanitizer" --tool memcheck --error-exitcode 99 \
    "$test_bin" --gtest_color=no --gtest_filter='CudaDevice.*'
else
  echo "compute-sanitizer not found; memcheck skipped" >"$out/cuda_kernels_memcheck.txt"
fi

step cuda_kernels_bench "$out/cuda_kernels_bench.txt" 600 \
  "$build/kernels/cuda_kernels_bench" --max-bytes 1G --require-device \
  --json "$out/cuda_kernels_bench.json"
cat "$out/cuda_kernels_bench.txt"

echo
if [[ ${#failed[@]} -eq 0 ]]; then
  echo "gpu_check_kernels: all steps passed (results in $out)"
  exit 0
fi
echo "gpu_check_kernels: FAILED: ${failed[*]} (results in $out)"
exit 1
