"""DistributedDataParallel over the "railshard" backend, checked against DDP over gloo in the
same processes: same seeds, same data, a few SGD steps, parameters equal within 1e-6.

Plus barrier, small gradient buckets (several buckets in flight at once), no_sync gradient
accumulation, a compression comm hook, and starting the ranks the ways users do (torchrun,
railshard-launch) instead of from this harness.
"""

import copy
import os
import subprocess
import sys
import textwrap
import time

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402
from torch import nn  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402

import conftest  # noqa: E402
from conftest import expect  # noqa: E402

TOLERANCE = 1e-6
WORLD = 2


def mlp(sizes, seed):
    torch.manual_seed(seed)
    layers = []
    for a, b in zip(sizes[:-1], sizes[1:]):
        layers += [nn.Linear(a, b), nn.ReLU()]
    return nn.Sequential(*layers[:-1])


def batch(step, rank, sizes, n=16):
    g = torch.Generator().manual_seed(10_000 * step + rank)
    return torch.randn(n, sizes[0], generator=g), torch.randn(n, sizes[-1], generator=g)


def max_diff(a, b):
    return max((p - q).abs().max().item() for p, q in zip(a.parameters(), b.parameters()))


def train_pair(ctx, sizes, steps=5, ddp_kwargs=None, micro=1, hook=None, momentum=0.9):
    """Trains two copies of one model, DDP over the backend under test and DDP over gloo, on
    the same per-rank data; returns (model under test, gloo model)."""
    ddp_kwargs = ddp_kwargs or {}
    # Different initial weights per rank: DDP's construction must broadcast rank 0's.
    base = mlp(sizes, seed=1234 + ctx.rank)
    models = [copy.deepcopy(base), copy.deepcopy(base)]
    ddps = [DDP(models[0], **ddp_kwargs), DDP(models[1], process_group=ctx.gloo, **ddp_kwargs)]
    if hook is not None:
        ddps[0].register_comm_hook(None, hook)
        ddps[1].register_comm_hook(ctx.gloo, hook)
    opts = [torch.optim.SGD(d.parameters(), lr=0.05, momentum=momentum) for d in ddps]
    for step in range(steps):
        for ddp, opt in zip(ddps, opts):
            opt.zero_grad()
            for m in range(micro):
                x, y = batch(step * micro + m, ctx.rank, sizes)
                if m < micro - 1:
                    with ddp.no_sync():  # accumulate locally, all-reduce on the last one
                        nn.functional.mse_loss(ddp(x), y).backward()
                else:
                    nn.functional.mse_loss(ddp(x), y).backward()
            opt.step()
    return models


def check_pair(ctx, models, what):
    diff = max_diff(*models)
    expect(diff <= TOLERANCE, f"{what}: railshard vs gloo DDP parameters differ by {diff:.3g}")
    # And every rank holds the same parameters (gathered through gloo).
    flat = torch.cat([p.detach().reshape(-1) for p in models[0].parameters()])
    everyone = [torch.empty_like(flat) for _ in range(ctx.world_size)]
    dist.all_gather(everyone, flat, group=ctx.gloo)
    for r in range(ctx.world_size):
        d = (everyone[r] - everyone[0]).abs().max().item()
        expect(d == 0, f"{what}: rank {r}'s parameters differ from rank 0's by {d:.3g}")
    return diff


SMALL = [32, 64, 64, 8]
# > 1 MB of parameters: DDP's first bucket is 1 MB whatever bucket_cap_mb says.
BIG = [256, 512, 512, 512, 16]


def _ddp_default(ctx):
    check_pair(ctx, train_pair(ctx, SMALL), "default buckets")


def _ddp_small_buckets(ctx):
    kwargs = dict(bucket_cap_mb=0.05, gradient_as_bucket_view=True)
    models = train_pair(ctx, BIG, steps=4, ddp_kwargs=kwargs)
    check_pair(ctx, models, "bucket_cap_mb=0.05")
    n_params = sum(p.numel() for p in models[0].parameters())
    expect(n_params * 4 > 2 * 1024 * 1024, f"model too small to need several buckets: {n_params}")


def _ddp_no_sync(ctx):
    check_pair(ctx, train_pair(ctx, SMALL, micro=3), "no_sync accumulation")


def _ddp_fp16_hook(ctx):
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    models = train_pair(ctx, SMALL, hook=default_hooks.fp16_compress_hook)
    check_pair(ctx, models, "fp16_compress_hook")


