"""The "railshard" backend with CUDA tensors (docs/gpu.md): all_reduce and broadcast run on
device memory (pinned-host staging between the processes, reductions in railshard's CUDA
kernels), the other collectives stage through host memory. Every result is compared with the
same collective of gloo on CPU copies of the same inputs, in the same processes.

Needs a torch built with CUDA, a visible GPU and a librailshard built with CUDA; skipped with
the reason otherwise (the CI machines have no GPU: these run in scripts/gpu_check.sh on a GPU
machine). Two processes share device 0 when there is one GPU.
"""

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402

import conftest  # noqa: E402

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(),
                                reason="torch has no CUDA device here (torch.cuda.is_available() "
                                       "is False)")

DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int32, torch.int64]
OPS = ["SUM", "AVG", "MIN", "MAX", "PRODUCT"]
COUNTS = [1, 7, 4099, 3 * 1024 * 1024 + 5]


def _input(rank, dtype, count, op, salt):
    g = torch.Generator().manual_seed(1000 * rank + 17 * salt + count)
    if dtype.is_floating_point:
        if op == "PRODUCT":
            choices = torch.tensor([-2.0, -1.0, -0.5, 0.5, 1.0, 2.0])
            return choices[torch.randint(0, 6, (count,), generator=g)].to(dtype)
        return torch.randint(-64, 65, (count,), generator=g).to(dtype)  # exact sums
    return torch.randint(-1000, 1000, (count,), generator=g).to(dtype)


def _cases(ctx):
    device = torch.device("cuda", ctx.rank % torch.cuda.device_count())
    torch.cuda.set_device(device)
    failures = []
    salt = 0
    for dtype in DTYPES:
        for op in OPS:
            if op == "AVG" and not dtype.is_floating_point:
                continue  # gloo has no integer AVG to compare with
            for count in COUNTS:
                salt += 1
                host = _input(ctx.rank, dtype, count, op, salt)
                gpu = host.to(device)
                # Work queued on the current stream before the collective must be seen by it.
                gpu.mul_(1)
                dist.all_reduce(gpu, op=getattr(dist.ReduceOp, op))
                wide = host.to(torch.float64 if dtype.is_floating_point else torch.int64)
                ref_op = dist.ReduceOp.SUM if op == "AVG" else getattr(dist.ReduceOp, op)
                dist.all_reduce(wide, op=ref_op, group=ctx.gloo)
                if op == "AVG":
                    wide = wide / ctx.world_size
                expected = wide.to(dtype)
                got = gpu.cpu()
                if not torch.equal(got, expected):
                    bad = (got != expected).nonzero()[:3].flatten().tolist()
                    failures.append(f"all_reduce {op} {dtype} n={count}: first wrong at {bad}")
    for root in range(ctx.world_size):
        data = torch.arange(10007, dtype=torch.float32, device=device) * (ctx.rank + 1)
        dist.broadcast(data, src=root)
        expected = torch.arange(10007, dtype=torch.float32) * (root + 1)
        if not torch.equal(data.cpu(), expected):
            failures.append(f"broadcast from {root}: wrong result")
    # A staged collective on CUDA tensors still works (through host memory).
    parts = [torch.empty(5, device=device) for _ in range(ctx.world_size)]
    dist.all_gather(parts, torch.full((5,), float(ctx.rank), device=device))
    for r, p in enumerate(parts):
        if not torch.equal(p.cpu(), torch.full((5,), float(r))):
            failures.append(f"all_gather block {r}: wrong result")
    torch.cuda.synchronize()
    return failures


@pytest.mark.parametrize("world_size", [2])
def test_cuda_tensors_match_gloo(world_size):
    conftest.skip_unless_railshard()
    results = conftest.run_world(_cases, world_size, timeout=600)
    for rank, failures in enumerate(results):
        assert not failures, f"rank {rank}: " + "; ".join(failures[:10])
