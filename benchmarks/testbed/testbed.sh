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
#   testbed.sh job NAME CMD [ARGS...]        run CMD as one railshard job: TESTBED_RANKS ranks
#                                            per host (default 1; "2" on every host, or a list
#                                            per host such as "1,2,3"), numbered host by host,
#                                            the ranks of a host sharing its UTS namespace
#                                            name and network; store on host 0's rail0
#                                            address; waits for all; exit status: the first
#                                            failure's
#   testbed.sh rate NAME RAIL RATE           reshape a rail on every host (tc change)
#   testbed.sh link NAME HOST RAIL up|down   take one host's rail port down or up
#
# NAME: 1-8 characters [a-z0-9]. A job is bounded by TESTBED_TIMEOUT seconds (default 300).
set -euo pipefail

usage() { sed -n '2,26p' "$0" >&2; exit 2; }
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
    # Ranks per host: one figure for every host, or one per host.
    IFS=, read -r -a per_host <<<"${TESTBED_RANKS:-1}"
    if [ "${#per_host[@]}" -eq 1 ]; then
      mapfile -t per_host < <(for _ in "${all[@]}"; do echo "${per_host[0]}"; done)
    fi
    [ "${#per_host[@]}" -eq "$size" ] ||
      { echo "testbed: TESTBED_RANKS lists ${#per_host[@]} hosts, the bed has $size" >&2; exit 2; }
    world=0
    for n in "${per_host[@]}"; do
      [[ "$n" =~ ^[0-9]+$ ]] && [ "$n" -ge 1 ] && [ "$n" -le 16 ] ||
        { echo "testbed: ranks per host must be 1..16, got '$n'" >&2; exit 2; }
      world=$((world + n))
    done
    port=$((20000 + RANDOM % 20000))
    token="testbed-$RANDOM$RANDOM"
    pids=()
    trap 'kill "${pids[@]}" 2>/dev/null || true' EXIT INT TERM
    rank=0
    for h in $(seq 0 $((size - 1))); do
      for local in $(seq 0 $((per_host[h] - 1))); do
        RAILSHARD_RANK=$rank RAILSHARD_WORLD_SIZE=$world RAILSHARD_STORE_ADDR="10.200.0.1:$port" \
          RAILSHARD_LOCAL_RANK=$local RAILSHARD_TOKEN="$token" \
          timeout "${TESTBED_TIMEOUT:-300}" "$0" run "$name" "$h" "$@" &
        pids+=($!)
        rank=$((rank + 1))
      done
    done
    status=0
    for pid in "${pids[@]}"; do
      # Not `if ! wait`: $? is then the negation's 0, and every job looked successful.
      rc=0
      wait "$pid" || rc=$?
      if [ "$rc" -ne 0 ] && [ "$status" -eq 0 ]; then status=$rc; fi
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
