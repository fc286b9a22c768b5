"""Sharded and pipelined training over the "railshard" backend, on CPU tensors, in real spawned
processes (conftest.run_world), each checked against the same run over gloo in the same
processes (`ctx.gloo`), with the same seeds and the same per-rank data:

* FSDP2 (`fully_shard` on a DeviceMesh built from the group) of a small transformer-like model
  (~164K float32 parameters) on 2 and 3 ranks (3: uneven shards), 5 SGD steps with gradient
  clipping: the first loss bitwise equal to gloo's; per-step losses, gradient norms and the
  final parameters (local shards and full_tensor()) within 1e-5 of the gloo run and of the
  same model trained on one process over every rank's batch (the independent reference).
* DTensor's functional collectives over the group (redistribute Partial->Shard, uneven
  Shard->Replicate, Partial->Replicate; coalesced all-gather and reduce-scatter of mixed
  dtypes) on 3 ranks: exact values, computed locally.
* torch.distributed.checkpoint (DCP) save and load of the FSDP2 model's DTensor state dict on
  2 and 3 ranks: what railshard saved loads back bitwise, into a railshard and into a gloo
  model, and so does what gloo saved; the files read without any process group
  (no_dist=True) give the saved model's full tensors bitwise.
* torch.distributed.pipelining (two PipelineStages, ScheduleGPipe) over 2 ranks: losses and
  parameters after 3 steps bitwise equal to the gloo run, and within 1e-6 of the same
  micro-batches trained on one process.
* A hand-written two-stage GPipe (isend/irecv of activations forward, batch_isend_irecv of
  gradients backward) over 2 ranks, against gloo and the one-process reference: the one test
  here that torch 1.13 can run.

Tests whose torch APIs this torch lacks (FSDP2, DeviceMesh.from_group, DTensor, DCP's
checkpoint_id API, pipelining) skip, naming the API and the torch version.
"""

import math

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402
from torch import nn  # noqa: E402

import conftest  # noqa: E402

# Float32 training through different reduction orders (railshard's vs gloo's reduce-scatter,
# the one-process sum over ranks' batches): losses and parameters may differ in the last
# bits. Absolute tolerance; losses are ~ln(VOCAB) ~ 4, parameters ~0.1.
FSDP_TOL = 1e-5
PIPE_REF_TOL = 1e-6

VOCAB, DIM, HIDDEN, SEQ = 51, 80, 320, 12  # 80, 320, 51 rows: uneven shards on 3 ranks
MODEL_SEED = 1234
CLIP = 1.0  # gradient-norm clipping in FSDP2 training (the first steps' norms are larger)


# ---------------------------------------------------------------------------------------------
# the model: embedding, two attention + MLP blocks, final LayerNorm, head (~164K parameters)


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1 = nn.LayerNorm(DIM)
        self.q = nn.Linear(DIM, DIM)
        self.k = nn.Linear(DIM, DIM)
        self.v = nn.Linear(DIM, DIM)
        self.o = nn.Linear(DIM, DIM)
        self.ln2 = nn.LayerNorm(DIM)
        self.up = nn.Linear(DIM, HIDDEN)
        self.down = nn.Linear(HIDDEN, DIM)

    def forward(self, x):
        h = self.ln1(x)
        scores = self.q(h) @ self.k(h).transpose(-2, -1) / math.sqrt(DIM)
        x = x + self.o(torch.softmax(scores, dim=-1) @ self.v(h))
        return x + self.down(torch.relu(self.up(self.ln2(x))))


class TinyLM(nn.Module):
    def __init__(self, seed):
        super().__init__()
        torch.manual_seed(seed)
        self.emb = nn.Embedding(VOCAB, DIM)
        self.blocks = nn.ModuleList([Block(), Block()])
        self.ln_f = nn.LayerNorm(DIM)
        self.head = nn.Linear(DIM, VOCAB)

    def forward(self, tokens):
        x = self.emb(tokens)
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


def lm_loss(logits, targets):
    return nn.functional.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1))


