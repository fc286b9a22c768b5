#!/bin/bash
# PID 1 of the guest (run by the image's guest_stub.sh, which has mounted /proc, /sys and
# the job folder /job): mount what a program expects, the host's shared folders at their host
# paths, load Soft-RoCE, run the job's command and power off. Its exit status goes to
# /job/rc, its output to /job/out.
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
mkdir -p /dev/pts /dev/shm
ln -sf /proc/self/fd /dev/fd
ln -sf /proc/self/fd/0 /dev/stdin
ln -sf /proc/self/fd/1 /dev/stdout
ln -sf /proc/self/fd/2 /dev/stderr
mount -t devpts devpts /dev/pts
mount -t tmpfs tmpfs /dev/shm
mount -t tmpfs tmpfs /tmp
mount -t tmpfs tmpfs /run
hostname railshard-guest
ip link set lo up
while read -r tag path; do
  mkdir -p "$path"
  mount -t 9p -o trans=virtio,version=9p2000.L,msize=1048576,cache=loose "$tag" "$path"
done </job/mounts
modprobe rdma_rxe
# Registered memory is pinned: the default 8 MiB lock limit is too small for the rings.
ulimit -l unlimited
timeout=$(sed -n 's/.*railshard\.timeout=\([0-9]*\).*/\1/p' /proc/cmdline)
(
  cd "$(cat /job/cwd)" || exit 125
  # shellcheck disable=SC1091
  . /job/env
  eval "exec timeout --kill-after=5 ${timeout:-600} $(cat /job/cmd)"
) >/job/out 2>&1
echo $? >/job/rc.tmp
mv /job/rc.tmp /job/rc
sync
echo o >/proc/sysrq-trigger
sleep 10
