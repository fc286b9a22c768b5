#!/usr/bin/env bash
# Issue #23's PyTorch kill-and-restart target, side by side with torchrun: examples/train.py
# (4 ranks, DDP, 1 ms of emulated compute per sample, global batch 512), rank 2 SIGKILLs
# itself after step 12.
#   railshard: railshard-launch --max-restarts 1 and train.py --elastic (ElasticGroup +
#     ElasticDataParallel): the survivors shrink and go on, the restarted process joins
#     at a step boundary and is handed model, optimizer and ledger.
#   torchrun:  torchrun --max-restarts 1 and train.py (plain DDP, backend railshard): torchrun
#     stops every worker and starts the group again; no checkpoint, so it begins at step 0.
# Trials alternate between the two. Per trial, from the processes' own wall-clock stamps (one
# host, one clock):
#   kill -> first step on 3 ranks   (railshard only: torchrun has no 3-rank phase)
#   start -> first step on 4 ranks  (the restarted process's start, before it imports torch,
#                                   -> its first step)
#   kill -> first step on 4 ranks
#   regain steps (railshard): steps on 4 ranks until one is within 5% of the median step
#     before the kill
# Prints medians and maxima; the ledger of every epoch must say "exactly once", and every
# replica's parameter checksum must be the same (the joiner's too).
#
#   benchmarks/elastic_restart.sh [TORCH_BUILD_DIR] [TRIALS] [LAYOUT]
# TORCH_BUILD_DIR: a build with the extension for the venv's torch (default build-torch2), or
# "installed": railshard is pip-installed for RAILSHARD_BENCH_PYTHON (the tools are that
# environment's console commands, nothing goes on PYTHONPATH).
# torchrun trials need /opt/railshard-torch-venv (scripts/torch_venv.sh); without it only
# railshard's run.
# LAYOUT 1x4 (default): one host, railshard-launch. LAYOUT 2x2: two emulated hosts of the
# namespace test bed (benchmarks/testbed/testbed.sh, rails 1gbit and 250mbit, needs root),
# two ranks each started by hand, the store in railshard-store on host 0; when rank 2 (host
# 1) dies the script starts it again there with RAILSHARD_JOIN=1, as a supervisor would. No
# torchrun trials in 2x2.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
trials=${2:-3}
layout=${3:-1x4}
venv=${RAILSHARD_TORCH_VENV:-/opt/railshard-torch-venv}
# RAILSHARD_BENCH_PYTHON: the interpreter the ranks run (its torch must be the build's).
python=${RAILSHARD_BENCH_PYTHON:-$venv/bin/python}
[ -x "$python" ] || python=python3
if [ "${1:-}" = installed ]; then
  tools=$(dirname "$python")
  pypath=""
else
  build=$(cd "$root" && cd "${1:-build-torch2}" && pwd)  # relative to the checkout, or absolute
  tools=$build/launcher/tools
  pypath=$build/python
fi
launch=$tools/railshard-launch
[ -x "$launch" ] || { echo "no $launch (build railshard-launch)" >&2; exit 2; }
store=$tools/railshard-store
if [ "$layout" = 2x2 ] && [ ! -x "$store" ]; then
  echo "no $store (cmake --build BUILD --target railshard-store)" >&2
  exit 2
fi
tmp=$(mktemp -d)
bed=""
cleanup() {
  [ -n "$bed" ] && "$root/benchmarks/testbed/testbed.sh" down "$bed"
  rm -rf "$tmp"
}
trap cleanup EXIT
common=(--steps 60 --kill 2:12)

# One railshard trial on the test bed: ranks 0,1 on host 0, ranks 2,3 on host 1, each rank's
# lines prefixed "[r] " as railshard-launch would, into railshard.$t.out.
netnsTrial() {
  local t=$1 tb="$root/benchmarks/testbed/testbed.sh" port=$((20000 + RANDOM % 20000))
  local pids=() r status=0
  local env=(RAILSHARD_WORLD_SIZE=4 RAILSHARD_STORE_ADDR=10.200.0.1:$port
             RAILSHARD_STORE_EXTERNAL=1 RAILSHARD_TOKEN=elastic-bench
             PYTHONPATH="$pypath" OMP_NUM_THREADS=1)
  rm -f "$tmp/addr"
  "$tb" run "$bed" 0 env RAILSHARD_TOKEN=elastic-bench "$store" --host 10.200.0.1 \
    --port "$port" --address-file "$tmp/addr" >/dev/null 2>"$tmp/store.err" &
  local store_pid=$!
  for _ in $(seq 200); do [ -s "$tmp/addr" ] && break; sleep 0.05; done
  for r in 0 1 2 3; do
    timeout 300 "$tb" run "$bed" $((r / 2)) env "${env[@]}" RAILSHARD_RANK=$r \
      RAILSHARD_LOCAL_RANK=$((r % 2)) "$python" "$root/examples/train.py" --elastic \
      "${common[@]}" >"$tmp/$t.$r.out" 2>&1 &
    pids+=($!)
  done
  { wait "${pids[2]}"; } 2>/dev/null || true  # rank 2 kills itself after step 12: again
  timeout 300 "$tb" run "$bed" 1 env "${env[@]}" RAILSHARD_RANK=2 RAILSHARD_LOCAL_RANK=0 \
    RAILSHARD_JOIN=1 "$python" "$root/examples/train.py" --elastic "${common[@]}" \
    >"$tmp/$t.2r.out" 2>&1 &
  pids+=($!)
  for r in 0 1 3 4; do wait "${pids[$r]}" || status=$?; done
  kill "$store_pid" 2>/dev/null || true
  wait "$store_pid" 2>/dev/null || true
  for r in 0 1 2 2r 3; do sed "s/^/[${r%r}] /" "$tmp/$t.$r.out"; done >"$tmp/railshard.$t.out"
  [ "$status" -eq 0 ] || echo "railshard trial $t: exit $status" >&2
}

