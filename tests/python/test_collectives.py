"""Every collective x dtype x op of the "railshard" backend on 2 and 3 real processes, each
result compared with the gloo backend's on the same inputs in the same processes.

All cases of one world size run in ONE spawned world (see conftest.run_cases): a case is a
small function every rank runs; pytest reports each case as its own test.

References. gloo is the reference wherever it computes the case itself. Where the installed
torch's gloo cannot (torch 1.13's gloo has no AVG, no bfloat16, int16 or bool; no
reduce_scatter, all_gather_into_tensor or reduce_scatter_tensor; torch 2.x's gloo has no
integer AVG and no int16), the reference is still computed through gloo but with an explicit
formula, said at each place below:
  * unsupported dtype: the op in a wider dtype gloo has (bool/int16 -> int32, then narrowed:
    wrap-around sums and products agree modulo 2^16, bool is "nonzero"; bfloat16/float16 ->
    float32, then rounded once), or for data movement the same bytes as uint8;
  * AVG: SUM through gloo in float64/int64, then divided by the world size (integers
    truncate toward zero, railshard's documented integer AVG);
  * the tensor-output collectives: the list forms through gloo (all_gather, then cat) or an
    all_reduce of the whole input, then this rank's chunk.
Inputs are chosen so every reference is exact (integer-valued floats, products of powers of
two); the "random" cases use arbitrary floats and dtype-scaled tolerances instead, since the
summation order of two implementations legitimately differs.
"""

import zlib

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402

import conftest  # noqa: E402
from conftest import expect  # noqa: E402

R = dist.ReduceOp
OPS = ["SUM", "AVG", "MIN", "MAX", "PRODUCT"]
DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.uint8, torch.int8,
          torch.int16, torch.int32, torch.int64, torch.bool]
FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
# Fewer elements than ranks, odd sizes (uneven chunks), 2-D, and one a few pages long.
SHAPES = [(1,), (7,), (3, 5), (4099,)]
LARGE = 4 * 1024 * 1024 + 3  # 4M floats (+3: uneven chunks at scale)
WORLD_SIZES = [2, 3]


def dname(dtype):
    return str(dtype).replace("torch.", "")


# ---------------------------------------------------------------------------------------------
# inputs


def _gen(name, rank, salt=0):
    return torch.Generator().manual_seed(zlib.crc32(f"{name}/{rank}/{salt}".encode()))


def exact_input(name, rank, dtype, shape, op="SUM", salt=0):
    """Per-rank deterministic values whose reduction every implementation computes exactly
    (the same op on the same values: no rounding anywhere, or wrap-around only)."""
    g = _gen(name, rank, salt)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=g).bool()
    if dtype in FLOATS:
        if op in ("SUM", "AVG"):
            # |partial sums| <= 3*64 = 192 < 256: exact even in bfloat16's 8 bits.
            return torch.randint(-64, 65, shape, generator=g).to(dtype)
        if op == "PRODUCT":
            choices = torch.tensor([-2.0, -1.0, -0.5, 0.5, 1.0, 2.0])
            return choices[torch.randint(0, 6, shape, generator=g)].to(dtype)
        return (torch.randn(shape, generator=g) * 100).to(dtype)  # MIN/MAX: exact anyway
    info = torch.iinfo(dtype)
    if op == "AVG":
        # No wrap-around (railshard stages int8/int16 as int32, so a wrapped sum would be
        # "wrapped" differently); negative sums pin truncation toward zero.
        lo, hi = (0, 80) if dtype == torch.uint8 else (-100, 100)
        return torch.randint(lo, hi, shape, generator=g).to(dtype)
    if op == "PRODUCT" and dtype in (torch.int32, torch.int64):
        return torch.randint(-50000, 50000, shape, generator=g).to(dtype)  # wraps int32
    # Full range: sums and products wrap; both sides must wrap the same way.
    lo, hi = max(info.min, -2 ** 62), min(info.max, 2 ** 62)
    return torch.randint(lo, hi, shape, generator=g, dtype=torch.int64).to(dtype)


def random_input(name, rank, dtype, shape):
    return torch.randn(shape, generator=_gen(name, rank, 7)).to(dtype)


def tolerance(dtype, world_size):
    """(rtol, atol) for sums of randn values computed in a different order and rounding each
    step in `dtype` (railshard: f32 compute, one rounding per step for f16/bf16)."""
    eps = torch.finfo(dtype).eps
    return 4 * world_size * eps, 16 * world_size * eps


def assert_same(got, want, what):
    """Records (does not raise) a difference: a case keeps making the same collective calls
    on every rank whatever one rank finds, or the ranks would fall out of step."""
    if got.dtype != want.dtype:
        return expect(False, f"{what}: dtype {got.dtype}, want {want.dtype}")
    if got.shape != want.shape:
        return expect(False, f"{what}: shape {tuple(got.shape)}, want {tuple(want.shape)}")
    if torch.equal(got, want):
        return True
    diff = (got != want).nonzero()
    first = tuple(diff[0].tolist()) if len(diff) else ()
    return expect(False, f"{what}: {len(diff)} of {got.numel()} elements differ; first at "
                         f"{first}: got {got[first].item()}, want {want[first].item()}")


