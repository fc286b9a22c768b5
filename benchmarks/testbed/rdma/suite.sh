#!/usr/bin/env bash
# The RDMA suite over Soft-RoCE, run inside the guest (guest.sh run -- suite.sh BUILD_DIR):
# three emulated hosts joined by two rxe rails (rxe_hosts.sh), then
#   1. tests/rdma_rxe_test: every collective x dtype over real verbs, 2 and 3 hosts, 1 and 2
#      rails, RDMA and TCP striped together, a rail taken down mid all-reduce, every rail down;
#   2. railshard-launch on two hosts (--nnodes 2), 2 ranks each, collective_check over RDMA;
#      the NCCL plugin's fused device over an rxe rail and a TCP rail (nccl_net_bench);
#   3. with --jobs: jobs of separate processes (tests/collective_check), one network, UTS and
#      mount namespace per host: 2 hosts x 1 rank, 2 hosts x 2 ranks (shared memory inside a
#      host, RDMA between), 3 hosts, and a killed rank that every survivor names;
#   4. with --perf: allreduce_perf over RDMA and over TCP between the same hosts, beside
#      perftest's ib_write_bw as the link limit (docs/rdma.md "Soft-RoCE in a qemu guest").
# Prints "rdma suite: N passed, M failed" and exits 1 when anything failed.
set -uo pipefail
build=$(cd "${1:?usage: suite.sh BUILD_DIR [--jobs] [--perf]}" && pwd)
shift
jobs=0 perf=0
for arg in "$@"; do
  case $arg in
    --jobs) jobs=1 ;;
    --perf) perf=1 ;;
    *) echo "suite.sh: unknown option $arg" >&2; exit 2 ;;
  esac
done
here=$(cd "$(dirname "$0")" && pwd)
hosts="$here/rxe_hosts.sh"
passed=0
failed=0
t0=$(date +%s)

step() {  # step NAME CMD...: runs CMD, counts and reports it
  local name=$1 s rc
  shift
  s=$(date +%s)
  echo "rdma suite: --- $name"
  "$@"
  rc=$?
  if [ $rc -eq 0 ]; then
    passed=$((passed + 1))
    echo "rdma suite: ok   $name ($(($(date +%s) - s)) s)"
  else
    failed=$((failed + 1))
    echo "rdma suite: FAIL $name (exit $rc, $(($(date +%s) - s)) s)"
  fi
}

"$hosts" up 3 2 || { echo "rdma suite: cannot set up the rxe hosts"; exit 1; }
rdma link
# The transport's default ACK timeout (1.07 s, 7 retries): rxe under qemu's CPU emulation has
# been seen to need more than 268 ms (RAILSHARD_IB_TIMEOUT=16) to acknowledge when several
# processes are busy (docs/rdma.md).
export RAILSHARD_CONNECT_TIMEOUT=60

# 1. The transport's tests over real verbs (threads as ranks, each on its own host's devices).
# In the guest none may skip: a skip here means the devices were not found.
no_skips() {
  local log=/tmp/rdma_rxe_test.log rc
  "$@" 2>&1 | tee "$log"
  rc=${PIPESTATUS[0]}
  [ "$rc" -eq 0 ] || return "$rc"
  if grep -q '^\[  SKIPPED \]' "$log"; then
    echo "rdma suite: tests skipped inside the guest (see above)"
    return 1
  fi
}
# The read rendezvous over rxe only with RAILSHARD_TEST_RXE_RENDEZVOUS=1 (forced on, rxe
# writes; see docs/rdma.md "Found over rxe"); left out by name, not skipped, so any skip still
# fails the step.
rendezvous=(--gtest_filter='-*RendezvousOverRxe*/Read')
[ "${RAILSHARD_TEST_RXE_RENDEZVOUS:-0}" = 1 ] && rendezvous=()
step "rdma_rxe_test" no_skips env RAILSHARD_TEST_RXE="$("$hosts" devices 0);$("$hosts" devices 1);$("$hosts" devices 2)" \
  RAILSHARD_TEST_RXE_LINKS="$hosts" "$build/tests/rdma_rxe_test" "${rendezvous[@]}"

# 2. railshard-launch on two hosts, as a user starts a job: one launcher per host
# (--nnodes 2 --node-rank K --master host 0's address), 2 ranks each: shared memory inside a
# host, RDMA between; every rank of both launchers reports its all-reduces exact.
launched() {
  local port=$((30000 + RANDOM % 20000)) out0=/tmp/launch_node0.log out1=/tmp/launch_node1.log
  local rc0 rc1 r
  export RAILSHARD_TOKEN="suite-$RANDOM$RANDOM" RAILSHARD_TRANSPORT=auto
  timeout 240 "$hosts" run 1 "$build/launcher/tools/railshard-launch" -n 2 --nnodes 2 \
    --node-rank 1 --master "10.220.0.1:$port" "$build/tests/collective_check" --iterations 5 \
    >"$out1" 2>&1 &
  local other=$!
  timeout 240 "$hosts" run 0 "$build/launcher/tools/railshard-launch" -n 2 --nnodes 2 \
    --node-rank 0 --master "10.220.0.1:$port" "$build/tests/collective_check" --iterations 5 \
    >"$out0" 2>&1
  rc0=$?
  wait "$other"
  rc1=$?
  unset RAILSHARD_TOKEN RAILSHARD_TRANSPORT
  tail -n 4 "$out0" "$out1"
  [ "$rc0" -eq 0 ] && [ "$rc1" -eq 0 ] || return 1
  for r in 0 1 2 3; do
    cat "$out0" "$out1" | grep -q "rank $r of 4 ok after 5 allreduces over shm per host and ibverbs" ||
      { echo "rank $r did not report its all-reduces over RDMA"; return 1; }
  done
}
step "railshard-launch on 2 hosts x 2 ranks" launched

