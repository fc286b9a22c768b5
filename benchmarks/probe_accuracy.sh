#!/usr/bin/env bash
# How well the start-up link probe (RAILSHARD_PROBE=1) measures rails: two "hosts" in network
# namespaces joined by two rails shaped with htb (benchmarks/testbed/testbed.sh), one rank in
# each, railshard-topo as the program. Prints, per repetition, each rail's shaped rate, the
# probe's bandwidth and latency, and the ratio measured / (0.955 x shaped) - htb delivers
# 95.5% of the rate as TCP payload (FIELD-NOTES) - then the medians. Needs root.
#
#   benchmarks/probe_accuracy.sh [BUILD_DIR] [REPS] [RATE0] [RATE1] [PROBE_MS]
set -euo pipefail
build=${1:-build}
reps=${2:-5}
rate0=${3:-1gbit}
rate1=${4:-250mbit}
probe_ms=${5:-300}
here=$(cd "$(dirname "$0")/.." && pwd)
bed="$here/benchmarks/testbed/testbed.sh"
topo="$build/launcher/tools/railshard-topo"
name="rsp$$"
name=${name:0:8}
trap '"$bed" down "$name"' EXIT
"$bed" up "$name" 2 "$rate0" "$rate1"

to_gbit() {  # 1gbit / 250mbit / 400kbit -> Gbit/s
  python3 -c "import re,sys; m=re.fullmatch(r'([0-9.]+)([kmg]?)bit', sys.argv[1]); \
print(float(m[1]) * {'k':1e-6,'m':1e-3,'g':1}[m[2]] if m[2] else float(m[1])*1e-9)" "$1"
}
shaped0=$(to_gbit "$rate0")
shaped1=$(to_gbit "$rate1")

results=$(mktemp)
for rep in $(seq 1 "$reps"); do
  out=$(mktemp)
  RAILSHARD_PROBE=1 RAILSHARD_PROBE_MS="$probe_ms" RAILSHARD_TOPO_DUMP="$out" \
    TESTBED_TIMEOUT=120 "$bed" job "$name" "$topo" >/dev/null
  python3 - "$out" "$shaped0" "$shaped1" "$rep" >>"$results" <<'PY'
import json, sys
graph = json.load(open(sys.argv[1]))
shaped = [float(sys.argv[2]), float(sys.argv[3])]
for link in graph["links"]:
    if "measured_gbps" not in link:
        continue
    rail = int(link["a"][-1])
    print(sys.argv[4], rail, shaped[rail], link["measured_gbps"], link["latency_us"],
          link["measured_gbps"] / (0.955 * shaped[rail]))
PY
  rm -f "$out"
done
python3 - "$results" <<'PY'
import statistics, sys
rows = [line.split() for line in open(sys.argv[1])]
print(f"{'rep':>3} {'rail':>4} {'shaped_gbps':>11} {'measured_gbps':>13} {'latency_us':>10} {'ratio':>6}")
for r in rows:
    print(f"{r[0]:>3} {r[1]:>4} {float(r[2]):>11.3f} {float(r[3]):>13.3f} {float(r[4]):>10.1f} {float(r[5]):>6.3f}")
for rail in sorted({r[1] for r in rows}):
    sel = [r for r in rows if r[1] == rail]
    print(f"median rail {rail}: shaped {float(sel[0][2]):.3f} Gbit/s, measured "
          f"{statistics.median(float(r[3]) for r in sel):.3f} Gbit/s, latency "
          f"{statistics.median(float(r[4]) for r in sel):.1f} us, ratio "
          f"{statistics.median(float(r[5]) for r in sel):.3f} (n={len(sel)})")
PY
rm -f "$results"
