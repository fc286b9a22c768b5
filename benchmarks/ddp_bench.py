#!/usr/bin/env python3
"""DDP step time with backend "railshard" vs "gloo", measured side by side in one run.

Every process builds the same MLP twice, wraps one copy in DistributedDataParallel over a
railshard group and the other over a gloo group, and times training steps alternately
(railshard round, gloo round, railshard round, ...), so both see the same machine load. Prints
the median step time of each, their ratio, and the gradient bytes all-reduced per step.

    PYTHONPATH=build/python /usr/bin/python3 benchmarks/ddp_bench.py --nprocs 2 4

--trace DIR records railshard's side (RAILSHARD_TRACE) and prints railshard-report's table of
the gradient all-reduces: their busbw, and their efficiency against the copy rate measured at
start-up (one host). With several ranks per host DDP's buckets come from shared memory
(RAILSHARD_SHARED_ALLOC, docs/pytorch.md); RAILSHARD_SHARED_ALLOC=0 in the environment
measures torch's own allocator instead. --cold-mib N compares, right after DDP steps, an
all-reduce of N MiB with a copy of N MiB on every rank at once (both out of cache).

Results and the command lines that produced them: docs/benchmarks.md ("DDP step time").
"""

import argparse
import os
import socket
import statistics
import sys
import time


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def build_model(torch, width, depth, seed):
    torch.manual_seed(seed)
    layers = []
    for _ in range(depth):
        layers += [torch.nn.Linear(width, width), torch.nn.ReLU()]
    layers.append(torch.nn.Linear(width, 10))
    return torch.nn.Sequential(*layers)


