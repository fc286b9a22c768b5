#!/usr/bin/env bash
# How long a job under railshard-launch --max-restarts takes to get going again after a rank
# is SIGKILLed: 4 ranks of tests/programs/collective_check (verified all-reduces, --pace-ms 20
# per step standing in for compute), rank 2 killed at step 12, restarted by the launcher,
# joining through init() (RAILSHARD_JOIN=1) and admitted by the members' grow(). Per trial,
# from the ranks' own wall-clock stamps (one host, one clock):
#   shrink: kill -> the last survivor has its communicator of 3 (its first step on 3 follows)
#   rejoin: the restarted process's start -> the last rank has the communicator of 4
#   total:  kill -> the last rank has the communicator of 4
# Prints the median and maximum of each over the trials.
#
#   benchmarks/restart_times.sh [BUILD_DIR] [TRIALS]
set -euo pipefail
build=${1:-build}
trials=${2:-5}
launch="$build/launcher/tools/railshard-launch"
check="$build/tests/collective_check"
for bin in "$launch" "$check"; do
  [ -x "$bin" ] || { echo "no $bin (build the tests first)" >&2; exit 2; }
done
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

for ((t = 0; t < trials; ++t)); do
  RAILSHARD_TIMEOUT=60 timeout 120 "$launch" -n 4 --max-restarts 1 "$check" --iterations 150 \
    --die-rank 2 --die-after 12 --die-how kill --count 1000 --elastic 1 --grow 1 --pace-ms 20 \
    >"$tmp/$t.out" 2>"$tmp/$t.err" || echo "trial $t: exit $?" >&2
done

python3 - "$tmp" "$trials" <<'EOF'
import re, statistics, sys
tmp, trials = sys.argv[1], int(sys.argv[2])
rows = {"shrink": [], "rejoin": [], "total": []}
for t in range(trials):
    err = open(f"{tmp}/{t}.err").read()
    out = open(f"{tmp}/{t}.out").read()
    killed = re.search(r"failing on purpose \(kill\) at iteration \d+, at (\d+) us", err)
    shrunk = [int(x) for x in re.findall(r"in generation 1 \(shrink [0-9.]+ ms, at (\d+) us\)", err)]
    joined = re.search(r"\(joined at iteration \d+, at \d+ us; process started at (\d+) us\)", err)
    grown = [int(x) for x in re.findall(r"in generation 2 \((?:grew|joined) at iteration \d+, at (\d+) us", err)]
    ok = len(re.findall(r"of 4 ok after 150 allreduces", out))
    if not (killed and len(shrunk) == 3 and joined and len(grown) == 4 and ok == 4):
        print(f"trial {t}: incomplete (ok lines {ok}); stderr tail:\n{err[-600:]}", file=sys.stderr)
        continue
    kill, start = int(killed.group(1)), int(joined.group(1))
    rows["shrink"].append((max(shrunk) - kill) / 1e6)
    rows["rejoin"].append((max(grown) - start) / 1e6)
    rows["total"].append((max(grown) - kill) / 1e6)
for name, values in rows.items():
    if values:
        print(f"{name:7s} (s): n={len(values)} median {statistics.median(values):.3f} "
              f"max {max(values):.3f}")
    else:
        print(f"{name:7s} (s): n=0")
EOF
