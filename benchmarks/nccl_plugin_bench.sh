#!/usr/bin/env bash
# The NCCL network plugin's fused device between two namespaced hosts joined by two unequal
# rails (default 1 Gbit + 250 Mbit), against iperf3 on both rails at once, with the equal
# split that NCCL's NIC fusion and aws-ofi-nccl do (RAILSHARD_RAIL_WEIGHTS=static: the veths'
# nominal speeds are equal) side by side in the same run, alternating, REPS times each.
# nccl_net_bench drives the plugin as NCCL's proxy does: COMMS connections, 8 requests in
# flight each, BYTES per message, every byte checked.
#
#   benchmarks/nccl_plugin_bench.sh BUILD [--reps 3] [--rates "1gbit 250mbit"] [--comms 8]
#                                   [--bytes 4194304] [--messages 30] [--out DIR]
#
# Prints one line per run and a summary (medians, ratios to iperf3). Needs root, iproute2,
# iperf3. The test bed is torn down on exit.
set -euo pipefail

build=${1:?usage: nccl_plugin_bench.sh BUILD [options]}
shift
reps=3 rates="1gbit 250mbit" comms=8 bytes=4194304 messages=30 out=/tmp/nccl_plugin_bench
while [ $# -gt 0 ]; do
  case $1 in
    --reps) reps=$2; shift 2 ;;
    --rates) rates=$2; shift 2 ;;
    --comms) comms=$2; shift 2 ;;
    --bytes) bytes=$2; shift 2 ;;
    --messages) messages=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done
here=$(cd "$(dirname "$0")" && pwd)
testbed=$here/testbed/testbed.sh
bench=$build/benchmarks/nccl_net_bench
plugin=$build/plugins/nccl/libnccl-net-railshard.so
[ -x "$bench" ] && [ -f "$plugin" ] || { echo "build $build lacks nccl_net_bench or the plugin" >&2; exit 2; }
name=ncb$$
name=${name:0:8}
mkdir -p "$out"
trap '"$testbed" down "$name" >/dev/null 2>&1 || true' EXIT
"$testbed" down "$name" >/dev/null 2>&1 || true
read -r -a rate <<<"$rates"
"$testbed" up "$name" 2 "${rate[@]}"
addr() { echo "10.$((200 + $2)).0.$(($1 + 1))"; }

# iperf3, both rails at once: 1 s omitted, 6 s measured.
for r in 0 1; do
  timeout 30 ip netns exec "$name-h1" iperf3 -s -1 -B "$(addr 1 $r)" -p $((5300 + r)) \
    >"$out/iperf_server$r.log" 2>&1 &
done
sleep 1
for r in 0 1; do
  timeout 30 ip netns exec "$name-h0" iperf3 -c "$(addr 1 $r)" -B "$(addr 0 $r)" \
    -p $((5300 + r)) -t 6 -O 1 -J >"$out/iperf$r.json" &
done
wait
iperf=$(python3 -c 'import json,sys
print("%.4f" % sum(json.load(open(f))["end"]["sum_received"]["bits_per_second"] / 1e9 for f in sys.argv[1:]))' \
  "$out/iperf0.json" "$out/iperf1.json")
echo "iperf3 both rails: $iperf Gbit/s"

run() {  # MODE REP -> prints the receiver's Gbit/s
  local mode=$1 rep=$2 handles="$out/handles.$mode.$rep"
  rm -f "$handles"
  local args=(--plugin "$plugin" --handle-file "$handles" --comms "$comms" --bytes "$bytes"
    --messages "$messages")
  RAILSHARD_RAIL_WEIGHTS=$mode timeout 120 "$testbed" run "$name" 0 "$bench" --role recv \
    "${args[@]}" >"$out/recv.$mode.$rep.log" 2>&1 &
  local receiver=$!
  RAILSHARD_RAIL_WEIGHTS=$mode timeout 120 "$testbed" run "$name" 1 "$bench" --role send \
    "${args[@]}" >"$out/send.$mode.$rep.log" 2>&1
  wait $receiver
  grep -q "wrong=0" "$out/recv.$mode.$rep.log" || { echo "$mode rep $rep: bytes wrong" >&2; exit 1; }
  sed -n 's/^result .*gbps=\([0-9.]*\) .*/\1/p' "$out/recv.$mode.$rep.log"
}

declare -A results
for rep in $(seq "$reps"); do
  for mode in adaptive static; do
    g=$(run $mode "$rep")
    echo "rep $rep $mode: $g Gbit/s"
    results[$mode]+="$g "
  done
done
python3 - "$iperf" "${results[adaptive]}" "${results[static]}" <<'EOF'
import statistics, sys
iperf = float(sys.argv[1])
adaptive = [float(x) for x in sys.argv[2].split()]
static = [float(x) for x in sys.argv[3].split()]
ma, ms = statistics.median(adaptive), statistics.median(static)
print(f"median fused by measured rate {ma:.4f} Gbit/s = {100 * ma / iperf:.1f} % of iperf3; "
      f"equal split {ms:.4f} = {100 * ms / iperf:.1f} %; ratio {ma / ms:.2f}")
EOF