def worker(rank, nprocs, port, args, queue):
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    import railshard  # noqa: F401  (registers the backend)

    torch.set_num_threads(args.threads)
    if args.trace:
        os.environ["RAILSHARD_TRACE"] = os.path.join(args.trace, f"np{nprocs}")
    dist.init_process_group("railshard", rank=rank, world_size=nprocs,
                            init_method=f"tcp://127.0.0.1:{port}")
    groups = {"railshard": dist.group.WORLD, "gloo": dist.new_group(backend="gloo")}
    models, optims = {}, {}
    for name, group in groups.items():
        model = build_model(torch, args.width, args.depth, seed=1)
        models[name] = DDP(model, process_group=group, bucket_cap_mb=args.bucket_mb)
        optims[name] = torch.optim.SGD(models[name].parameters(), lr=1e-3)
    params = sum(p.numel() for p in models["railshard"].parameters())
    gen = torch.Generator().manual_seed(100 + rank)
    x = torch.randn(args.batch, args.width, generator=gen)
    y = torch.randint(0, 10, (args.batch,), generator=gen)
    loss_fn = torch.nn.CrossEntropyLoss()

    def step(name):
        optims[name].zero_grad(set_to_none=True)
        loss = loss_fn(models[name](x), y)
        loss.backward()  # DDP all-reduces the gradient buckets during backward
        optims[name].step()

    # --cold-mib: right after a DDP step (caches holding the model, not these buffers), an
    # in-place all-reduce of a tensor allocated as DDP's buckets are, then (after the next
    # step) a copy of the same size on every rank at once: the all-reduce's busbw against
    # memcpy's rate in the same state of the machine.
    cold = []
    cold_bytes = int(args.cold_mib * (1 << 20)) // 4 * 4
    cold_t = torch.ones(cold_bytes // 4) if cold_bytes else None
    cold_u, cold_v = (torch.ones(cold_bytes // 4), torch.ones(cold_bytes // 4)) if cold_bytes \
        else (None, None)

    def cold_pair(name):
        dist.barrier(group=groups["gloo"])
        begin = time.perf_counter()
        if name == "railshard":
            dist.all_reduce(cold_t)
        else:
            cold_u.copy_(cold_v)
        return name, cold_bytes / (time.perf_counter() - begin) / 1e9

    times = {name: [] for name in groups}
    for round_ in range(args.warmup + args.steps):
        for name in groups:
            dist.barrier(group=groups[name])
            start = time.perf_counter()
            step(name)
            elapsed = time.perf_counter() - start
            if round_ >= args.warmup:
                times[name].append(elapsed)
            if args.cold_mib > 0 and round_ >= args.warmup:
                cold.append(cold_pair(name))
    # A rank's step ends when its own all-reduces did; the slowest rank is the step time.
    slowest = {}
    for name in groups:
        t = torch.tensor(times[name], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=groups["gloo"])
        slowest[name] = t.tolist()
    # Same seeds, same data, same updates: the two models must still agree.
    diff = max((a - b).abs().max().item() for a, b in
               zip(models["railshard"].parameters(), models["gloo"].parameters()))
    if rank == 0:
        queue.put((params, slowest, diff, cold))
    dist.barrier(group=groups["gloo"])
    dist.destroy_process_group()


def report(trace_dir):
    """railshard-report's size-class table of the traced run (next to this build's tools)."""
    import shutil
    import subprocess
    here = os.path.dirname(os.path.abspath(__file__))
    tool = shutil.which("railshard-report") or os.path.join(here, "..", "build", "launcher",
                                                            "tools", "railshard-report")
    out = subprocess.run([tool, trace_dir], capture_output=True, text=True, timeout=300)
    lines = out.stdout.splitlines()
    keep = [line for line in lines if "link limit" in line or "allreduce" in line
            or line.lstrip().startswith("size")]
    print("\n".join("   " + line for line in keep) or out.stderr, flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nprocs", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--width", type=int, default=2048)
    parser.add_argument("--depth", type=int, default=6, help="hidden layers of width x width")
    parser.add_argument("--batch", type=int, default=16, help="samples per rank per step")
    parser.add_argument("--steps", type=int, default=15)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--bucket-mb", type=float, default=25)
    parser.add_argument("--threads", type=int, default=1, help="torch threads per process")
    parser.add_argument("--cold-mib", type=float, default=0,
                        help="after each step, time an in-place all-reduce (after railshard's "
                             "step) and a copy (after gloo's) of this many MiB")
    parser.add_argument("--trace", metavar="DIR",
                        help="trace railshard's side into DIR/np<N> and report its all-reduces")
    args = parser.parse_args()

    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    print(f"# DDP step time, MLP {args.depth}x{args.width}, batch {args.batch}/rank, "
          f"{args.steps} steps after {args.warmup} warm-up, median over steps of the slowest rank")
    print(f"{'procs':>5} {'params':>10} {'grad MB':>8} {'railshard ms':>13} {'gloo ms':>9} "
          f"{'ratio':>6} {'max |dw|':>9}")
    for nprocs in args.nprocs:
        queue = ctx.SimpleQueue()
        port = free_port()
        procs = [ctx.Process(target=worker, args=(r, nprocs, port, args, queue))
                 for r in range(nprocs)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(timeout=900)
        if any(p.exitcode != 0 for p in procs) or queue.empty():
            print(f"ddp_bench: {nprocs} processes failed: exit codes "
                  f"{[p.exitcode for p in procs]}", file=sys.stderr)
            return 1
        params, slowest, diff, cold = queue.get()
        rs = statistics.median(slowest["railshard"]) * 1e3
        gl = statistics.median(slowest["gloo"]) * 1e3
        print(f"{nprocs:>5} {params:>10} {params * 4 / 1e6:>8.1f} {rs:>13.1f} {gl:>9.1f} "
              f"{rs / gl:>6.2f} {diff:>9.2e}", flush=True)
        if cold:
            reduce = [gbps for name, gbps in cold if name == "railshard"]
            copy = [gbps for name, gbps in cold if name == "gloo"]
            ratios = [a / b for a, b in zip(reduce, copy)]
            print(f"   after a step, {args.cold_mib:g} MiB on rank 0: all-reduce busbw median "
                  f"{statistics.median(reduce):.2f} GB/s, copy {statistics.median(copy):.2f} "
                  f"GB/s, ratio median {statistics.median(ratios):.2f} (per step)", flush=True)
        if args.trace:
            report(os.path.join(args.trace, f"np{nprocs}"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
