#!/usr/bin/env python3
"""send/recv and all_to_all_single with backend "railshard" vs "gloo", side by side in one run.

Every process joins a railshard group and a gloo group and times the same operation on each,
alternately (railshard round, gloo round, ...), so both see the same machine load:
  sendrecv  ranks pair up (0-1, 2-3, ...); the even rank sends then receives, the odd rank
            receives then sends back (ping-pong, every pair at once). Latency = half the round
            trip; bandwidth = message bytes / latency.
  alltoall  all_to_all_single of a buffer of `size` bytes per rank (nccl-tests' alltoall
            convention): each rank sends size/n bytes to every rank. busbw = size * (n-1)/n /
            time.
A round is `--iters` operations; the slowest rank's round time counts; the table shows the
median over rounds, and ratio = gloo time / railshard time (> 1: railshard is faster).

    PYTHONPATH=build/python /usr/bin/python3 benchmarks/p2p_bench.py --nprocs 2 4

Results and the command lines that produced them: docs/benchmarks.md ("Point-to-point and
all-to-all").
"""

import argparse
import socket
import statistics
import sys
import time

SIZES = [8, 1 << 10, 64 << 10, 1 << 20, 16 << 20]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def parse_size(text):
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    if text[-1].upper() in units:
        return int(text[:-1]) * units[text[-1].upper()]
    return int(text)


def pretty(size):
    for unit, shift in (("G", 30), ("M", 20), ("K", 10)):
        if size >= 1 << shift and size % (1 << shift) == 0:
            return f"{size >> shift}{unit}"
    return str(size)


def worker(rank, nprocs, port, args, queue):
    import torch
    import torch.distributed as dist

    import railshard  # noqa: F401  (registers the backend)

    torch.set_num_threads(1)
    dist.init_process_group("railshard", rank=rank, world_size=nprocs,
                            init_method=f"tcp://127.0.0.1:{port}")
    groups = {"railshard": dist.group.WORLD, "gloo": dist.new_group(backend="gloo")}
    peer = rank ^ 1

    def sendrecv(group, send, recv):
        if rank % 2 == 0:
            dist.send(send, peer, group=group)
            dist.recv(recv, peer, group=group)
        else:
            dist.recv(recv, peer, group=group)
            dist.send(send, peer, group=group)

    def alltoall(group, send, recv):
        dist.all_to_all_single(recv, send, group=group)

    ops = {"sendrecv": sendrecv, "alltoall": alltoall}
    results = []
    for op_name in args.ops:
        op = ops[op_name]
        for size in args.sizes:
            elements = max(nprocs, size // 4)
            elements -= elements % nprocs  # all_to_all_single: equal blocks
            send = torch.arange(elements, dtype=torch.float32) + rank * elements
            recv = {name: torch.empty(elements, dtype=torch.float32) for name in groups}
            rounds = {name: [] for name in groups}
            # Fewer operations per round for big messages, so a sweep stays within minutes.
            iters = max(2, min(args.iters, (64 << 20) // max(size, 1)))
            for round_ in range(args.warmup + args.rounds):
                for name, group in groups.items():
                    dist.barrier(group=group)
                    start = time.perf_counter()
                    for _ in range(iters):
                        op(group, send, recv[name])
                    elapsed = (time.perf_counter() - start) / iters
                    if round_ >= args.warmup:
                        rounds[name].append(elapsed)
            # Both backends must have delivered the same bytes (and the right ones).
            if not torch.equal(recv["railshard"], recv["gloo"]):
                raise RuntimeError(f"{op_name} {size}: railshard and gloo results differ")
            slowest = {}
            for name in groups:
                t = torch.tensor(rounds[name], dtype=torch.float64)
                dist.all_reduce(t, op=dist.ReduceOp.MAX, group=groups["gloo"])
                slowest[name] = statistics.median(t.tolist())
            results.append((op_name, elements * 4, slowest))
    if rank == 0:
        queue.put(results)
    dist.barrier(group=groups["gloo"])
    dist.destroy_process_group()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nprocs", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--ops", nargs="+", choices=["sendrecv", "alltoall"],
                        default=["sendrecv", "alltoall"])
    parser.add_argument("--sizes", type=parse_size, nargs="+", default=SIZES,
                        help="message bytes (K/M suffixes)")
    parser.add_argument("--iters", type=int, default=50, help="operations per round (at most)")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--warmup", type=int, default=1, help="rounds not counted")
    args = parser.parse_args()
    if any(n % 2 for n in args.nprocs) and "sendrecv" in args.ops:
        parser.error("sendrecv pairs ranks up: every --nprocs must be even")

    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    print(f"# send/recv (ping-pong, one-way) and all_to_all_single, float32, median of "
          f"{args.rounds} rounds of the slowest rank; ratio = gloo / railshard")
    print(f"{'procs':>5} {'op':>9} {'bytes':>6} {'railshard us':>13} {'gloo us':>10} "
          f"{'ratio':>6} {'railshard GB/s':>15} {'gloo GB/s':>10}")
    for nprocs in args.nprocs:
        queue = ctx.SimpleQueue()
        port = free_port()
        procs = [ctx.Process(target=worker, args=(r, nprocs, port, args, queue))
                 for r in range(nprocs)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(timeout=1800)
        if any(p.exitcode != 0 for p in procs) or queue.empty():
            print(f"p2p_bench: {nprocs} processes failed: exit codes "
                  f"{[p.exitcode for p in procs]}", file=sys.stderr)
            return 1
        for op_name, size, slowest in queue.get():
            rs, gl = slowest["railshard"], slowest["gloo"]
            if op_name == "sendrecv":
                rs, gl = rs / 2, gl / 2  # one way
                moved = size
            else:
                moved = size * (nprocs - 1) / nprocs
            print(f"{nprocs:>5} {op_name:>9} {pretty(size):>6} {rs * 1e6:>13.1f} "
                  f"{gl * 1e6:>10.1f} {gl / rs:>6.2f} {moved / rs / 1e9:>15.2f} "
                  f"{moved / gl / 1e9:>10.2f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
