#!/usr/bin/python3
"""Tables and plots for benchmarks/multirail_bench.sh.

  plot_multirail.py sweep --dir OUT [--rates 2gbit,500mbit]
      OUT/allreduce/<mode>.rep<k>.txt (allreduce_perf output) -> OUT/allreduce_busbw.csv
      (mode, size, median/min/max busbw over the repetitions) and OUT/allreduce_busbw.png
      (busbw vs size per mode, the iperf3 rates of OUT/iperf3.csv as horizontal lines).
      A run's busbw at a size is the mean of its out-of-place and in-place busbw (as in
      nccl-tests' "Avg bus bandwidth"), computed from the time column (the busbw column has
      two decimals only). GB/s = 1e9 bytes/s.

  plot_multirail.py timeline --csv timeline.csv --events events.csv --title T --out PNG
      rail_bench's CSV -> busbw over time, each rail's share and estimated Gbit/s, rails
      marked where they were down, the events (rate change, link down/up) as vertical lines.

Run with Debian's python (matplotlib from python3-matplotlib).
"""

import argparse
import csv
import re
import statistics
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from compare_peers import human, parse_table  # noqa: E402

MODE_ORDER = ("railshard-adaptive", "railshard-equal", "railshard-rail0", "gloo-rail0",
              "mpi-rail0", "mpi-both")


def pyplot():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def read_iperf(path):
    """iperf3.csv -> {(test, rail): Gbit/s}."""
    rates = {}
    if path.exists():
        with path.open() as f:
            for row in csv.DictReader(f):
                if row.get("gbps"):
                    rates[(row["test"], row["rail"])] = float(row["gbps"])
    return rates


def sweep(args):
    out = Path(args.dir)
    runs = defaultdict(lambda: defaultdict(list))  # mode -> size -> [busbw per rep]
    wrong = defaultdict(int)
    for path in sorted((out / "allreduce").glob("*.rep*.txt")):
        match = re.fullmatch(r"(.+)\.rep(\d+)\.txt", path.name)
        if not match:
            continue  # *.failed.txt
        mode = match.group(1)
        rows, _, _ = parse_table(path.read_text(errors="replace"))
        for row in rows:
            busbws = [row["size"] / (row[f"{p}_time_us"] * 1e-6) / 1e9  # 2 ranks: factor 1
                      for p in ("oop", "ip") if row[f"{p}_time_us"] > 0]
            if busbws:
                runs[mode][row["size"]].append(sum(busbws) / len(busbws))
            wrong[mode] += row["oop_wrong"] + row["ip_wrong"]
    if not runs:
        print("plot_multirail: no allreduce_perf results in", out / "allreduce", file=sys.stderr)
        return 1
    modes = [m for m in MODE_ORDER if m in runs] + sorted(m for m in runs if m not in MODE_ORDER)
    with (out / "allreduce_busbw.csv").open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["mode", "size_bytes", "size", "busbw_median_gbs", "busbw_min_gbs",
                    "busbw_max_gbs", "busbw_median_gbits", "runs", "wrong"])
        for mode in modes:
            for size in sorted(runs[mode]):
                v = runs[mode][size]
                med = statistics.median(v)
                w.writerow([mode, size, human(size), f"{med:.4f}", f"{min(v):.4f}",
                            f"{max(v):.4f}", f"{med * 8:.3f}", len(v), wrong[mode]])

    plt = pyplot()
    fig, ax = plt.subplots(figsize=(9, 6.5))
    for mode in modes:
        sizes = sorted(runs[mode])
        med = [statistics.median(runs[mode][s]) for s in sizes]
        lo = [med[i] - min(runs[mode][s]) for i, s in enumerate(sizes)]
        hi = [max(runs[mode][s]) - med[i] for i, s in enumerate(sizes)]
        ax.errorbar(sizes, med, yerr=[lo, hi], marker="o", capsize=3, label=mode)
    rates = read_iperf(out / "iperf3.csv")
    lines = [(("alone", "rail0"), "iperf3 rail0", "tab:gray", ":"),
             (("alone", "rail1"), "iperf3 rail1", "tab:gray", "-."),
             (("both", "sum"), "iperf3 both rails at once (sum)", "black", "--")]
    for key, label, color, style in lines:
        if key in rates:
            ax.axhline(rates[key] / 8, color=color, linestyle=style, linewidth=1,
                       label=f"{label}: {rates[key]:.2f} Gbit/s")
    ax.set_xscale("log", base=2)
    ax.set_xticks(sorted({s for m in modes for s in runs[m]}))
    ax.set_xticklabels([human(s) for s in ax.get_xticks()])
    ax.set_xlabel("all-reduce size (bytes, float32)")
    ax.set_ylabel("busbw (GB/s; 2 ranks: = algbw)")
    ax.set_ylim(bottom=0)
    ax.secondary_yaxis("right", functions=(lambda x: x * 8, lambda x: x / 8)).set_ylabel(
        "Gbit/s")
    title = "allreduce_perf, 2 hosts on the namespace test bed"
    if args.rates:
        r0, r1 = args.rates.split(",")
        title += f" (rail0 {r0}, rail1 {r1})"
    reps = max(len(v) for m in runs.values() for v in m.values())
    ax.set_title(f"{title}\nmedian of {reps} interleaved runs, bars: min-max")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=3)
    fig.tight_layout()
    fig.savefig(out / "allreduce_busbw.png", dpi=120)
    print(f"plot_multirail: {out / 'allreduce_busbw.csv'}, {out / 'allreduce_busbw.png'}")
    return 0


