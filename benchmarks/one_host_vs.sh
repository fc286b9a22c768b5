#!/usr/bin/env bash
# One host, two builds side by side: is the new one as fast as the old one? Runs
# railshard-launch -n NP allreduce_perf from each build in turn, alternating old and new for
# --rounds rounds (the machine's noise then hits both alike), each round two jobs per build:
#   -b 64K -e 64M -f 4 -n 40 -w 5 -J ...   (busbw: mean of out-of-place and in-place)
#   -b 8 -e 8 -n 2000 -w 200 -J ...        (8 B latency: the better of the two)
# and prints per np and size the median over rounds of old and new and the median of the
# per-round new/old ratios (busbw: > 1 is faster; latency: < 1 is faster). Issue #21's target:
# every size >= 64 KiB within 5% (ratio >= 0.95), 8 B no slower.
#
#   benchmarks/one_host_vs.sh OLD_BUILD NEW_BUILD [--rounds N] [--np "2 4"] [--logs DIR]
# Each BUILD_DIR needs benchmarks/allreduce_perf and launcher/tools/railshard-launch. 2 cores,
# np 2 and 4, 6 rounds: ~8 minutes.
set -euo pipefail
python=/usr/bin/python3
[ -x "$python" ] || python=python3
usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit "${1:-2}"; }
[ $# -ge 2 ] || usage
old=$1
new=$2
shift 2
rounds=6
nps="2 4"
logs=""
while [ $# -gt 0 ]; do
  case "$1" in
    --rounds) rounds=$2; shift 2 ;;
    --np) nps=$2; shift 2 ;;
    --logs) logs=$2; shift 2 ;;
    -h | --help) usage 0 ;;
    *) echo "one_host_vs: unknown option $1" >&2; usage ;;
  esac
done
for build in "$old" "$new"; do
  for tool in benchmarks/allreduce_perf launcher/tools/railshard-launch; do
    [ -x "$build/$tool" ] || { echo "one_host_vs: no $build/$tool" >&2; exit 2; }
  done
done
logs=${logs:-$new/one_host_vs.logs}
mkdir -p "$logs"

status=0
for round in $(seq "$rounds"); do
  for np in $nps; do
    for side in old new; do
      build=$old
      [ "$side" = new ] && build=$new
      for kind in bw lat; do
        args=(-b 64K -e 64M -f 4 -n 40 -w 5)
        [ "$kind" = lat ] && args=(-b 8 -e 8 -n 2000 -w 200)
        base="$logs/r$round.np$np.$side.$kind"
        if ! timeout -k 10 300 "$build/launcher/tools/railshard-launch" -n "$np" \
          "$build/benchmarks/allreduce_perf" "${args[@]}" -J "$base.json" >"$base.txt" 2>&1; then
          echo "one_host_vs: round $round np $np $side $kind failed (see $base.txt)" >&2
          status=1
        fi
      done
    done
  done
  echo "[one_host_vs $(date +%H:%M:%S)] round $round/$rounds done" >&2
done

"$python" - "$logs" "$rounds" $nps <<'EOF'
import json, os, statistics, sys
logs, rounds, nps = sys.argv[1], int(sys.argv[2]), [int(n) for n in sys.argv[3:]]
def load(r, np, side, kind):
    path = f"{logs}/r{r}.np{np}.{side}.{kind}.json"
    if not os.path.exists(path) or os.path.getsize(path) == 0:
        return None
    doc = json.load(open(path))
    if doc["wrong_total"]:
        sys.exit(f"{path}: {doc['wrong_total']} wrong elements")
    return doc["rows"]
def size_text(b):
    for unit, div in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if b >= div:
            return f"{b // div} {unit}"
    return f"{b} B"
for np in nps:
    bw = {}   # size -> side -> [busbw per round]
    ratio = {}
    lat = {"old": [], "new": []}
    lat_ratio = []
    for r in range(1, rounds + 1):
        rows = {side: load(r, np, side, "bw") for side in ("old", "new")}
        if all(rows.values()):
            for o, n in zip(rows["old"], rows["new"]):
                ob = (o["oop_busbw"] + o["ip_busbw"]) / 2
                nb = (n["oop_busbw"] + n["ip_busbw"]) / 2
                bw.setdefault(o["size"], {"old": [], "new": []})
                bw[o["size"]]["old"].append(ob)
                bw[o["size"]]["new"].append(nb)
                ratio.setdefault(o["size"], []).append(nb / ob if ob > 0 else float("nan"))
        rows = {side: load(r, np, side, "lat") for side in ("old", "new")}
        if all(rows.values()):
            o = min(rows["old"][0]["oop_time_us"], rows["old"][0]["ip_time_us"])
            n = min(rows["new"][0]["oop_time_us"], rows["new"][0]["ip_time_us"])
            lat["old"].append(o)
            lat["new"].append(n)
            lat_ratio.append(n / o)
    cells = []
    for size in sorted(bw):
        m = statistics.median
        cells.append(f"{size_text(size)}: {m(bw[size]['old']):.2f} -> {m(bw[size]['new']):.2f} GB/s,"
                     f" {m(ratio[size]):.2f}")
    if lat_ratio:
        m = statistics.median
        cells.append(f"8 B: {m(lat['old']):.2f} -> {m(lat['new']):.2f} us, {m(lat_ratio):.2f}")
    worst = min((statistics.median(v) for v in ratio.values()), default=float("nan"))
    print(f"np={np}: " + "; ".join(cells))
    print(f"np={np}: worst busbw ratio (new/old, median of rounds) {worst:.2f} (target >= 0.95)")
EOF
exit "$status"
