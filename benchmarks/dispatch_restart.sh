#!/usr/bin/env bash
# The dispatcher across a kill and a restart (issue #23's target): 4 ranks of dispatch_bench
# (speeds 1,2,4,2, 840 samples per step, ideal step 50 ms, --work sleep), launch rank 2
# SIGKILLed in step 12, restarted by railshard-launch --max-restarts 1, admitted by the
# members at the next step boundary (--grow). Per trial, from the ranks' own wall-clock stamps
# (one host, one clock) and the JSON rank 0 writes:
#   to 3 ranks: kill -> the first step on the 3 survivors is done
#   to 4 ranks: the restarted process's start -> the first step on 4 ranks is done
#   regain:     steps from the first 4-rank step to one within 5% of the step time before the
#               failure (0: that step already was)
#   ledger:     every sample of the epoch processed exactly once, by the ranks' reports
# Prints the median and maximum of each over the trials.
#
#   benchmarks/dispatch_restart.sh [BUILD_DIR] [TRIALS]
set -euo pipefail
build=${1:-build}
trials=${2:-5}
launch="$build/launcher/tools/railshard-launch"
bench="$build/benchmarks/dispatch_bench"
for bin in "$launch" "$bench"; do
  [ -x "$bin" ] || { echo "no $bin (build the benchmarks first)" >&2; exit 2; }
done
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

for ((t = 0; t < trials; ++t)); do
  RAILSHARD_TIMEOUT=30 timeout 120 "$launch" --max-restarts 1 -n 4 "$bench" --speeds 1,2,4,2 \
    --kill 2:12 --grow --policies proportional --json "$tmp/$t.json" \
    >"$tmp/$t.out" 2>"$tmp/$t.err" || echo "trial $t: exit $?" >&2
done

python3 - "$tmp" "$trials" <<'PY'
import json, re, statistics, sys
tmp, trials = sys.argv[1], int(sys.argv[2])
rows = {"to 3 ranks (s)": [], "to 4 ranks (s)": [], "regain (steps)": []}
ledgers = 0
for t in range(trials):
    out = open(f"{tmp}/{t}.out").read()
    killed = re.search(r"# slot 2 kills itself in step \d+ at (\d+) us", out)
    three = re.search(r"# first step on 3 ranks \(step \d+\) done at (\d+) us", out)
    started = re.search(r"# slot 2 rejoined .* process started at (\d+) us", out)
    four = re.search(r"# first step on 4 ranks \(step \d+\) done at (\d+) us", out)
    try:
        summary = json.load(open(f"{tmp}/{t}.json"))["summary"][0]
    except (OSError, ValueError, KeyError, IndexError):
        summary = None
    if not (killed and three and started and four and summary):
        print(f"trial {t}: incomplete; output tail:\n{out[-800:]}", file=sys.stderr)
        continue
    rows["to 3 ranks (s)"].append((int(three.group(1)) - int(killed.group(1))) / 1e6)
    rows["to 4 ranks (s)"].append((int(four.group(1)) - int(started.group(1))) / 1e6)
    regain = summary.get("after_growth", {}).get("regain_steps")
    if regain is not None:
        rows["regain (steps)"].append(regain)
    ledgers += bool(summary.get("ledger_ok"))
for name, values in rows.items():
    if values:
        print(f"{name:15s} n={len(values)} median {statistics.median(values):.3f} "
              f"max {max(values):.3f}")
    else:
        print(f"{name:15s} n=0")
print(f"ledger exactly once: {ledgers} of {trials} trials")
PY
