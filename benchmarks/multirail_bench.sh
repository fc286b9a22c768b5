#!/usr/bin/env bash
# Multi-rail benchmark on the namespace test bed (benchmarks/testbed/testbed.sh): two "hosts"
# joined by two rails shaped to different rates (default 2gbit and 500mbit), and
#   a. iperf3 reference: each rail alone, then both at once (TCP, Gbit/s of payload)
#   b. allreduce_perf -b 1M -e 256M -f 4 for railshard (adaptive weights, equal weights,
#      fastest rail only), Gloo over rail0, OpenMPI over rail0 and over both rails; the set
#      repeated --reps times interleaved; per mode and size the median/min/max busbw -> CSV
#      and a plot with the iperf3 rates as horizontal lines
#   c. rate change: rail_bench for ~12 s, the two rails' rates swapped at t ~ 4 s
#   d. link down: rail_bench for ~12 s with RAILSHARD_RAIL_TIMEOUT=1, rail1 down on both
#      hosts at t ~ 4 s, up again at t ~ 8 s; every rank's stderr kept
# Every step is bounded by a timeout; a step that fails is recorded in OUT/failures.txt and the
# rest still run. The test bed is always torn down (EXIT trap). Needs root, iproute2, iperf3,
# OpenMPI (mpirun) and python3-matplotlib (scripts/install_deps.sh installs them). ~8 minutes.
#
#   benchmarks/multirail_bench.sh [options]
#     --build DIR     build tree with benchmarks/allreduce_perf and rail_bench (default: build)
#     --out DIR       where results go (default: multirail-out)
#     --rates R0,R1   rail rates, tc syntax (default: 2gbit,500mbit)
#     --reps N        repetitions of the allreduce_perf set (default: 3)
#     --parts LIST    which parts to run, e.g. ab or cd (default: abcd)
#     --modes LIST    part b's modes, comma-separated (default: railshard-adaptive,
#                     railshard-equal,railshard-rail0,gloo-rail0,mpi-rail0,mpi-both)
#     --name NAME     test-bed name, 1-8 of [a-z0-9] (default: mrb<random>)
#     --old DIR       another build: mode railshard-old (adaptive, that build's allreduce_perf)
#                     is run beside the others in every repetition (old against new)
#
# Outputs (OUT/): run.log (everything printed), failures.txt, iperf3.csv + iperf3/*.json,
# allreduce/<mode>.rep<k>.txt (raw allreduce_perf output), allreduce_busbw.csv,
# allreduce_busbw.png, rate/ and linkdown/ (timeline.csv, events.csv, stdout, stderr.rank<r>,
# timeline.png).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/.." && pwd)
testbed="$here/testbed/testbed.sh"
plot="$here/plot_multirail.py"
python=/usr/bin/python3
[ -x "$python" ] || python=python3

build="$root/build"
out="multirail-out"
rates="2gbit,500mbit"
reps=3
parts=abcd
modes_arg=""
old=""
name="mrb$((RANDOM % 100000))"

usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit "${1:-2}"; }
while [ $# -gt 0 ]; do
  case "$1" in
    --build) build=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --rates) rates=$2; shift 2 ;;
    --reps) reps=$2; shift 2 ;;
    --parts) parts=$2; shift 2 ;;
    --modes) modes_arg=$2; shift 2 ;;
    --name) name=$2; shift 2 ;;
    --old) old=$2; shift 2 ;;
    -h | --help) usage 0 ;;
    *) echo "multirail_bench: unknown argument '$1'" >&2; usage ;;
  esac