def tokens(step, rank, n=4):
    """Rank `rank`'s batch at `step` (inputs, targets): a function of the two only."""
    g = torch.Generator().manual_seed(1000 * step + rank)
    x = torch.randint(0, VOCAB, (n, SEQ), generator=g)
    return x, (7 * x + 3) % VOCAB  # a rule the model can learn in a few steps


def optimizer(params):
    return torch.optim.SGD(params, lr=0.1, momentum=0.9)


# ---------------------------------------------------------------------------------------------
# which torch APIs exist (checked in the parent, so that a missing one skips before spawning)


def _torch_version():
    return torch.__version__.split("+")[0]


def _fully_shard_api():
    """FSDP2's fully_shard, or raises with why not (torch 1.13's torch.distributed.fsdp does
    not even import under Python 3.11: ValueError from a dataclass)."""
    errors = []
    for where in ("torch.distributed.fsdp", "torch.distributed._composable.fsdp"):
        try:
            module = __import__(where, fromlist=["fully_shard"])
            return module.fully_shard
        except Exception as e:  # noqa: BLE001
            errors.append(f"{where}.fully_shard: {type(e).__name__}: {str(e)[:90]}")
    raise ImportError("; ".join(errors))


def _mesh_from_group(group):
    from torch.distributed.device_mesh import DeviceMesh

    return DeviceMesh.from_group(group, "cpu")


def require_fsdp2():
    try:
        _fully_shard_api()
        from torch.distributed.device_mesh import DeviceMesh
        DeviceMesh.from_group  # noqa: B018
    except Exception as e:  # noqa: BLE001
        pytest.skip(f"torch {_torch_version()} has no FSDP2 fully_shard with "
                    f"DeviceMesh.from_group ({e})")


def require_dcp():
    try:
        import inspect

        import torch.distributed.checkpoint as dcp
        for fn in (dcp.save, dcp.load):
            missing = {"checkpoint_id", "process_group", "no_dist"} - set(
                inspect.signature(fn).parameters)
            if missing:
                raise AttributeError(f"{fn.__name__}() has no {sorted(missing)}")
    except Exception as e:  # noqa: BLE001
        pytest.skip(f"torch {_torch_version()} lacks torch.distributed.checkpoint.save/load "
                    f"with checkpoint_id= ({type(e).__name__}: {e})")
    require_fsdp2()  # the state dict checkpointed is an FSDP2 model's


def require_pipelining():
    try:
        from torch.distributed.pipelining import PipelineStage, ScheduleGPipe  # noqa: F401
    except Exception as e:  # noqa: BLE001
        pytest.skip(f"torch {_torch_version()} has no torch.distributed.pipelining "
                    f"PipelineStage/ScheduleGPipe ({type(e).__name__}: {e})")


def groups(ctx):
    """(name, group) for the backend under test (the default group) and for gloo."""
    return [(ctx.backend, dist.group.WORLD), ("gloo", ctx.gloo)]


def max_abs(a, b):
    return (a - b).abs().max().item()


# ---------------------------------------------------------------------------------------------
# 1. FSDP2