def _ddp_allreduce_hook(ctx):
    """The stock allreduce hook: a future chain (then()) on the backend's Work."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    check_pair(ctx, train_pair(ctx, SMALL, hook=default_hooks.allreduce_hook), "allreduce_hook")


def _ddp_unused_params(ctx):
    class Branchy(nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(7)
            self.a = nn.Linear(32, 8)
            self.b = nn.Linear(32, 8)  # never used

        def forward(self, x):
            return self.a(x)

    models = [Branchy(), Branchy()]
    ddps = [DDP(models[0], find_unused_parameters=True),
            DDP(models[1], process_group=ctx.gloo, find_unused_parameters=True)]
    opts = [torch.optim.SGD(d.parameters(), lr=0.1) for d in ddps]
    for step in range(3):
        x, y = batch(step, ctx.rank, [32, 8])
        for ddp, opt in zip(ddps, opts):
            opt.zero_grad()
            nn.functional.mse_loss(ddp(x), y).backward()
            opt.step()
    check_pair(ctx, models, "find_unused_parameters")


def _ddp_sparse_embedding(ctx):
    """nn.Embedding(sparse=True): DDP all-reduces its gradient as a sparse tensor."""
    class Bag(nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(11)
            self.emb = nn.Embedding(50, 16, sparse=True)
            self.out = nn.Linear(16, 4)

        def forward(self, ids):
            return self.out(self.emb(ids).mean(dim=1))

    models = [Bag(), Bag()]
    ddps = [DDP(models[0]), DDP(models[1], process_group=ctx.gloo)]
    opts = [torch.optim.SGD(d.parameters(), lr=0.1) for d in ddps]
    for step in range(4):
        g = torch.Generator().manual_seed(100 * step + ctx.rank)
        ids = torch.randint(0, 50, (8, 5), generator=g)  # different rows on each rank
        y = torch.randn(8, 4, generator=g)
        for ddp, opt in zip(ddps, opts):
            opt.zero_grad()
            nn.functional.mse_loss(ddp(ids), y).backward()
            expect(ddp.module.emb.weight.grad.is_sparse, "the embedding's gradient is not sparse")
            opt.step()
    check_pair(ctx, models, "sparse embedding")


def _barrier(ctx):
    for _ in range(50):
        dist.barrier()
    # A barrier really waits: rank 0 arrives 0.5 s before the last rank.
    if ctx.rank == ctx.world_size - 1:
        time.sleep(0.5)
    t0 = time.monotonic()
    dist.barrier()
    waited = time.monotonic() - t0
    if ctx.rank == 0:
        expect(waited > 0.4, f"rank 0 left the barrier after {waited:.3f} s, before the last rank")


def cases(world_size):
    return [("ddp_default", _ddp_default), ("ddp_small_buckets", _ddp_small_buckets),
            ("ddp_no_sync", _ddp_no_sync), ("ddp_allreduce_hook", _ddp_allreduce_hook),
            ("ddp_fp16_hook", _ddp_fp16_hook), ("ddp_unused_params", _ddp_unused_params),
            ("ddp_sparse_embedding", _ddp_sparse_embedding), ("barrier", _barrier)]


_RESULTS = {}


@pytest.mark.parametrize("case", [name for name, _ in cases(WORLD)])
def test_ddp(case):
    if "r" not in _RESULTS:
        try:
            _RESULTS["r"] = conftest.run_cases("test_ddp", "cases", (WORLD,), WORLD, timeout=300)
        except conftest.WorldError as e:
            _RESULTS["r"] = e
    results = _RESULTS["r"]
    if isinstance(results, Exception):
        pytest.fail(f"the world running this case failed:\n{results}", pytrace=False)
    if results[case] is not None:
        pytest.fail(results[case], pytrace=False)


# ---------------------------------------------------------------------------------------------
# started by a launcher: env:// rendezvous instead of this harness's tcp://

SCRIPT = textwrap.dedent("""
    import os, sys, torch, torch.distributed as dist
    from torch import nn
    import railshard
    torch.set_num_threads(1)
    dist.init_process_group("railshard")  # env:// from the launcher
    rank, world = dist.get_rank(), dist.get_world_size()
    assert world == int(sys.argv[1]), (world, sys.argv)
    assert dist.get_backend() == "railshard", dist.get_backend()
    torch.manual_seed(rank)
    model = nn.parallel.DistributedDataParallel(nn.Linear(16, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(3):
        g = torch.Generator().manual_seed(100 * step + rank)
        opt.zero_grad()
        model(torch.randn(8, 16, generator=g)).pow(2).mean().backward()
        opt.step()
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    everyone = [torch.empty_like(flat) for _ in range(world)]
    dist.all_gather(everyone, flat)
    assert all(torch.equal(e, everyone[0]) for e in everyone), "ranks diverged"
    t = torch.tensor([float(rank)])
    dist.all_reduce(t)
    assert t.item() == world * (world - 1) / 2, t
    dist.barrier()
    dist.destroy_process_group()
    print(f"LAUNCHED-OK rank {rank}/{world}", flush=True)
""")


def _run_launcher(cmd, world, tmp_path, timeout=180):
    script = tmp_path / "launched.py"
    script.write_text(SCRIPT)
    full = cmd + [str(script), str(world)]
    proc = subprocess.Popen(full, env=conftest.child_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        out, _ = proc.communicate()
        pytest.fail(f"{' '.join(full)} did not finish in {timeout} s:\n{out}", pytrace=False)
    assert proc.returncode == 0, f"{' '.join(full)} exited {proc.returncode}:\n{out}"
    assert out.count("LAUNCHED-OK") == world, out


@pytest.mark.railshard_only
def test_torchrun(tmp_path):
    port = conftest.free_port()
    # --redirects/--tee 1 (stdout to a log, tee'd to the console): Debian's torch 1.13 under
    # Python 3.11 cannot parse the default "0" (enum.Flag no longer iterates its zero member).
    _run_launcher([sys.executable, "-m", "torch.distributed.run", "--nnodes", "1",
                   "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
                   "--master_port", str(port), "--redirects", "1", "--tee", "1",
                   "--log_dir", str(tmp_path / "torchrun_logs")], 2, tmp_path)


@pytest.mark.railshard_only
def test_railshard_launch(tmp_path):
    launch = conftest.railshard_launch_binary()
    if launch is None:
        pytest.skip("railshard-launch is not built (RAILSHARD_LAUNCH or <build>/launcher/tools)")
    _run_launcher([launch, "-n", "3", sys.executable], 3, tmp_path)