def assert_close(got, want, what, rtol, atol):
    if got.dtype != want.dtype:
        return expect(False, f"{what}: dtype {got.dtype}, want {want.dtype}")
    try:
        torch.testing.assert_close(got.double(), want.double(), rtol=rtol, atol=atol)
    except AssertionError as e:
        return expect(False, f"{what}: {e}")
    return True


# ---------------------------------------------------------------------------------------------
# references through gloo

_GLOO_OK = {}


def _gloo_try(key, call):
    """Runs call() (a gloo collective) unless an earlier call with the same key showed gloo
    refuses it; returns None when refused. gloo's refusals are argument checks that every
    rank makes the same way before communicating, so refusing never desynchronizes."""
    if _GLOO_OK.get(key) is False:
        return None
    try:
        result = call()
    except (RuntimeError, ValueError, TypeError):
        _GLOO_OK[key] = False
        return None
    _GLOO_OK[key] = True
    return result


def ref_all_reduce(ctx, t, opname):
    """The all_reduce of t (this rank's input) over the world, computed by gloo."""
    dtype, n = t.dtype, ctx.world_size
    op = getattr(R, opname)
    if not (opname == "AVG" and dtype not in FLOATS):  # gloo's integer AVG: never (see top)
        def native():
            r = t.clone()
            dist.all_reduce(r, op=op, group=ctx.gloo)
            return r
        r = _gloo_try(("all_reduce", dtype, opname), native)
        if r is not None:
            # gloo may leave a bool's byte at 2 (1 + 1): normalize to 0/1.
            return r.view(torch.uint8) != 0 if dtype == torch.bool else r
    if opname == "AVG":
        # Formula: SUM through gloo in float64/int64, then / world size (ints: truncating).
        if dtype in FLOATS:
            s = t.to(torch.float64, copy=True)  # copy: never reduce the caller's input
            dist.all_reduce(s, op=R.SUM, group=ctx.gloo)
            return (s / n).to(dtype)
        s = t.to(torch.int64, copy=True)
        dist.all_reduce(s, op=R.SUM, group=ctx.gloo)
        return torch.div(s, n, rounding_mode="trunc").to(dtype)
    # Formula: same op through gloo in a wider dtype, narrowed back once.
    wide = torch.float32 if dtype in FLOATS else torch.int32
    if dtype == torch.float64:
        raise AssertionError("gloo refused float64 all_reduce: no reference")
    r = t.to(wide, copy=True)
    dist.all_reduce(r, op=op, group=ctx.gloo)
    return (r != 0) if dtype == torch.bool else r.to(dtype)


def _as_bytes(t):
    return t.contiguous().view(torch.uint8) if t.dim() > 0 else t.reshape(1).view(torch.uint8)


def ref_broadcast(ctx, t, root):
    def native():
        r = t.clone()
        dist.broadcast(r, src=root, group=ctx.gloo)
        return r
    r = _gloo_try(("broadcast", t.dtype), native)
    if r is not None:
        return r
    # Formula: the same bytes as uint8.
    b = _as_bytes(t).clone()
    dist.broadcast(b, src=root, group=ctx.gloo)
    return b.view(t.dtype).reshape(t.shape)


def ref_all_gather(ctx, t):
    def native():
        out = [torch.empty_like(t) for _ in range(ctx.world_size)]
        dist.all_gather(out, t.contiguous(), group=ctx.gloo)
        return out
    r = _gloo_try(("all_gather", t.dtype), native)
    if r is not None:
        return r
    # Formula: the same bytes as uint8.
    b = _as_bytes(t)
    out = [torch.empty_like(b) for _ in range(ctx.world_size)]
    dist.all_gather(out, b, group=ctx.gloo)
    return [o.view(t.dtype).reshape(t.shape) for o in out]


def ref_reduce_scatter(ctx, chunks, opname):
    """reduce_scatter of the list `chunks` (equal shapes): all_reduce of their concatenation,
    then this rank's chunk -- always through gloo's all_reduce (see top)."""
    flat = torch.cat([c.reshape(-1) for c in chunks])
    full = ref_all_reduce(ctx, flat, opname)
    n = chunks[0].numel()
    return full[ctx.rank * n:(ctx.rank + 1) * n].reshape(chunks[0].shape)


def garbage_like(t):
    """An output buffer full of values no correct result has in these tests."""
    if t.dtype == torch.bool:
        return torch.ones_like(t)  # inputs are random bools: still checked per element
    if t.dtype in FLOATS:
        return torch.full_like(t, 77.0)
    return torch.full_like(t, 77)


# ---------------------------------------------------------------------------------------------
# the matrix


def _case_all_reduce(name, dtype, opname):
    def check(ctx):
        for shape in SHAPES:
            x = exact_input(name, ctx.rank, dtype, shape, opname)
            want = ref_all_reduce(ctx, x, opname)
            t = x.clone()
            ptr = t.data_ptr()
            dist.all_reduce(t, op=getattr(R, opname))
            expect(t.data_ptr() == ptr, "all_reduce replaced the tensor's storage")
            assert_same(t, want, f"all_reduce {opname} {dname(dtype)}{list(shape)}")
    return check


def _case_all_reduce_random(name, dtype, opname):
    def check(ctx):
        rtol, atol = tolerance(dtype, ctx.world_size)
        for shape in [(1000,), (4099,)]:
            x = random_input(name, ctx.rank, dtype, shape)
            want = ref_all_reduce(ctx, x, opname)
            t = x.clone()
            dist.all_reduce(t, op=getattr(R, opname))
            assert_close(t, want, f"all_reduce {opname} {dname(dtype)}{list(shape)} (random)",
                         rtol, atol)
    return check


