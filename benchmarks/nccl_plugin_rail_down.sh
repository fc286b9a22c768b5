#!/bin/bash
# The plugin's fused device with a rail taken down mid-stream and brought back: 2 namespaced
# hosts, 1 Gbit + 250 Mbit, rail1 (250 Mbit) down 3 s after the start and up 3 s later; 8
# connections x 4 MiB messages; the receiver prints Gbit/s per 250 ms window.
#   benchmarks/nccl_plugin_rail_down.sh BUILD    (M=messages per connection, RT=RAILSHARD_RAIL_TIMEOUT)
# Logs: /tmp/tl.recv.log (timeline), /tmp/tl.send.log (take-out and re-admission lines).
set -e
tb=$(cd "$(dirname "$0")" && pwd)/testbed/testbed.sh; b=${1:?usage: nccl_plugin_rail_down.sh BUILD}
name=tl$$; name=${name:0:8}
trap "$tb down $name >/dev/null 2>&1 || true" EXIT
$tb down $name >/dev/null 2>&1 || true
$tb up $name 2 1gbit 250mbit
rm -f /tmp/tl.handles
args=(--plugin $b/plugins/nccl/libnccl-net-railshard.so --handle-file /tmp/tl.handles --comms 8 --bytes 4194304 --messages ${M:-40} --window-ms 250)
RAILSHARD_RAIL_TIMEOUT=${RT:-1} timeout 120 $tb run $name 0 $b/benchmarks/nccl_net_bench --role recv "${args[@]}" > /tmp/tl.recv.log 2>&1 &
r=$!
RAILSHARD_RAIL_TIMEOUT=${RT:-1} timeout 120 $tb run $name 1 $b/benchmarks/nccl_net_bench --role send "${args[@]}" > /tmp/tl.send.log 2>&1 &
s=$!
sleep 3; $tb link $name 1 1 down; echo "down at $(date +%s.%N)"
sleep 3; $tb link $name 1 1 up; echo "up at $(date +%s.%N)"
wait $s; wait $r