def down_spans(rows, rail):
    """[(t_first, t_last)] of each run of rows in which `rail` was reported down."""
    spans, start, last = [], None, None
    for r in rows:
        t = float(r["t_s"])
        if r.get(f"{rail}_up", "") == "0":
            start = t if start is None else start
            last = t
        elif start is not None:
            spans.append((start, t))
            start = None
    if start is not None:
        spans.append((start, last))
    return spans


def timeline(args):
    with open(args.csv) as f:
        rows = list(csv.DictReader(f))
    if not rows:
        print("plot_multirail: no rows in", args.csv, file=sys.stderr)
        return 1
    fields = rows[0].keys()
    rails = [k[: -len("_fraction")] for k in fields if k.endswith("_fraction")]
    events = []
    if args.events and Path(args.events).exists():
        with open(args.events) as f:
            events = [(float(r["t_s"]), r["event"]) for r in csv.DictReader(f)]

    def column(name, rail_rows=None):
        xs, ys = [], []
        for r in rail_rows or rows:
            if r.get(name, "") != "":
                xs.append(float(r["t_s"]))
                ys.append(float(r[name]))
        return xs, ys

    plt = pyplot()
    panels = 3 if rails else 1
    fig, axes = plt.subplots(panels, 1, figsize=(10, 2.8 * panels + 0.6), sharex=True,
                             squeeze=False)
    axes = axes[:, 0]
    t, busbw = column("busbw_gbs")
    axes[0].plot(t, busbw, ".-", linewidth=0.8, markersize=3, color="black")
    axes[0].set_ylabel("busbw (GB/s)")
    axes[0].set_ylim(bottom=0)
    if rails:
        for rail in rails:
            line, = axes[1].plot(*column(f"{rail}_fraction"), ".-", linewidth=0.8,
                                 markersize=3, label=rail)
            axes[2].plot(*column(f"{rail}_gbps"), ".-", linewidth=0.8, markersize=3,
                         label=rail, color=line.get_color())
            for i, (x0, x1) in enumerate(down_spans(rows, rail)):
                for ax in axes[1:]:
                    ax.axvspan(x0, x1, color=line.get_color(), alpha=0.15,
                               label=f"{rail} down" if i == 0 and ax is axes[1] else None)
        axes[1].set_ylabel("share of a message")
        axes[1].set_ylim(0, 1.05)
        axes[1].legend(fontsize=8, loc="best")
        axes[2].set_ylabel("estimated Gbit/s")
        axes[2].set_ylim(bottom=0)
        axes[2].legend(fontsize=8, loc="best")
    else:
        axes[0].text(0.01, 0.02, "the transport reported no rails", transform=axes[0].transAxes,
                     fontsize=8, color="gray")
    for ax in axes:
        ax.grid(True, alpha=0.3)
        for x, text in events:
            ax.axvline(x, color="red", linestyle="--", linewidth=1)
    for x, text in events:
        axes[0].annotate(text, (x, 1), xycoords=("data", "axes fraction"), xytext=(3, -12),
                         textcoords="offset points", fontsize=8, color="red")
    axes[-1].set_xlabel("t (s since start)")
    axes[0].set_title(args.title or "rail_bench timeline")
    fig.tight_layout()
    fig.savefig(args.out, dpi=120)
    print(f"plot_multirail: {args.out}")
    return 0


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("sweep")
    p.add_argument("--dir", required=True)
    p.add_argument("--rates", default="")
    p = sub.add_parser("timeline")
    p.add_argument("--csv", required=True)
    p.add_argument("--events", default="")
    p.add_argument("--title", default="")
    p.add_argument("--out", required=True)
    args = parser.parse_args()
    return sweep(args) if args.command == "sweep" else timeline(args)


if __name__ == "__main__":
    sys.exit(main())