def _case_broadcast(name, dtype):
    def check(ctx):
        for root in range(ctx.world_size):
            for shape in SHAPES:
                x = exact_input(name, ctx.rank, dtype, shape, salt=root)
                root_x = exact_input(name, root, dtype, shape, salt=root)
                want = ref_broadcast(ctx, x, root)
                assert_same(want, root_x, "gloo's own broadcast (the reference)")
                t = x.clone()
                ptr = t.data_ptr()
                dist.broadcast(t, src=root)
                expect(t.data_ptr() == ptr, "broadcast replaced the tensor's storage")
                assert_same(t, want, f"broadcast root {root} {dname(dtype)}{list(shape)}")
    return check


def _case_all_gather(name, dtype):
    def check(ctx):
        for shape in SHAPES:
            x = exact_input(name, ctx.rank, dtype, shape)
            want = ref_all_gather(ctx, x)
            t = x.clone()
            out = [garbage_like(x) for _ in range(ctx.world_size)]
            dist.all_gather(out, t)
            assert_same(t, x, "all_gather changed its input")
            for r in range(ctx.world_size):
                assert_same(out[r], want[r], f"all_gather {dname(dtype)}{list(shape)} from {r}")
    return check


def _case_all_gather_tensor(name, dtype, fn_name, stacked):
    def check(ctx):
        fn = getattr(dist, fn_name)
        n = ctx.world_size
        for shape in SHAPES:
            x = exact_input(name, ctx.rank, dtype, shape)
            want = torch.cat(ref_all_gather(ctx, x))  # formula: list all_gather, then cat
            if stacked:  # (world, *shape) instead of (world*shape[0], *shape[1:])
                want = want.reshape((n,) + tuple(shape))
            out = garbage_like(want)
            t = x.clone()
            fn(out, t)
            assert_same(t, x, f"{fn_name} changed its input")
            assert_same(out, want, f"{fn_name} {dname(dtype)}{list(shape)}"
                                   f"{' stacked' if stacked else ''}")
    return check


def _case_reduce_scatter(name, dtype, opname):
    def check(ctx):
        for shape in SHAPES:
            chunks = [exact_input(name, ctx.rank, dtype, shape, opname, salt=j)
                      for j in range(ctx.world_size)]
            want = ref_reduce_scatter(ctx, chunks, opname)
            inputs = [c.clone() for c in chunks]
            out = garbage_like(chunks[0])
            dist.reduce_scatter(out, inputs, op=getattr(R, opname))
            for j in range(ctx.world_size):
                assert_same(inputs[j], chunks[j], f"reduce_scatter changed input {j}")
            assert_same(out, want, f"reduce_scatter {opname} {dname(dtype)}{list(shape)}")
    return check


def _case_reduce_scatter_tensor(name, dtype, opname, fn_name, stacked):
    def check(ctx):
        fn = getattr(dist, fn_name)
        n = ctx.world_size
        for shape in SHAPES:
            chunks = [exact_input(name, ctx.rank, dtype, shape, opname, salt=j)
                      for j in range(n)]
            want = ref_reduce_scatter(ctx, chunks, opname)
            x = torch.stack(chunks) if stacked else torch.cat(chunks)
            t = x.clone()
            out = garbage_like(chunks[0])
            fn(out, t, op=getattr(R, opname))
            assert_same(t, x, f"{fn_name} changed its input")
            assert_same(out, want, f"{fn_name} {opname} {dname(dtype)}{list(shape)}"
                                   f"{' stacked' if stacked else ''}")
    return check


def matrix_cases(world_size):
    cases = []
    for dtype in DTYPES:
        for opname in OPS:
            if dtype == torch.bool and opname == "AVG":
                continue  # refused by design (test_errors checks the refusal)
            cases.append((f"all_reduce-{opname}-{dname(dtype)}", _case_all_reduce))
    for dtype in FLOATS:
        for opname in ("SUM", "AVG"):
            cases.append((f"all_reduce_random-{opname}-{dname(dtype)}", _case_all_reduce_random))
    for dtype in DTYPES:
        cases.append((f"broadcast-{dname(dtype)}", _case_broadcast))
        cases.append((f"all_gather-{dname(dtype)}", _case_all_gather))
        for fn_name in ("all_gather_into_tensor", "_all_gather_base"):
            if hasattr(dist, fn_name):
                cases.append((f"{fn_name}-{dname(dtype)}", _case_all_gather_tensor))
                if fn_name == "all_gather_into_tensor":
                    cases.append((f"{fn_name}_stacked-{dname(dtype)}", _case_all_gather_tensor))
    for dtype in DTYPES:
        for opname in OPS:
            if dtype == torch.bool and opname == "AVG":
                continue
            cases.append((f"reduce_scatter-{opname}-{dname(dtype)}", _case_reduce_scatter))
            for fn_name in ("reduce_scatter_tensor", "_reduce_scatter_base"):
                if not hasattr(dist, fn_name):
                    continue
                if fn_name == "_reduce_scatter_base" and opname not in ("SUM", "MAX"):
                    continue  # the old name: same code path, a sample suffices
                cases.append((f"{fn_name}-{opname}-{dname(dtype)}", _case_reduce_scatter_tensor))
                if fn_name == "reduce_scatter_tensor" and opname == "SUM":
                    cases.append((f"{fn_name}_stacked-{opname}-{dname(dtype)}",
                                  _case_reduce_scatter_tensor))
    return cases


