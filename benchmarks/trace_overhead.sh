#!/usr/bin/env bash
# Tracing overhead: allreduce_perf with RAILSHARD_TRACE off and on, alternated round by round
# on the same machine so that noise hits both alike; prints the median out-of-place time of
# each size with and without tracing and their ratio.
#
#   benchmarks/trace_overhead.sh [BUILD_DIR] [ROUNDS] [RANKS] [TRANSPORT]
#   (defaults: build 5 2 tcp; TRANSPORT tcp or shm)
set -euo pipefail
build=${1:-build}
rounds=${2:-5}
ranks=${3:-2}
transport=${4:-tcp}
launch="$build/launcher/tools/railshard-launch"
perf="$build/benchmarks/allreduce_perf"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

for ((i = 0; i < rounds; i++)); do
  for mode in off on; do
    env_args=(RAILSHARD_TRANSPORT="$transport")
    [ "$mode" = on ] && env_args+=(RAILSHARD_TRACE="$work/trace")
    env "${env_args[@]}" timeout 300 "$launch" -n "$ranks" --no-prefix "$perf" \
      -b 4K -e 64M -f 4 -n 20 -w 3 -c 0 >"$work/$mode.$i.txt" 2>/dev/null
  done
done

python3 - "$work" "$rounds" "$ranks" "$transport" <<'EOF'
import statistics, sys, glob, os
work, rounds, ranks, transport = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
def times(path):
    out = {}
    for line in open(path):
        f = line.split()
        if f and f[0].isdigit() and len(f) >= 8:
            out[int(f[0])] = float(f[5])  # out-of-place time (us)
    return out
runs = {m: [times(os.path.join(work, f"{m}.{i}.txt")) for i in range(rounds)] for m in ("off", "on")}
print(f"# {ranks} ranks, transport {transport}, {rounds} alternated rounds, median of each")
print(f"# {'size(B)':>10} {'off(us)':>10} {'on(us)':>10} {'on/off':>7}  (per-round on/off: median)")
ratios_all = []
for size in sorted(runs["off"][0]):
    off = statistics.median(r[size] for r in runs["off"])
    on = statistics.median(r[size] for r in runs["on"])
    paired = statistics.median(runs["on"][i][size] / runs["off"][i][size] for i in range(rounds))
    ratios_all.append(paired)
    print(f"  {size:>10} {off:>10.1f} {on:>10.1f} {on/off:>7.3f}  {paired:.3f}")
print(f"# median over sizes of the per-round ratio: {statistics.median(ratios_all):.3f}")
EOF