# 2b. The NCCL network plugin (plugins/nccl) between two hosts, as NCCL's proxy drives it
# (nccl_net_bench: 2 connections, 8 requests in flight each, every byte checked): its fused
# device over host h's rxe rail (h<h>r0) and its TCP interface eth0; both must carry bytes.
nccl_plugin() {
  local handles=/tmp/nccl_plugin_handles.$$ out0=/tmp/nccl_plugin_recv.log
  local out1=/tmp/nccl_plugin_send.log rc0 rc1 rail
  rm -f "$handles"
  local args=(--plugin "$build/plugins/nccl/libnccl-net-railshard.so" --handle-file "$handles"
    --comms 2 --bytes 1048576 --messages 24)
  RXE_RAILS=1 RAILSHARD_NCCL_RAILS==eth0 timeout 240 "$hosts" run 0 \
    "$build/benchmarks/nccl_net_bench" --role recv "${args[@]}" >"$out0" 2>&1 &
  local receiver=$!
  RXE_RAILS=1 RAILSHARD_NCCL_RAILS==eth0 timeout 240 "$hosts" run 1 \
    "$build/benchmarks/nccl_net_bench" --role send "${args[@]}" >"$out1" 2>&1
  rc1=$?
  wait "$receiver"
  rc0=$?
  rm -f "$handles"
  grep -hE "devices|carried|^result|refused|error" "$out0" "$out1"
  [ "$rc0" -eq 0 ] && [ "$rc1" -eq 0 ] || { tail -n 5 "$out0" "$out1"; return 1; }
  grep -q "devices .*railshard-fused(eth0+h1r0:1)" "$out1" || { echo "no fused device"; return 1; }
  # The send comms' closing lines: each rail carried a share.
  for rail in eth0 h1r0:1; do
    grep -qE "NCCL send comm with .*: $rail carried [1-9][0-9]* bytes" "$out1" ||
      { echo "$rail carried nothing"; return 1; }
  done
}
step "NCCL plugin: an RDMA rail and a TCP rail fused" nccl_plugin

# 3. Separate processes, one network, UTS and mount namespace (host name, /dev/shm) per host.
job() {  # job RANKS_PER_HOST EXPECT ARGS...: collective_check on the first two hosts
  local per=$1 expect=$2 out
  shift 2
  out=$(RAILSHARD_TRANSPORT=auto RXE_TIMEOUT=240 "$hosts" job "$per" \
    "$build/tests/collective_check" "$@" 2>&1)
  local rc=$?
  echo "$out" | tail -12
  [ $rc -eq 0 ] || return $rc
  [ "$(echo "$out" | grep -c "$expect")" -ge 1 ] || { echo "expected: $expect"; return 1; }
}
if [ $jobs = 1 ]; then
step "2 hosts x 1 rank, 2 rails, processes" job 1,1 "ok after 10 allreduces over ibverbs" \
  --iterations 10 --rails 1
step "2 hosts x 2 ranks (shm inside, RDMA between)" job 2,2 \
  "ok after 10 allreduces over shm per host and ibverbs, topology [0-9a-f]* with 2 host(s)" \
  --iterations 10
step "3 hosts x 1 rank" job 1 "ok after 10 allreduces over ibverbs" --iterations 10
killed() {
  local out
  out=$(RAILSHARD_TRANSPORT=auto RAILSHARD_TIMEOUT=30 RXE_TIMEOUT=120 "$hosts" job 1 \
    "$build/tests/collective_check" --iterations 200 --die-rank 2 --die-after 5 --die-how kill 2>&1)
  echo "$out" | tail -8
  # Every survivor (ranks 0 and 1) names the killed rank.
  for r in 0 1; do
    echo "$out" | grep -q "PeerLostError: rank $r: .*lost rank 2" ||
      { echo "rank $r did not report rank 2 lost"; return 1; }
  done
}
step "a killed rank: every survivor raises naming it" killed
fi

if [ $perf = 1 ]; then  # 4.
  "$here/perf.sh" "$build" 4M
fi
echo "rdma suite: $passed passed, $failed failed in $(($(date +%s) - t0)) s"
[ $failed -eq 0 ]
