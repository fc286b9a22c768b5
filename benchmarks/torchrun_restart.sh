#!/usr/bin/env bash
# The PyTorch baseline for issue #23's kill-and-restart target: torchrun --max-restarts 1
# restarting examples/train.py (DDP + ThroughputSampler, 4 ranks, 1 ms of emulated compute per
# sample) after rank 2 SIGKILLs itself after step 12. torchrun stops every worker and starts the
# whole group again; train.py keeps no checkpoint, so the restarted group begins at step 0.
# Per trial, from the processes' own wall-clock stamps (one host, one clock):
#   kill -> first step: the SIGKILL -> the restarted group's first step is done
#   start -> first step: the restarted rank 0's process start -> that step done
# Prints the median and maximum over the trials.
#
#   benchmarks/torchrun_restart.sh [TORCH_BUILD_DIR] [TRIALS] [BACKEND]
# TORCH_BUILD_DIR: a build with the extension for the venv's torch (default build-torch2);
# BACKEND: railshard (default) or gloo. Needs /opt/railshard-torch-venv (scripts/torch_venv.sh).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-build-torch2}
trials=${2:-3}
backend=${3:-railshard}
venv=${RAILSHARD_TORCH_VENV:-/opt/railshard-torch-venv}
[ -x "$venv/bin/torchrun" ] || { echo "no $venv/bin/torchrun (scripts/torch_venv.sh)" >&2; exit 2; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

for ((t = 0; t < trials; ++t)); do
  # TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1: torch >= 2.5 shares the rendezvous store with the
  # workers, and restarted workers read the previous attempt's keys (gloo and railshard alike
  # fail to connect; pytorch/pytorch#135712); this is torch's own workaround.
  TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 PYTHONPATH="$root/$build/python" OMP_NUM_THREADS=1 \
    timeout 300 "$venv/bin/torchrun" \
    --standalone --nproc_per_node 4 --max-restarts 1 "$root/examples/train.py" \
    --backend "$backend" --steps 30 --kill 2:12 --quiet >"$tmp/$t.out" 2>&1 ||
    echo "trial $t: exit $?" >&2
done

python3 - "$tmp" "$trials" <<'PY'
import re, statistics, sys
tmp, trials = sys.argv[1], int(sys.argv[2])
rows = {"kill -> first step (s)": [], "start -> first step (s)": []}
for t in range(trials):
    out = open(f"{tmp}/{t}.out").read()
    killed = re.search(r"rank 2 kills itself after step 12 at (\d+) us", out)
    first = re.search(r"first step after restart 1 \(step (\d+)\) done at (\d+) us; "
                      r"process started at (\d+) us", out)
    done = "train.py: done" in out
    if not (killed and first and done):
        print(f"trial {t}: incomplete; output tail:\n{out[-1500:]}", file=sys.stderr)
        continue
    rows["kill -> first step (s)"].append((int(first.group(2)) - int(killed.group(1))) / 1e6)
    rows["start -> first step (s)"].append((int(first.group(2)) - int(first.group(3))) / 1e6)
    print(f"trial {t}: restarted group began again at step {first.group(1)}")
for name, values in rows.items():
    if values:
        print(f"{name:24s} n={len(values)} median {statistics.median(values):.3f} "
              f"max {max(values):.3f}")
    else:
        print(f"{name:24s} n=0")
PY
