#!/usr/bin/env bash
# Rank layouts on the namespace test bed (benchmarks/testbed/testbed.sh): one float32 sum
# all-reduce (default 64 MiB) across emulated hosts joined by two rails shaped 1gbit and
# 250mbit, with one or several ranks per host. A layout HxR is H hosts with R ranks each
# (world H*R, ranks numbered host by host). The question is what extra ranks on a host cost:
# the rails between hosts carry the same bytes whatever R is, so an HxR all-reduce should take
# about as long as the Hx1 one; whatever it takes more is intra-host work or a poor schedule.
#
# Every repetition runs every layout once, one after another (the machine's noise, a build
# beside it or a slow minute, then hits all layouts of that repetition alike), each as one
# bounded job: allreduce_perf -b SIZE -e SIZE -w 1 -n 3 -J (results read from the JSON).
# testbed.sh job starts ranks on every host of a bed, so there is one bed per host count in
# the layouts (NAME2, NAME3, ...), brought up once at the start and torn down at exit.
#
# How to read the output:
#   - per layout and backend: median, min and max over the repetitions of the out-of-place
#     time (ms; allreduce_perf's default -a 1: the ranks' mean) and the median busbw;
#   - ratios HxR / Hx1 (2x2/2x1, 2x4/2x1, 3x2/3x1) are taken within each repetition, then
#     medianed: a slow repetition slows both sides of its ratio, so the ratio is steadier than
#     the ratio of medians. Targets: 2x2/2x1 <= 1.10, 2x4/2x1 <= 1.15, 3x2/3x1 <= 1.15;
#   - --old OLD_BUILD: the same layouts from another build too ("railshard-old"), each run
#     beside the new build's in the same repetition; new/old time per layout, per-rep ratios
#     medianed (< 1: the new build is faster), and HxR/Hx1 for both builds;
#   - --peers: OpenMPI (shared memory inside a host, TCP over both rails between hosts,
#     its default even split) and Gloo (TCP over rail0, the fast rail: it uses one interface)
#     in the 2x2 layout, interleaved with railshard's runs; speed-up = the peer's median time
#     over railshard's (and, in brackets, the median of the per-repetition factors). Targets:
#     >= 1.5x against OpenMPI, >= 2x against Gloo.
# A run that fails or times out is recorded in the CSV (status) and left out of the figures,
# and the exit status is then 1; a (layout, backend) that fails twice is not run again. Don't
# run it while the build tree is being rebuilt: ranks that load half-written libraries fail.
# Needs root, iproute2, python3; --peers also OpenMPI (mpirun) and an allreduce_perf built
# with MPI and Gloo.
# 2 cores, 64 MiB, 5 reps, default layouts: ~5 minutes (one rep ~60 s); --peers adds ~40 s a
# rep (OpenMPI's run alone takes ~28 s).
#
#   benchmarks/layout_bench.sh BUILD_DIR [options]
#     --reps N          repetitions (default 5)
#     --size BYTES      message size, allreduce_perf syntax: 4M, 64M, 1G (default 64M)
#     --layouts "L..."  HxR layouts in the order they run (default "2x1 2x2 2x4 3x1 3x2")
#     --peers           also OpenMPI and Gloo in 2x2 (added to the layouts if missing)
#     --old OLD_BUILD   also every layout from OLD_BUILD's allreduce_perf (old against new)
#     --csv FILE        one row per (rep, layout, backend) run (default BUILD_DIR/layout_bench.csv)
#     --logs DIR        every run's output and JSON (default BUILD_DIR/layout_bench.logs)
#     --timeout S       bound of one run in seconds (default 120)
#     --rates R0,R1     rail rates, tc syntax (default 1gbit,250mbit)
#     --mpi-args "..."  extra mpirun arguments, e.g. "--mca btl_tcp_bandwidth_rail0 1000
#                       --mca btl_tcp_bandwidth_rail1 250" for a hand-weighted split
#     --name NAME       test-bed base name, 1-6 of [a-z0-9] (default lb<random>)
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
testbed="$here/testbed/testbed.sh"
python=/usr/bin/python3
[ -x "$python" ] || python=python3

usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit "${1:-2}"; }
[ $# -ge 1 ] || usage
case "$1" in -h | --help) usage 0 ;; -*) usage ;; esac
build=$1
shift
reps=5
size=64M
layouts_arg="2x1 2x2 2x4 3x1 3x2"
peers=0
old=""
csv=""
logs=""
job_timeout=120
rates="1gbit,250mbit"
mpi_extra=""
name="lb$((RANDOM % 10000))"
while [ $# -gt 0 ]; do
  case "$1" in
    --reps) reps=$2; shift 2 ;;
    --size) size=$2; shift 2 ;;
    --layouts) layouts_arg=$2; shift 2 ;;
    --peers) peers=1; shift ;;
    --old) old=$2; shift 2 ;;
    --csv) csv=$2; shift 2 ;;
    --logs) logs=$2; shift 2 ;;
    --timeout) job_timeout=$2; shift 2 ;;
    --rates) rates=$2; shift 2 ;;
    --mpi-args) mpi_extra=$2; shift 2 ;;
    --name) name=$2; shift 2 ;;
    -h | --help) usage 0 ;;
    *) echo "layout_bench: unknown argument '$1'" >&2; usage ;;
  esac
done

die() { echo "layout_bench: $*" >&2; exit 2; }
[[ "$reps" =~ ^[1-9][0-9]*$ ]] || die "bad --reps '$reps'"
[[ "$size" =~ ^[0-9]+[KMGkmg]?$ ]] || die "bad --size '$size' (e.g. 4M, 64M)"
[[ "$job_timeout" =~ ^[1-9][0-9]*$ ]] || die "bad --timeout '$job_timeout'"
# Bed names are NAME<hosts>, and testbed.sh allows 8 characters.
[[ "$name" =~ ^[a-z0-9]{1,6}$ ]] || die "bad --name '$name' (1-6 of [a-z0-9])"
IFS=, read -r -a rate <<<"$rates"
[ ${#rate[@]} -eq 2 ] || die "--rates needs two rates, R0,R1"
read -r -a layouts <<<"$layouts_arg"
[ ${#layouts[@]} -ge 1 ] || die "no --layouts"
for layout in "${layouts[@]}"; do
  [[ "$layout" =~ ^([0-9]+)x([0-9]+)$ ]] || die "bad layout '$layout' (HOSTSxRANKS, e.g. 2x4)"
  h=${BASH_REMATCH[1]} r=${BASH_REMATCH[2]}
  if [ "$h" -lt 2 ] || [ "$h" -gt 32 ]; then die "layout '$layout': 2..32 hosts"; fi
  if [ "$r" -lt 1 ] || [ "$r" -gt 16 ]; then die "layout '$layout': 1..16 ranks per host"; fi
done
# The peers run in 2x2 beside railshard's 2x2, which their speed-ups are taken against.
if [ "$peers" -eq 1 ] && [[ " ${layouts[*]} " != *" 2x2 "* ]]; then layouts+=(2x2); fi
[ "$(id -u)" -eq 0 ] || die "needs root (network namespaces)"
for tool in ip tc timeout "$python"; do
  command -v "$tool" >/dev/null || die "'$tool' not found (scripts/install_deps.sh)"
done
[ -d "$build" ] || die "no build directory '$build'"
build=$(cd "$build" && pwd)
perf="$build/benchmarks/allreduce_perf"
[ -x "$perf" ] || die "$perf not built (cmake --build $build)"
old_perf=""
if [ -n "$old" ]; then
  old_perf="$(cd "$old" 2>/dev/null && pwd)/benchmarks/allreduce_perf"
  [ -x "$old_perf" ] || die "--old: no benchmarks/allreduce_perf in '$old'"
fi
mpi_ok=1
if [ "$peers" -eq 1 ] && ! command -v mpirun >/dev/null; then
  echo "layout_bench: --peers: mpirun not found, OpenMPI is left out (Gloo still runs)" >&2
  mpi_ok=0
fi
# The size in bytes, for the CSV (allreduce_perf's suffixes are powers of 1024).
case "$size" in
  *[Kk]) bytes=$((${size%?} * 1024)) ;;
  *[Mm]) bytes=$((${size%?} * 1024 * 1024)) ;;
  *[Gg]) bytes=$((${size%?} * 1024 * 1024 * 1024)) ;;
  *) bytes=$size ;;