done
IFS=, read -r -a rate <<<"$rates"
[ ${#rate[@]} -eq 2 ] || { echo "multirail_bench: --rates needs two rates, R0,R1" >&2; exit 2; }
[[ "$name" =~ ^[a-z0-9]{1,8}$ ]] || { echo "multirail_bench: bad --name '$name'" >&2; exit 2; }
[[ "$reps" =~ ^[1-9][0-9]*$ ]] || { echo "multirail_bench: bad --reps '$reps'" >&2; exit 2; }
[ "$(id -u)" -eq 0 ] || { echo "multirail_bench: needs root (network namespaces)" >&2; exit 2; }
# Part b's modes, in the order they run in every repetition.
all_modes=(railshard-adaptive railshard-equal railshard-rail0 gloo-rail0 mpi-rail0 mpi-both)
modes=("${all_modes[@]}")
if [ -n "$modes_arg" ]; then
  IFS=, read -r -a modes <<<"$modes_arg"
  for mode in "${modes[@]}"; do
    [[ " ${all_modes[*]} " == *" $mode "* ]] ||
      { echo "multirail_bench: unknown mode '$mode' (${all_modes[*]})" >&2; exit 2; }
  done
fi
old_perf=""
if [ -n "$old" ]; then
  old_perf="$(cd "$old" 2>/dev/null && pwd)/benchmarks/allreduce_perf"
  [ -x "$old_perf" ] || { echo "multirail_bench: --old: no allreduce_perf in '$old'" >&2; exit 2; }
  modes+=(railshard-old)
fi

build=$(cd "$build" && pwd)
perf="$build/benchmarks/allreduce_perf"
rail_bench="$build/benchmarks/rail_bench"
for f in "$perf" "$rail_bench"; do
  [ -x "$f" ] || { echo "multirail_bench: $f not built (cmake --build $build)" >&2; exit 2; }
done
for tool in ip tc iperf3 timeout; do
  command -v "$tool" >/dev/null || {
    echo "multirail_bench: '$tool' not found (scripts/install_deps.sh)" >&2
    exit 2
  }
done

mkdir -p "$out"
out=$(cd "$out" && pwd)
: >"$out/failures.txt"
exec > >(tee "$out/run.log") 2>&1
tee_pid=$!
started=$(date +%s)

log() { echo "[multirail $(date +%T)] $*"; }
fail() {  # fail STEP WHY: recorded, the run goes on
  log "FAILED: $1: $2"
  echo "$1: $2" >>"$out/failures.txt"
}

# Stops a process of this script's and everything it started, children first.
kill_tree() {
  local child
  for child in $(pgrep -P "$1" || true); do kill_tree "$child"; done
  kill "$1" 2>/dev/null || true
}
# Long steps run in the background and are waited for, so that a signal is handled at once
# (bash runs traps only between foreground commands); on exit every one left is stopped.
cleanup() {
  local rc=$? pid
  trap - INT TERM
  for pid in $(pgrep -P $$ || true); do
    [ "$pid" = "$tee_pid" ] || kill_tree "$pid"
  done
  "$testbed" down "$name" 2>/dev/null || true
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# Host h's address on rail r.
addr() { echo "10.$((200 + $2)).0.$(($1 + 1))"; }

log "test bed '$name': 2 hosts, rail0 ${rate[0]}, rail1 ${rate[1]}; build $build; out $out"
"$testbed" down "$name" 2>/dev/null || true
"$testbed" up "$name" 2 "${rate[0]}" "${rate[1]}"

# --- a. iperf3 --------------------------------------------------------------------------------

# iperf_start RAIL PORT: an iperf3 server for one test in h1 on its RAIL address; waits until
# it listens. Its pid is in $server.
iperf_start() {
  local r=$1 port=$2
  timeout 30 ip netns exec "$name-h1" iperf3 -s -1 -B "$(addr 1 "$r")" -p "$port" \
    >"$out/iperf3/server.$port.log" 2>&1 &
  server=$!
  for _ in $(seq 50); do
    ip netns exec "$name-h1" ss -Hltn "sport = :$port" | grep -q . && return 0
    sleep 0.1
  done
  return 1
}

# iperf_client RAIL PORT FILE: 1 s omitted (slow start), then 4 s measured.
iperf_client() {
  timeout 30 ip netns exec "$name-h0" iperf3 -c "$(addr 1 "$1")" -B "$(addr 0 "$1")" -p "$2" \
    -t 4 -O 1 -J >"$3"
}

iperf_gbps() {  # FILE -> received Gbit/s, or empty when the file is no iperf3 result
  "$python" -c 'import json,sys
try:
    print("%.4f" % (json.load(open(sys.argv[1]))["end"]["sum_received"]["bits_per_second"] / 1e9))
except Exception:
    pass' "$1"
}

run_iperf() {
  mkdir -p "$out/iperf3"
  echo "test,rail,gbps" >"$out/iperf3.csv"
  local r g port s0 s1 c0 c1
  for r in 0 1; do
    port=$((5201 + r))
    if ! iperf_start "$r" "$port"; then fail "iperf3 rail$r" "server did not start"; continue; fi
    if iperf_client "$r" "$port" "$out/iperf3/rail$r.json"; then
      g=$(iperf_gbps "$out/iperf3/rail$r.json")
      echo "alone,rail$r,$g" >>"$out/iperf3.csv"
      log "iperf3 rail$r alone: $g Gbit/s"
    else
      fail "iperf3 rail$r" "client failed (see iperf3/rail$r.json)"
    fi
    wait "$server" || true
  done
  # Both rails at once: two servers, two clients in parallel.
  if iperf_start 0 5211 && s0=$server && iperf_start 1 5212 && s1=$server; then
    iperf_client 0 5211 "$out/iperf3/both.rail0.json" &
    c0=$!
    iperf_client 1 5212 "$out/iperf3/both.rail1.json" &
    c1=$!
    wait "$c0" || fail "iperf3 both" "rail0 client failed"
    wait "$c1" || fail "iperf3 both" "rail1 client failed"
    wait "$s0" "$s1" || true
    local g0 g1
    g0=$(iperf_gbps "$out/iperf3/both.rail0.json")
    g1=$(iperf_gbps "$out/iperf3/both.rail1.json")
    echo "both,rail0,$g0" >>"$out/iperf3.csv"
    echo "both,rail1,$g1" >>"$out/iperf3.csv"
    if [ -n "$g0" ] && [ -n "$g1" ]; then
      echo "both,sum,$("$python" -c "print('%.4f' % ($g0 + $g1))")" >>"$out/iperf3.csv"
    fi
    log "iperf3 both rails at once: rail0 $g0 + rail1 $g1 Gbit/s"
  else
    fail "iperf3 both" "servers did not start"
  fi
}

# --- b. allreduce_perf sweep ------------------------------------------------------------------

# Sizes 1M..256M (-f 4) in two runs per mode: the small sizes with more iterations (a 1 MiB
# all-reduce takes ~5 ms here, so 4 ms scheduler ticks make single ones noisy), the large
# ones with few (256 MiB takes 1-4 s; the validated first call warms up). Their outputs go
# to one file. One mode's set takes 15-40 s.
perf_small=(-b 1M -e 4M -f 4 -n 10 -w 2)
perf_large=(-b 16M -e 256M -f 4 -n 2 -w 0)

# mpirun across namespaces (FIELD-NOTES): mpirun runs in h0; its plm_rsh_agent starts orted in
# the namespace of the host it is given (a rail address), under the host's own UTS namespace
# like every test-bed process.
write_agent() {
  cat >"$out/allreduce/mpi_agent.sh" <<EOF
#!/usr/bin/env bash
# plm_rsh_agent for mpirun on test bed '$name': called as 'agent [-opts] HOST CMD...'.
while [ \$# -gt 0 ] && [ "\${1#-}" != "\$1" ]; do shift; done
host=\$1
shift
case "\$host" in
  10.2[0-9][0-9].0.*) h=\$(( \${host##*.} - 1 )) ;;
  $name-h*) h=\${host##*-h} ;;
  *) echo "mpi_agent: unknown host '\$host'" >&2; exit 1 ;;
esac
exec "$testbed" run "$name" "\$h" /bin/sh -c "\$*"
EOF
  chmod +x "$out/allreduce/mpi_agent.sh"
}

mpi_run() {  # mpi_run IF_LIST ARGS...: allreduce_perf --backend mpi, one rank per host
  local ifs=$1
  shift
  OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
    timeout 120 "$testbed" run "$name" 0 mpirun --allow-run-as-root -np 2 \
    -H "$(addr 0 0),$(addr 1 0)" --bind-to none \
    --mca plm_rsh_agent "$out/allreduce/mpi_agent.sh" \
    --mca oob_tcp_if_include rail0 \
    --mca btl tcp,self --mca btl_tcp_if_include "$ifs" \
    "$perf" --backend mpi "$@"
}

run_mode() {  # run_mode MODE FILE ARGS...: one allreduce_perf run of MODE, appended to FILE
  local mode=$1 file=$2
  shift 2
  local job=(env TESTBED_TIMEOUT=120 "$testbed" job "$name" "$perf")
  local how  # for the record at the top of the output
  case "$mode" in
    railshard-adaptive) how="RAILSHARD_RAIL_WEIGHTS=adaptive testbed.sh job" ;;
    railshard-old) how="RAILSHARD_RAIL_WEIGHTS=adaptive testbed.sh job, $old_perf" ;;
    railshard-equal) how="RAILSHARD_RAIL_WEIGHTS=equal testbed.sh job" ;;
    railshard-rail0) how="RAILSHARD_SOCKET_IFNAME=rail0 testbed.sh job" ;;
    gloo-rail0) how="RAILSHARD_SOCKET_IFNAME=rail0 testbed.sh job (--backend gloo)" ;;
    mpi-rail0) how="mpirun in h0, mpi_agent.sh, btl tcp,self, btl_tcp_if_include rail0" ;;
    mpi-both) how="mpirun in h0, mpi_agent.sh, btl tcp,self, btl_tcp_if_include rail0,rail1" ;;
  esac
  echo "# multirail_bench $mode: $how: allreduce_perf $*" >>"$file"
  case "$mode" in
    railshard-adaptive) RAILSHARD_RAIL_WEIGHTS=adaptive "${job[@]}" "$@" ;;
    railshard-old)
      RAILSHARD_RAIL_WEIGHTS=adaptive env TESTBED_TIMEOUT=120 "$testbed" job "$name" "$old_perf" \
        "$@"
      ;;
    railshard-equal) RAILSHARD_RAIL_WEIGHTS=equal "${job[@]}" "$@" ;;
    railshard-rail0) RAILSHARD_SOCKET_IFNAME=rail0 "${job[@]}" "$@" ;;
    gloo-rail0) RAILSHARD_SOCKET_IFNAME=rail0 "${job[@]}" --backend gloo "$@" ;;
    mpi-rail0) mpi_run rail0 "$@" ;;
    mpi-both) mpi_run rail0,rail1 "$@" ;;
  esac >>"$file" 2>&1
}

