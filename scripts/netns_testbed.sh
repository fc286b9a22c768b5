#!/usr/bin/env bash
# A two-"host" test bed on one machine: network namespaces <name>-a and <name>-b joined by one
# veth pair per rail, rail i on subnet 10.(200+i).0.0/24 (a = .1, b = .2), each end shaped to
# its rate with htb (see FIELD-NOTES: delivers ~95.5% of the rate as TCP payload). Traffic
# never leaves the two namespaces. Needs root and iproute2.
#
#   netns_testbed.sh up NAME RATE [RATE...]   create; RATE like 400mbit, 1gbit, or "none"
#   netns_testbed.sh down NAME                delete both namespaces (and so the veths)
#   netns_testbed.sh run NAME a|b HOSTNAME CMD [ARGS...]
#                                             run CMD inside namespace a or b with its own UTS
#                                             namespace whose host name is HOSTNAME, so it looks
#                                             like a separate machine to railshard
#   netns_testbed.sh rate NAME RAIL RATE      reshape rail RAIL (both ends) to RATE
#
# NAME: at most 10 characters ([a-z0-9]); interfaces are NAMEa<i> / NAMEb<i>.
set -euo pipefail

usage() { sed -n '2,17p' "$0" >&2; exit 2; }
[ $# -ge 2 ] || usage
cmd=$1
name=$2
shift 2
[[ "$name" =~ ^[a-z0-9]{1,10}$ ]] || { echo "netns_testbed: bad name '$name'" >&2; exit 2; }

shape() {  # shape NS DEV RATE
  local ns=$1 dev=$2 rate=$3
  ip -n "$ns" link set "$dev" up
  tc -n "$ns" qdisc del dev "$dev" root 2>/dev/null || true
  [ "$rate" = none ] && return 0
  tc -n "$ns" qdisc add dev "$dev" root handle 1: htb default 10
  tc -n "$ns" class add dev "$dev" parent 1: classid 1:10 htb rate "$rate" ceil "$rate" \
    burst 256kb cburst 256kb quantum 60000
}

case "$cmd" in
  up)
    [ $# -ge 1 ] || usage
    ip netns add "$name-a"
    ip netns add "$name-b"
    trap 'ip netns del "$name-a" 2>/dev/null; ip netns del "$name-b" 2>/dev/null' ERR
    ip -n "$name-a" link set lo up
    ip -n "$name-b" link set lo up
    i=0
    for rate in "$@"; do
      ip link add "${name}a$i" type veth peer name "${name}b$i"
      ip link set "${name}a$i" netns "$name-a"
      ip link set "${name}b$i" netns "$name-b"
      ip -n "$name-a" addr add "10.$((200 + i)).0.1/24" dev "${name}a$i"
      ip -n "$name-b" addr add "10.$((200 + i)).0.2/24" dev "${name}b$i"
      shape "$name-a" "${name}a$i" "$rate"
      shape "$name-b" "${name}b$i" "$rate"
      i=$((i + 1))
    done
    ;;
  down)
    ip netns del "$name-a" 2>/dev/null || true
    ip netns del "$name-b" 2>/dev/null || true
    ;;
  run)
    [ $# -ge 3 ] || usage
    side=$1
    host=$2
    shift 2
    [[ "$side" =~ ^[ab]$ ]] || usage
    exec ip netns exec "$name-$side" unshare --uts /bin/sh -c 'hostname "$0" && exec "$@"' \
      "$host" "$@"
    ;;
  rate)
    [ $# -eq 2 ] || usage
    shape "$name-a" "${name}a$1" "$2"
    shape "$name-b" "${name}b$1" "$2"
    ;;
  *) usage ;;
esac
