"""train.py --compare: the same training under several dispatch policies, one after the other
in one job, so that their step times are measured side by side on the same ranks (under
railshard-launch --emulate-speeds each rank really computes at its speed: its CPU quota).

Each policy starts from the same model (seed 0) and trains on the same global batches (the
dispatcher cuts the epoch's order into the same steps whatever the shares), with gradients
weighted by each rank's share (railshard.weighted_allreduce_hook), so the runs differ only in
who computes what -- and the evaluation loss after them says so. Rank 0 prints every step's
shares, compute times and step time, then per policy the median step time over the second
half of its steps and the evaluation loss, and the speed-up of the last policy over the
first; --plot FILE draws shares and step times over the steps (PNG).
"""

import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F

import railshard


def _train(args, data, policy, rank, make_model, log):
    model = make_model(args.hidden)
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    sampler = railshard.ThroughputSampler(data, args.batch, micro_batch=args.micro_batch,
                                          policy=policy)
    ddp.register_comm_hook(sampler, railshard.weighted_allreduce_hook)
    loader = torch.utils.data.DataLoader(data, batch_sampler=sampler)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=args.lr, momentum=0.9)
    steps = []  # (step seconds, shares, every rank's compute seconds)
    epoch = 0
    while len(steps) < args.steps:
        sampler.set_epoch(epoch)
        for x, y in loader:
            started = time.perf_counter()
            loss = F.cross_entropy(ddp(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            shares = sampler.shares
            sampler.report(sampler.grads_ready_at - started)
            steps.append((time.perf_counter() - started, shares, sampler.reported_seconds,
                          loss.item()))
            if len(steps) == args.steps:
                break
        epoch += 1
    # Printed afterwards: rank 0 may be the slowest rank, and printing costs it CPU time.
    for i, (seconds, shares, computed, loss) in enumerate(steps if log else []):
        ms = " ".join(f"{c * 1000:6.1f}" for c in computed)
        print(f"{policy:>12s} step {i:3d} | shares {' '.join(f'{n:4d}' for n in shares)} | "
              f"compute ms {ms} | step {seconds * 1000:6.1f} ms | loss {loss:.4f}", flush=True)
    return model, steps


def _plot(path, runs, world):
    try:
        import matplotlib
    except ImportError:
        print(f"train.py --compare: no plot in {path}: matplotlib is not installed "
              "(apt-get install python3-matplotlib, or pip install matplotlib)", flush=True)
        return False

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(9, 7), sharex=True)
    for policy, steps in runs:
        x = range(len(steps))
        for r in range(world):
            top.plot(x, [step[1][r] for step in steps],
                     linestyle="-" if policy == runs[-1][0] else "--",
                     label=f"{policy}: rank {r}")
        bottom.plot(x, [step[0] * 1000 for step in steps], label=policy)
    top.set_ylabel("samples per step")
    top.set_title("Shares of each global batch")
    top.legend(fontsize=8, ncol=2)
    bottom.set_ylabel("step time (ms)")
    bottom.set_xlabel("step")
    bottom.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    return True


def run(args, data, make_model):
    """Called by train.py --compare P,Q,..."""
    railshard.init_process_group(args.backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    policies = [p for p in args.compare.split(",") if p]
    if len(policies) < 2:
        sys.exit(f"train.py: --compare needs two policies or more, got {args.compare!r}")
    # The task's samples and 2048 more of the same task, held out: never trained on.
    full = type(data)(len(data) + 2048)
    data = torch.utils.data.Subset(full, range(len(data)))
    held_x, held_y = full.x[len(data):], full.y[len(data):]
    runs, losses = [], []
    if rank == 0:
        print(f"train.py --compare: {world} ranks, global batch {args.batch}, {args.steps} "
              f"steps per policy ({', '.join(policies)}), real compute", flush=True)
    for policy in policies:
        model, steps = _train(args, data, policy, rank, make_model, rank == 0 and not args.quiet)
        with torch.no_grad():
            losses.append(F.cross_entropy(model(held_x), held_y).item())
        runs.append((policy, steps))
        dist.barrier()
    if rank == 0:
        medians = []
        for (policy, steps), loss in zip(runs, losses):
            half = [step[0] for step in steps[len(steps) // 2:]]
            medians.append(statistics.median(half))
            print(f"train.py --compare: {policy}: median step {medians[-1] * 1000:.1f} ms over "
                  f"the last {len(half)} steps; last shares {steps[-1][1]}; eval loss {loss:.4f}",
                  flush=True)
        gap = abs(losses[-1] - losses[0]) / max(abs(losses[0]), 1e-12)
        print(f"train.py --compare: {runs[-1][0]} is {medians[0] / medians[-1]:.2f}x faster per "
              f"step than {runs[0][0]}; eval loss {losses[-1]:.4f} vs {losses[0]:.4f} "
              f"({gap * 100:.2f}% apart) after the same {args.steps * args.batch} samples",
              flush=True)
        if args.plot and _plot(args.plot, runs, world):
            print(f"train.py --compare: plot in {args.plot}", flush=True)
    dist.barrier()
    dist.destroy_process_group()
