#!/bin/bash
# The measurements cluster_sim is fitted to and checked against (docs/simulator.md): the
# 8 B-32 KiB all-reduce with the algorithm forced, out-of-place, on one host (shm_direct,
# shm_rsag) and on namespaced hosts (two_level_direct, two_level_leader), repetitions
# interleaved. Prints one line per run: "REP HOSTS RANKS_PER_HOST ALGORITHM | out in out in ...".
#
#   benchmarks/sim/calibrate.sh [--reps-one-host 5] [--reps-hosts 3] BUILD_DIR > measured.txt
#
# One-host runs use railshard-launch; the hosts use benchmarks/testbed/testbed.sh (root,
# network namespaces). Every run is bounded (200 s).
set -u
reps_one=5
reps_hosts=3
while [ $# -gt 1 ]; do
  case "$1" in
    --reps-one-host) reps_one="$2"; shift 2 ;;
    --reps-hosts) reps_hosts="$2"; shift 2 ;;
    *) break ;;
  esac
done
[ $# -eq 1 ] || { sed -n 2,10p "$0" >&2; exit 2; }
build=$(cd "$1" && pwd)
cd "$(dirname "$0")/../.."
perf_args=(-b 8 -e 32K -f 8 -n 100 -w 5)
times() { awk '$1 ~ /^[0-9]+$/ && NF >= 12 {printf "%s %s ", $6, $10}'; }
for rep in $(seq "$reps_one"); do
  for n in 16 32 64 128; do
    for algo in shm_direct shm_rsag; do
      t=$(RAILSHARD_ALGO=$algo timeout 200 "$build/launcher/tools/railshard-launch" -n "$n" \
        --no-prefix "$build/benchmarks/allreduce_perf" "${perf_args[@]}" 2>&1 | times)
      echo "$rep 1 $n $algo | $t"
    done
  done
done
for spec in "4 4 8" "8 8 16" "16 8"; do
  set -- $spec
  hosts=$1
  shift
  benchmarks/testbed/testbed.sh up cal$hosts "$hosts" none > /dev/null 2>&1 ||
    { echo "testbed of $hosts hosts did not come up" >&2; continue; }
  for rep in $(seq "$reps_hosts"); do
    for l in "$@"; do
      for algo in two_level_direct two_level_leader; do
        t=$(RAILSHARD_ALGO=$algo TESTBED_RANKS=$l TESTBED_TIMEOUT=200 \
          benchmarks/testbed/testbed.sh job cal$hosts "$build/benchmarks/allreduce_perf" \
          "${perf_args[@]}" 2>&1 | times)
        echo "$rep $hosts $l $algo | $t"
      done
    done
  done
  benchmarks/testbed/testbed.sh down cal$hosts > /dev/null 2>&1
done
