#!/usr/bin/env bash
# A Debian 12 qemu guest with a real kernel verbs stack (Soft-RoCE, rdma_rxe), for running
# railshard's RDMA transport against a real libibverbs provider. This machine's kernel has no
# InfiniBand support; Debian's own 6.1 kernel ships rdma_rxe. The guest runs under qemu's CPU
# emulation (TCG): /dev/kvm here is a software hypervisor that cannot boot Debian's kernel
# (docs/rdma.md). Host-built binaries run in it unchanged (same Debian release).
#
#   guest.sh build                 build the image unless it is there (debootstrap from
#                                  Debian's packages only; ~2-3 minutes, ~700 MB)
#   guest.sh check                 exit 0 when qemu and the image are there, else say why (1)
#   guest.sh run [-t SECONDS] [-s DIR]... [--] CMD [ARGS...]
#                                  boot the guest, run CMD under bash in the current directory
#                                  (shared with the guest at the same path, as is every -s
#                                  DIR), print its output and exit with its status; 124 when
#                                  it runs past SECONDS (default 600), 125 when the guest
#                                  broke before finishing it (the console log is printed),
#                                  77 when there is no guest here (no qemu or no image)
#
# The image lives outside the checkout, in RAILSHARD_GUEST_DIR (default
# /var/cache/railshard/rdma-guest), built once and reused; a build is locked so two callers
# never build it twice. Every run boots a copy-on-write view of it (qemu snapshot=on): runs
# neither change the image nor see each other. Needs root (debootstrap), debootstrap and
# qemu-system-x86 (scripts/install_deps.sh installs them) and network access to Debian's
# mirror for the one build.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
dir=${RAILSHARD_GUEST_DIR:-/var/cache/railshard/rdma-guest}
mirror=${RAILSHARD_GUEST_MIRROR:-http://deb.debian.org/debian}
# What the guest needs: the kernel and its modules, the verbs stack and its tools (perftest
# is the link limit), and the shared libraries railshard's binaries link against.
packages=linux-image-amd64,kmod,busybox-static,iproute2,procps,util-linux,psmisc,
packages+=rdma-core,ibverbs-utils,ibverbs-providers,rdmacm-utils,perftest,
packages+=libstdc++6,libopenmpi3,libgloo0,libspdlog1.10,libfmt9,libhwloc15,libhiredis0.14,
packages+=libnl-route-3-200,libevent-core-2.1-7,libevent-pthreads-2.1-7,libudev1,
packages+=libprometheus-cpp-core1.0,libprometheus-cpp-pull1.0,libcivetweb1,zlib1g

usage() { sed -n '2,20p' "$0" >&2; exit 2; }

# The image's recipe: a changed package list or boot script makes an older image stale.
version() {
  { echo "$packages"; cat "$here/guest_stub.sh" "$here/guest_initrd_init.sh"; } | sha256sum | cut -c1-12
}

fresh() { [ -f "$dir/ready" ] && [ "$(cut -d' ' -f1 "$dir/ready")" = "$(version)" ]; }

why_not() {  # prints why the guest cannot run here, nothing when it can
  command -v qemu-system-x86_64 >/dev/null || { echo "qemu-system-x86_64 is not installed"; return; }
  [ -f "$dir/ready" ] || { echo "no guest image in $dir (run: $0 build)"; return; }
  fresh || echo "the guest image in $dir is from an older recipe (run: $0 build)"
}

build() {
  fresh && return 0
  [ "$(id -u)" = 0 ] || { echo "guest.sh: building the image needs root (debootstrap)" >&2; exit 1; }
  command -v debootstrap >/dev/null || { echo "guest.sh: debootstrap is not installed" >&2; exit 1; }
  mkdir -p "$dir"
  exec 9>"$dir/.lock"
  flock 9
  fresh && return 0
  rm -f "$dir/ready"
  local t0 root
  t0=$(date +%s)
  root="$dir/root.tmp"
  rm -rf "$dir/initrd.d"
  # A tree debootstrap finished (an earlier build that failed after it) is used again.
  if [ ! -f "$root/.railshard-bootstrapped" ]; then
    rm -rf "$root"
    echo "guest.sh: building the guest image in $dir (debootstrap bookworm from $mirror)" >&2
    debootstrap --variant=minbase --include="$packages" bookworm "$root" "$mirror" >"$dir/build.log" 2>&1 ||
      { tail -20 "$dir/build.log" >&2; echo "guest.sh: debootstrap failed (log: $dir/build.log)" >&2; exit 1; }
    touch "$root/.railshard-bootstrapped"
  fi
  local kver
  kver=$(basename "$(ls -d "$root"/lib/modules/* | sort -V | tail -1)")
  cp "$root/boot/vmlinuz-$kver" "$dir/vmlinuz"
  install -m 755 "$here/guest_stub.sh" "$root/sbin/railshard-guest-init"
  echo "railshard-guest" >"$root/etc/hostname"
  # A small initrd of our own (busybox + the modules the root disk needs): Debian's
  # initramfs takes far longer to unpack and probe under emulation.
  local initrd="$dir/initrd.d"
  mkdir -p "$initrd/bin" "$initrd/lib/modules"
  cp "$root/bin/busybox" "$initrd/bin/busybox"
  # The guest's own modprobe resolves the dependencies (in load order; shared ones once).
  : >"$initrd/lib/modules/order"
  for m in virtio_pci virtio_blk ext4; do
    chroot "$root" modprobe -S "$kver" --show-depends "$m"
  done | awk '$1 == "insmod" && !seen[$2]++ {print $2}' | while read -r ko; do
    cp "$root$ko" "$initrd/lib/modules/"
    basename "$ko" >>"$initrd/lib/modules/order"
  done
  install -m 755 "$here/guest_initrd_init.sh" "$initrd/init"
  (cd "$initrd" && find . | cpio -o -H newc --quiet) >"$dir/initrd"
  # The root disk: an ext4 image made from the tree (no loop mount needed).
  rm -f "$dir/root.img"
  mke2fs -q -t ext4 -L railshard-guest -d "$root" "$dir/root.img" 3G
  rm -rf "$root" "$initrd"
  echo "$(version) debootstrap bookworm, kernel $kver, built $(date -u +%FT%TZ) in $(($(date +%s) - t0)) s" >"$dir/ready"
  cat "$dir/ready" >&2
}

run() {
  local timeout=600 shares=()
  while [ $# -gt 0 ]; do
    case $1 in
      -t) timeout=$2; shift 2 ;;
      -s) shares+=("$(cd "$2" && pwd)"); shift 2 ;;
      --) shift; break ;;
      *) break ;;
    esac
  done
  [ $# -ge 1 ] || usage
  local why
  why=$(why_not)
  [ -z "$why" ] || { echo "guest.sh: cannot run the guest: $why" >&2; exit 77; }
  job=""
  job=$(mktemp -d /tmp/railshard-guest.XXXXXX)
  trap 'rm -rf "${job:-}"' EXIT
  shares=("$PWD" "${shares[@]}")
  local args=() i=0
  : >"$job/mounts"
  for s in "${shares[@]}"; do
    args+=(-virtfs "local,path=$s,mount_tag=s$i,security_model=none")
    echo "s$i $s" >>"$job/mounts"
    i=$((i + 1))
  done
  cp "$here/guest_init.sh" "$job/init.sh"
  printf '%q ' "$@" >"$job/cmd"
  echo "$PWD" >"$job/cwd"
  # The variables a caller passes on (RAILSHARD_*, GTEST_*), quoted for the guest's shell.
  { env | grep -E '^(RAILSHARD|GTEST)_[A-Za-z0-9_]*=' || true; } | while IFS='=' read -r k v; do
    printf 'export %s=%q\n' "$k" "$v"
  done >"$job/env"
  local cpus
  cpus=$(nproc)
  # TCG with a thread per virtual CPU; the guest never sees KVM (it cannot boot here).
  timeout --kill-after=10 "$((timeout + 60))" qemu-system-x86_64 \
    -accel tcg,thread=multi -cpu max -smp "$cpus" -m "${RAILSHARD_GUEST_MEMORY:-3G}" \
    -nographic -no-reboot -serial "file:$job/console.log" -monitor none \
    -kernel "$dir/vmlinuz" -initrd "$dir/initrd" \
    -append "console=ttyS0 quiet panic=-1 railshard.timeout=$timeout" \
    -drive "file=$dir/root.img,if=virtio,format=raw,snapshot=on" \
    -virtfs "local,path=$job,mount_tag=job,security_model=none" "${args[@]}" \
    -nic none </dev/null >"$job/qemu.log" 2>&1 || true
  [ -f "$job/out" ] && cat "$job/out"
  if [ ! -f "$job/rc" ]; then
    echo "guest.sh: the guest did not finish the command (no exit status); console:" >&2
    tail -40 "$job/console.log" >&2 || true
    cat "$job/qemu.log" >&2 || true
    exit 125
  fi
  exit "$(cat "$job/rc")"
}

[ $# -ge 1 ] || usage
case $1 in
  build) build ;;
  check)
    why=$(why_not)
    [ -z "$why" ] || { echo "$why"; exit 1; }
    cat "$dir/ready"
    ;;
  run) shift; run "$@" ;;
  *) usage ;;
esac
