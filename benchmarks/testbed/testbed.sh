#!/usr/bin/env bash
# A cluster of H "hosts" on one machine: network namespaces NAME-h0 .. NAME-h<H-1>, each with
# one interface per rail (rail0, rail1, ...) plugged into that rail's bridge in a switch
# namespace NAME-sw. Rail i is the subnet 10.(200+i).0.0/24; host h has 10.(200+i).0.(h+1).
# Every port is shaped with htb in both directions (FIELD-NOTES: htb delivers ~95.5% of the
# rate as TCP payload). Addresses exist only inside these namespaces; nothing else is touched.
# Needs root and iproute2.
#
#   testbed.sh up NAME HOSTS RATE [RATE...]  create; one rail per RATE (400mbit, 2gbit, none)
#   testbed.sh down NAME                     delete every namespace of NAME (and its links)
#   testbed.sh run NAME HOST CMD [ARGS...]   run CMD in host HOST (0-based) under its own UTS
#                                            namespace with host name NAME-hHOST, so railshard
#                                            sees a separate machine
#   testbed.sh job NAME CMD [ARGS...]        run CMD once per host as one railshard job (rank =
#                                            host; store on host 0's rail0 address), wait for
#                                            all; exit status: the first failure's
#   testbed.sh rate NAME RAIL RATE           reshape a rail on every host (tc change)
#   testbed.sh link NAME HOST RAIL up|down   take one host's rail port down or up
#
# NAME: 1-8 characters [a-z0-9]. A job is bounded by TESTBED_TIMEOUT seconds (default 300).
set -euo pipefail

usage() { sed -n '2,22p' "$0" >&2; exit 2; }
[ $# -ge 2 ] || usage
cmd=$1
name=$2
shift 2
[[ "$name" =~ ^[a-z0-9]{1,8}$ ]] || { echo "testbed: bad name '$name'" >&2; exit 2; }
sw="$name-sw"

hosts_of() { ip netns list | awk '{print $1}' | grep -E "^$name-h[0-9]+$" | sort -V; }

shape() {  # shape NS DEV RATE
  local ns=$1 dev=$2 rate=$3
  if tc -n "$ns" qdisc show dev "$dev" | grep -q htb; then
    if [ "$rate" = none ]; then
      tc -n "$ns" qdisc del dev "$dev" root
    else
      tc -n "$ns" class change dev "$dev" parent 1: classid 1:10 htb rate "$rate" ceil "$rate" \
        burst 256kb cburst 256kb quantum 60000
    fi
    return 0
  fi
  [ "$rate" = none ] && return 0
  tc -n "$ns" qdisc add dev "$dev" root handle 1: htb default 10
  tc -n "$ns" class add dev "$dev" parent 1: classid 1:10 htb rate "$rate" ceil "$rate" \
    burst 256kb cburst 256kb quantum 60000
}

down() {
  for ns in $(hosts_of) "$sw"; do ip netns del "$ns" 2>/dev/null || true; done
}

case "$cmd" in
  up)
    [ $# -ge 2 ] || usage
    hosts=$1
    shift
    [[ "$hosts" =~ ^[0-9]+$ ]] && [ "$hosts" -ge 2 ] && [ "$hosts" -le 32 ] ||
      { echo "testbed: HOSTS must be 2..32" >&2; exit 2; }
    trap down ERR
    ip netns add "$sw"
    for h in $(seq 0 $((hosts - 1))); do
      ip netns add "$name-h$h"
      ip -n "$name-h$h" link set lo up
    done
    rail=0
    for rate in "$@"; do
      ip -n "$sw" link add "br$rail" type bridge
      ip -n "$sw" link set "br$rail" up
      for h in $(seq 0 $((hosts - 1))); do
        host_end="${name}h${h}r${rail}"
        sw_end="${name}s${h}r${rail}"
        ip link add "$host_end" type veth peer name "$sw_end"
        ip link set "$host_end" netns "$name-h$h"
        ip link set "$sw_end" netns "$sw"
        ip -n "$name-h$h" link set "$host_end" name "rail$rail"
        ip -n "$name-h$h" addr add "10.$((200 + rail)).0.$((h + 1))/24" dev "rail$rail"
        ip -n "$name-h$h" link set "rail$rail" up
        ip -n "$sw" link set "$sw_end" master "br$rail"
        shape "$name-h$h" "rail$rail" "$rate"
        shape "$sw" "$sw_end" "$rate"
        ip -n "$sw" link set "$sw_end" up
      done
      rail=$((rail + 1))
    done
    ;;
  down)
    down
    ;;
  run)
    [ $# -ge 2 ] || usage
    host=$1
    shift
    exec ip netns exec "$name-h$host" unshare --uts /bin/sh -c 'hostname "$0" && exec "$@"' \
      "$name-h$host" "$@"
    ;;
  job)
    [ $# -ge 1 ] || usage
    mapfile -t all < <(hosts_of)
    size=${#all[@]}
    [ "$size" -ge 2 ] || { echo "testbed: no test bed '$name' (run up first)" >&2; exit 2; }
    port=$((20000 + RANDOM % 20000))
    token="testbed-$RANDOM$RANDOM"
    pids=()
    trap 'kill "${pids[@]}" 2>/dev/null || true' EXIT INT TERM
    for h in $(seq 0 $((size - 1))); do
      RAILSHARD_RANK=$h RAILSHARD_WORLD_SIZE=$size RAILSHARD_STORE_ADDR="10.200.0.1:$port" \
        RAILSHARD_TOKEN="$token" timeout "${TESTBED_TIMEOUT:-300}" "$0" run "$name" "$h" "$@" &
      pids+=($!)
    done
    status=0
    for pid in "${pids[@]}"; do
      if ! wait "$pid"; then
        rc=$?
        [ "$status" -eq 0 ] && status=$rc
      fi
    done
    exit "$status"
    ;;
  rate)
    [ $# -eq 2 ] || usage
    rail=$1
    for ns in $(hosts_of); do
      h=${ns##*-h}
      shape "$ns" "rail$rail" "$2"
      shape "$sw" "${name}s${h}r${rail}" "$2"
    done
    ;;
  link)
    [ $# -eq 3 ] || usage
    ip -n "$name-h$1" link set "rail$2" "$3"
    ;;
  *) usage ;;
esac