run_sweep() {
  mkdir -p "$out/allreduce"
  rm -f "$out"/allreduce/*.rep*.txt
  write_agent
  declare -A broken=()
  local rep mode file t0 rc
  for rep in $(seq "$reps"); do
    for mode in "${modes[@]}"; do
      if [ -n "${broken[$mode]:-}" ]; then continue; fi
      file="$out/allreduce/$mode.rep$rep.txt"
      t0=$(date +%s)
      rc=0
      : >"$file"
      run_mode "$mode" "$file" "${perf_small[@]}" &
      wait $! || rc=$?
      if [ "$rc" -eq 0 ]; then
        run_mode "$mode" "$file" "${perf_large[@]}" &
        wait $! || rc=$?
      fi
      if [ "$rc" -eq 0 ]; then
        log "allreduce_perf $mode rep $rep: $(($(date +%s) - t0)) s; busbw (GB/s)" \
          "$(awk '(NF == 13 || NF == 14) && $1 ~ /^[0-9]+$/ {
                    printf "%s%dM %.3f", sep, $1 / 1048576, $1 / ($6 + $10) * 2 / 1e3; sep = ", "
                  }' "$file")"
      else
        broken[$mode]=1
        fail "allreduce_perf $mode rep $rep" \
          "exit $rc after $(($(date +%s) - t0)) s; not repeated (last lines of $file:" \
          "$(tail -n 3 "$file" | tr '\n' ' '))"
        mv "$file" "$out/allreduce/$mode.rep$rep.failed.txt"
      fi
    done
  done
  "$python" "$plot" sweep --dir "$out" --rates "${rate[0]},${rate[1]}" ||
    fail "sweep plot" "plot_multirail.py sweep failed"
}

# --- c/d. rail_bench timelines ----------------------------------------------------------------

# rail_bench's clock: t=0 is after its first barrier. now_ms echoes the current time on that
# clock in milliseconds, from the last "t=" line rank 0 printed (seen_t, "4.37") and when this
# script saw it (seen_at, ms since the epoch).
seen_t=""
seen_at=0
now_ms() { echo $((10#${seen_t/./} * 10 + $(date +%s%3N) - seen_at)); }

# wait_t FILE T LIMIT: returns when it is t >= T on rail_bench's clock (known from the lines
# rank 0 prints every ~0.5 s, so within ~0.1 s), or fails after LIMIT seconds.
wait_t() {
  local file=$1 want=$2 limit=$3 t
  local end=$(($(date +%s) + limit))
  while [ "$(date +%s)" -lt "$end" ]; do
    t=$(sed -n 's/^t= *\([0-9.]*\)s.*/\1/p' "$file" 2>/dev/null | tail -1 || true)
    if [ -n "$t" ] && [ "$t" != "$seen_t" ]; then
      seen_t=$t
      seen_at=$(date +%s%3N)
    fi
    if [ -n "$seen_t" ] && [ "$(now_ms)" -ge $((want * 1000)) ]; then return 0; fi
    sleep 0.1
  done
  return 1
}

