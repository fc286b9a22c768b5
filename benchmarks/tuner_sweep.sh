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
# two_level_direct and two_level_leader take messages up to one slot and fall back to
# two_level above, so their figures there are two_level's (bracketed). auto's own choice per size is read from one more
# short job per range in the first repetition, at RAILSHARD_LOG_LEVEL=debug (-n 1 -w 0): the
# timed jobs run at info level, since debug logging of every all-reduce and rail piece costs
# more than a small all-reduce and slowed auto's timings by up to 2x.
#
# Needs root, iproute2, python3. 2 cores, 2x2, 2 reps: ~12 minutes. Don't run it while the
# build tree is being rebuilt.
#
# Two ratios per size: auto / fastest (auto's own timed run against the fastest forced one:
# includes the spread between jobs of one algorithm, 10-40% below 64 KiB here) and choice /
# fastest (the forced run of the algorithm auto chose against the fastest forced one: the
# quality of the choice alone). RAILSHARD_PROBE=1 in the environment gives the tuner the
# rails' measured rates (else their nominal speeds: the test bed's veths say 10 Gbit/s).
#
#   benchmarks/tuner_sweep.sh BUILD_DIR [--reps N] [--hosts H] [--ranks R] [--rates R0,R1]
#                             [--logs DIR] [--timeout S] [--name NAME] [--report-only]
# --report-only: no runs, the table from the logs of an earlier run.
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
report_only=0
while [ $# -gt 0 ]; do
  case "$1" in
    --reps) reps=$2; shift 2 ;;
    --hosts) hosts=$2; shift 2 ;;
    --ranks) ranks=$2; shift 2 ;;
    --rates) rates=$2; shift 2 ;;
    --logs) logs=$2; shift 2 ;;
    --timeout) job_timeout=$2; shift 2 ;;
    --name) name=$2; shift 2 ;;
    --report-only) report_only=1; shift ;;
    -h | --help) usage 0 ;;
    *) echo "tuner_sweep: unknown option $1" >&2; usage ;;
  esac
done
perf="$build/benchmarks/allreduce_perf"
[ -x "$perf" ] || { echo "tuner_sweep: no $perf" >&2; exit 2; }
[[ "$name" =~ ^[a-z0-9]{1,8}$ ]] || { echo "tuner_sweep: bad --name '$name'" >&2; exit 2; }
[ "$report_only" = 1 ] || [ "$(id -u)" -eq 0 ] ||
  { echo "tuner_sweep: needs root (network namespaces)" >&2; exit 2; }
logs=${logs:-$build/tuner_sweep.logs}
mkdir -p "$logs"
IFS=, read -r rate0 rate1 <<<"$rates"

algorithms=(auto ring recursive_doubling)
if [ "$ranks" -gt 1 ]; then algorithms+=(two_level two_level_direct two_level_leader); fi

log() { echo "[tuner_sweep $(date +%H:%M:%S)] $*" >&2; }
status=0
if [ "$report_only" = 0 ]; then
cleanup() { "$testbed" down "$name" || true; }
trap cleanup EXIT
log "test bed '$name': $hosts hosts x $ranks ranks, rails $rate0 + $rate1; $reps reps of" \
  "${algorithms[*]}; logs in $logs"
"$testbed" up "$name" "$hosts" "$rate0" "$rate1"

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
      if [ "$algo" = auto ] && [ "$rep" = 1 ]; then
        # auto's choices: one untimed iteration per size, at debug level.
        RAILSHARD_ALGO=auto RAILSHARD_LOG_LEVEL=debug TESTBED_RANKS=$ranks \
          TESTBED_TIMEOUT=$job_timeout timeout -k 10 $((job_timeout + 15)) \
          "$testbed" job "$name" "$perf" "${args[0]}" "${args[1]}" "${args[2]}" "${args[3]}" \
          -f 8 -n 1 -w 0 >"$logs/choices.$range.txt" 2>&1 || true
      fi
      rc=0
      RAILSHARD_ALGO=$algo TESTBED_RANKS=$ranks \
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
fi

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
    path = f"{logs}/choices.{rng}.txt"
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
print("| bytes | " + " | ".join(algos) + " | auto's choice | auto / fastest | choice / fastest |")
print("|---|" + "---|" * (len(algos) + 3))
worst = 0
worst_choice = 0
for s in sizes:
    med = {a: statistics.median(times[(a, s)]) for a in algos if (a, s) in times}
    forced = {a: t for a, t in med.items() if a != "auto"}
    cells = []
    for a in algos:
        if a not in med:
            cells.append("-")
        elif a in ("two_level_direct", "two_level_leader") and choice.get(s) != a and s > (1 << 20):
            cells.append(f"({med[a]:.0f})")
        else:
            cells.append(f"{med[a]:.0f}")
    fastest = min(forced.values()) if forced else float("nan")
    ratio = med["auto"] / fastest if "auto" in med else float("nan")
    chosen = choice.get(s)
    # two_level_direct/_leader above one slot run two_level: their forced figures are its.
    chosen_time = forced.get(chosen, float("nan"))
    choice_ratio = chosen_time / fastest
    worst = max(worst, ratio)
    worst_choice = max(worst_choice, choice_ratio)
    print(f"| {size_text(s)} | " + " | ".join(cells) +
          f" | {chosen or '?'} | {ratio:.2f} | {choice_ratio:.2f} |")
print(f"\nworst auto / fastest: {worst:.2f}; worst choice / fastest: {worst_choice:.2f}"
      " (target <= 1.10)")
EOF
exit "$status"
