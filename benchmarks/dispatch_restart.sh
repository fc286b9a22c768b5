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
# LAYOUT 1x4 (default): one host, railshard-launch --max-restarts 1 restarts the rank.
# LAYOUT 2x2: two emulated hosts of the namespace test bed (benchmarks/testbed/testbed.sh,
# rails 1gbit and 250mbit, needs root), two ranks each, started by hand with the store in a
# railshard-store process on host 0 (RAILSHARD_STORE_EXTERNAL=1); when rank 2 (host 1) dies
# the script starts it again on host 1 with RAILSHARD_JOIN=1, as a supervisor would.
#
#   benchmarks/dispatch_restart.sh [BUILD_DIR] [TRIALS] [LAYOUT]
set -euo pipefail
build=$(cd "${1:-build}" && pwd)
trials=${2:-5}
layout=${3:-1x4}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
launch="$build/launcher/tools/railshard-launch"
bench="$build/benchmarks/dispatch_bench"
store="$build/launcher/tools/railshard-store"
for bin in "$launch" "$bench" "$store"; do
  [ -x "$bin" ] || { echo "no $bin (build the benchmarks first)" >&2; exit 2; }
done
tmp=$(mktemp -d)
args=(--speeds 1,2,4,2 --kill 2:12 --grow --policies proportional)
bed=""
cleanup() {
  [ -n "$bed" ] && "$here/testbed/testbed.sh" down "$bed"
  rm -rf "$tmp"
}
trap cleanup EXIT

# One trial on the test bed: ranks 0,1 on host 0, ranks 2,3 on host 1; rank 0's output and
# the killed and restarted rank 2's are what the parser reads (concatenated into $t.out).
netnsTrial() {
  local t=$1 tb="$here/testbed/testbed.sh" port=$((20000 + RANDOM % 20000)) pids=() r
  # RAILSHARD_ELASTIC=1: this script is the ranks' supervisor, and it keeps the job going.
  local env=(RAILSHARD_WORLD_SIZE=4 RAILSHARD_STORE_ADDR=10.200.0.1:$port
             RAILSHARD_STORE_EXTERNAL=1 RAILSHARD_TOKEN=restart-bench RAILSHARD_TIMEOUT=30
             RAILSHARD_ELASTIC=1)
  rm -f "$tmp/addr"
  "$tb" run "$bed" 0 env RAILSHARD_TOKEN=restart-bench "$store" --host 10.200.0.1 \
    --port "$port" --address-file "$tmp/addr" >/dev/null 2>"$tmp/store.err" &
  local store_pid=$!
  for _ in $(seq 200); do [ -s "$tmp/addr" ] && break; sleep 0.05; done
  for r in 0 1 2 3; do
    timeout 120 "$tb" run "$bed" $((r / 2)) env "${env[@]}" RAILSHARD_RANK=$r \
      RAILSHARD_LOCAL_RANK=$((r % 2)) "$bench" "${args[@]}" --json "$tmp/$t.json" \
      >"$tmp/$t.$r.out" 2>"$tmp/$t.$r.err" &
    pids+=($!)
  done
  { wait "${pids[2]}"; } 2>/dev/null || true  # rank 2 kills itself in step 12: start it again
  timeout 120 "$tb" run "$bed" 1 env "${env[@]}" RAILSHARD_RANK=2 RAILSHARD_LOCAL_RANK=0 \
    RAILSHARD_JOIN=1 "$bench" "${args[@]}" >"$tmp/$t.2r.out" 2>"$tmp/$t.2r.err" &
  pids+=($!)
  local status=0
  for r in 0 1 3 4; do wait "${pids[$r]}" || status=$?; done
  kill "$store_pid" 2>/dev/null || true
  wait "$store_pid" 2>/dev/null || true
  cat "$tmp/$t.0.out" "$tmp/$t.2.out" "$tmp/$t.2r.out" >"$tmp/$t.out"
  [ "$status" -eq 0 ] || { echo "trial $t: exit $status" >&2; tail -3 "$tmp/$t".*.err >&2; }
}

case "$layout" in
  1x4) ;;
  2x2)
    bed=drs$((RANDOM % 10000))
    "$here/testbed/testbed.sh" up "$bed" 2 1gbit 250mbit >/dev/null
    ;;
  *) echo "dispatch_restart: layout must be 1x4 or 2x2, got '$layout'" >&2; exit 2 ;;
esac
for ((t = 0; t < trials; ++t)); do
  if [ "$layout" = 2x2 ]; then
    netnsTrial "$t"
  else
    RAILSHARD_TIMEOUT=30 timeout 120 "$launch" --max-restarts 1 -n 4 "$bench" "${args[@]}" \
      --json "$tmp/$t.json" >"$tmp/$t.out" 2>"$tmp/$t.err" || echo "trial $t: exit $?" >&2
  fi
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
    rejoined = re.search(r"# slot 2 rejoined .* handed its state at \d+ us \((.*)\)$", out, re.M)
    print(f"trial {t}: the restarted rank sees {rejoined.group(1)}")
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