event() {  # event DIR TEXT CMD...: runs CMD, records its time on rail_bench's clock
  local dir=$1 text=$2
  shift 2
  local ms t
  ms=$(now_ms)
  t=$(printf '%d.%03d' $((ms / 1000)) $((ms % 1000)))
  if "$@"; then
    echo "$t,${text//,/;}" >>"$dir/events.csv"
    log "t=${t}s: $text"
  else
    fail "$(basename "$dir")" "'$text' failed"
  fi
}

start_timeline() {  # start_timeline DIR SECONDS ENV...: rail_bench in the background
  local dir=$1 seconds=$2
  shift 2
  mkdir -p "$dir"
  rm -f "$dir"/stderr.rank* "$dir/timeline.csv"
  echo "t_s,event" >"$dir/events.csv"
  seen_t=""
  # Each rank's stderr to its own file (the transport's log lines name the rails).
  env "$@" TESTBED_TIMEOUT=$((seconds + 60)) "$testbed" job "$name" /bin/sh -c \
    'exec "$0" "$@" 2>"$DIR/stderr.rank$RAILSHARD_RANK"' "$rail_bench" --bytes 16M \
    --seconds "$seconds" --csv "$dir/timeline.csv" >"$dir/stdout" 2>"$dir/stderr.job" &
  timeline_pid=$!
}

