#!/usr/bin/env bash
# The plugin's fused device with a rail taken down mid-stream and brought back, REPS times:
# 2 namespaced hosts joined by rail0 and rail1 (default 1 Gbit + 250 Mbit), 8 connections x
# 4 MiB messages (nccl_net_bench, every byte checked); rail1's veth is taken down DOWN_AT s
# after the stream starts and brought back UP_FOR s later. Before the runs, iperf3 on rail0
# alone: the rate the stream should keep while rail1 is down. Per run, from the bench's timed
# log lines and its receive timeline (100 ms windows, on the system clock):
#   out      median over the 8 connections of (rail1 taken out) - (link down)
#   gap      the longest time without a completed receive after the link went down
#   rate     payload delivered from (link down) to (link up), over rail0's iperf3
#   back     median over the connections of (rail1 re-admitted) - (link up), how often
#            rail1 was taken out again after it came back, and the payload rate from 1 s after
#            the link came back to the end, over rail0's iperf3 (above 100 %: rail1 carries)
# then the medians over the runs.
#
#   benchmarks/nccl_plugin_rail_down.sh BUILD [--reps 5] [--rail-timeout 0.5]
#                                       [--rates "1gbit 250mbit"] [--out DIR]
# Needs root, iproute2, iperf3; the test bed is torn down on exit.
set -euo pipefail
build=${1:?usage: nccl_plugin_rail_down.sh BUILD [options]}
shift
reps=5 rail_timeout=0.5 rates="1gbit 250mbit" out=/tmp/nccl_rail_down
down_at=3 up_for=4 messages=60
while [ $# -gt 0 ]; do
  case $1 in
    --reps) reps=$2; shift 2 ;;
    --rail-timeout) rail_timeout=$2; shift 2 ;;
    --rates) rates=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done
here=$(cd "$(dirname "$0")" && pwd)
tb=$here/testbed/testbed.sh
bench=$build/benchmarks/nccl_net_bench
plugin=$build/plugins/nccl/libnccl-net-railshard.so
[ -x "$bench" ] && [ -f "$plugin" ] || { echo "build $build lacks nccl_net_bench or the plugin" >&2; exit 2; }
name=rd$$
name=${name:0:8}
mkdir -p "$out"
rm -f "$out/summary"
trap '"$tb" down "$name" >/dev/null 2>&1 || true' EXIT
"$tb" down "$name" >/dev/null 2>&1 || true
read -r -a rate <<<"$rates"
"$tb" up "$name" 2 "${rate[@]}" >/dev/null
addr() { echo "10.$((200 + $2)).0.$(($1 + 1))"; }

# rail0 alone: 1 s omitted, 5 s measured.
timeout 30 ip netns exec "$name-h1" iperf3 -s -1 -B "$(addr 1 0)" -p 5300 >/dev/null 2>&1 &
sleep 1
timeout 30 ip netns exec "$name-h0" iperf3 -c "$(addr 1 0)" -B "$(addr 0 0)" -p 5300 -t 5 -O 1 \
  -J >"$out/iperf0.json"
wait
iperf=$(python3 -c 'import json,sys; print("%.4f" % (json.load(open(sys.argv[1]))["end"]["sum_received"]["bits_per_second"] / 1e9))' "$out/iperf0.json")
echo "iperf3 rail0 alone: $iperf Gbit/s"