def _bind(name, factory):
    """Turns a matrix entry into its check from the name's parts."""
    parts = name.split("-")
    kind, dtype = parts[0], getattr(torch, parts[-1])
    opname = parts[1] if len(parts) == 3 else None
    if kind == "all_reduce":
        return factory(name, dtype, opname)
    if kind == "all_reduce_random":
        return factory(name, dtype, opname)
    if kind in ("broadcast", "all_gather"):
        return factory(name, dtype)
    if kind.startswith(("all_gather_into_tensor", "_all_gather_base")):
        stacked = kind.endswith("_stacked")
        return factory(name, dtype, kind.replace("_stacked", ""), stacked)
    if kind == "reduce_scatter":
        return factory(name, dtype, opname)
    stacked = kind.endswith("_stacked")
    return factory(name, dtype, opname, kind.replace("_stacked", ""), stacked)


# ---------------------------------------------------------------------------------------------
# everything else: layouts, lists, objects, async, large, sub-groups


def _strided_all_reduce(ctx):
    base = exact_input("strided", ctx.rank, torch.float32, (6, 8))
    # A transposed view, a strided slice and a channels_last 4-D tensor.
    for label, make in [("transposed", lambda b: b.t()),
                        ("every other column", lambda b: b[:, ::2]),
                        ("column", lambda b: b[:, 3])]:
        b = base.clone()
        view = make(b)
        want = ref_all_reduce(ctx, view.contiguous(), "SUM")
        untouched = b.clone()
        make(untouched).zero_()
        dist.all_reduce(view)
        assert_same(view, want, f"all_reduce of a {label} view")
        rest = b.clone()
        make(rest).zero_()
        assert_same(rest, untouched, f"all_reduce of a {label} view wrote outside the view")
    x = exact_input("cl", ctx.rank, torch.float32, (2, 3, 4, 5)).to(
        memory_format=torch.channels_last)
    want = ref_all_reduce(ctx, x.contiguous(), "SUM")
    dist.all_reduce(x)
    assert_same(x.contiguous(), want, "all_reduce of a channels_last tensor")
    # A staged dtype (int16 travels as int32) through a strided view.
    b16 = exact_input("i16", ctx.rank, torch.int16, (5, 4))
    want = ref_all_reduce(ctx, b16.t().contiguous(), "MAX")
    v = b16.t()
    dist.all_reduce(v, op=R.MAX)
    assert_same(v, want, "all_reduce MAX of a transposed int16 view")


def _strided_others(ctx):
    n = ctx.world_size
    # broadcast into a strided slice.
    b = exact_input("bs", ctx.rank, torch.float64, (10, 3))
    root = n - 1
    want = ref_broadcast(ctx, b[::2].contiguous(), root)
    before = b.clone()
    dist.broadcast(b[::2], src=root)
    assert_same(b[::2], want, "broadcast into a strided slice")
    assert_same(b[1::2], before[1::2], "broadcast wrote outside the slice")
    # all_gather: a transposed input, outputs that are column blocks of one tensor.
    x = exact_input("agx", ctx.rank, torch.float32, (3, 4))
    want = ref_all_gather(ctx, x.t().contiguous())
    big = torch.zeros(4, 3 * n)
    outs = list(big.chunk(n, dim=1))
    expect(not outs[0].is_contiguous(), 'not outs[0].is_contiguous()')
    dist.all_gather(outs, x.t())
    for r in range(n):
        assert_same(big[:, 3 * r:3 * (r + 1)], want[r], f"all_gather into column block {r}")
    # reduce_scatter: non-contiguous inputs and output.
    chunks = [exact_input("rsx", ctx.rank, torch.int64, (4, 3), salt=j) for j in range(n)]
    want = ref_reduce_scatter(ctx, [c.t().contiguous() for c in chunks], "SUM")
    out_base = torch.zeros(3, 8, dtype=torch.int64)
    out = out_base[:, ::2]
    dist.reduce_scatter(out, [c.t() for c in chunks])
    assert_same(out, want, "reduce_scatter into a strided output")
    assert_same(out_base[:, 1::2], torch.zeros(3, 4, dtype=torch.int64),
                "reduce_scatter wrote outside its output view")


def _scalars_and_empty(ctx):
    # A 0-dim tensor (the usual loss averaging) and empty tensors.
    loss = torch.tensor(float(ctx.rank + 1))
    dist.all_reduce(loss, op=R.SUM)
    expect(loss.dim() == 0 and loss.item() == sum(range(1, ctx.world_size + 1)), loss)
    avg = torch.tensor(float(ctx.rank + 1))
    dist.all_reduce(avg, op=R.AVG)
    expect(avg.item() == sum(range(1, ctx.world_size + 1)) / ctx.world_size, avg)
    for dtype in (torch.float32, torch.int64, torch.bfloat16):
        e = torch.empty(0, dtype=dtype)
        dist.all_reduce(e)
        expect(e.numel() == 0, 'e.numel() == 0')
        dist.broadcast(e, src=0)
        out = [torch.empty(0, dtype=dtype) for _ in range(ctx.world_size)]
        dist.all_gather(out, e)
        expect(all(o.numel() == 0 for o in out), 'all(o.numel() == 0 for o in out)')
    # After the empty ones, a real one still lines up.
    t = torch.full((5,), float(ctx.rank))
    dist.all_reduce(t)
    assert_same(t, torch.full((5,), float(sum(range(ctx.world_size)))),
                "all_reduce after empty collectives")


