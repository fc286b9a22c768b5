#!/usr/bin/env bash
# The tuner against every algorithm forced, on the namespace test bed (benchmarks/testbed):
# H hosts with R ranks each, joined by two rails shaped 1gbit and 250mbit; a float32 sum
# all-reduce swept from 8 B to 256 MiB (x8), once with RAILSHARD_ALGO=auto and once with each
# algorithm that applies to the layout forced. The question: is auto's choice within 10% of the
# fastest forced algorithm at every size (issue #21's target)?
#
# Every repetition runs every algorithm once, one after another (noise then hits all of that
# repetition alike), each as two bounded jobs: allreduce_perf -b 8 -e 32K -f 8 -n 40 -w 5
# (small sizes: more iterations) and -b 256K -e 256M -f 8 -n 3 -w 1, results read from -J.
# Per run and size the better of out-of-place and in-place time; per algorithm and size the
# median over the repetitions; auto / fastest is that median over the fastest algorithm's.
# two_level_direct takes messages up to one slot and falls back to two_level above, so its
# figures there are two_level's (bracketed). auto's own choice per size is read from its
# debug log (RAILSHARD_LOG_LEVEL=debug on rank 0's first all-reduce of each size).
#
# Needs root, iproute2, python3. 2 cores, 2x2, 2 reps: ~12 minutes. Don't run it while the
# build tree is being rebuilt.
#
#   benchmarks/tuner_sweep.sh BUILD_DIR [--reps N] [--hosts H] [--ranks R] [--rates R0,R1]
#                             [--logs DIR] [--timeout S] [--name NAME]
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
testbed="$here/testbed/testbed.sh"
python=/usr/bin/python3
[ -x "$python" ] || python=python3

usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit "${1:-2}"; }
[ $# -ge 1 ] || usage
case "$1" in -h | --help) usage 0 ;; -*) usage ;; esac
build=$1
shift
reps=2
hosts=2
ranks=2
rates=1gbit,250mbit
logs=""
job_timeout=240
name="ts$RANDOM"
while [ $# -gt 0 ]; do
  case "$1" in
    --reps) reps=$2; shift 2 ;;
    --hosts) hosts=$2; shift 2 ;;
    --ranks) ranks=$2; shift 2 ;;
    --rates) rates=$2; shift 2 ;;
    --logs) logs=$2; shift 2 ;;
    --timeout) job_timeout=$2; shift 2 ;;
    --name) name=$2; shift 2 ;;
    -h | --help) usage 0 ;;
    *) echo "tuner_sweep: unknown option $1" >&2; usage ;;
  esac
done
perf="$build/benchmarks/allreduce_perf"
[ -x "$perf" ] || { echo "tuner_sweep: no $perf" >&2; exit 2; }
[[ "$name" =~ ^[a-z0-9]{1,8}$ ]] || { echo "tuner_sweep: bad --name '$name'" >&2; exit 2; }
[ "$(id -u)" -eq 0 ] || { echo "tuner_sweep: needs root (network namespaces)" >&2; exit 2; }
logs=${logs:-$build/tuner_sweep.logs}
mkdir -p "$logs"
IFS=, read -r rate0 rate1 <<<"$rates"

algorithms=(auto ring recursive_doubling)
if [ "$ranks" -gt 1 ]; then algorithms+=(two_level two_level_direct); fi

log() { echo "[tuner_sweep $(date +%H:%M:%S)] $*" >&2; }
cleanup() { "$testbed" down "$name" || true; }
trap cleanup EXIT
log "test bed '$name': $hosts hosts x $ranks ranks, rails $rate0 + $rate1; $reps reps of" \
  "${algorithms[*]}; logs in $logs"
"$testbed" up "$name" "$hosts" "$rate0" "$rate1"

status=0
for rep in $(seq "$reps"); do
  for algo in "${algorithms[@]}"; do
    for range in small large; do
      if [ "$range" = small ]; then
        args=(-b 8 -e 32K -f 8 -n 40 -w 5)
      else
        args=(-b 256K -e 256M -f 8 -n 3 -w 1)
      fi
      base="$logs/rep$rep.$algo.$range"
      rm -f "$base.json"
      level=info
      [ "$algo" = auto ] && level=debug
      rc=0
      RAILSHARD_ALGO=$algo RAILSHARD_LOG_LEVEL=$level TESTBED_RANKS=$ranks \
        TESTBED_TIMEOUT=$job_timeout timeout -k 10 $((job_timeout + 15)) \
        "$testbed" job "$name" "$perf" "${args[@]}" -J "$base.json" >"$base.txt" 2>&1 || rc=$?
      if [ "$rc" -ne 0 ] || [ ! -s "$base.json" ]; then
        log "rep $rep $algo $range: FAILED (exit $rc, see $base.txt)"
        status=1
      else
        log "rep $rep $algo $range: done"
      fi
    done
  done
done

"$python" - "$logs" "$reps" "${algorithms[@]}" <<'EOF'
import json, os, re, statistics, sys
logs, reps, algos = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
times = {}  # (algo, size) -> [us per rep]
for rep in range(1, reps + 1):
    for algo in algos:
        for rng in ("small", "large"):
            path = f"{logs}/rep{rep}.{algo}.{rng}.json"
            if not os.path.exists(path) or os.path.getsize(path) == 0:
                continue
            doc = json.load(open(path))
            for row in doc["rows"]:
                if row["oop_wrong"] or row["ip_wrong"]:
                    sys.exit(f"{path}: wrong elements at {row['size']} B")
                t = min(row["oop_time_us"], row["ip_time_us"])
                times.setdefault((algo, row["size"]), []).append(t)
# auto's choice: "rank 0: allreduce #K (float sum, count C) -> ALGO (...)" at debug level.
choice = {}
for rng in ("small", "large"):
    path = f"{logs}/rep1.auto.{rng}.txt"
    if not os.path.exists(path):
        continue
    for line in open(path, errors="replace"):
        m = re.search(r"rank 0: allreduce #\d+ \(float sum, count (\d+)\) -> (\w+)", line)
        if m:
            choice.setdefault(int(m.group(1)) * 4, m.group(2))
sizes = sorted({s for (_, s) in times})
def size_text(b):
    for unit, div in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if b >= div:
            return f"{b // div} {unit}"
    return f"{b}"
print("| bytes | " + " | ".join(algos) + " | auto's choice | auto / fastest |")
print("|---|" + "---|" * (len(algos) + 2))
worst = 0
for s in sizes:
    med = {a: statistics.median(times[(a, s)]) for a in algos if (a, s) in times}
    forced = {a: t for a, t in med.items() if a != "auto"}
    cells = []
    for a in algos:
        if a not in med:
            cells.append("-")
        elif a == "two_level_direct" and choice.get(s) != "two_level_direct" and s > (1 << 20):
            cells.append(f"({med[a]:.0f})")
        else:
            cells.append(f"{med[a]:.0f}")
    ratio = med["auto"] / min(forced.values()) if "auto" in med and forced else float("nan")
    worst = max(worst, ratio)
    print(f"| {size_text(s)} | " + " | ".join(cells) + f" | {choice.get(s, '?')} | {ratio:.2f} |")
print(f"\nworst auto / fastest: {worst:.2f} (target <= 1.10)")
EOF
exit "$status"
