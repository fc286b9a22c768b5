#!/usr/bin/env bash
# Emulated hosts joined by Soft-RoCE rails, inside the RDMA guest (guest.sh): rail r is a
# bridge rxbr<r>; host h plugs into it with a veth whose guest end h<h>r<r> carries the
# address 10.(210+r).0.(h+1)/24 and an rxe device of the same name. A host is a network
# namespace rxh<h> (its TCP interface eth0, 10.220.0.(h+1)/24, on the bridge rxtcp) plus a UTS
# and mount namespace (its own host name rxh<h> and /dev/shm); its ranks get RAILSHARD_IB_HCA
# = its rxe devices in rail order, so railshard pairs rail r of one host with rail r of
# another.
#
#   rxe_hosts.sh up HOSTS RAILS [MTU]      create (MTU of every veth, default 1500)
#   rxe_hosts.sh run HOST CMD [ARGS...]    run CMD as host HOST (0-based)
#   rxe_hosts.sh job RANKS CMD [ARGS...]   one railshard job: RANKS ranks per host (a figure
#                                          for every host, or a list such as 1,2; hosts past
#                                          the list's end get none), numbered
#                                          host by host; waits for all; exit status: the
#                                          first failure's; bounded by RXE_TIMEOUT (300 s)
#   rxe_hosts.sh link HOST RAIL up|down    take one host's rail down or up (the veth)
#   rxe_hosts.sh devices HOST              the host's rxe devices, comma-separated
#
# RXE_RAILS=N: run, job and devices use only each host's first N rails.
#
# Why it is built this way (docs/rdma.md "Soft-RoCE in a guest"): rxe in Linux 6.1 receives
# only in the initial network namespace, so every veth end stays there and traffic is forced
# over each host's own veth with policy routing (a rule per outgoing interface, the local
# table moved after them, accept_local, no reverse-path filter) and permanent neighbour
# entries (rdma_cm rejects connections otherwise). Only in the guest: it rewires routing.
set -euo pipefail

