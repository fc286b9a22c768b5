#!/usr/bin/env bash
# Installs the Debian 12 packages railshard's build, tests and benchmarks need. Idempotent and
# quiet when everything is already there. Needs root (or sudo).
set -euo pipefail

packages=(
  build-essential cmake pkg-config
  libspdlog-dev libfmt-dev prometheus-cpp-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  openmpi-bin libopenmpi-dev
  libhwloc-dev nlohmann-json3-dev libcli11-dev
  libgloo-dev python3-matplotlib
  libibverbs-dev librdmacm-dev
  iproute2 graphviz iperf3
  openssl  # the README's job token: export RAILSHARD_TOKEN=$(openssl rand -hex 16)
  clang libclang-rt-14-dev llvm-14  # fuzz/ (libFuzzer) and sanitizer symbolization
  # python/ (the torch.distributed backend) and its pytest suites under Debian's torch 1.13;
  # python3-venv: scripts/torch_venv.sh makes the torch 2.x venv
  python3-torch libtorch-dev pybind11-dev python3-dev python3-pytest python3-venv
  chromium  # railshard-report --html is rendered headless in a test (ReportRender)
  prometheus  # a real Prometheus server scrapes a job in tests/python/test_prometheus.py
  # benchmarks/testbed/rdma/: a Debian guest with Soft-RoCE under qemu (the RDMA suite)
  debootstrap debian-archive-keyring qemu-system-x86 cpio e2fsprogs
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
[ ${#missing[@]} -eq 0 ] && exit 0

sudo=""
if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
echo "install_deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