case "$layout" in
  1x4) ;;
  2x2)
    bed=ers$((RANDOM % 10000))
    "$root/benchmarks/testbed/testbed.sh" up "$bed" 2 1gbit 250mbit >/dev/null
    ;;
  *) echo "elastic_restart: layout must be 1x4 or 2x2, got '$layout'" >&2; exit 2 ;;
esac

for ((t = 0; t < trials; ++t)); do
  if [ "$layout" = 2x2 ]; then
    netnsTrial "$t"
    continue
  fi
  PYTHONPATH="$pypath" OMP_NUM_THREADS=1 timeout 300 "$launch" -n 4 \
    --max-restarts 1 "$python" "$root/examples/train.py" --elastic "${common[@]}" \
    >"$tmp/railshard.$t.out" 2>&1 || echo "railshard trial $t: exit $?" >&2
  if [ -x "$venv/bin/torchrun" ]; then
    # TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1: see benchmarks/torchrun_restart.sh.
    TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 PYTHONPATH="$pypath" OMP_NUM_THREADS=1 \
      timeout 300 "$venv/bin/torchrun" --standalone --nproc_per_node 4 --max-restarts 1 \
      "$root/examples/train.py" --backend railshard "${common[@]}" --quiet \
      >"$tmp/torchrun.$t.out" 2>&1 || echo "torchrun trial $t: exit $?" >&2
  fi
done

"$python" - "$tmp" "$trials" <<'PY'
import os, re, statistics, sys
tmp, trials = sys.argv[1], int(sys.argv[2])
rows = {}
def add(name, value):
    rows.setdefault(name, []).append(value)
for t in range(trials):
    out = open(f"{tmp}/railshard.{t}.out").read()
    killed = re.search(r"rank 2 kills itself after step 12 at (\d+) us", out)
    shrunk = re.search(r"first step after the loss \(step \d+, 3 ranks\) done at (\d+) us", out)
    joined = re.search(r"first step after joining \(step (\d+), 4 ranks\) done at (\d+) us; "
                       r"process started at (\d+) us", out)
    ledgers = re.findall(r"# ledger: epoch \d+: .*", out)
    if not (killed and shrunk and joined and "train.py: done" in out):
        print(f"railshard trial {t}: incomplete; output tail:\n{out[-2000:]}", file=sys.stderr)
        continue
    kill_us = int(killed.group(1))
    add("railshard kill -> first step on 3 ranks (s)", (int(shrunk.group(1)) - kill_us) / 1e6)
    add("railshard start -> first step on 4 ranks (s)",
        (int(joined.group(2)) - int(joined.group(3))) / 1e6)
    add("railshard kill -> first step on 4 ranks (s)", (int(joined.group(2)) - kill_us) / 1e6)
    steps = {int(s): (int(r), float(ms)) for s, r, ms in
             re.findall(r"\] step +(\d+) epoch \d+ \| ranks (\d) \|.*\| step +([\d.]+) ms", out)}
    before = statistics.median(ms for s, (r, ms) in steps.items() if 4 <= s < 12)
    first = int(joined.group(1))
    regain = next((s - first + 1 for s in sorted(steps) if s >= first and steps[s][0] == 4
                   and steps[s][1] <= before * 1.05), None)
    if regain is not None:
        add("railshard regain steps", regain)
    ok = all("exactly once" in line for line in ledgers) and ledgers
    sums = dict(re.findall(r"launch rank (\d+) parameter checksum (\S+)", out))
    agree = len(sums) == 4 and len(set(sums.values())) == 1
    where = re.search(r"joined the running job as launch rank \d+: (imports [\d.]+ s, "
                      r"ElasticGroup\(\) [\d.]+ s)", out)
    if where:
        print(f"railshard trial {t}: the joiner's {where.group(1)}")
    print(f"railshard trial {t}: joined before step {first}; median step before the kill "
          f"{before:.1f} ms; ledgers {'all exactly once' if ok else 'NOT OK: ' + str(ledgers)}; "
          f"replicas {'agree' if agree else 'DISAGREE: ' + str(sums)}")
for t in range(trials):
    path = f"{tmp}/torchrun.{t}.out"
    if not os.path.exists(path):
        continue
    out = open(path).read()
    killed = re.search(r"rank 2 kills itself after step 12 at (\d+) us", out)
    first = re.search(r"first step after restart 1 \(step (\d+)\) done at (\d+) us; "
                      r"process started at (\d+) us", out)
    if not (killed and first and "train.py: done" in out):
        print(f"torchrun trial {t}: incomplete; output tail:\n{out[-1500:]}", file=sys.stderr)
        continue
    add("torchrun start -> first step on 4 ranks (s)",
        (int(first.group(2)) - int(first.group(3))) / 1e6)
    add("torchrun kill -> first step on 4 ranks (s)",
        (int(first.group(2)) - int(killed.group(1))) / 1e6)
    print(f"torchrun trial {t}: the restarted group began again at step {first.group(1)}")
for name, values in rows.items():
    print(f"{name:46s} n={len(values)} median {statistics.median(values):.3f} "
          f"max {max(values):.3f}")
PY