for rep in $(seq "$reps"); do
  handles=$out/handles.$rep
  rm -f "$handles"
  args=(--plugin "$plugin" --handle-file "$handles" --comms 8 --bytes 4194304
    --messages "$messages" --window-ms 100)
  RAILSHARD_RAIL_TIMEOUT=$rail_timeout timeout 120 "$tb" run "$name" 0 "$bench" --role recv \
    "${args[@]}" >"$out/recv.$rep.log" 2>&1 &
  receiver=$!
  RAILSHARD_RAIL_TIMEOUT=$rail_timeout timeout 120 "$tb" run "$name" 1 "$bench" --role send \
    "${args[@]}" >"$out/send.$rep.log" 2>&1 &
  sender=$!
  # From the first delivery on (the receiver's first timeline window is its start).
  for _ in $(seq 200); do
    grep -q "send device" "$out/send.$rep.log" 2>/dev/null && break
    sleep 0.05
  done
  sleep "$down_at"
  down=$(date +%s.%N)
  "$tb" link "$name" 1 1 down >/dev/null
  sleep "$up_for"
  up=$(date +%s.%N)
  "$tb" link "$name" 1 1 up >/dev/null
  wait "$sender"
  wait "$receiver"
  grep -q "wrong=0" "$out/recv.$rep.log" || { echo "rep $rep: bytes wrong" >&2; exit 1; }
  echo "$down $up" >"$out/times.$rep"
  python3 - "$out" "$rep" "$iperf" <<'PY'
import re, statistics, sys
out, rep, iperf = sys.argv[1], sys.argv[2], float(sys.argv[3])
down, up = map(float, open(f"{out}/times.{rep}").read().split())
send = open(f"{out}/send.{rep}.log").read()
comms = 8
outs = [float(t) for t in re.findall(r"^\[([\d.]+)\] .*rail1 .* taken out", send, re.M)]
backs = [float(t) for t in re.findall(r"^\[([\d.]+)\] .*rail1 .* is back", send, re.M)]
took = sorted(t - down for t in outs if t >= down)[:comms]
back = sorted(t - up for t in backs if t >= up)[:comms]
flaps = sum(1 for t in outs if t > up)  # taken out again after coming back
windows = [(float(e), float(g)) for e, g in re.findall(
    r"^timeline t=[\d.]+ epoch=([\d.]+) gbps=([\d.]+)", open(f"{out}/recv.{rep}.log").read(), re.M)]
span = [g for e, g in windows if down + 0.1 <= e <= up]
rate = statistics.mean(span) if span else 0.0
# The longest run of 100 ms windows without a completed receive after the link went down.
gap = run = 0
for e, g in windows:
    if e < down + 0.1 or e > up:
        continue
    run = run + 1 if g == 0 else 0
    gap = max(gap, run)
# After: from 1 s after the link came back to the last window (rail1 carrying again makes it
# more than rail0 alone can).
after = [g for e, g in windows if e >= up + 1.0]
after_rate = statistics.mean(after[:-1]) if len(after) > 1 else 0.0
def med(xs):
    return statistics.median(xs) if xs else float("nan")
print(f"run {rep}: out {med(took):.2f} s, no receive completed for {gap / 10:.1f} s, "
      f"{rate:.3f} Gbit/s from down to up = {100 * rate / iperf:.0f} % of rail0 alone, back "
      f"{med(back):.2f} s, taken out again {flaps} times after; from 1 s after up "
      f"{after_rate:.3f} Gbit/s = {100 * after_rate / iperf:.0f} % of rail0 alone")
with open(f"{out}/summary", "a") as f:
    f.write(f"{med(took)} {gap / 10} {rate / iperf} {med(back)} {flaps} {after_rate / iperf}\n")
PY
done
python3 - "$out/summary" <<'PY'
import statistics, sys
rows = [list(map(float, l.split())) for l in open(sys.argv[1]) if l.strip()]
out, gap, rate, back, flaps, after = (statistics.median(c) for c in zip(*rows))
print(f"median of {len(rows)} runs: rail1 taken out {out:.2f} s after its link went down; "
      f"no receive completed for {gap:.1f} s; from down to up {100 * rate:.0f} % of rail0's "
      f"iperf3 rate; rail1 re-admitted {back:.2f} s after its link came back, then taken out "
      f"again {flaps:.0f} times; from 1 s after it came back {100 * after:.0f} % of rail0's rate")
PY
