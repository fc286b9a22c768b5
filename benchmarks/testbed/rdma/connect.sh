#!/usr/bin/env bash
# In the guest, after rxe_hosts.sh up: what connecting the job's RDMA lanes costs, eager
# against lazy (RAILSHARD_IB_CONNECT), side by side in one run: connect_bench on every host
# with RANKS ranks each (default 2), RUNS times (default 3) alternating. Each line: init time,
# first all-reduce (where lazy lanes connect), the steady all-reduce after, the memory each
# rank's process pinned (VmPin: rxe pins what ibv_reg_mr registers), RDMA lanes up in all.
# Absolute times mean nothing under emulation; the ratios and the pinned memory do.
#
#   connect.sh BUILD_DIR [RANKS] [SIZE]       SIZE: the all-reduce's size (default 1M)
set -uo pipefail
build=$(cd "${1:?usage: connect.sh BUILD_DIR [RANKS] [SIZE]}" && pwd)
ranks=${2:-2}
size=${3:-1M}
runs=${RUNS:-3}
here=$(cd "$(dirname "$0")" && pwd)
export RAILSHARD_CONNECT_TIMEOUT=120  # transport auto: shared memory inside a host, RDMA between
status=0
for run in $(seq "$runs"); do
  for mode in eager lazy; do
    line=$(RAILSHARD_IB_CONNECT=$mode RXE_RAILS=1 RXE_TIMEOUT=300 "$here/rxe_hosts.sh" job "$ranks" \
      "$build/benchmarks/connect_bench" --bytes "$size" 2>&1 | grep -E "connect_bench" | tail -1)
    [ -n "$line" ] || status=1
    echo "connect run $run $mode: ${line:-no figure}"
  done
done
exit "$status"
