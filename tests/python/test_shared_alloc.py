"""The shared CPU allocator (issue #45): once a railshard group has several ranks on this host,
large CPU tensors come from memory the host's other ranks map, so DDP's gradient buckets take
the single copy read with plain loads ("shm_single_copy_mapped" in the trace) with no change
to the training script; the parameters still equal DDP over gloo's. Also: small tensors stay
torch's, freed regions are reused, RAILSHARD_SHARED_ALLOC=0 keeps torch's allocator, and a
forked child (a DataLoader worker) writes its own copy, never the parent's tensors.
"""

import json
import os

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402

import conftest  # noqa: E402
from conftest import expect  # noqa: E402
from test_ddp import check_pair, train_pair  # noqa: E402

# Three 1024x1024 layers (4 MiB of gradients each): every DDP bucket is past the 1 MiB
# single-copy threshold.
SIZES = [1024, 1024, 1024, 1024, 8]
MIB = 1 << 20


def _ddp_on_shared(ctx):
    import railshard.shared as shared
    installed = shared.allocator_stats()["installed"]
    models = train_pair(ctx, SIZES, steps=3)
    check_pair(ctx, models, "DDP with the shared allocator")
    big, small = torch.empty(MIB // 4 * 3), torch.empty(1000)  # 3 MiB, 4 KB
    where = {"big": shared.is_shared(big), "small": shared.is_shared(small)}
    # A forked child writes into its copy of a shared tensor; the parent's is untouched, and
    # the child's copy is no longer offered to peers.
    t = torch.full((MIB,), 1.0)
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            seen = float(t[12345])
            t.fill_(9.0)
            os.write(write_fd, f"{seen} {int(shared.is_shared(t))}".encode())
        finally:
            os._exit(0)
    os.close(write_fd)
    child = os.read(read_fd, 100).decode()
    os.close(read_fd)
    os.waitpid(pid, 0)
    return {"installed": installed, "where": where, "stats": shared.allocator_stats(),
            "child": child, "parent_after_child": float(t.max()), "t_shared": shared.is_shared(t)}


def _mapped_allreduces(path):
    """(all-reduces of at least 1 MiB, those of them that ran the mapped single copy)."""
    with open(path) as f:
        events = json.load(f)["traceEvents"]
    mapped = {e["args"]["seq"] for e in events
              if e.get("cat") == "phase" and e.get("name") == "shm_single_copy_mapped"}
    large = [e["args"]["seq"] for e in events
             if e.get("cat") == "collective" and e.get("name") == "allreduce"
             and e["args"].get("bytes", 0) >= MIB]
    return large, [s for s in large if s in mapped]


def test_ddp_buckets_take_the_mapped_single_copy(tmp_path):
    conftest.skip_unless_railshard()
    results = conftest.run_world(_ddp_on_shared, 2, env={"RAILSHARD_TRACE": str(tmp_path)},
                                 timeout=300)
    for rank, r in enumerate(results):
        assert r["installed"], f"rank {rank}: allocator not installed: {r}"
        assert r["where"] == {"big": True, "small": False}, f"rank {rank}: {r['where']}"
        stats = r["stats"]
        # 3 steps x 2 models reallocate the same gradients: later steps reuse regions.
        assert stats["reused"] > 0 and stats["live_regions"] > 0, f"rank {rank}: {stats}"
        assert stats["live_bytes"] + stats["kept_bytes"] <= 2 * stats["peak_live_bytes"], stats
        assert r["child"] == "1.0 0", f"rank {rank}: the child saw/offered: {r['child']}"
        assert r["parent_after_child"] == 1.0, f"rank {rank}: the child's write reached the parent"
        assert r["t_shared"], f"rank {rank}: the parent's tensor stopped being shared"
        large, mapped = _mapped_allreduces(tmp_path / f"railshard-trace-rank{rank}.json")
        # 3 steps, DDP's buckets of 4 MiB gradients (the gloo model's are not in this trace).
        assert len(large) >= 3, f"rank {rank}: {len(large)} all-reduces of >= 1 MiB traced"
        assert mapped == large, (f"rank {rank}: {len(large) - len(mapped)} of {len(large)} "
                                 "bucket all-reduces did not take the mapped single copy")


def _allocator_off(ctx):
    import railshard.shared as shared
    models = train_pair(ctx, SIZES, steps=2)
    check_pair(ctx, models, "DDP with torch's allocator")
    return {"stats": shared.allocator_stats(), "big": shared.is_shared(torch.empty(MIB))}


def test_opt_out_keeps_torchs_allocator(tmp_path):
    conftest.skip_unless_railshard()
    results = conftest.run_world(_allocator_off, 2, timeout=300,
                                 env={"RAILSHARD_SHARED_ALLOC": "0",
                                      "RAILSHARD_TRACE": str(tmp_path)})
    for rank, r in enumerate(results):
        assert not r["stats"]["installed"] and r["stats"]["allocations"] == 0, r
        assert not r["big"], f"rank {rank}: a tensor came from a shared region"
        large, mapped = _mapped_allreduces(tmp_path / f"railshard-trace-rank{rank}.json")
        assert len(large) >= 2 and not mapped, (rank, large, mapped)


def _alone(ctx):
    import railshard.shared as shared
    dist.all_reduce(torch.ones(MIB))
    return shared.allocator_stats()["installed"]


def test_not_installed_for_a_single_rank():
    conftest.skip_unless_railshard()
    assert conftest.run_world(_alone, 1, timeout=120) == [False]