def fsdp_model(mesh, seed):
    fully_shard = _fully_shard_api()
    model = TinyLM(seed)  # the same full weights on every rank: fully_shard keeps a chunk
    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def _fsdp_train(ctx, steps):
    n, me = ctx.world_size, ctx.rank
    out = {"losses": {}, "norms": {}, "shards": {}, "full": {}}
    for name, group in groups(ctx):
        model = fsdp_model(_mesh_from_group(group), MODEL_SEED)
        opt = optimizer(model.parameters())
        losses, norms = [], []
        for step in range(steps):
            x, y = tokens(step, me)
            opt.zero_grad()
            loss = lm_loss(model(x), y)
            loss.backward()  # reduce-scatter (ReduceOp.AVG) of the gradients over `group`
            # The norm of sharded (DTensor) gradients: partial sums all-reduced over `group`.
            norm = nn.utils.clip_grad_norm_(model.parameters(), CLIP)
            norms.append((norm.full_tensor() if hasattr(norm, "full_tensor") else norm).item())
            opt.step()
            losses.append(loss.item())
        out["losses"][name] = losses
        out["norms"][name] = norms
        out["shards"][name] = {k: p.to_local().detach().clone()
                               for k, p in model.named_parameters()}
        out["full"][name] = {k: p.full_tensor().detach().clone()  # an all-gather over `group`
                             for k, p in model.named_parameters()}
        out.setdefault("rows", {k: (p.to_local().shape[0], p.shape[0])
                                for k, p in model.named_parameters()})

    # The independent reference: one unsharded model, the mean loss over every rank's batch
    # (what averaging the gradients across ranks computes), no communication at all.
    ref = TinyLM(MODEL_SEED)
    init = {k: p.detach().clone() for k, p in ref.named_parameters()}
    opt = optimizer(ref.parameters())
    ref_losses, ref_norms = [], []
    for step in range(steps):
        opt.zero_grad()
        per_rank = [lm_loss(ref(x), y) for x, y in (tokens(step, r) for r in range(n))]
        (sum(per_rank) / n).backward()
        ref_norms.append(nn.utils.clip_grad_norm_(ref.parameters(), CLIP).item())
        opt.step()
        ref_losses.append(per_rank[me].item())

    under_test = ctx.backend
    result = {
        "losses": out["losses"], "ref_losses": ref_losses, "rows": out["rows"],
        "norms": out["norms"], "ref_norms": ref_norms,
        "shard_diff": {k: max_abs(out["shards"][under_test][k], out["shards"]["gloo"][k])
                       for k in init},
        "full_diff": {k: max_abs(out["full"][under_test][k], out["full"]["gloo"][k])
                      for k in init},
        "ref_diff": {k: max_abs(out["full"]["gloo"][k], p.detach())
                     for k, p in ref.named_parameters()},
        "unchanged": sorted(k for k in init if torch.equal(out["full"]["gloo"][k], init[k])),
        "n_params": sum(p.numel() for p in init.values()),
    }
    return result


@pytest.mark.parametrize("world_size", [2, 3])
def test_fsdp2_training(world_size):
    """FSDP2 over railshard vs over gloo (and vs one process): 5 SGD steps."""
    require_fsdp2()
    steps = 5
    results = conftest.run_world(_fsdp_train, world_size, steps, timeout=240)
    backend = conftest.BACKEND
    n_params = results[0]["n_params"]
    assert 100_000 < n_params < 1_000_000, f"model has {n_params} parameters"
    for rank, r in enumerate(results):
        # Really sharded: every parameter's local shard has fewer rows than the parameter
        # (FSDP2 shards dim 0; on 3 ranks 80/320/51 rows split unevenly).
        for k, (local, full) in r["rows"].items():
            assert local < full, f"rank {rank}: {k} not sharded ({local} of {full} rows)"
        mine, gloo = r["losses"][backend], r["losses"]["gloo"]
        # Step 0 runs on all-gathered initial weights only: all-gather is exact.
        assert mine[0] == gloo[0], (
            f"rank {rank} step 0: {backend} loss {mine[0]!r} != gloo loss {gloo[0]!r} "
            "(the first forward only all-gathers the initial weights)")
        for step, (a, b, c) in enumerate(zip(mine, gloo, r["ref_losses"])):
            assert abs(a - b) <= FSDP_TOL, (
                f"rank {rank} step {step}: {backend} loss {a!r} vs gloo {b!r} "
                f"(|diff| {abs(a - b):.3g} > {FSDP_TOL})")
            assert abs(b - c) <= FSDP_TOL, (
                f"rank {rank} step {step}: gloo FSDP2 loss {b!r} vs one-process reference "
                f"{c!r} (|diff| {abs(b - c):.3g} > {FSDP_TOL})")
        assert mine[-1] < mine[0], f"rank {rank}: training did not lower the loss: {mine}"
        for step, (a, b, c) in enumerate(zip(r["norms"][backend], r["norms"]["gloo"],
                                             r["ref_norms"])):
            assert abs(a - b) <= FSDP_TOL * b and abs(b - c) <= FSDP_TOL * c, (
                f"rank {rank} step {step}: gradient norm over {backend} {a!r}, over gloo "
                f"{b!r}, one process {c!r} (relative tolerance {FSDP_TOL})")
        assert max(r["ref_norms"]) > CLIP, f"clipping never clipped: norms {r['ref_norms']}"
        for what, diffs, against in (("local shard", r["shard_diff"], "gloo"),
                                     ("full_tensor()", r["full_diff"], "gloo"),
                                     ("gloo full_tensor()", r["ref_diff"], "one-process")):
            worst = max(diffs, key=diffs.get)
            assert diffs[worst] <= FSDP_TOL, (
                f"rank {rank}: {what} of {worst} differs from the {against} run's by "
                f"{diffs[worst]:.3g} (> {FSDP_TOL}); all: "
                + ", ".join(f"{k}={v:.2g}" for k, v in diffs.items() if v > FSDP_TOL))
        # Only the key biases keep their initial values: softmax ignores what they add.
        assert all(k.endswith(".k.bias") for k in r["unchanged"]), (
            f"rank {rank}: parameters unchanged by training: {r['unchanged']}")