def _tensor_lists(ctx):
    n = ctx.world_size
    if hasattr(dist, "all_reduce_coalesced"):
        xs = [exact_input("coal", ctx.rank, torch.float32, (k * 3 + 1,), salt=k)
              for k in range(5)]
        wants = [ref_all_reduce(ctx, x, "SUM") for x in xs]
        ts = [x.clone() for x in xs]
        dist.all_reduce_coalesced(ts, op=R.SUM)
        for k in range(5):
            assert_same(ts[k], wants[k], f"all_reduce_coalesced tensor {k}")
    # all_gather with a multi-dim tensor list; reduce_scatter with per-rank lists.
    x = exact_input("agl", ctx.rank, torch.int32, (2, 3, 4))
    out = [torch.empty_like(x) for _ in range(n)]
    dist.all_gather(out, x)
    for r in range(n):
        assert_same(out[r], exact_input("agl", r, torch.int32, (2, 3, 4)), f"all_gather from {r}")


def _complex(ctx):
    """Complex tensors in every collective, SUM/AVG componentwise. torch.distributed hands
    most of them to the backend as view_as_real itself; reduce, gather and reduce_scatter
    reach it complex, and railshard takes their real views (gloo has no complex gather).
    References: gloo's all_reduce of the same inputs, or the inputs themselves."""
    n = ctx.world_size
    for dtype in (torch.complex64, torch.complex128):
        def make(rank, shape=(9,), salt=0):
            return torch.complex(
                exact_input("cplx", rank, torch.float64, shape, salt=salt),
                exact_input("cplx", rank, torch.float64, shape, salt=salt + 1)).to(dtype)

        x = make(ctx.rank)
        want = ref_all_reduce(ctx, x, "SUM")
        t = x.clone()
        dist.all_reduce(t)
        assert_same(t, want, f"all_reduce SUM {dname(dtype)}")
        t = x.clone()
        dist.reduce(t, dst=0)
        assert_same(t, want if ctx.rank == 0 else x, f"reduce SUM {dname(dtype)}")
        out = [torch.empty_like(x) for _ in range(n)] if ctx.rank == 0 else None
        dist.gather(x.clone(), out, dst=0)
        if ctx.rank == 0:
            for r in range(n):
                assert_same(out[r], make(r), f"gather {dname(dtype)} block {r}")
        gathered = [torch.empty_like(x) for _ in range(n)]
        dist.all_gather(gathered, x)
        for r in range(n):
            assert_same(gathered[r], make(r), f"all_gather {dname(dtype)} block {r}")
        chunks = [make(ctx.rank, (4,), salt=10 + 2 * c) for c in range(n)]
        got = torch.empty(4, dtype=dtype)
        dist.reduce_scatter(got, [c.clone() for c in chunks])
        # Block r of the result is the sum over ranks of each rank's chunk r.
        want_rs = sum(make(r, (4,), salt=10 + 2 * ctx.rank) for r in range(n))
        assert_same(got, want_rs, f"reduce_scatter SUM {dname(dtype)}")
        got = torch.empty(4, dtype=dtype)
        dist.reduce_scatter_tensor(got, torch.cat(chunks))
        assert_same(got, want_rs, f"reduce_scatter_tensor SUM {dname(dtype)}")
        t = x.clone()
        try:
            dist.reduce(t, dst=0, op=dist.ReduceOp.MAX)
        except Exception as e:  # noqa: BLE001 - the type and text are the check
            expect("only SUM and AVG reduce complex tensors" in str(e)
                   or "does not support" in str(e), f"reduce MAX complex: {e}")
        else:
            expect(False, "reduce MAX of a complex tensor was accepted")
        assert_same(t, x, f"reduce MAX {dname(dtype)} left the tensor alone")