esac
csv=${csv:-$build/layout_bench.csv}
logs=${logs:-$build/layout_bench.logs}
mkdir -p "$logs"
logs=$(cd "$logs" && pwd)

# One bed per host count, each brought up once.
declare -A bed_of=()
for layout in "${layouts[@]}"; do bed_of[${layout%x*}]="$name${layout%x*}"; done
for bed in "${bed_of[@]}"; do
  # A random name that is taken belongs to someone else's run: not ours to tear down.
  if ip netns list | awk '{print $1}' | grep -qE "^$bed-(h[0-9]+|sw)$"; then
    die "test bed '$bed' exists already; pick another --name"
  fi
done

log() { echo "[layout $(date +%T)] $*"; }

# Stops a process of this script's and everything it started, children first.
kill_tree() {
  local child
  for child in $(pgrep -P "$1" || true); do kill_tree "$child"; done
  kill "$1" 2>/dev/null || true
}
# Whatever still runs inside a bed's namespaces was started by this script (a rank that
# ignored its timeout's TERM, an orted): deleting the namespace would not stop it, and it
# would keep the namespace alive.
kill_bed_pids() {
  local ns pids
  for ns in $(ip netns list | awk '{print $1}' | grep -E "^$1-(h[0-9]+|sw)$" || true); do
    pids=$(ip netns pids "$ns" 2>/dev/null || true)
    [ -n "$pids" ] || continue
    # shellcheck disable=SC2086  # one pid a word
    kill $pids 2>/dev/null || true
    sleep 1
    # shellcheck disable=SC2086
    kill -9 $pids 2>/dev/null || true
  done
}
# Runs are started in the background and waited for, so that a signal is handled at once
# (bash runs traps only between foreground commands); on exit every one left is stopped and
# every bed torn down.
cleanup() {
  local rc=$? pid bed
  trap - INT TERM
  for pid in $(pgrep -P $$ || true); do kill_tree "$pid"; done
  if [ "$rc" -ne 0 ]; then log "exit status $rc; test beds torn down"; fi
  for bed in "${bed_of[@]}"; do
    kill_bed_pids "$bed"
    "$testbed" down "$bed" 2>/dev/null || true
  done
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

for hosts in $(printf '%s\n' "${!bed_of[@]}" | sort -n); do
  log "test bed '${bed_of[$hosts]}': $hosts hosts, rail0 ${rate[0]}, rail1 ${rate[1]}"
  "$testbed" up "${bed_of[$hosts]}" "$hosts" "${rate[0]}" "${rate[1]}"
done

# mpirun across namespaces (FIELD-NOTES): mpirun runs in h0 of the bed; its plm_rsh_agent
# starts orted on the host it is given (a rail address), through testbed.sh run, i.e. in that
# host's network namespace under its own UTS namespace and host name, like every rank of a
# railshard job (OpenMPI's session directory and its shared-memory peers go by host name).
write_agent() {  # write_agent BED: prints the agent's path
  local agent="$logs/mpi_agent.$1.sh"
  cat >"$agent" <<EOF
#!/usr/bin/env bash
# plm_rsh_agent for mpirun on test bed '$1': called as 'agent [-opts] HOST CMD...'.
while [ \$# -gt 0 ] && [ "\${1#-}" != "\$1" ]; do shift; done
host=\$1
shift
case "\$host" in
  10.2[0-9][0-9].0.*) h=\$(( \${host##*.} - 1 )) ;;
  $1-h*) h=\${host##*-h} ;;
  *) echo "mpi_agent: unknown host '\$host'" >&2; exit 1 ;;
esac
exec "$testbed" run "$1" "\$h" /bin/sh -c "\$*"
EOF
  chmod +x "$agent"
  echo "$agent"
}

# mpi_run BED HOSTS RANKS ARGS...: allreduce_perf --backend mpi, RANKS per host; hosts by
# their rail0 addresses with slots=RANKS, so mpirun places ranks host by host as testbed
# does. vader inside a host, tcp over both rails between hosts (oob on rail0 only).
mpi_run() {
  local bed=$1 hosts=$2 ranks=$3 h agent hostfile
  shift 3
  agent=$(write_agent "$bed")
  hostfile="$logs/mpi_hosts.$bed.$ranks"
  for h in $(seq 0 $((hosts - 1))); do echo "10.200.0.$((h + 1)) slots=$ranks"; done >"$hostfile"
  local extra=()
  # shellcheck disable=SC2206  # --mpi-args is a word list by design
  if [ -n "$mpi_extra" ]; then extra=($mpi_extra); fi
  OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
    timeout -k 10 "$job_timeout" "$testbed" run "$bed" 0 mpirun --allow-run-as-root \
    --oversubscribe -np $((hosts * ranks)) --hostfile "$hostfile" --bind-to none \
    --mca plm_rsh_agent "$agent" --mca oob_tcp_if_include rail0 \
    --mca btl tcp,self,vader --mca btl_tcp_if_include rail0,rail1 "${extra[@]}" \
    "$perf" --backend mpi "$@"
}

# stragglers BED WHAT: after a run, nothing of it may linger in the bed and skew the next
# one (a rank that outlived its timeout, an orted whose mpirun was killed).
stragglers() {
  local ns left=""
  for _ in $(seq 50); do
    left=""
    for ns in $(ip netns list | awk '{print $1}' | grep -E "^$1-h[0-9]+$" || true); do
      left+=$(ip netns pids "$ns" 2>/dev/null | tr '\n' ' ' || true)
    done
    [ -n "$left" ] || return 0
    sleep 0.1
  done
  log "  $2: processes left in '$1' after the run ($left): stopped"
  kill_bed_pids "$1"
}

# run_one LAYOUT BACKEND JSON ARGS...: one bounded allreduce_perf job.
run_one() {
  local layout=$1 backend=$2 json=$3
  shift 3
  local hosts=${layout%x*} ranks=${layout#*x}
  local bed=${bed_of[$hosts]}
  local args=(-b "$size" -e "$size" -w 1 -n 3 -J "$json" "$@")
  case "$backend" in
    railshard | railshard-old)
      local binary=$perf
      if [ "$backend" = railshard-old ]; then binary=$old_perf; fi
      TESTBED_RANKS=$ranks TESTBED_TIMEOUT=$job_timeout \
        timeout -k 10 $((job_timeout + 15)) "$testbed" job "$bed" "$binary" "${args[@]}" ;;
    gloo)
      # Gloo uses one interface; rail0 is the fast one (it would pick it anyway: the store is
      # on rail0).
      RAILSHARD_SOCKET_IFNAME=rail0 TESTBED_RANKS=$ranks TESTBED_TIMEOUT=$job_timeout \
        timeout -k 10 $((job_timeout + 15)) "$testbed" job "$bed" "$perf" --backend gloo \
        "${args[@]}" ;;
    mpi) mpi_run "$bed" "$hosts" "$ranks" "${args[@]}" ;;
  esac
}

# json_row FILE WORLD: "oop_us oop_busbw ip_us ip_busbw wrong" of the one row, or fails.
json_row() {
  "$python" - "$1" "$2" <<'EOF'
import json, sys
doc = json.load(open(sys.argv[1]))
ranks = doc["config"]["ranks"]
if ranks != int(sys.argv[2]):
    sys.exit(f"{ranks} ranks, expected {sys.argv[2]}")
row = doc["rows"][0]
print(f'{row["oop_time_us"]:.1f} {row["oop_busbw"]:.4f} {row["ip_time_us"]:.1f} '
      f'{row["ip_busbw"]:.4f} {doc["wrong_total"]}')
EOF
}

# What runs in each repetition, in order: LAYOUT:BACKEND.
runs=()
for layout in "${layouts[@]}"; do
  runs+=("$layout:railshard")
  if [ -n "$old_perf" ]; then runs+=("$layout:railshard-old"); fi
  if [ "$peers" -eq 1 ] && [ "$layout" = 2x2 ]; then
    if [ "$mpi_ok" -eq 1 ]; then runs+=("2x2:mpi"); fi
    runs+=("2x2:gloo")
  fi
done

columns=(rep layout hosts ranks_per_host world backend bytes status oop_time_us oop_busbw_GBps
  ip_time_us ip_busbw_GBps wrong wall_s log)
(IFS=,; echo "${columns[*]}") >"$csv"
declare -A failures=()
started=$(date +%s)
log "$reps reps of: ${runs[*]}; size $size; each run bounded by ${job_timeout} s;" \
  "CSV $csv, logs $logs"
for rep in $(seq "$reps"); do
  for entry in "${runs[@]}"; do
    layout=${entry%:*}
    backend=${entry#*:}
    if [ "${failures[$entry]:-0}" -ge 2 ]; then continue; fi
    hosts=${layout%x*}
    ranks=${layout#*x}
    world=$((hosts * ranks))
    base="$logs/rep$rep.$layout.$backend"
    rm -f "$base.json"
    t0=$(date +%s%3N)
    rc=0
    run_one "$layout" "$backend" "$base.json" >"$base.txt" 2>&1 &
    wait $! || rc=$?
    stragglers "${bed_of[$hosts]}" "$layout $backend"
    wall=$(( $(date +%s%3N) - t0 ))
    wall_s=$(printf '%d.%03d' $((wall / 1000)) $((wall % 1000)))
    fields=""
    why=""
    # testbed.sh job exits 0 even when a rank failed or timed out, so a run counts as done
    # only when rank 0 wrote its JSON; the wall time tells a timeout.
    if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ] || [ "$wall" -ge $((job_timeout * 1000)) ]; then
      why="timed out after ${job_timeout} s (exit $rc)"
    elif [ "$rc" -ne 0 ]; then
      why="exit $rc"
    elif [ ! -s "$base.json" ]; then
      why="no JSON written"
    elif ! fields=$(json_row "$base.json" "$world" 2>&1); then
      why="bad JSON: $fields"
      fields=""
    fi
    read -r oop oop_bw ip ip_bw wrong <<<"${fields:-- - - - -}"
    status=ok
    if [ -n "$why" ]; then
      status=failed
    elif [ "$wrong" != 0 ]; then
      status=wrong
      why="$wrong wrong elements"
    fi
    if [ "$status" = ok ]; then
      ms=$(awk -v t="$oop" 'BEGIN { printf "%.1f", t / 1e3 }')
      log "rep $rep/$reps $layout $backend: $ms ms out-of-place, busbw $oop_bw GB/s" \
        "(wall ${wall_s} s)"
    else
      failures[$entry]=$((${failures[$entry]:-0} + 1))
      log "rep $rep/$reps $layout $backend: FAILED: $why after ${wall_s} s; last lines of" \
        "$base.txt: $(tail -n 3 "$base.txt" | tr '\n' ' ')"
      if [ "${failures[$entry]}" -ge 2 ]; then
        log "  $layout $backend failed twice: not run again"
      fi
    fi
    if [ "$status" != ok ]; then oop="" oop_bw="" ip="" ip_bw=""; fi
    if [ "$wrong" = - ]; then wrong=""; fi
    row=("$rep" "$layout" "$hosts" "$ranks" "$world" "$backend" "$bytes" "$status" "$oop" "$oop_bw"
      "$ip" "$ip_bw" "$wrong" "$wall_s" "$base.txt")
    (IFS=,; echo "${row[*]}") >>"$csv"
  done
done
log "done in $(($(date +%s) - started)) s"

# Exit status 1 when a run failed (the summary says which), whatever the targets.
"$python" - "$csv" "$peers" "$mpi_ok" "$reps" <<'EOF'
import csv, statistics, sys
path, peers, mpi_ok, reps = sys.argv[1], sys.argv[2] == "1", sys.argv[3] == "1", sys.argv[4]
rows = list(csv.DictReader(open(path)))
time = {}  # (layout, backend) -> {rep: out-of-place ms}
busbw = {}
order = []
for r in rows:
    key = (r["layout"], r["backend"])
    if key not in order:
        order.append(key)
    if r["status"] == "ok":
        time.setdefault(key, {})[r["rep"]] = float(r["oop_time_us"]) / 1e3
        busbw.setdefault(key, []).append(float(r["oop_busbw_GBps"]))
size = rows[0]["bytes"] if rows else "?"

print(f"\n# {size} B float32 sum all-reduce, out-of-place time over {reps} reps (ms)")
print(f"  {'layout':<7} {'backend':<10} {'ok':>5} {'median':>9} {'min':>9} {'max':>9} "
      f"{'busbw GB/s':>11}")
for key in order:
    t = time.get(key, {})
    runs = sum(1 for r in rows if (r["layout"], r["backend"]) == key)
    if t:
        v = list(t.values())
        print(f"  {key[0]:<7} {key[1]:<10} {len(v):>2}/{runs:<2} {statistics.median(v):>9.1f} "
              f"{min(v):>9.1f} {max(v):>9.1f} {statistics.median(busbw[key]):>11.3f}")
    else:
        print(f"  {key[0]:<7} {key[1]:<10} {0:>2}/{runs:<2} {'(no successful run)':>30}")

def paired(a, b):  # per-rep a/b, over the reps where both ran
    ta, tb = time.get(a, {}), time.get(b, {})
    return [ta[k] / tb[k] for k in ta if k in tb]

targets = {"2x2": 1.10, "2x4": 1.15, "3x2": 1.15}
lines = []
for layout, backend in order:
    if not backend.startswith("railshard"):
        continue
    hosts, ranks = layout.split("x")
    base = (f"{hosts}x1", backend)
    if ranks == "1" or base not in order:
        continue
    q = paired((layout, backend), base)
    if not q:
        lines.append(f"  {layout}/{base[0]}: no rep where both ran")
        continue
    target = targets.get(layout)
    verdict = "" if target is None else (
        f"  target <= {target:.2f}: {'met' if statistics.median(q) <= target else 'NOT met'}")
    lines.append(f"  {backend:<13} {layout}/{base[0]}: {statistics.median(q):.3f} "
                 f"(min {min(q):.3f}, max {max(q):.3f}, {len(q)} reps){verdict}")
if lines:
    print("\n# railshard, extra ranks per host: per-rep time ratio HxR / Hx1, median over reps")
    print("\n".join(lines))
old_lines = []
for layout, backend in order:
    if backend != "railshard-old":
        continue
    q = paired((layout, "railshard"), (layout, "railshard-old"))
    if q:
        old_lines.append(f"  {layout}: {statistics.median(q):.3f} (min {min(q):.3f}, "
                         f"max {max(q):.3f}, {len(q)} reps)")
if old_lines:
    print("\n# new against old: per-rep time ratio new / old, median over reps (< 1: faster)")
    print("\n".join(old_lines))

if peers:
    print("\n# 2x2 peers: speed-up = peer's median time / railshard's "
          "[median of per-rep factors]")
    mine = time.get(("2x2", "railshard"), {})
    for backend, label, target in (("mpi", "OpenMPI", 1.5), ("gloo", "Gloo", 2.0)):
        theirs = time.get(("2x2", backend), {})
        if backend == "mpi" and not mpi_ok:
            print(f"  vs {label}: not run (no mpirun)")
        elif not theirs or not mine:
            print(f"  vs {label}: no successful {'railshard' if not mine else label} run "
                  f"(see the FAILED lines and the logs)")
        else:
            f = statistics.median(theirs.values()) / statistics.median(mine.values())
            q = paired(("2x2", backend), ("2x2", "railshard"))
            per_rep = f"[{statistics.median(q):.2f}x]" if q else "[no common rep]"
            print(f"  vs {label}: {f:.2f}x {per_rep}  ({statistics.median(theirs.values()):.1f} "
                  f"vs {statistics.median(mine.values()):.1f} ms)  target >= {target:.1f}x: "
                  f"{'met' if f >= target else 'NOT met'}")
failed = [r for r in rows if r["status"] != "ok"]
if failed:
    print(f"\n# {len(failed)} run(s) did not succeed (status in {path}):")
    for r in failed:
        print(f"  rep {r['rep']} {r['layout']} {r['backend']}: {r['status']}, see {r['log']}")
    sys.exit(1)
EOF
