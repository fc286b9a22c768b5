#!/usr/bin/python3
"""Runs allreduce_perf with every backend (railshard, mpi, gloo) on this host and compares them.

Each backend runs the same sweep (same sizes, same data, same validation, same columns) under
its natural launcher:

  railshard  railshard-launch -n NP allreduce_perf --backend railshard
  mpi        mpirun --allow-run-as-root --oversubscribe --bind-to none -np NP ... --backend mpi
             (--bind-to none: with binding, oversubscribed ranks share core 0 and every call
             costs a 4 ms scheduler tick; see FIELD-NOTES)
  gloo       railshard-launch -n NP allreduce_perf --backend gloo

The sweep is split in two runs per repetition: sizes below --split with many iterations (small
messages are cheap and noisy) and the rest with few (a 128 MiB all-reduce takes ~0.1-1 s on two
cores). Repetitions are interleaved (rep 1 of every backend, then rep 2, ...) so slow drift of a
shared machine hits all backends alike. Per-size medians over repetitions go to CSV, JSON and a
PNG (busbw and time vs size, one column per world size).

Every run has a timeout and the whole comparison a time budget: when the budget runs out, the
remaining runs are skipped and the results so far are written. Exit status 1 when a run failed
(non-zero exit, wrong values, timeout) or a backend could not be run at all, else 0.

Run with Debian's python (matplotlib from python3-matplotlib):

  /usr/bin/python3 benchmarks/compare_peers.py --build build       # ~10 min with defaults
  /usr/bin/python3 benchmarks/compare_peers.py --build build --replot   # redraw, no runs

Outputs in --out (default BUILD/compare): runs.csv (every table row of every run, with the
1-minute load average at its start), medians.csv (per backend, np and size: median, min and
max time over repetitions; algbw and busbw from the median time), compare.json (the same plus
each backend's "# Using" line, the commands and failures) and compare_peers.png.
"""

import argparse
import csv
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import textwrap
import time
from pathlib import Path

BACKENDS = ("railshard", "mpi", "gloo", "railshard-staged", "railshard-shared", "railshard-cross")
DEFAULT_BACKENDS = ("railshard", "mpi", "gloo")
# railshard run another way, for old-vs-new in one run (issue #26): extra environment and
# allreduce_perf options.
VARIANTS = {
    "railshard-staged": ({"RAILSHARD_SHM_SINGLE_COPY": "0"}, []),  # every byte via the slots
    "railshard-shared": ({}, ["--shared-buffers", "1"]),  # buffers the peers map once
    "railshard-cross": ({"RAILSHARD_SHM_CROSS_READ": "1"}, []),  # ordinary ones read across
}
COLUMNS = ("time_us", "algbw", "busbw", "wrong")


def parse_size(text):
    """'8', '64K', '32M', '1G' -> bytes (the suffixes allreduce_perf accepts)."""
    units = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
    text = text.strip()
    if text and text[-1].lower() in units:
        return int(float(text[:-1]) * units[text[-1].lower()])
    return int(text)


def human(size):
    for unit, shift in (("G", 30), ("M", 20), ("K", 10)):
        if size >= 1 << shift and size % (1 << shift) == 0:
            return f"{size >> shift}{unit}"
    return str(size)


def sweep_sizes(min_bytes, max_bytes, factor):
    """The sizes allreduce_perf visits for -b/-e/-f (nccl-tests: min * factor^k <= max)."""
    sizes = []
    size = min_bytes
    while size <= max_bytes:
        sizes.append(size)
        if int(size * factor) <= size:
            break
        size = int(size * factor)
    return sizes


