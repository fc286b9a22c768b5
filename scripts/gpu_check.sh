#!/usr/bin/env bash
# The GPU checks of docs/gpu.md, as one script for a machine with an NVIDIA GPU (the CI
# machines have none): build with CUDA, then
#   1. the CUDA kernels against the CPU kernels, every dtype x op, odd lengths and offsets;
#   2. kernel bandwidth against a device-to-device copy (scripts/gpu_check_kernels.sh);
#   3. a 2-process all-reduce of device buffers on one GPU through the pinned-host staging
#      path (allreduce_perf --device cuda under railshard-launch), next to host buffers, and
#      NCCL itself in the same harness when there are two GPUs (NCCL refuses two ranks on one);
#   4. the PyTorch backend with CUDA tensors (tests/python/test_cuda.py) when a python3 with a
#      CUDA torch is found (RAILSHARD_PYTHON picks it).
#   5. the load signals a rank reports on a GPU (NVML utilisation, memory, power, energy)
#      while the GPU computes (tests/programs/load_probe).
#   6. where the machine also has an RDMA device: what the transport sees (railshard-topo
#      --rdma), the peer-memory module, and 2 ranks forced over RDMA (RAILSHARD_TRANSPORT=
#      ibverbs; on one host the traffic loops through the HCA) with host and with device
#      buffers -- GPUDirect where nvidia_peermem or dmabuf allows, else staged, as the log says
#      (docs/rdma.md). Skipped, saying so, without /sys/class/infiniband devices.
#   7. NCCL's own all-reduce through the NCCL plugin (libnccl-net-railshard.so): two
#      processes on one GPU made to look like two hosts (NCCL_HOSTID differs per rank), so
#      NCCL must use the network -- railshard's plugin over the loopback, then NCCL's own
#      socket transport over the same loopback, both checked (docs/nccl-plugin.md).
# Usage: scripts/gpu_check.sh [BUILD_DIR] ; results go to $OUT (default ./gpu-check-out).
#        scripts/gpu_check.sh --bundle DIR: run what scripts/gpu_bundle.sh packed (built
#        elsewhere, for a GPU machine that cannot build railshard) instead of building.
# Every step is bounded by `timeout`; a failing step is reported and the others still run.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=${OUT:-$root/gpu-check-out}
mkdir -p "$out"
status=0
bundle=""
if [ "${1:-}" = "--bundle" ]; then
  bundle=$(cd "$2" && pwd)
fi
build=${1:-$root/build-gpu}
step() {
  local name=$1 limit=$2
  shift 2
  echo "gpu_check: === $name ==="
  local t0=$SECONDS rc=0
  timeout "$limit" "$@" >"$out/$name.txt" 2>&1 || rc=$?
  echo "gpu_check: $name: exit $rc in $((SECONDS - t0)) s" | tee -a "$out/summary.txt"
  tail -n 40 "$out/$name.txt"
  [ $rc -eq 0 ] || status=1
}

nvidia-smi >"$out/nvidia-smi.txt" 2>&1 || true

# The load signals while the GPU computes (a PyTorch matrix-product loop), then idle.
loadCheck() {
  local probe=$1
  "${RAILSHARD_PYTHON:-python3}" -c 'import torch, time
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
end = time.time() + 12
while time.time() < end:
    a = (a @ a).clamp_(-1, 1)
torch.cuda.synchronize()' &
  local burner=$!
  sleep 3
  "$probe" 0 8 1000
  wait $burner
  echo "# idle"
  "$probe" 0 3 1000
}

# RDMA beside the GPU (step 6): rdmaCheck LAUNCH TOPO PERF...
rdmaCheck() {
  local launch=$1 topo=$2
  shift 2
  if ! ls /sys/class/infiniband/*/ports/*/state >/dev/null 2>&1; then
    echo "gpu_check: rdma: skipped: no RDMA device (/sys/class/infiniband has none)" |
      tee -a "$out/summary.txt"
    return
  fi
  step rdma_topo 60 "$topo" --rdma
  step rdma_peer_memory 10 sh -c 'lsmod | grep -e nvidia_peermem -e nv_peer_mem ||
    echo "no peer-memory module: dmabuf registration (kernel >= 5.12, driver >= 515) or staged"'
  step allreduce_rdma_host_2ranks 300 env RAILSHARD_TRANSPORT=ibverbs RAILSHARD_LOG_LEVEL=info \
    "$launch" -n 2 -- "$@" --device host
  step allreduce_rdma_device_2ranks 300 env RAILSHARD_TRANSPORT=ibverbs RAILSHARD_LOG_LEVEL=info \
    "$launch" -n 2 -- "$@" --device cuda -J "$out/allreduce_rdma_device_2ranks.json"
}

