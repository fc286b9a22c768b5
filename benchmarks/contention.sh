#!/usr/bin/env bash
# A 2-rank job on one host with CPU-bound processes beside it (DataLoader workers, a
# neighbour's job): railshard with RAILSHARD_WAIT=auto (the default: pause, then yield),
# RAILSHARD_WAIT=sleep (glance, then sleep) and OpenMPI (mpirun, its shared-memory transport),
# side by side in every round. Each round starts --hogs busy loops (each bounded by
# `timeout`), runs every contender at 8 B (-n 20000), 64 KiB (-n 2000) and 2 MiB (-n 200),
# then stops the hogs and runs them all once more idle at 8 B. Prints per contender and case the median over rounds of the time per all-reduce
# (the better of out-of-place and in-place, µs) and the per-round ratio to OpenMPI.
#
#   benchmarks/contention.sh BUILD_DIR [--rounds N] [--hogs K] [--logs DIR]
# 2 cores, 5 rounds: ~4 minutes. OpenMPI is skipped when allreduce_perf lacks --backend mpi.
set -euo pipefail
usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit "${1:-2}"; }
[ $# -ge 1 ] || usage
build=$1
shift
rounds=5
hogs=2
logs=""
while [ $# -gt 0 ]; do
  case "$1" in
    --rounds) rounds=$2; shift 2 ;;
    --hogs) hogs=$2; shift 2 ;;
    --logs) logs=$2; shift 2 ;;
    -h | --help) usage 0 ;;
    *) echo "contention: unknown option $1" >&2; usage ;;
  esac
done
perf=$build/benchmarks/allreduce_perf
launch=$build/launcher/tools/railshard-launch
for tool in "$perf" "$launch"; do
  [ -x "$tool" ] || { echo "contention: no $tool" >&2; exit 2; }
done
contenders="auto sleep"
if "$perf" --help 2>&1 | grep -q "mpi"; then contenders="$contenders mpi"; fi
logs=${logs:-$build/contention.logs}
mkdir -p "$logs"
rm -f "$logs"/*.txt

hog_pids=()
stopHogs() {
  for pid in "${hog_pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait "${hog_pids[@]}" 2>/dev/null || true
  hog_pids=()
}
trap stopHogs EXIT

# run CONTENDER CASE ARGS...: one allreduce_perf job, its time per all-reduce in µs on stdout.
run() {
  local who=$1 case=$2
  shift 2
  local out="$logs/$case.$who.$round.txt"
  if [ "$who" = mpi ]; then
    timeout -k 5 120 mpirun --allow-run-as-root --oversubscribe --bind-to none -np 2 \
      "$perf" --backend mpi "$@" >"$out" 2>&1 || true
  else
    RAILSHARD_WAIT=$who timeout -k 5 120 "$launch" -n 2 "$perf" "$@" >"$out" 2>&1 || true
  fi
  # Size line: "[0] size count type op root time algbw busbw wrong time ..." (the rank prefix
  # only under railshard-launch).
  awk '{ if ($1 == "[0]") $1 = ""; $0 = $0 }
       $1 ~ /^[0-9]+$/ && NF >= 12 { t = ($6 < $10) ? $6 : $10; print t; exit }' "$out"
}

for round in $(seq "$rounds"); do
  for _ in $(seq "$hogs"); do
    timeout 300 sh -c 'while :; do :; done' &
    hog_pids+=($!)
  done
  sleep 0.5
  for who in $contenders; do
    echo "busy8 $who $(run "$who" busy8 -b 8 -e 8 -n 20000 -w 200)" >>"$logs/results"
    echo "busy64K $who $(run "$who" busy64K -b 64K -e 64K -n 2000 -w 50)" >>"$logs/results"
    echo "busy2M $who $(run "$who" busy2M -b 2M -e 2M -n 200 -w 10)" >>"$logs/results"
  done
  stopHogs
  sleep 0.5
  for who in $contenders; do
    echo "idle8 $who $(run "$who" idle8 -b 8 -e 8 -n 20000 -w 200)" >>"$logs/results"
  done
  echo "[contention $(date +%H:%M:%S)] round $round/$rounds done" >&2
done

python3 - "$logs/results" <<'EOF'
import statistics, sys
rows = [line.split() for line in open(sys.argv[1]) if len(line.split()) == 3]
cases = ["busy8", "busy64K", "busy2M", "idle8"]
by = {}
for case, who, t in rows:
    by.setdefault((case, who), []).append(float(t))
print(f"{'case':8} {'contender':10} {'median µs':>10} {'runs':>30} {'vs mpi':>8}")
for case in cases:
    mpi = by.get((case, "mpi"))
    for (c, who), times in sorted(by.items()):
        if c != case:
            continue
        ratio = ""
        if mpi and who != "mpi":
            ratios = [a / b for a, b in zip(times, mpi) if b > 0]
            ratio = f"{statistics.median(ratios):.2f}x"
        runs = ",".join(f"{t:g}" for t in times)
        print(f"{case:8} {who:10} {statistics.median(times):10.2f} {runs:>30} {ratio:>8}")
EOF
mv "$logs/results" "$logs/results.$(date +%s)"