def require_dtensor():
    try:
        from torch.distributed.tensor import DTensor, Partial, Replicate, Shard  # noqa: F401
        import torch.distributed._functional_collectives as funcol

        for fn in ("all_gather_single_coalesced", "reduce_scatter_single_coalesced"):
            getattr(funcol, fn)
        from torch.distributed.device_mesh import DeviceMesh
        DeviceMesh.from_group  # noqa: B018
    except Exception as e:  # noqa: BLE001
        pytest.skip(f"torch {_torch_version()} lacks torch.distributed.tensor (DTensor, Partial) "
                    f"or functional *_single_coalesced collectives ({type(e).__name__}: {e})")


def _dtensor_collectives(ctx):
    """The functional collectives under DTensor (what FSDP2's full_tensor() and state dicts
    use): the exact sums and blocks, over the group under test and over gloo."""
    from torch.distributed.tensor import DTensor, Partial, Replicate, Shard
    import torch.distributed._functional_collectives as funcol

    n, me = ctx.world_size, ctx.rank

    def part(r):  # rank r's addend: small integers, exact in float32 whatever the order
        return torch.arange(35, dtype=torch.float32).reshape(7, 5) * (r + 1) + r

    total = sum(part(r) for r in range(n))
    problems = []

    def same(got, want, what):
        got = funcol.wait_tensor(got) if isinstance(got, funcol.AsyncCollectiveTensor) else got
        if got.dtype != want.dtype or got.shape != want.shape or not torch.equal(got, want):
            problems.append(f"{what}: got {got.dtype}{list(got.shape)} "
                            f"{got.flatten()[:6].tolist()}, want {want.dtype}{list(want.shape)} "
                            f"{want.flatten()[:6].tolist()}")

    for name, group in groups(ctx):
        mesh = _mesh_from_group(group)
        # 7 rows: on 3 ranks the shards are 3, 3 and 1 rows (padded collectives underneath).
        sharded = DTensor.from_local(part(me), mesh, [Partial()]).redistribute(mesh, [Shard(0)])
        same(sharded.to_local(), torch.chunk(total, n)[me], f"{name} Partial->Shard(0)")
        same(sharded.full_tensor(), total, f"{name} Shard(0)->full_tensor()")
        same(sharded.redistribute(mesh, [Shard(1)]).to_local(), torch.chunk(total, n, 1)[me],
             f"{name} Shard(0)->Shard(1)")
        replicated = DTensor.from_local(part(me), mesh, [Partial()]).redistribute(
            mesh, [Replicate()])
        same(replicated.to_local(), total, f"{name} Partial->Replicate")
        # Several tensors of different dtypes in one coalesced call.
        a = torch.full((2, 3), float(me))
        b = torch.arange(4, dtype=torch.int64) + 10 * me
        got = funcol.all_gather_single_coalesced([a, b], group)
        same(got[0], torch.cat([torch.full((2, 3), float(r)) for r in range(n)]),
             f"{name} all_gather_single_coalesced float32")
        same(got[1], torch.cat([torch.arange(4) + 10 * r for r in range(n)]),
             f"{name} all_gather_single_coalesced int64")
        c = torch.arange(6 * n, dtype=torch.float32).reshape(2 * n, 3) + me
        d = torch.ones(3 * n, dtype=torch.int64) * (me + 1)
        got = funcol.reduce_scatter_single_coalesced([c, d], "sum", [0, 0], group)
        c_total = sum(torch.arange(6 * n, dtype=torch.float32).reshape(2 * n, 3) + r
                      for r in range(n))
        same(got[0], c_total[2 * me:2 * me + 2], f"{name} reduce_scatter_single_coalesced float32")
        same(got[1], torch.full((3,), n * (n + 1) // 2, dtype=torch.int64),
             f"{name} reduce_scatter_single_coalesced int64")
    return problems


def test_dtensor_collectives():
    """DTensor redistribute (reduce-scatter, uneven all-gather, all-reduce) and the functional
    coalesced all-gather/reduce-scatter on 3 ranks: exact values, railshard and gloo."""
    require_dtensor()
    for rank, problems in enumerate(conftest.run_world(_dtensor_collectives, 3, timeout=120)):
        assert not problems, f"rank {rank}:\n" + "\n".join(problems)


# ---------------------------------------------------------------------------------------------
# 2. DCP


SAVE_SEED, LOAD_SEED = 77, 78


def _dcp_roundtrip(ctx, root):
    import torch.distributed.checkpoint as dcp

    backends = dict(groups(ctx))
    meshes = {name: _mesh_from_group(group) for name, group in backends.items()}
    # The saved models: trained one step, so they are no longer their seed's initial weights.
    saved = {}
    for name, group in backends.items():
        model = fsdp_model(meshes[name], SAVE_SEED)
        opt = optimizer(model.parameters())
        x, y = tokens(0, ctx.rank)
        lm_loss(model(x), y).backward()
        opt.step()
        dcp.save(model.state_dict(), checkpoint_id=f"{root}/{name}", process_group=group)
        saved[name] = {k: v.to_local().detach().clone() for k, v in model.state_dict().items()}
        saved[name + ":full"] = {k: v.full_tensor().detach().clone()
                                 for k, v in model.state_dict().items()}

    problems = []
    # Every saver into every loader: the checkpoint is sharded like the saver's mesh and
    # resharded into the loader's (the same layout here, found through DCP's planner).
    for saver in backends:
        for loader, group in backends.items():
            fresh = fsdp_model(meshes[loader], LOAD_SEED)
            sd = fresh.state_dict()
            before = {k: v.to_local().detach().clone() for k, v in sd.items()}
            dcp.load(sd, checkpoint_id=f"{root}/{saver}", process_group=group)
            fresh.load_state_dict(sd)
            got = {k: v.to_local() for k, v in fresh.state_dict().items()}
            want = saved[saver]  # (the loader's mesh shards like the saver's: same size)
            if set(got) != set(want):
                problems.append(f"{saver}->{loader}: keys {sorted(set(got) ^ set(want))}")
            for k in want:
                if torch.equal(before[k], want[k]) and want[k].numel():
                    problems.append(f"{saver}->{loader}: {k} equal before loading (no check)")
                if not torch.equal(got[k], want[k]):
                    problems.append(f"{saver}->{loader}: {k} local shard differs after load "
                                    f"by {max_abs(got[k], want[k]):.3g}")
    # The two saved models are the same training step; on 3 ranks their reduce-scatters may
    # round differently (the order of a 3-term sum), so close, not bitwise.
    for k, v in saved["gloo:full"].items():
        d = max_abs(saved[ctx.backend + ":full"][k], v)
        if d > FSDP_TOL:
            problems.append(f"saved {ctx.backend} and gloo models differ in {k} by {d:.3g}")

    # Without any process group: the files give the full tensors.
    dist.barrier(group=ctx.gloo)
    for saver in backends:
        plain = TinyLM(LOAD_SEED).state_dict()
        dcp.load(plain, checkpoint_id=f"{root}/{saver}", no_dist=True)
        for k, full in saved[saver + ":full"].items():
            if not torch.equal(plain[k], full):
                problems.append(f"{saver} checkpoint read with no_dist=True: {k} differs from "
                                f"the saved model's full tensor by {max_abs(plain[k], full):.3g}")
    return problems, sorted(saved[ctx.backend])


@pytest.mark.parametrize("world_size", [2, 3])
def test_dcp_save_load(world_size, tmp_path):
    """DCP of FSDP2 DTensor state dicts: railshard- and gloo-saved checkpoints each load
    bitwise into railshard and gloo models, and read back whole without a process group."""
    require_dcp()
    results = conftest.run_world(_dcp_roundtrip, world_size, str(tmp_path), timeout=240)
    for rank, (problems, keys) in enumerate(results):
        assert keys == sorted(TinyLM(0).state_dict()), f"rank {rank}: keys {keys}"
        assert not problems, f"rank {rank}:\n" + "\n".join(problems)
    for name in (conftest.BACKEND, "gloo"):
        files = sorted(p.name for p in (tmp_path / name).iterdir())
        assert ".metadata" in files and sum(f.endswith(".distcp") for f in files) == world_size, (
            f"{name} checkpoint files: {files}")


# ---------------------------------------------------------------------------------------------
# 3. pipelines over 2 ranks: stage 0 = embedding + block 0, stage 1 = block 1 + LayerNorm +
# head + loss


class Stage0(nn.Module):
    def __init__(self, full):
        super().__init__()
        self.emb, self.block = full.emb, full.blocks[0]

    def forward(self, tokens):
        return self.block(self.emb(tokens))


class Stage1(nn.Module):
    def __init__(self, full):
        super().__init__()
        self.block, self.ln_f, self.head = full.blocks[1], full.ln_f, full.head

    def forward(self, x):
        return self.head(self.ln_f(self.block(x)))


MICRO, MICRO_BATCH, PIPE_STEPS = 4, 2, 3


def stage_of(rank, seed=MODEL_SEED):
    full = TinyLM(seed)
    return Stage0(full) if rank == 0 else Stage1(full)


def pipe_batch(step):
    """The whole batch of a step (every rank can make it; only the end stages use it)."""
    return tokens(step, 100, n=MICRO * MICRO_BATCH)


def one_process_reference():
    """The same micro-batches on one process: per-micro-batch losses, backward of each, the
    gradients divided by the number of micro-batches (as ScheduleGPipe's scale_grads)."""
    model = TinyLM(MODEL_SEED)
    opt = optimizer(model.parameters())
    losses = []
    for step in range(PIPE_STEPS):
        x, y = pipe_batch(step)
        opt.zero_grad()
        for xm, ym in zip(x.chunk(MICRO), y.chunk(MICRO)):
            loss = lm_loss(model(xm), ym)
            loss.backward()
            losses.append(loss.item())
        for p in model.parameters():
            p.grad.div_(MICRO)
        opt.step()
    return losses, {"stage0": Stage0(model).state_dict(), "stage1": Stage1(model).state_dict()}


def _pipelining(ctx):
    from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

    out = {}
    for name, group in groups(ctx):
        module = stage_of(ctx.rank)
        stage = PipelineStage(module, ctx.rank, 2, torch.device("cpu"), group=group)
        schedule = ScheduleGPipe(stage, n_microbatches=MICRO, loss_fn=lm_loss)
        opt = optimizer(module.parameters())
        losses = []
        for step in range(PIPE_STEPS):
            x, y = pipe_batch(step)
            opt.zero_grad()
            if ctx.rank == 0:
                schedule.step(x)
            else:
                step_losses = []
                schedule.step(target=y, losses=step_losses)
                losses += [loss.item() for loss in step_losses]
            opt.step()
        out[name] = (losses, {k: v.clone() for k, v in module.state_dict().items()})
    return out


def _hand_pipeline(ctx):
    """GPipe by hand: stage 0 sends each micro-batch's activations (isend, tag = micro-batch),
    stage 1 receives them all (irecv posted up front), computes the losses and sends the
    activations' gradients back in one batch_isend_irecv; stage 0 backpropagates them."""
    out = {}
    for name, group in groups(ctx):
        peer = 1 - ctx.rank
        module = stage_of(ctx.rank)
        opt = optimizer(module.parameters())
        losses = []
        for step in range(PIPE_STEPS):
            x, y = pipe_batch(step)
            opt.zero_grad()
            if ctx.rank == 0:
                acts = [module(xm) for xm in x.chunk(MICRO)]
                sends = [dist.isend(a.detach().contiguous(), peer, group=group, tag=m)
                         for m, a in enumerate(acts)]
                grads = [torch.empty_like(a) for a in acts]
                ops = [dist.P2POp(dist.irecv, g, peer, group, MICRO + m)
                       for m, g in enumerate(grads)]
                for w in dist.batch_isend_irecv(ops) + sends:
                    w.wait()
                for a, g in zip(acts, grads):
                    a.backward(g)
            else:
                bufs = [torch.empty(MICRO_BATCH, SEQ, DIM) for _ in range(MICRO)]
                recvs = [dist.irecv(b, peer, group=group, tag=m) for m, b in enumerate(bufs)]
                grads = []
                for b, w, ym in zip(bufs, recvs, y.chunk(MICRO)):
                    w.wait()
                    b.requires_grad_(True)
                    loss = lm_loss(module(b), ym)
                    loss.backward()
                    losses.append(loss.item())
                    grads.append(b.grad)
                ops = [dist.P2POp(dist.isend, g, peer, group, MICRO + m)
                       for m, g in enumerate(grads)]
                for w in dist.batch_isend_irecv(ops):
                    w.wait()
            for p in module.parameters():
                p.grad.div_(MICRO)
            opt.step()
        out[name] = (losses, {k: v.clone() for k, v in module.state_dict().items()})
    return out


def check_pipeline(results, what):
    ref_losses, ref_params = one_process_reference()
    backend = conftest.BACKEND
    assert len(ref_losses) == PIPE_STEPS * MICRO
    assert ref_losses[-1] < ref_losses[0], f"reference training did not learn: {ref_losses}"
    for rank, r in enumerate(results):
        (mine, mine_params), (gloo, gloo_params) = r[backend], r["gloo"]
        stage_ref = ref_params[f"stage{rank}"]
        if rank == 1:  # the loss is on the last stage
            assert mine == gloo, f"{what}: {backend} losses {mine} != gloo losses {gloo}"
            worst = max(abs(a - b) for a, b in zip(gloo, ref_losses))
            assert len(gloo) == len(ref_losses) and worst <= PIPE_REF_TOL, (
                f"{what}: gloo losses {gloo} vs one-process {ref_losses} (|diff| {worst:.3g})")
        else:
            assert mine == [] and gloo == [], f"{what}: stage 0 reported losses"
        assert set(mine_params) == set(stage_ref), (set(mine_params), set(stage_ref))
        for k, ref in stage_ref.items():
            assert torch.equal(mine_params[k], gloo_params[k]), (
                f"{what} stage {rank}: {backend} {k} differs from gloo's by "
                f"{max_abs(mine_params[k], gloo_params[k]):.3g} (point-to-point is exact)")
            d = max_abs(gloo_params[k], ref)
            assert d <= PIPE_REF_TOL, (
                f"{what} stage {rank}: {k} differs from the one-process reference by {d:.3g}")
        init = stage_of(rank).state_dict()
        assert any(not torch.equal(init[k], v) for k, v in mine_params.items()), (
            f"{what} stage {rank}: parameters did not change")


def test_pipelining_gpipe():
    """torch.distributed.pipelining ScheduleGPipe, 2 stages, 4 micro-batches, 3 steps."""
    require_pipelining()
    check_pipeline(conftest.run_world(_pipelining, 2, timeout=180), "pipelining GPipe")


def test_hand_written_pipeline():
    """A two-stage GPipe over isend/irecv/batch_isend_irecv, 4 micro-batches, 3 steps."""
    check_pipeline(conftest.run_world(_hand_pipeline, 2, timeout=180), "hand-written GPipe")