if [ -n "$bundle" ]; then
  export LD_LIBRARY_PATH="$bundle/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  b=$bundle/bin
  step load_signals 60 bash -c "$(declare -f loadCheck); loadCheck $b/load_probe"
  step cuda_kernels_test 300 "$b/cuda_kernels_test" --gtest_color=no
  step staging_test 300 "$b/device_staging_test" --gtest_color=no
  step communicator_device_test 300 "$b/communicator_device_test" --gtest_color=no
  step cuda_kernels_bench 300 "$b/cuda_kernels_bench" --max-bytes 1G --require-device \
    --json "$out/cuda_kernels_bench.json"
  perf=("$b/allreduce_perf" -b 1M -e 256M -f 4 -n 20 -w 5 -c 1)
  step allreduce_device_2ranks 300 "$b/railshard-launch" -n 2 -- "${perf[@]}" --device cuda \
    -J "$out/allreduce_device_2ranks.json"
  step allreduce_host_2ranks 300 "$b/railshard-launch" -n 2 -- "${perf[@]}" --device host
  rdmaCheck "$b/railshard-launch" "$b/railshard-topo" "${perf[@]}"
  cat "$out/summary.txt"
  exit $status
fi
python=${RAILSHARD_PYTHON:-python3}
torch_opts=(-DRAILSHARD_WITH_TORCH=OFF)
if "$python" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
  torch_opts=(-DRAILSHARD_WITH_TORCH=ON -DRAILSHARD_PYTHON="$(command -v "$python")")
fi
step configure 300 cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release \
  -DRAILSHARD_WITH_CUDA=ON "${torch_opts[@]}"
targets=(railshard railshard-launch railshard-topo allreduce_perf cuda_kernels_test
  cuda_kernels_bench device_staging_test nccl_net_railshard)
[ "${torch_opts[0]}" = "-DRAILSHARD_WITH_TORCH=ON" ] && targets+=(railshard_torch)
step build 900 cmake --build "$build" -j "$(nproc)" --target "${targets[@]}"

step kernels 600 bash "$root/scripts/gpu_check_kernels.sh" "$build"
step staging_test 300 "$build/tests/device_staging_test"

perf=("$build/benchmarks/allreduce_perf" -b 1M -e 256M -f 4 -n 20 -w 5 -c 1)
launch="$build/launcher/tools/railshard-launch"
step allreduce_device_2ranks 300 "$launch" -n 2 -- "${perf[@]}" --device cuda \
  -J "$out/allreduce_device_2ranks.json"
step allreduce_device_2ranks_bf16 300 "$launch" -n 2 -- "${perf[@]}" --device cuda -d bfloat16
step allreduce_host_2ranks 300 "$launch" -n 2 -- "${perf[@]}" --device host
gpus=$(nvidia-smi -L 2>/dev/null | wc -l)
if [ "$gpus" -ge 2 ]; then
  step allreduce_nccl_2ranks 300 "$launch" -n 2 -- "${perf[@]}" --backend nccl
  step allreduce_hierarchical_2ranks 300 env RAILSHARD_NCCL=auto "$launch" -n 2 -- \
    "${perf[@]}" --device cuda
fi

rdmaCheck "$launch" "$build/launcher/tools/railshard-topo" "${perf[@]}"

# 7. Each rank its own NCCL host id: NCCL then sees two hosts and goes through NCCL_NET.
for net in railshard Socket; do
  step "nccl_net_${net}_2hosts_on_1gpu" 300 env \
    LD_LIBRARY_PATH="$build/plugins/nccl${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
    NCCL_NET_PLUGIN=railshard NCCL_NET="$net" NCCL_SOCKET_IFNAME=lo RAILSHARD_NCCL_RAILS==lo \
    NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET "$launch" -n 2 -- \
    bash -c 'NCCL_HOSTID="gpu-check-host-$RAILSHARD_RANK" exec "$@"' rank "${perf[@]}" \
    --backend nccl -J "$out/nccl_net_${net}.json"
done

if [ "${torch_opts[0]}" = "-DRAILSHARD_WITH_TORCH=ON" ]; then
  step torch_cuda 600 env RAILSHARD_BUILD_PYTHON="$build/python" RAILSHARD_REQUIRE_MODULE=1 \
    RAILSHARD_LAUNCH="$launch" PYTHONDONTWRITEBYTECODE=1 \
    "$python" -m pytest -q -rfEs -p no:cacheprovider "$root/tests/python/test_cuda.py"
else
  echo "gpu_check: torch_cuda: skipped: no $python with a CUDA torch" | tee -a "$out/summary.txt"
fi
cat "$out/summary.txt"
exit $status
