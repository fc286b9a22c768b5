#!/usr/bin/env python3
"""Fits cluster_sim's machine figures to measured all-reduces and prints prediction against
measurement for every layout (docs/simulator.md).

    benchmarks/sim/fit.py BUILD_DIR MEASURED [--fit 1x16,1x64] [--free a,b] [--start JSON]
        [--iterations 400] [--cores 2]

MEASURED is what benchmarks/sim/calibrate.sh prints. The search is a seeded random walk on one
figure at a time (log scale), keeping a step that lowers the largest |log(predicted /
measured)| over the --fit layouts; --free names the figures it may change (default all).
"""
import argparse
import json
import math
import random
import re
import statistics
import subprocess

FIGURES = ["shm-gbps", "shm-us", "wake-cpu-us", "wake-per-crowding-us", "shm-peer-us",
           "call-cpu-us", "reduce-gbps", "yield-us", "reduce-far-gbps", "network-us",
           "network-gbps", "message-cpu-us"]
# The calibration of docs/simulator.md (2026-12-07, Intel Xeon 2 vCPU).
CALIBRATED = [93.7, 1.0, 4.358, 0.2745, 0.0412, 2.97, 237.0, 0.727, 150.0, 4.7, 4.272, 12.89]
SIZES = ["8", "64", "512", "4K", "32K"]


def load(path):
    """{(hosts, ranks_per_host, algorithm): [median out-of-place us per size]}"""
    runs = {}
    for line in open(path):
        if "|" not in line:
            continue
        head, times = line.split("|")
        _, hosts, per_host, algorithm = head.split()
        values = [float(x) for x in times.split()][0::2]
        if len(values) == len(SIZES):
            runs.setdefault((int(hosts), int(per_host), algorithm), []).append(values)
    return {k: [statistics.median(c) for c in zip(*v)] for k, v in runs.items()}


def simulate(build, cores, hosts, per_host, figures):
    args = [build + "/benchmarks/cluster_sim", "--hosts", str(hosts), "--ranks-per-host",
            str(per_host), "--cores", str(cores), "--cores-shared", "--cache-kb", "2048",
            "--sizes", ",".join(SIZES), "--algorithms", "all"]
    for name, value in zip(FIGURES, figures):
        args += ["--" + name, "%.4g" % value]
    out = subprocess.run(args, capture_output=True, text=True, check=True).stdout
    result = {}
    for line in out.splitlines():
        if line.startswith("| ") and "B |" in line:
            for algorithm, us in re.findall(r"(\w+)=(\d+)", line):
                result.setdefault(algorithm, []).append(float(us))
    return result


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("build")
    parser.add_argument("measured")
    parser.add_argument("--fit", default="")
    parser.add_argument("--free", default=",".join(FIGURES))
    parser.add_argument("--start", default=json.dumps(CALIBRATED))
    parser.add_argument("--iterations", type=int, default=400)
    parser.add_argument("--cores", type=int, default=2)
    o = parser.parse_args()
    measured = load(o.measured)
    layouts = sorted({(h, l) for h, l, _ in measured})
    fit = [tuple(int(x) for x in s.split("x")) for s in o.fit.split(",") if s]
    free = [FIGURES.index(name) for name in o.free.split(",")]
    figures = json.loads(o.start)

    def error(candidate):
        worst = 0.0
        for hosts, per_host in fit:
            predicted = simulate(o.build, o.cores, hosts, per_host, candidate)
            for (h, l, algorithm), times in measured.items():
                if (h, l) != (hosts, per_host):
                    continue
                for p, m in zip(predicted[algorithm], times):
                    worst = max(worst, abs(math.log(max(p, 1.0) / m)))
        return worst

    if fit:
        best = error(figures)
        rng = random.Random(2)
        step = 0.7
        for i in range(o.iterations):
            candidate = list(figures)
            k = rng.choice(free)
            candidate[k] = (candidate[k] * math.exp(rng.uniform(-step, step))
                            if candidate[k] > 0 else rng.choice([0.01, 0.1, 1.0]))
            e = error(candidate)
            if e < best:
                best, figures = e, candidate
            if i % 100 == 99:
                step *= 0.7
        print("fitted on %s: largest ratio %.2f" % (o.fit, math.exp(best)))
    print("figures: " + " ".join("--%s %.4g" % (n, v) for n, v in zip(FIGURES, figures)))
    within = total = 0
    for hosts, per_host in layouts:
        predicted = simulate(o.build, o.cores, hosts, per_host, figures)
        for (h, l, algorithm), times in sorted(measured.items()):
            if (h, l) != (hosts, per_host):
                continue
            cells = []
            for p, m in zip(predicted[algorithm], times):
                within += 0.8 <= p / m <= 1.2
                total += 1
                cells.append("%.0f / %.0f (%.2f)" % (p, m, p / m))
            tag = " (fitted)" if (hosts, per_host) in fit else ""
            print("| %d × %d%s | %s | %s |" % (hosts, per_host, tag, algorithm, " | ".join(cells)))
    print("%d of %d within 20 %%" % (within, total))


if __name__ == "__main__":
    main()
