#!/usr/bin/env bash
# Packs what scripts/gpu_check.sh --bundle runs on a GPU machine that cannot build railshard
# (no spdlog, fmt, hwloc... there): the CUDA-enabled librailshard.so, the GPU tests and
# benchmarks, railshard-launch, the load probe, and every shared library they need that is
# not the C/C++ runtime. Built here, carried there (same x86-64).
#
#   scripts/gpu_bundle.sh BUILD_DIR DEST_DIR
set -euo pipefail
build=$(cd "$1" && pwd)
dest=$2
rm -rf "$dest"
mkdir -p "$dest/bin" "$dest/lib"
bins=(tests/cuda_kernels_test tests/device_staging_test tests/communicator_device_test
      tests/load_probe kernels/cuda_kernels_bench benchmarks/allreduce_perf
      launcher/tools/railshard-launch launcher/tools/railshard-topo)
for b in "${bins[@]}"; do
  [ -x "$build/$b" ] || { echo "gpu_bundle: $build/$b is not built" >&2; exit 1; }
  cp "$build/$b" "$dest/bin/"
done
cp -P "$build"/librailshard.so* "$dest/lib/"
# The libraries they load, but the C runtime, the C++ runtime and the dynamic loader.
for b in "${bins[@]}"; do ldd "$build/$b"; done | awk '$3 ~ /^\// {print $3}' | sort -u |
  grep -Ev '/(libc|libm|libpthread|libdl|librt|libstdc\+\+|libgcc_s|ld-linux[^/]*)\.so' |
  grep -v librailshard | while read -r lib; do cp -L "$lib" "$dest/lib/"; done
du -sh "$dest"