def _sparse(ctx):
    """all_reduce of sparse COO tensors (SUM; DDP's gradients of nn.Embedding(sparse=True)),
    against gloo's sparse all_reduce of the same inputs and a dense sum of them: ranks with
    different nnz, overlapping and duplicate (uncoalesced) indices, a rank with none, every
    rank with none, several sparse and dense dims, float and integer values. Bad input: an
    op other than SUM, and shapes that differ between ranks (every rank raises; the group
    stays usable)."""
    n, r = ctx.world_size, ctx.rank

    def make(rank, sparse_dims, dense_dims, dtype, nnz=None):
        g = torch.Generator().manual_seed(1000 + rank)
        nnz = rank + 2 if nnz is None else nnz
        shape = [5] * sparse_dims + [3] * dense_dims
        idx = torch.randint(0, 5, (sparse_dims, nnz), generator=g)
        if nnz >= 2:
            idx[:, 1] = idx[:, 0]  # a duplicate index: the input is not coalesced
        vals = torch.randint(-9, 10, [nnz] + [3] * dense_dims, generator=g).to(dtype)
        return torch.sparse_coo_tensor(idx, vals, shape)

    last_has_none = lambda q: 0 if q == n - 1 else None  # noqa: E731
    nobody_has_any = lambda q: 0  # noqa: E731
    default = lambda q: None  # noqa: E731
    cases = [(1, 0, torch.float32, default), (2, 1, torch.float64, default),
             (1, 2, torch.int64, default), (2, 0, torch.float32, last_has_none),
             (1, 1, torch.float32, nobody_has_any)]
    for sparse_dims, dense_dims, dtype, nnz_of in cases:
        what = f"sparse all_reduce {sparse_dims} sparse + {dense_dims} dense dims " \
               f"{dname(dtype)} ({nnz_of is default and 'every rank has some' or 'some empty'})"
        x = make(r, sparse_dims, dense_dims, dtype, nnz_of(r))
        ref = x.clone()
        dist.all_reduce(ref, group=ctx.gloo)
        got = x.clone()
        dist.all_reduce(got)
        expect(got.is_sparse, f"{what}: the result is not sparse")
        dense_want = sum(make(q, sparse_dims, dense_dims, dtype, nnz_of(q)).to_dense()
                         for q in range(n))
        assert_same(got.to_dense(), ref.to_dense(), f"{what} vs gloo")
        assert_same(got.to_dense(), dense_want, f"{what} vs the dense sum")
    if not conftest.UNDER_TEST_IS_RAILSHARD:
        return  # the error texts below are railshard's
    x = make(r, 1, 0, torch.float32)
    try:
        dist.all_reduce(x, op=dist.ReduceOp.MAX)
    except Exception as e:  # noqa: BLE001 - the type and text are the check
        expect(type(e).__name__ == "InvalidArgument" and
               "sparse tensors are summed only" in str(e), f"sparse MAX: {type(e).__name__}: {e}")
    else:
        expect(False, "a sparse all_reduce MAX was accepted")
    odd = torch.sparse_coo_tensor([[0]], [1.0], (5 + r,))
    try:
        dist.all_reduce(odd)
    except Exception as e:  # noqa: BLE001
        expect(type(e).__name__ == "InvalidArgument" and
               "sparse tensors differ in shape" in str(e),
               f"sparse shape mismatch: {type(e).__name__}: {e}")
    else:
        expect(False, "sparse tensors of different shapes were summed")
    t = torch.ones(3)
    dist.all_reduce(t)  # the group is still usable
    assert_same(t, torch.full((3,), float(n)), "all_reduce after the sparse mismatch")


def _object_collectives(ctx):
    objs = [None] * ctx.world_size
    dist.all_gather_object(objs, {"rank": ctx.rank, "payload": "x" * (100 * ctx.rank + 1)})
    for r, o in enumerate(objs):
        expect(o == {"rank": r, "payload": "x" * (100 * r + 1)}, (r, o))
    lst = [ctx.rank, "from", ctx.rank] if ctx.rank == 1 else [None, None, None]
    dist.broadcast_object_list(lst, src=1)
    expect(lst == [1, "from", 1], lst)


def _rooted(ctx):
    """reduce / gather / scatter: the backend implements them; compared with gloo."""
    n = ctx.world_size
    for root in range(n):
        for dtype, opname in [(torch.float32, "SUM"), (torch.int64, "MAX"),
                              (torch.bfloat16, "SUM"), (torch.int8, "PRODUCT")]:
            x = exact_input("reduce", ctx.rank, dtype, (33,), opname, salt=root)
            want = ref_all_reduce(ctx, x, opname)
            t = x.clone()
            dist.reduce(t, dst=root, op=getattr(R, opname))
            if ctx.rank == root:
                assert_same(t, want, f"reduce {opname} {dname(dtype)} to {root}")
        x = exact_input("gather", ctx.rank, torch.float32, (5,), salt=root)
        gathered = [torch.empty(5) for _ in range(n)] if ctx.rank == root else None
        dist.gather(x, gather_list=gathered, dst=root)
        if ctx.rank == root:
            for r in range(n):
                assert_same(gathered[r], exact_input("gather", r, torch.float32, (5,), salt=root),
                            f"gather to {root} from {r}")
        pieces = ([exact_input("scatter", j, torch.int64, (6,), salt=root) for j in range(n)]
                  if ctx.rank == root else None)
        got = torch.empty(6, dtype=torch.int64)
        dist.scatter(got, scatter_list=pieces, src=root)
        assert_same(got, exact_input("scatter", ctx.rank, torch.int64, (6,), salt=root),
                    f"scatter from {root}")


