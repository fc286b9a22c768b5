#!/usr/bin/env bash
# In the guest, after rxe_hosts.sh up: the link limit and railshard's all-reduce side by side
# on rail 0 between hosts 0 and 1 (one rank per host):
#   - perftest ib_write_bw at the all-reduce's piece size (the link limit, RDMA WRITE);
#   - allreduce_perf over RDMA (RAILSHARD_TRANSPORT=ibverbs, rail 0 only), large messages
#     copied through the ring slots (RAILSHARD_IB_RENDEZVOUS=0), read in place by the
#     zero-copy rendezvous (RAILSHARD_IB_RENDEZVOUS=512K RAILSHARD_IB_RENDEZVOUS_VERB=read)
#     and written in place (..._VERB=write), with the CPU time rank 0's process used;
#   - allreduce_perf over TCP between the same hosts (their eth0 veths, unshaped like the rails').
# Absolute figures mean nothing under emulation (rxe is CPU-bound in an emulated CPU); the
# ratio busbw / ib_write_bw says what the transport costs. Repeats RUNS times (default 3),
# alternating, and prints every run.
#
#   perf.sh BUILD_DIR [SIZE]      SIZE: the all-reduce's size (default 8M)
set -uo pipefail
build=$(cd "${1:?usage: perf.sh BUILD_DIR [SIZE]}" && pwd)
size=${2:-8M}
runs=${RUNS:-3}
here=$(cd "$(dirname "$0")" && pwd)
hosts="$here/rxe_hosts.sh"
perf="$build/benchmarks/allreduce_perf"
export RAILSHARD_CONNECT_TIMEOUT=60

tx() { cat "/sys/class/net/$1/statistics/tx_bytes"; }

link_limit() {  # link_limit [-b]: ib_write_bw h0r0 -> h1r0 in Gbit/s, 256 KiB messages (the
  # transport's slot size); perftest's own handshake goes over the hosts' eth0, the data over
  # rxe (GID index 1). -b: both directions at once, the figure per direction (perftest prints
  # the sum) -- an all-reduce sends and receives at once.
  "$hosts" run 1 timeout 60 ib_write_bw -d h1r0 -x 1 -s 262144 -n 400 -F --report_gbits "$@" \
    >/tmp/ib_write_bw.server 2>&1 &
  sleep 1
  "$hosts" run 0 timeout 60 ib_write_bw -d h0r0 -x 1 -s 262144 -n 400 -F --report_gbits "$@" \
    10.220.0.2 2>&1 | awk -v both="$#" '$1 == 262144 {print both ? $4 / 2 : $4}'
  wait
}

allreduce() {  # allreduce TRANSPORT: "busbw cpu": mean busbw in GB/s (in and out of place) and
  # the CPU seconds rank 0's process used (user + system), from its waiting shell's children
  local out=/tmp/perf_allreduce_$1.log busbw cpu
  RAILSHARD_TRANSPORT=$1 RXE_RAILS=1 RXE_TIMEOUT=300 "$hosts" job 1,1 bash -c \
    '"$@"; rc=$?; awk "{print \"cpu_ticks\", \$16 + \$17}" /proc/$$/stat; exit $rc' _ \
    "$perf" -b "$size" -e "$size" -n 5 -w 1 -c 1 >"$out" 2>&1
  busbw=$(awk '/Avg bus bandwidth/ {print $NF}' "$out" | head -1)
  cpu=$(awk -v hz="$(getconf CLK_TCK)" '$1 == "cpu_ticks" {print $2 / hz; exit}' "$out")
  if [ -z "$busbw" ]; then
    echo "perf.sh: allreduce_perf over $1 gave no figure:" >&2
    tail -5 "$out" >&2
  fi
  echo "${busbw:-0} ${cpu:-0}"
}

for run in $(seq "$runs"); do
  limit=$(link_limit)
  duplex=$(link_limit -b)
  before=$(tx h0r0)
  read -r staged staged_cpu < <(RAILSHARD_IB_RENDEZVOUS=0 allreduce ibverbs)
  staged_bytes=$(($(tx h0r0) - before))
  read -r rdv rdv_cpu < <(RAILSHARD_IB_RENDEZVOUS=512K RAILSHARD_IB_RENDEZVOUS_VERB=read \
    allreduce ibverbs)
  read -r wrv wrv_cpu < <(RAILSHARD_IB_RENDEZVOUS=512K RAILSHARD_IB_RENDEZVOUS_VERB=write \
    allreduce ibverbs)
  before=$(tx t0p)
  read -r tcp tcp_cpu < <(allreduce tcp)
  tcp_bytes=$(($(tx t0p) - before))
  echo "perf run $run: ib_write_bw ${limit} Gbit/s (both ways at once: $duplex each); allreduce $size busbw:" \
    "rdma staged ${staged} GB/s (${staged_cpu} s CPU; h0r0 sent $staged_bytes B), rdma read rendezvous ${rdv} GB/s" \
    "(${rdv_cpu} s CPU), rdma write rendezvous ${wrv} GB/s (${wrv_cpu} s CPU)," \
    "tcp ${tcp} GB/s (${tcp_cpu} s CPU; host 0's TCP veth carried $tcp_bytes B)"
  awk -v l="$limit" -v d="$duplex" -v s="$staged" -v r="$rdv" -v w="$wrv" -v t="$tcp" 'BEGIN {
    if (l > 0 && d > 0) printf "perf run: busbw / ib_write_bw: rdma staged %.2f (/ both ways: %.2f), read rendezvous %.2f, write rendezvous %.2f, tcp %.2f\n",
      s * 8 / l, s * 8 / d, r * 8 / l, w * 8 / l, t * 8 / l }'
done