def parse_table(stdout):
    """allreduce_perf's output -> (rows, using line, footer ok). Strips railshard-launch's
    '[r] ' prefix. A row: size count type redop root, then time algbw busbw #wrong for
    out-of-place and in-place."""
    rows = []
    using = ""
    footer_ok = False
    for line in stdout.splitlines():
        if line.startswith("[") and "] " in line:
            line = line.split("] ", 1)[1]
        if line.startswith("# Using "):
            using = line[len("# Using "):].strip()
        if line.startswith("# Out of bounds values"):
            footer_ok = line.rstrip().endswith("0 OK")
        words = line.split()
        # 13 columns, or 14 with allreduce_perf's efficiency column (link limit known).
        if len(words) not in (13, 14) or not words[0].isdigit() or words[4] != "-1":
            continue
        row = {"size": int(words[0]), "count": int(words[1]), "dtype": words[2],
               "op": words[3]}
        for prefix, start in (("oop", 5), ("ip", 9)):
            for i, name in enumerate(COLUMNS):
                value = words[start + i]
                row[f"{prefix}_{name}"] = int(value) if name == "wrong" else float(value)
        rows.append(row)
    return rows, using, footer_ok


def load_average():
    """1-minute load average: other work on a 2-core machine skews every number, so each run
    records it."""
    try:
        return float(Path("/proc/loadavg").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return -1.0


def run_bounded(argv, timeout, env):
    """Runs argv in its own session; on timeout SIGTERM (launchers forward it to their
    ranks), then SIGKILL of the whole group. Returns (rc or None on timeout, stdout,
    stderr, seconds)."""
    start = time.monotonic()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
        return proc.returncode, out, err, time.monotonic() - start
    except subprocess.TimeoutExpired:
        pass
    for sig, wait in ((signal.SIGTERM, 10), (signal.SIGKILL, 10)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            out, err = proc.communicate(timeout=wait)
            return None, out, err, time.monotonic() - start
        except subprocess.TimeoutExpired:
            continue
    return None, "", "", time.monotonic() - start


def command_for(backend, np_, args, perf_args):
    extra = VARIANTS.get(backend, ({}, []))[1]
    perf = [str(args.perf), "--backend", backend.split("-")[0]] + perf_args + extra
    if backend == "gloo":
        perf += ["--gloo-algo", args.gloo_algo]
    if backend == "mpi":
        return [args.mpirun, "--allow-run-as-root", "--oversubscribe", "--bind-to", "none",
                "-np", str(np_)] + perf
    return [str(args.launch), "-n", str(np_), "--grace", "2"] + perf


def built_backends(perf):
    out = subprocess.run([str(perf), "--help"], capture_output=True, text=True,
                         timeout=30).stdout
    for line in out.splitlines():
        if line.startswith("Backends built in:"):
            return line.split(":", 1)[1].split()
    return ["railshard"]


def load_memcpy(path):
    """CSV of single-core memcpy bandwidth: a size column (bytes/size) and a GB/s column
    (gbps/GB/s/bandwidth); else the first two columns. Returns [(bytes, GB/s)]."""
    points = []
    with open(path, newline="") as f:
        reader = csv.reader(f)
        header = next(reader, [])
        lower = [h.strip().lower() for h in header]
        size_col = next((i for i, h in enumerate(lower) if h in ("bytes", "size", "size_bytes")), 0)
        bw_col = next((i for i, h in enumerate(lower)
                       if h in ("gbps", "gb/s", "bandwidth", "bw_gbps", "memcpy_gbps")), 1)
        try:  # a header-less file: the first line is data
            points.append((parse_size(header[size_col]), float(header[bw_col])))
        except (ValueError, IndexError):
            pass
        for row in reader:
            try:
                points.append((parse_size(row[size_col]), float(row[bw_col])))
            except (ValueError, IndexError):
                continue
    return sorted(points)


def medians(records, np_):
    """records of one (backend, np): per size, the median time over repetitions, and algbw and
    busbw computed from it (nccl-tests' formulas: algbw = bytes / time, busbw = algbw *
    2(n-1)/n). Computed rather than taken from the table, whose two decimals of GB/s read
    0.00 for every small message; for an odd number of repetitions it is the same as the
    median of the per-run bandwidths."""
    by_size = {}
    for r in records:
        by_size.setdefault(r["size"], []).append(r)
    factor = 2.0 * (np_ - 1) / np_ if np_ > 1 else 0.0
    result = []
    for size in sorted(by_size):
        group = by_size[size]
        entry = {"size": size, "reps": len(group)}
        for prefix in ("oop", "ip"):
            times = [r[f"{prefix}_time_us"] for r in group]
            t = statistics.median(times)
            algbw = size / (t * 1e-6) / 1e9 if t > 0 else 0.0
            entry[f"{prefix}_time_us"] = t
            # The spread over repetitions: on a shared 2-core machine it is often 2-10x.
            entry[f"{prefix}_time_us_min"] = min(times)
            entry[f"{prefix}_time_us_max"] = max(times)
            entry[f"{prefix}_algbw"] = algbw
            entry[f"{prefix}_busbw"] = algbw * factor
        entry["wrong"] = sum(r["oop_wrong"] + r["ip_wrong"] for r in group)
        result.append(entry)
    return result


def plot(path, table, nps, backends, memcpy, title):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    size_labels = FuncFormatter(lambda x, _: human(int(x)) if x >= 1 else "")

    colors = {"railshard": "tab:red", "mpi": "tab:blue", "gloo": "tab:green"}
    fig, axes = plt.subplots(2, len(nps), figsize=(6.5 * len(nps), 9), squeeze=False)
    for col, np_ in enumerate(nps):
        bw_ax, time_ax = axes[0][col], axes[1][col]
        for backend in backends:
            rows = table.get((backend, np_), [])
            if not rows:
                continue
            sizes = [r["size"] for r in rows]
            color = colors.get(backend)
            bw_ax.plot(sizes, [r["ip_busbw"] for r in rows], "o-", color=color,
                       label=f"{backend} in-place")
            bw_ax.plot(sizes, [r["oop_busbw"] for r in rows], "x--", color=color, alpha=0.6,
                       label=f"{backend} out-of-place")
            time_ax.plot(sizes, [r["ip_time_us"] for r in rows], "o-", color=color,
                         label=f"{backend} in-place")
        if memcpy:
            bw_ax.plot([p[0] for p in memcpy], [p[1] for p in memcpy], ":", color="gray",
                       label="single-core memcpy")
        bw_ax.set_xscale("log", base=2)
        bw_ax.xaxis.set_major_formatter(size_labels)
        bw_ax.set_title(f"all-reduce float sum, np={np_}")
        bw_ax.set_xlabel("message size (bytes)")
        bw_ax.set_ylabel("bus bandwidth (GB/s, median)")
        bw_ax.grid(True, which="both", alpha=0.3)
        bw_ax.legend(fontsize=8)
        time_ax.set_xscale("log", base=2)
        time_ax.xaxis.set_major_formatter(size_labels)
        time_ax.set_yscale("log")
        time_ax.set_xlabel("message size (bytes)")
        time_ax.set_ylabel("time per all-reduce (µs, median)")
        time_ax.grid(True, which="both", alpha=0.3)
        time_ax.legend(fontsize=8)
    fig.suptitle(title, fontsize=8)
    fig.tight_layout(rect=(0, 0, 1, 0.94))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def read_runs(path):
    """runs.csv as written by an earlier run -> records with numeric fields."""
    records = []
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            for key, value in row.items():
                if key in ("backend", "part", "dtype", "op"):
                    continue
                row[key] = float(value) if "." in value or "e" in value else int(value)
            records.append(row)
    return records


def report(out_dir, records, backends, nps, sizes, usings, extra, memcpy_csv, no_plot, loads):
    """Writes medians.csv, compare.json and the PNG; prints the summary table."""
    table = {}
    for backend in backends:
        for np_ in nps:
            table[(backend, np_)] = medians(
                [r for r in records if r["backend"] == backend and r["np"] == np_], np_)
    med_fields = ["backend", "np", "size", "reps"] + \
                 [f"{p}_{c}" for p in ("oop", "ip")
                  for c in ("time_us", "time_us_min", "time_us_max", "algbw", "busbw")] + \
                 ["wrong"]
    with open(out_dir / "medians.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=med_fields)
        writer.writeheader()
        for (backend, np_), rows in table.items():
            for row in rows:
                writer.writerow({"backend": backend, "np": np_, **row})
    summary = dict(extra)
    summary.update({
        "sizes": sizes,
        "nps": nps,
        "backends": {b: {str(n): usings.get((b, n), "") for n in nps} for b in backends},
        "load_average_1min": {"min": min(loads, default=-1), "max": max(loads, default=-1),
                              "median": statistics.median(loads) if loads else -1},
        "medians": [{"backend": b, "np": n, **row} for (b, n), rows in table.items()
                    for row in rows],
    })
    (out_dir / "compare.json").write_text(json.dumps(summary, indent=1) + "\n")

    # Summary: in-place busbw medians and ratios.
    for np_ in nps:
        print(f"\nnp={np_}: in-place busbw GB/s (median of reps), time µs in parentheses")
        header = f"{'size':>8}" + "".join(f"{b:>24}" for b in backends)
        ratio_cols = [b for b in ("mpi", "gloo") if b in backends]
        if "railshard" in backends:
            header += "".join(f"{'rs/' + b:>9}" for b in ratio_cols)
        print(header)
        by = {b: {r["size"]: r for r in table[(b, np_)]} for b in backends}
        for size in sizes:
            line = f"{human(size):>8}"
            for b in backends:
                r = by[b].get(size)
                line += f"{r['ip_busbw']:>12.3f} ({r['ip_time_us']:>9.1f})" if r else f"{'-':>24}"
            if "railshard" in backends:
                rs = by["railshard"].get(size)
                for b in ratio_cols:
                    peer = by[b].get(size)
                    if rs and peer and rs["ip_time_us"] > 0:
                        # time ratio inverted = busbw ratio, and defined where busbw prints 0.00
                        line += f"{peer['ip_time_us'] / rs['ip_time_us']:>9.2f}"
                    else:
                        line += f"{'-':>9}"
            print(line)
    if "railshard" in backends:
        print("\nrs/X = X's time / railshard's time (= railshard busbw / X busbw); > 1: "
              "railshard faster")

    if not no_plot and records:
        title = "\n".join(textwrap.shorten(usings.get((b, nps[-1]), b), 170)
                          for b in backends)
        memcpy = load_memcpy(memcpy_csv) if memcpy_csv else None
        try:
            plot(out_dir / "compare_peers.png", table, nps, backends, memcpy, title)
        except ImportError as e:
            print(f"compare_peers: no plot ({e}); apt-get install python3-matplotlib",
                  file=sys.stderr)
    print(f"\nwrote {out_dir}/runs.csv, medians.csv, compare.json"
          + ("" if no_plot else ", compare_peers.png"))
    if loads:
        print(f"1-minute load average at run starts: min {min(loads):.2f}, median "
              f"{statistics.median(loads):.2f}, max {max(loads):.2f} (2 cores: above ~0.5, "
              f"other work shares the cores with the ranks)")


def replot(args):
    out_dir = args.out or args.build / "compare"
    runs = out_dir / "runs.csv"
    if not runs.exists():
        sys.exit(f"compare_peers: --replot: {runs} does not exist")
    records = read_runs(runs)
    old = {}
    if (out_dir / "compare.json").exists():
        old = json.loads((out_dir / "compare.json").read_text())
    backends = [b for b in BACKENDS if any(r["backend"] == b for r in records)]
    nps = sorted({r["np"] for r in records})
    sizes = sorted({r["size"] for r in records})
    usings = {(b, int(n)): text for b, by_np in old.get("backends", {}).items()
              for n, text in by_np.items()}
    loads = sorted({(r["backend"], r["np"], r["rep"], r["part"]): r["load"]
                    for r in records if "load" in r}.values())
    extra = {k: old[k] for k in ("command", "parts", "reps", "not_run",
                                 "skipped_runs_for_budget", "failures") if k in old}
    report(out_dir, records, backends, nps, sizes, usings, extra, args.memcpy_csv,
           args.no_plot, loads)
    return 0


def main():
    repo = Path(__file__).resolve().parent.parent
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--build", type=Path, default=repo / "build",
                   help="build directory with benchmarks/allreduce_perf and "
                        "launcher/tools/railshard-launch (default: build)")
    p.add_argument("--out", type=Path, help="output directory (default: BUILD/compare)")
    p.add_argument("--backends", default=",".join(DEFAULT_BACKENDS),
                   help="comma list (default: %(default)s; also " +
                   ", ".join(VARIANTS) + ")")
    p.add_argument("--np", default="2,4", help="world sizes, comma list (default: 2,4)")
    p.add_argument("-b", "--min-bytes", default="8")
    p.add_argument("-e", "--max-bytes", default="256M")
    p.add_argument("-f", "--factor", type=float, default=4)
    p.add_argument("--reps", type=int, default=5, help="repetitions per backend and np")
    p.add_argument("--split", default="1M",
                   help="sizes below run with --small-iters, the rest with --large-iters")
    p.add_argument("--small-iters", default="100,10", help="-n,-w below --split")
    p.add_argument("--large-iters", default="10,2", help="-n,-w from --split on")
    p.add_argument("--gloo-algo", default="auto", choices=("auto", "ring", "hd"))
    p.add_argument("--timeout", type=float, default=240, help="seconds per run")
    p.add_argument("--budget", type=float, default=840,
                   help="seconds for everything; runs that would start later are skipped")
    p.add_argument("--mpirun", default=shutil.which("mpirun") or "mpirun")
    p.add_argument("--memcpy-csv", type=Path, help="single-core memcpy GB/s to draw as a line")
    p.add_argument("--no-plot", action="store_true")
    p.add_argument("--replot", action="store_true",
                   help="run nothing: read OUT/runs.csv (and OUT/compare.json) from an earlier "
                        "run and write the medians, JSON, summary and PNG again")
    args = p.parse_args()
    if args.replot:
        return replot(args)

    deadline = time.monotonic() + args.budget
    args.perf = args.build / "benchmarks" / "allreduce_perf"
    args.launch = args.build / "launcher" / "tools" / "railshard-launch"
    out_dir = args.out or args.build / "compare"
    backends = [b for b in args.backends.split(",") if b]
    nps = [int(n) for n in args.np.split(",") if n]
    for b in backends:
        if b not in BACKENDS:
            sys.exit(f"compare_peers: unknown backend '{b}' (known: {', '.join(BACKENDS)})")
    for tool in (args.perf, args.launch):
        if not os.access(tool, os.X_OK):
            sys.exit(f"compare_peers: {tool} is missing or not executable; build it first "
                     f"(cmake --build {args.build} --target allreduce_perf railshard-launch)")
    built = built_backends(args.perf)
    missing = [b for b in backends if b.split("-")[0] not in built]
    if "mpi" in backends and "mpi" not in missing and not shutil.which(args.mpirun):
        missing.append("mpi")
        print(f"compare_peers: mpirun '{args.mpirun}' not found", file=sys.stderr)
    for b in missing:
        print(f"compare_peers: backend '{b}' is not available in {args.perf} (built: "
              f"{', '.join(built)}); skipping it", file=sys.stderr)
    backends = [b for b in backends if b not in missing]
    if not backends:
        sys.exit("compare_peers: no backend to run")

    sizes = sweep_sizes(parse_size(args.min_bytes), parse_size(args.max_bytes), args.factor)
    split = parse_size(args.split)
    parts = []
    small = [s for s in sizes if s < split]
    large = [s for s in sizes if s >= split]
    for name, part_sizes, iters in (("small", small, args.small_iters),
                                    ("large", large, args.large_iters)):
        if part_sizes:
            n, w = (int(x) for x in iters.split(","))
            parts.append((name, ["-b", str(part_sizes[0]), "-e", str(part_sizes[-1]),
                                 "-f", f"{args.factor:g}", "-n", str(n), "-w", str(w),
                                 "-d", "float", "-o", "sum"]))
    out_dir.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)  # MPI's and railshard's defaults: no tuning for anyone

    records, failures, usings, loads = [], [], {}, []
    skipped = 0
    total_runs = args.reps * len(nps) * len(backends) * len(parts)
    done = 0
    print(f"compare_peers: {total_runs} runs ({', '.join(backends)}; np {args.np}; "
          f"{human(sizes[0])}..{human(sizes[-1])} x{args.factor:g}; {args.reps} reps), "
          f"budget {args.budget:.0f} s", flush=True)
    for rep in range(1, args.reps + 1):
        for np_ in nps:
            for backend in backends:
                for part, perf_args in parts:
                    left = deadline - time.monotonic()
                    if left < 5:
                        skipped += 1
                        continue
                    argv = command_for(backend, np_, args, perf_args)
                    load = load_average()
                    loads.append(load)
                    run_env = dict(env, **VARIANTS.get(backend, ({}, []))[0])
                    rc, out, err, secs = run_bounded(argv, min(args.timeout, left), run_env)
                    done += 1
                    rows, using, footer_ok = parse_table(out)
                    if using:
                        usings[(backend, np_)] = using
                    problem = None
                    if rc is None:
                        problem = f"timed out after {secs:.0f} s"
                    elif rc != 0:
                        problem = f"exit status {rc}"
                    elif not footer_ok:
                        problem = "wrong values (footer not '0 OK')"
                    elif len(rows) != len(small if part == "small" else large):
                        problem = f"{len(rows)} table rows, expected " \
                                  f"{len(small if part == 'small' else large)}"
                    status = "ok" if problem is None else f"FAILED: {problem}"
                    print(f"  [{done}/{total_runs}] rep {rep} np {np_} {backend:9s} {part:5s} "
                          f"{secs:6.1f} s  load {load:4.2f}  {status}", flush=True)
                    if problem is not None:
                        failures.append({"backend": backend, "np": np_, "rep": rep,
                                         "part": part, "problem": problem,
                                         "command": " ".join(argv),
                                         "stderr_tail": err[-2000:]})
                        print("    " + " ".join(argv), file=sys.stderr)
                        if err.strip():
                            print("    " + err.strip()[-800:].replace("\n", "\n    "),
                                  file=sys.stderr)
                        continue
                    for row in rows:
                        row.update({"backend": backend, "np": np_, "rep": rep, "part": part,
                                    "load": load})
                        records.append(row)

    # Raw rows, then per-size medians.
    raw_fields = ["backend", "np", "rep", "part", "load", "size", "count", "dtype", "op"] + \
                 [f"{p}_{c}" for p in ("oop", "ip") for c in COLUMNS]
    with open(out_dir / "runs.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=raw_fields)
        writer.writeheader()
        writer.writerows(records)
    extra = {
        "command": sys.argv,
        "parts": {name: a for name, a in parts},
        "reps": args.reps,
        "not_run": missing,
        "skipped_runs_for_budget": skipped,
        "failures": failures,
    }
    report(out_dir, records, backends, nps, sizes, usings, extra, args.memcpy_csv,
           args.no_plot, loads)
    if skipped:
        print(f"compare_peers: {skipped} runs skipped: --budget {args.budget:.0f} s used up",
              file=sys.stderr)
    if failures or missing:
        print(f"compare_peers: {len(failures)} failed runs, backends not run: "
              f"{', '.join(missing) or 'none'}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
