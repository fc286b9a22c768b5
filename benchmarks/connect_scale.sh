#!/bin/bash
# Sockets per rank and whole-job time on namespaced hosts, TCP connections made at start-up
# against on first use (issue #46; docs/scaling.md, "Connections on first use"). Brings up
# HOSTS namespaced hosts (benchmarks/testbed/testbed.sh, one unshaped rail), then per rep and
# per RAILSHARD_TCP_CONNECT mode runs one job of RANKS ranks per host of allreduce_perf
# (-b 8 -e 8 -n 300 -w 2, long enough to be sampled after its first all-reduce) and samples
# every rank's /proc/PID/fd once a second. Prints per run the wall time and, over the ranks,
# the median, second largest and largest number of sockets a rank held (the largest is the
# store's host: one per rank more). The allreduce_perf output lands in OUT/NAME_MODE_REP.txt.
#
#   benchmarks/connect_scale.sh [--hosts 16] [--ranks 16] [--reps 3] [--modes "eager lazy"]
#       BUILD_DIR OUT_DIR
#
# Needs root and iproute2; every job is bounded by 200 s. The sampling costs CPU on a small
# machine: time the modes against each other, not against runs without it.
set -u
hosts=16
ranks=16
reps=3
modes="eager lazy"
args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --hosts) hosts="$2"; shift 2 ;;
    --ranks) ranks="$2"; shift 2 ;;
    --reps) reps="$2"; shift 2 ;;
    --modes) modes="$2"; shift 2 ;;
    -h|--help) sed -n 2,15p "$0"; exit 0 ;;
    *) args+=("$1"); shift ;;
  esac
done
[ ${#args[@]} -eq 2 ] || { sed -n 2,15p "$0" >&2; exit 2; }
build=$(realpath "${args[0]}")
out=${args[1]}
here=$(cd "$(dirname "$0")" && pwd)
testbed="$here/testbed/testbed.sh"
perf="$build/benchmarks/allreduce_perf"
name=cs$hosts
mkdir -p "$out"
"$testbed" up "$name" "$hosts" none >/dev/null
trap '"$testbed" down "$name"' EXIT
for rep in $(seq 1 "$reps"); do
  for mode in $modes; do
    start=$(date +%s.%N)
    RAILSHARD_TCP_CONNECT=$mode TESTBED_RANKS=$ranks TESTBED_TIMEOUT=200 \
      "$testbed" job "$name" "$perf" -b 8 -e 8 -n 300 -w 2 >"$out/${name}_${mode}_$rep.txt" 2>&1 &
    job=$!
    declare -A most=()
    while kill -0 "$job" 2>/dev/null; do
      for pid in $(pgrep -f "^$perf" 2>/dev/null); do
        n=$(ls -l "/proc/$pid/fd" 2>/dev/null | grep -c socket)
        [ "$n" -gt "${most[$pid]:-0}" ] && most[$pid]=$n
      done
      sleep 1
    done
    wait "$job"
    rc=$?
    end=$(date +%s.%N)
    stats="not sampled (the job ended within a second)"
    [ ${#most[@]} -gt 0 ] && stats=$(printf '%s\n' "${most[@]}" | sort -n |
      awk '{v[NR] = $1} END {print "ranks " NR ", sockets median " v[int((NR + 1) / 2)] ", second " v[NR - 1] ", max " v[NR]}')
    unset most
    echo "$name $mode rep $rep: rc $rc, wall $(echo "$end - $start" | bc) s, $stats"
  done
done
