#!/bin/bash
# Whole-job start-up at N ranks on this host (issue #46; docs/scaling.md): railshard-launch
# starts N ranks of allreduce_perf, they form the communicator, run an 8-byte all-reduce
# (-n 20 -w 2) and end. Prints, per rank count and build, the median wall time of --reps
# runs (the builds interleaved, so that they share the machine's state), the store's requests
# and bytes (its own count, logged when it ends), and the 8-byte all-reduce's time; --mpi adds
# OpenMPI starting the same program (mpirun --oversubscribe --bind-to none).
#
#   benchmarks/startup_scale.sh [--ranks "8 32 64 128"] [--reps 3] [--mpi]
#       [--transport auto|tcp] [--limit SECONDS] BUILD_DIR [BUILD_DIR...]
#
# Every run is bounded by --limit (default 300 s; a run over it counts as failed).
set -u
ranks="8 32 64 128"
reps=3
mpi=0
transport=auto
limit=300
builds=()
while [ $# -gt 0 ]; do
  case "$1" in
    --ranks) ranks="$2"; shift 2 ;;
    --reps) reps="$2"; shift 2 ;;
    --mpi) mpi=1; shift ;;
    --transport) transport="$2"; shift 2 ;;
    --limit) limit="$2"; shift 2 ;;
    -h|--help) sed -n 2,12p "$0"; exit 0 ;;
    *) builds+=("$1"); shift ;;
  esac
done
[ ${#builds[@]} -gt 0 ] || { echo "startup_scale.sh: name at least one build directory" >&2; exit 2; }
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

# One run: prints "seconds requests bytes_out latency_us" (requests "-" for OpenMPI).
run_one() {
  local build="$1" n="$2" log="$out/log"
  local perf="$build/benchmarks/allreduce_perf" start end
  start=$(date +%s.%N)
  if [ "$build" = mpi ]; then
    perf="${builds[0]}/benchmarks/allreduce_perf"
    timeout "$limit" mpirun --allow-run-as-root --oversubscribe --bind-to none -np "$n" \
      "$perf" --backend mpi -b 8 -e 8 -n 20 -w 2 > "$log" 2>&1
  else
    RAILSHARD_LOG_LEVEL=info RAILSHARD_TRANSPORT="$transport" timeout "$limit" \
      "$build/launcher/tools/railshard-launch" -n "$n" --no-prefix \
      "$perf" -b 8 -e 8 -n 20 -w 2 > "$log" 2>&1
  fi
  local rc=$?
  end=$(date +%s.%N)
  if [ $rc -ne 0 ]; then echo "failed(rc=$rc) - - -"; return; fi
  local requests bytes latency
  requests=$(grep -o "answered [0-9]* requests" "$log" | awk '{print $2}' | head -1)
  bytes=$(grep -o "MB in, [0-9.]* MB out" "$log" | awk '{print $3}' | head -1)
  latency=$(awk '$1 == "8" && NF >= 12 {print $6; exit}' "$log")
  echo "$(echo "$end - $start" | bc | xargs printf '%.2f') ${requests:--} ${bytes:--} ${latency:--}"
}

median() { sort -g | awk '{a[NR]=$1} END {if (NR == 0) print "-"; else print a[int((NR + 1) / 2)]}'; }

targets=("${builds[@]}")
[ $mpi -eq 1 ] && targets+=(mpi)
printf "%-6s %-28s %10s %10s %12s %12s\n" ranks build "median s" requests "MB out" "8B us"
for n in $ranks; do
  for t in "${targets[@]}"; do : > "$out/$(echo "$t" | tr / _).$n"; done
  for ((i = 0; i < reps; i++)); do
    for t in "${targets[@]}"; do run_one "$t" "$n" >> "$out/$(echo "$t" | tr / _).$n"; done
  done
  for t in "${targets[@]}"; do
    f="$out/$(echo "$t" | tr / _).$n"
    printf "%-6s %-28s %10s %10s %12s %12s   (runs: %s)\n" "$n" "$t" \
      "$(awk '{print $1}' "$f" | grep -v failed | median)" "$(awk '{print $2}' "$f" | median)" \
      "$(awk '{print $3}' "$f" | median)" "$(awk '{print $4}' "$f" | median)" \
      "$(awk '{printf "%s ", $1}' "$f")"
  done
done