def _async_ops(ctx):
    n = ctx.world_size
    # Many in flight, waited in reverse order; different dtypes and sizes.
    specs = [(torch.float32, (1000,)), (torch.int64, (7,)), (torch.bfloat16, (4099,)),
             (torch.float64, (1,)), (torch.int8, (300,)), (torch.float16, (2049,)),
             (torch.float32, (100000,)), (torch.uint8, (5,))]
    xs = [exact_input("async", ctx.rank, d, s, salt=k) for k, (d, s) in enumerate(specs)]
    wants = [ref_all_reduce(ctx, x, "SUM") for x in xs]
    ts = [x.clone() for x in xs]
    works = [dist.all_reduce(t, async_op=True) for t in ts]
    for k in reversed(range(len(works))):
        expect(works[k].wait() in (True, None), 'works[k].wait() in (True, None)')
        expect(works[k].is_completed(), 'works[k].is_completed()')
        assert_same(ts[k], wants[k], f"async all_reduce {k} after wait()")
    # get_future(): its value is the output tensors; then() chains.
    x = exact_input("fut", ctx.rank, torch.float32, (64,))
    want = ref_all_reduce(ctx, x, "SUM")
    t = x.clone()
    work = dist.all_reduce(t, async_op=True)
    fut = work.get_future()
    doubled = fut.then(lambda f: f.value()[0] * 2)
    value = fut.wait()
    expect(isinstance(value, list) and len(value) == 1, f"future value {type(value)} {value}")
    assert_same(value[0], want, "get_future().wait()[0]")
    assert_same(t, want, "tensor after get_future().wait()")
    assert_same(doubled.wait(), want * 2, "get_future().then(...)")
    # Several futures collected together, mixed with a blocking collective in between.
    ts = [exact_input("collect", ctx.rank, torch.int64, (9,), salt=k) for k in range(4)]
    wants = [ref_all_reduce(ctx, t, "MAX") for t in ts]
    futs = [dist.all_reduce(t, op=R.MAX, async_op=True).get_future() for t in ts[:2]]
    mid = torch.ones(3)
    dist.all_reduce(mid)
    futs += [dist.all_reduce(t, op=R.MAX, async_op=True).get_future() for t in ts[2:]]
    torch.futures.collect_all(futs).wait()
    for k in range(4):
        assert_same(ts[k], wants[k], f"collect_all future {k}")
    assert_same(mid, torch.full((3,), float(n)), "blocking all_reduce between async ones")
    # Async forms of the other collectives.
    b = exact_input("abcast", ctx.rank, torch.float32, (10,))
    root_b = exact_input("abcast", 0, torch.float32, (10,))
    dist.broadcast(b, src=0, async_op=True).wait()
    assert_same(b, root_b, "async broadcast")
    g = exact_input("aag", ctx.rank, torch.int32, (4,))
    outs = [torch.empty_like(g) for _ in range(n)]
    fut = dist.all_gather(outs, g, async_op=True).get_future()
    fut.wait()
    for r in range(n):
        assert_same(outs[r], exact_input("aag", r, torch.int32, (4,)), f"async all_gather {r}")
    chunks = [exact_input("ars", ctx.rank, torch.float32, (6,), salt=j) for j in range(n)]
    want = ref_reduce_scatter(ctx, chunks, "SUM")
    out = torch.empty(6)
    dist.reduce_scatter(out, chunks, async_op=True).wait()
    assert_same(out, want, "async reduce_scatter")
    dist.barrier(async_op=True).wait()


def _large(ctx):
    x = exact_input("large", ctx.rank, torch.float32, (LARGE,))  # integers: exact sums
    want = ref_all_reduce(ctx, x, "SUM")
    t = x.clone()
    dist.all_reduce(t)
    assert_same(t, want, f"all_reduce SUM float32[{LARGE}]")
    root = ctx.world_size - 1
    b = x.clone()
    dist.broadcast(b, src=root)
    assert_same(b, exact_input("large", root, torch.float32, (LARGE,)), "large broadcast")
    h = exact_input("largeh", ctx.rank, torch.bfloat16, (LARGE,), "AVG")
    want = ref_all_reduce(ctx, h, "AVG")
    dist.all_reduce(h, op=R.AVG)
    assert_same(h, want, f"all_reduce AVG bfloat16[{LARGE}]")


def _empty_shared(ctx):
    """railshard.empty_shared tensors (host memory the other ranks map once): large all_reduces
    on them take the mapped single copy on one host. Reference: gloo on the same values."""
    import railshard
    if ctx.backend != "railshard":
        pytest.skip("railshard.empty_shared is railshard's")
    t = railshard.empty_shared(2, 3, dtype=torch.int16)
    assert t.shape == (2, 3) and t.dtype == torch.int16 and t.is_contiguous(), t
    assert int(t.abs().sum()) == 0, "zero-filled"
    for dtype, opname in [(torch.float32, "SUM"), (torch.bfloat16, "AVG"), (torch.int64, "MAX")]:
        x = exact_input("shared", ctx.rank, dtype, (LARGE,), opname)
        want = ref_all_reduce(ctx, x, opname)
        t = railshard.empty_shared(LARGE, dtype=dtype)
        t.copy_(x)
        dist.all_reduce(t, op=getattr(R, opname))
        assert_same(t, want, f"all_reduce {opname} {dtype} on empty_shared[{LARGE}]")
    with pytest.raises(railshard.InvalidArgument, match="expected a positive size in bytes"):
        railshard._C._empty_shared_bytes(0)