usage() { sed -n '2,18p' "$0" >&2; exit 2; }
[ $# -ge 1 ] || usage
state=/run/rxe_hosts

dev() { echo "h$1r$2"; }
addr() { echo "10.$((210 + $2)).0.$(($1 + 1))"; }

# route HOST RAIL HOSTS: host HOST's sends on rail RAIL go out of its own veth, to every peer
# through a permanent neighbour entry. Taking a veth down flushes its routes and neighbours
# (permanent ones included), so `link ... up` runs this again.
route() {
  local h=$1 r=$2 hosts=$3 d table p
  d=$(dev "$h" "$r")
  table=$((100 + h * 8 + r))
  ip route replace "10.$((210 + r)).0.0/24" dev "$d" table "$table"
  for p in $(seq 0 $((hosts - 1))); do
    [ "$p" = "$h" ] && continue
    # Added once; `ip rule show` may print the oif as "h1r1 [detached]" while it is down, and
    # a rule that exists already is fine (`link ... up` runs this again).
    if ! ip rule show pref 10 | grep -qF "to $(addr "$p" "$r") oif $d "; then
      ip rule add pref 10 oif "$d" to "$(addr "$p" "$r")" lookup "$table" 2>"$state/rule.err" ||
        grep -q "File exists" "$state/rule.err" || { cat "$state/rule.err" >&2; return 1; }
    fi
    ip neigh replace "$(addr "$p" "$r")" dev "$d" nud permanent \
      lladdr "$(cat "/sys/class/net/$(dev "$p" "$r")/address")"
  done
}

case $1 in
  up)
    [ $# -ge 3 ] || usage
    hosts=$2 rails=$3 mtu=${4:-1500}
    [ "$hosts" -ge 2 ] && [ "$hosts" -le 8 ] && [ "$rails" -ge 1 ] && [ "$rails" -le 4 ] ||
      { echo "rxe_hosts: 2-8 hosts, 1-4 rails" >&2; exit 2; }
    mkdir -p "$state"
    echo "$hosts $rails" >"$state/layout"
    sysctl -qw net.ipv4.conf.all.accept_local=1 net.ipv4.conf.all.rp_filter=0 \
      net.ipv4.conf.default.rp_filter=0 net.ipv4.conf.default.accept_local=1
    # A lossless fabric, as RoCE is deployed (PFC): RDMA READ responses come in bursts the
    # default backlog (1000 packets) drops, and rxe in 6.1 does not recover a read whose
    # responses were dropped (kernel WARNING in rxe_completer, the queue pair in error).
    sysctl -qw net.core.netdev_max_backlog=100000
    for r in $(seq 0 $((rails - 1))); do
      ip link add "rxbr$r" type bridge
      ip link set "rxbr$r" up
      for h in $(seq 0 $((hosts - 1))); do
        d=$(dev "$h" "$r")
        ip link add "$d" mtu "$mtu" type veth peer name "${d}p" mtu "$mtu"
        ip link set "${d}p" master "rxbr$r" up
        ip addr add "$(addr "$h" "$r")/24" dev "$d"
        ip link set "$d" up
        sysctl -qw "net.ipv4.conf.$d.accept_local=1" "net.ipv4.conf.$d.rp_filter=0"
        rdma link add "$d" type rxe netdev "$d"
      done
    done
    # Every (host, rail) sends to its peers through its own veth, never through loopback.
    for r in $(seq 0 $((rails - 1))); do
      for h in $(seq 0 $((hosts - 1))); do route "$h" "$r" "$hosts"; done
    done
    ip rule add pref 1000 lookup local
    ip rule del pref 0 lookup local
    # Each host's own network namespace for TCP (the control plane, the store): one veth
    # "eth0" with 10.220.0.(h+1)/24 on the bridge rxtcp. The rxe devices stay usable from it
    # (RDMA devices are shared between namespaces by default) while its processes see only
    # their own host's TCP interface, as on a real host.
    ip link add rxtcp type bridge
    ip link set rxtcp up
    for h in $(seq 0 $((hosts - 1))); do
      ip netns add "rxh$h"
      ip link add "t$h" type veth peer name "t${h}p"
      ip link set "t${h}p" master rxtcp up
      ip link set "t$h" netns "rxh$h"
      ip -n "rxh$h" link set "t$h" name eth0
      ip -n "rxh$h" addr add "10.220.0.$((h + 1))/24" dev eth0
      ip -n "rxh$h" link set eth0 up
      ip -n "rxh$h" link set lo up
      # The host's UTS and mount namespaces, held open by a sleeping process that every rank
      # of the host enters: one host name, one /dev/shm for all of them.
      ip netns exec "rxh$h" unshare --uts --mount --propagation private \
        sh -c 'hostname "$0"; mount -t tmpfs tmpfs /dev/shm; exec sleep infinity' "rxh$h" \
        </dev/null >/dev/null 2>&1 &
      echo $! >"$state/holder$h"
    done
    sleep 0.5
    ;;
  devices)
    [ $# -eq 2 ] || usage
    read -r _ rails <"$state/layout"
    rails=${RXE_RAILS:-$rails}  # only the first RXE_RAILS rails
    list=""
    for r in $(seq 0 $((rails - 1))); do list+="${list:+,}$(dev "$2" "$r")"; done
    echo "$list"
    ;;
  run)
    [ $# -ge 3 ] || usage
    host=$2
    shift 2
    hca=$("$0" devices "$host")
    RAILSHARD_IB_HCA=$hca exec nsenter -t "$(cat "$state/holder$host")" --net --uts --mount \
      --wd="$PWD" "$@"
    ;;
  link)
    [ $# -eq 4 ] || usage
    read -r hosts _ <"$state/layout"
    ip link set "$(dev "$2" "$3")" "$4"
    if [ "$4" = up ]; then
      # The peers' neighbour entries for this host went with its link too.
      for h in $(seq 0 $((hosts - 1))); do route "$h" "$3" "$hosts"; done
    fi
    ;;
  job)
    [ $# -ge 3 ] || usage
    read -r hosts _ <"$state/layout"
    IFS=, read -r -a per_host <<<"$2"
    shift 2
    if [ "${#per_host[@]}" -eq 1 ]; then
      mapfile -t per_host < <(for _ in $(seq "$hosts"); do echo "${per_host[0]}"; done)
    fi
    [ "${#per_host[@]}" -le "$hosts" ] ||
      { echo "rxe_hosts: ${#per_host[@]} rank counts for $hosts hosts" >&2; exit 2; }
    while [ "${#per_host[@]}" -lt "$hosts" ]; do per_host+=(0); done  # a short list: none there
    world=0
    for n in "${per_host[@]}"; do world=$((world + n)); done
    port=$((20000 + RANDOM % 20000))
    token="rxe-$RANDOM$RANDOM"
    pids=()
    trap 'kill "${pids[@]}" 2>/dev/null || true' EXIT INT TERM
    rank=0
    for h in $(seq 0 $((hosts - 1))); do
      for local in $(seq 0 $((per_host[h] - 1))); do
        RAILSHARD_RANK=$rank RAILSHARD_WORLD_SIZE=$world RAILSHARD_LOCAL_RANK=$local \
          RAILSHARD_STORE_ADDR="10.220.0.1:$port" RAILSHARD_TOKEN="$token" \
          timeout "${RXE_TIMEOUT:-300}" "$0" run "$h" "$@" &
        pids+=($!)
        rank=$((rank + 1))
      done
    done
    status=0
    for pid in "${pids[@]}"; do
      rc=0
      wait "$pid" || rc=$?
      if [ "$rc" -ne 0 ] && [ "$status" -eq 0 ]; then status=$rc; fi
    done
    exit "$status"
    ;;
  *) usage ;;
esac
