#!/usr/bin/env bash
# How fast survivors learn of a failure, and how long shrink() takes: repeated real-process
# runs of tests/programs/collective_check (4 ranks started by hand, RAILSHARD_TIMEOUT=60 so
# that only detection can explain a fast error). Prints one line per scenario with the median
# and maximum over every survivor of every trial of the "failed after waiting X s" figure each
# survivor's error reports (from the start of the collective that failed), and of shrink().
#
#   benchmarks/detection_times.sh [BUILD_DIR] [TRIALS]
set -euo pipefail
build=${1:-build}
trials=${2:-5}
check="$build/tests/collective_check"
[ -x "$check" ] || { echo "no $check (build the tests first)" >&2; exit 2; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# run_world NAME ENV... -- ARGS...: one trial, outputs in $tmp/NAME.RANK.err
run_world() {
  local name=$1; shift
  local envs=()
  while [ "$1" != "--" ]; do envs+=("$1"); shift; done
  shift
  # Below Linux's ephemeral range (32768-60999), where the ranks' own connections would
  # sometimes hold a random port (rank 0 then fails to bind and the trial is lost), and free.
  local port
  while :; do
    port=$((10000 + RANDOM % 22000))
    ss -Htln "sport = :$port" 2>/dev/null | grep -q . || break
  done
  local pids=()
  for rank in 0 1 2 3; do
    env "${envs[@]}" RAILSHARD_RANK=$rank RAILSHARD_WORLD_SIZE=4 \
      RAILSHARD_STORE_ADDR=127.0.0.1:$port RAILSHARD_TOKEN=bench \
      timeout 60 "$check" "$@" >"$tmp/$name.$rank.out" 2>"$tmp/$name.$rank.err" &
    pids+=($!)
  done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
}

# stats FILE: median and max of the numbers in FILE
stats() {
  sort -g "$1" | awk '{v[NR]=$1} END {if (NR==0) {print "n=0"; exit}
    m=(NR%2)?v[(NR+1)/2]:(v[NR/2]+v[NR/2+1])/2; printf "n=%d median %.3f max %.3f\n", NR, m, v[NR]}'
}

scenario() {
  local label=$1; shift
  : >"$tmp/waited"; : >"$tmp/shrink"
  for ((t = 0; t < trials; ++t)); do
    local before
    before=$(wc -l <"$tmp/waited")
    run_world s "$@"
    local died
    died=$(grep -hoE 'failing on purpose .* at [0-9]+ us' "$tmp"/s.*.err | grep -oE '[0-9]+ us' |
      grep -oE '[0-9]+' || true)
    if [ -n "$died" ]; then
      # Survivors only: a stopped rank also catches the error once it is resumed.
      grep -L 'failing on purpose' "$tmp"/s.*.err | xargs grep -hoE 'caught PeerLostError at [0-9]+ us' |
        grep -oE '[0-9]+' |
        awk -v d="$died" '{printf "%.4f\n", ($1 - d) / 1e6}' >>"$tmp/waited" || true
    else
      grep -hoE 'timed out after [0-9.]+ s' "$tmp"/s.*.err | grep -oE '[0-9.]+' | head -n 3 \
        >>"$tmp/waited" || true
    fi
    grep -hoE 'shrink [0-9.]+ ms' "$tmp"/s.*.err 2>/dev/null | grep -oE '[0-9.]+' >>"$tmp/shrink" || true
    # A trial in which a survivor reported nothing is kept for a look, not silently dropped.
    if [ "$(wc -l <"$tmp/waited")" -lt $((before + 3)) ]; then
      lost+=("$label trial $t: $(head -c 300 "$tmp"/s.0.err | tr '\n' ' ')")
    fi
  done
  printf '%-44s detection (s): %s' "$label" "$(stats "$tmp/waited")"
  if [ -s "$tmp/shrink" ]; then printf '   shrink (ms): %s' "$(stats "$tmp/shrink")"; fi
  printf '\n'
}

lost=()
kill_args=(--iterations 100000 --die-rank 2 --die-after 20 --count 1000)
scenario "SIGKILL, tcp" RAILSHARD_TIMEOUT=60 RAILSHARD_TRANSPORT=tcp -- "${kill_args[@]}" --die-how kill
scenario "SIGKILL, shm" RAILSHARD_TIMEOUT=60 RAILSHARD_TRANSPORT=auto -- "${kill_args[@]}" --die-how kill
scenario "SIGKILL, tcp, --elastic shrink" RAILSHARD_TIMEOUT=60 RAILSHARD_TRANSPORT=tcp -- \
  --iterations 60 --die-rank 2 --die-after 20 --count 1000 --die-how kill --elastic 1
scenario "SIGKILL, shm, --elastic shrink" RAILSHARD_TIMEOUT=60 RAILSHARD_TRANSPORT=auto -- \
  --iterations 60 --die-rank 2 --die-after 20 --count 1000 --die-how kill --elastic 1
scenario "SIGSTOP, tcp, heartbeat 2 s" RAILSHARD_TIMEOUT=60 RAILSHARD_HEARTBEAT_TIMEOUT=2 \
  RAILSHARD_TRANSPORT=tcp -- "${kill_args[@]}" --die-how stop --stop-seconds 3
scenario "SIGSTOP, shm, heartbeat 2 s" RAILSHARD_TIMEOUT=60 RAILSHARD_HEARTBEAT_TIMEOUT=2 \
  RAILSHARD_TRANSPORT=auto -- "${kill_args[@]}" --die-how stop --stop-seconds 3
scenario "rank never arrives, RAILSHARD_TIMEOUT=2" RAILSHARD_TIMEOUT=2 -- \
  --iterations 30 --stall-rank 3 --stall-after 12 --stall-seconds 5 --count 1000
for l in "${lost[@]}"; do echo "incomplete: $l"; done