finish_timeline() {  # finish_timeline DIR TITLE
  local dir=$1 title=$2 rc=0
  wait "$timeline_pid" || rc=$?
  [ "$rc" -eq 0 ] || fail "$(basename "$dir")" "rail_bench exited $rc (see $dir/stdout, stderr.*)"
  log "$(basename "$dir"): $(grep '^# [0-9]* iterations' "$dir/stdout" || echo 'no summary line')"
  if [ -s "$dir/timeline.csv" ]; then
    "$python" "$plot" timeline --csv "$dir/timeline.csv" --events "$dir/events.csv" \
      --title "$title" --out "$dir/timeline.png" || fail "$(basename "$dir")" "plot failed"
  else
    fail "$(basename "$dir")" "no timeline.csv"
  fi
}

run_rate_change() {
  local dir="$out/rate"
  log "rate change: rail_bench 12 s, adaptive weights; rates swapped at t ~ 4 s"
  start_timeline "$dir" 12 DIR="$dir" RAILSHARD_RAIL_WEIGHTS=adaptive
  if wait_t "$dir/stdout" 4 40; then
    event "$dir" "rail0 -> ${rate[1]}; rail1 -> ${rate[0]}" \
      sh -c "'$testbed' rate '$name' 0 '${rate[1]}' && '$testbed' rate '$name' 1 '${rate[0]}'"
  else
    fail rate "rail_bench never reached t=4 s (see $dir/stdout)"
  fi
  finish_timeline "$dir" "rate change: rails swap ${rate[0]} <-> ${rate[1]}"
  # Back to the original rates for whatever runs next.
  "$testbed" rate "$name" 0 "${rate[0]}"
  "$testbed" rate "$name" 1 "${rate[1]}"
}

run_link_down() {
  local dir="$out/linkdown"
  log "link down: rail_bench 12 s, RAILSHARD_RAIL_TIMEOUT=1; rail1 down t ~ 4..8 s"
  start_timeline "$dir" 12 DIR="$dir" RAILSHARD_RAIL_TIMEOUT=1
  if wait_t "$dir/stdout" 4 40; then
    event "$dir" "rail1 down" \
      sh -c "'$testbed' link '$name' 0 1 down && '$testbed' link '$name' 1 1 down"
    if wait_t "$dir/stdout" 8 20; then
      event "$dir" "rail1 up" \
        sh -c "'$testbed' link '$name' 0 1 up && '$testbed' link '$name' 1 1 up"
    else
      fail linkdown "rail_bench did not reach t=8 s with rail1 down (see $dir/stdout)"
    fi
  else
    fail linkdown "rail_bench never reached t=4 s (see $dir/stdout)"
  fi
  # Up again whatever happened, for whatever runs next.
  "$testbed" link "$name" 0 1 up || true
  "$testbed" link "$name" 1 1 up || true
  finish_timeline "$dir" "rail1 (${rate[1]}) down on both hosts, then up (RAIL_TIMEOUT=1 s)"
  grep -h -i "rail" "$dir"/stderr.rank* >"$dir/rail_log.txt" 2>/dev/null || true
  log "linkdown: $(wc -l <"$dir/rail_log.txt") log lines that name a rail (linkdown/rail_log.txt)"
}

if [[ "$parts" == *a* ]]; then run_iperf; fi
if [[ "$parts" == *b* ]]; then run_sweep; fi
if [[ "$parts" == *c* ]]; then run_rate_change; fi
if [[ "$parts" == *d* ]]; then run_link_down; fi

log "done in $(($(date +%s) - started)) s; outputs in $out:"
(cd "$out" && find . -type f | sort | sed 's/^\.\//  /')
[ -s "$out/iperf3.csv" ] && column -s, -t <"$out/iperf3.csv"
[ -s "$out/allreduce_busbw.csv" ] && column -s, -t <"$out/allreduce_busbw.csv"
if [ -s "$out/failures.txt" ]; then
  log "$(wc -l <"$out/failures.txt") step(s) failed:"
  cat "$out/failures.txt"
  exit 1
fi