def _cuda(ctx):
    """CUDA tensors (the backend stages them through host memory); skipped without a GPU.
    The reference is gloo on the same values on the CPU."""
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    dev = torch.device("cuda", ctx.rank % torch.cuda.device_count())
    for dtype, opname in [(torch.float32, "SUM"), (torch.bfloat16, "AVG"), (torch.int64, "MAX")]:
        x = exact_input("cuda", ctx.rank, dtype, (4099,), opname)
        want = ref_all_reduce(ctx, x, opname)
        t = x.to(dev)
        dist.all_reduce(t, op=getattr(R, opname))
        expect(t.device == dev, f"all_reduce moved the tensor to {t.device}")
        assert_same(t.cpu(), want, f"all_reduce {opname} {dname(dtype)} on {dev}")
    root = ctx.world_size - 1
    b = exact_input("cudab", ctx.rank, torch.float16, (513,)).to(dev)
    dist.broadcast(b, src=root)
    assert_same(b.cpu(), exact_input("cudab", root, torch.float16, (513,)), "broadcast on cuda")
    g = exact_input("cudag", ctx.rank, torch.int32, (77,))
    outs = [torch.empty(77, dtype=torch.int32, device=dev) for _ in range(ctx.world_size)]
    dist.all_gather(outs, g.to(dev))
    for r in range(ctx.world_size):
        assert_same(outs[r].cpu(), exact_input("cudag", r, torch.int32, (77,)),
                    f"all_gather on cuda from {r}")
    torch.cuda.synchronize(dev)


def _barrier(ctx):
    for _ in range(20):
        dist.barrier()
    dist.barrier(group=ctx.gloo)
    expect(dist.get_backend() == ctx.backend, dist.get_backend())


def _subgroups(ctx):
    """More groups of the backend: a second full one and a sub-group of ranks {0, last}."""
    n = ctx.world_size
    full = dist.new_group(backend=ctx.backend)
    members = [0, n - 1]
    sub = dist.new_group(ranks=members, backend=ctx.backend)
    x = torch.full((11,), float(ctx.rank + 1))
    y = x.clone()
    w1 = dist.all_reduce(x, async_op=True)            # default group
    w2 = dist.all_reduce(y, op=R.MAX, group=full, async_op=True)
    w2.wait()
    w1.wait()
    assert_same(x, torch.full((11,), float(n * (n + 1) // 2)), "default group after interleave")
    assert_same(y, torch.full((11,), float(n)), "second group")
    if ctx.rank in members:
        z = torch.full((4,), float(ctx.rank))
        dist.all_reduce(z, group=sub)
        assert_same(z, torch.full((4,), float(sum(members))), "sub-group all_reduce")
        b = torch.full((3,), float(ctx.rank))
        dist.broadcast(b, src=n - 1, group=sub)  # global rank as src
        assert_same(b, torch.full((3,), float(n - 1)), "sub-group broadcast")
    dist.barrier()


def misc_cases(world_size):
    cases = [
        ("strided-all_reduce", _strided_all_reduce),
        ("strided-broadcast_all_gather_reduce_scatter", _strided_others),
        ("scalars_and_empty", _scalars_and_empty),
        ("tensor_lists", _tensor_lists),
        ("complex", _complex),
        ("sparse", _sparse),
        ("object_collectives", _object_collectives),
        ("reduce_gather_scatter", _rooted),
        ("async_ops", _async_ops),
        ("large_4M", _large),
        ("empty_shared", _empty_shared),
        ("cuda", _cuda),
        ("barrier", _barrier),
    ]
    if world_size >= 3:
        cases.append(("subgroups", _subgroups))
    return cases


def build_cases(world_size, which="all"):
    out = []
    if which in ("all", "matrix"):
        out += [(name, _bind(name, factory)) for name, factory in matrix_cases(world_size)]
    if which in ("all", "misc"):
        out += misc_cases(world_size)
    if which == "transport":
        keep = ("all_reduce-SUM-float32", "all_reduce-AVG-bfloat16", "all_reduce-MAX-int64",
                "all_reduce-PRODUCT-int8", "broadcast-float16", "all_gather-bool",
                "reduce_scatter-SUM-float32", "reduce_scatter_tensor-MIN-int32")
        out = [(n, _bind(n, f)) for n, f in matrix_cases(world_size) if n in keep]
        out += [c for c in misc_cases(world_size)
                if c[0] in ("async_ops", "large_4M", "strided-all_reduce")]
    return out


# ---------------------------------------------------------------------------------------------
# pytest side: one world per (world size, variant), every case its own test

_RESULTS = {}


def _results(world_size, which, env=None):
    key = (world_size, which, tuple(sorted((env or {}).items())))
    if key not in _RESULTS:
        try:
            _RESULTS[key] = conftest.run_cases("test_collectives", "build_cases",
                                               (world_size, which), world_size, env=env,
                                               timeout=300)
        except conftest.WorldError as e:
            _RESULTS[key] = e
    return _RESULTS[key]


def _check(world_size, which, name, env=None):
    results = _results(world_size, which, env)
    if isinstance(results, Exception):
        pytest.fail(f"the world running this case failed:\n{results}", pytrace=False)
    if name not in results:
        pytest.fail(f"case {name} did not run", pytrace=False)
    if results[name] is not None and results[name].startswith("skip:"):
        pytest.skip(results[name][5:].strip())
    if results[name] is not None:
        pytest.fail(results[name], pytrace=False)


def _params():
    return [pytest.param(w, name, id=f"w{w}-{name}")
            for w in WORLD_SIZES for name, _ in build_cases(w)]


@pytest.mark.parametrize("world_size,case", _params())
def test_collective(world_size, case):
    _check(world_size, "all", case)


@pytest.mark.railshard_only
@pytest.mark.parametrize("transport", ["tcp", "shm"])
@pytest.mark.parametrize("case", [name for name, _ in build_cases(2, "transport")])
def test_transport(transport, case):
    """A subset, with each of railshard's host transports forced."""
    _check(2, "transport", case, env={"RAILSHARD_TRANSPORT": transport})
