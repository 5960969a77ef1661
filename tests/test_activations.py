"""Tests of the sparse maps in sae.activations: exactness against float64 sort-based references,
simplex properties, gradients, the `entmax` package, non-finite input, precision and layout."""

from __future__ import annotations

import math

import entmax
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from sae.activations import (
    Entmax15,
    EntmaxAlpha,
    Sparsemax,
    entmax15,
    entmax_alpha,
    kernels,
    solver,
    sparsemax,
)
from sae.activations.autograd import _scatter_blocks

F64 = torch.float64


@pytest.fixture(autouse=True, params=["kernels", "tensor-ops"])
def sparsemax_path(request, monkeypatch):
    """Every test runs twice: with the compiled CPU sparsemax kernels (sae.activations.kernels) and
    with the tensor-op path that CUDA, torch.compile and machines without numba use."""
    if request.param == "tensor-ops":
        monkeypatch.setattr(kernels, "_ENABLED", False)
    return request.param


# --------------------------------------------------------------------------- references
def ref_sparsemax(x: torch.Tensor) -> torch.Tensor:
    """Sort-and-threshold (Martins & Astudillo, 2016, Algorithm 1) over the last dim."""
    z = x.sort(-1, descending=True).values
    k = torch.arange(1, x.shape[-1] + 1, dtype=x.dtype)
    cs = z.cumsum(-1)
    size = (1 + k * z > cs).sum(-1, keepdim=True)
    tau = (cs.gather(-1, size - 1) - 1) / size
    return (x - tau).clamp_min(0)


def ref_entmax15(x: torch.Tensor) -> torch.Tensor:
    """Sort-based 1.5-entmax (Peters, Niculae & Martins, 2019, Algorithm 2) over the last dim."""
    u = x / 2
    z = u.sort(-1, descending=True).values
    k = torch.arange(1, x.shape[-1] + 1, dtype=x.dtype)
    mean = z.cumsum(-1) / k
    var = (z * z).cumsum(-1) / k - mean**2
    tau = mean - (1 / k - var).clamp_min(0).sqrt()
    size = (tau <= z).sum(-1, keepdim=True)
    return (u - tau.gather(-1, size - 1)).clamp_min(0) ** 2


def ref_entmax_alpha(x: torch.Tensor, alpha: float) -> torch.Tensor:
    """alpha-entmax by 64 bisection steps on the threshold (to 2^-64), over the last dim."""
    z = (alpha - 1) * (x - x.amax(-1, keepdim=True))
    lo = torch.full_like(z[..., :1], -1.0)
    hi = torch.zeros_like(lo)
    for _ in range(64):
        mid = (lo + hi) / 2
        ok = (z - mid).clamp_min(0).pow(1 / (alpha - 1)).sum(-1, keepdim=True) >= 1
        lo, hi = torch.where(ok, mid, lo), torch.where(ok, hi, mid)
    p = (z - lo).clamp_min(0).pow(1 / (alpha - 1))
    return p / p.sum(-1, keepdim=True)


def threshold_of(name: str, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """The threshold t of each row (last dim), read off the output on its largest entry."""
    j = y.argmax(-1, keepdim=True)
    xj, yj = x.gather(-1, j), y.gather(-1, j)
    alpha = {"sparsemax": 2.0, "entmax15": 1.5}.get(name, ALPHA)
    return xj - yj ** (alpha - 1) / (alpha - 1)


ALPHA = 1.3
MAPS = {
    "sparsemax": (sparsemax, ref_sparsemax),
    "entmax15": (entmax15, ref_entmax15),
    "alpha": (
        lambda x, **kw: entmax_alpha(x, ALPHA, **kw),
        lambda x: ref_entmax_alpha(x, ALPHA),
    ),
}
NAMES = list(MAPS)


def rand(*shape, scale=1.0, seed=0, dtype=F64):
    g = torch.Generator().manual_seed(seed)
    return (scale * torch.randn(*shape, generator=g, dtype=F64)).to(dtype)


# --------------------------------------------------------------------------- exactness
@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("n", [1, 2, 5, 16, 17, 32, 100, 256, 784, 1000, 1024, 4096])
@pytest.mark.parametrize("scale", [0.01, 1.0, 30.0])
def test_matches_float64_reference(name, n, scale):
    fn, ref = MAPS[name]
    x = rand(12 if n < 4096 else 4, n, scale=scale, seed=n)
    y, r = fn(x), ref(x)
    # rounding of x - t grows with |x|
    assert torch.allclose(y, r, rtol=0, atol=max(scale, 1) * (1e-12 if name != "alpha" else 1e-10))
    assert torch.equal((y > 0).sum(-1), (r > 0).sum(-1))  # support sizes


@pytest.mark.parametrize("name", NAMES)
def test_ties_and_integer_inputs(name):
    fn, ref = MAPS[name]
    g = torch.Generator().manual_seed(1)
    for n in (3, 8, 40, 1024):
        x = torch.randint(-3, 4, (16, n), generator=g).to(F64)
        x[0] = 0.0  # all tied
        assert torch.allclose(fn(x), ref(x), rtol=0, atol=1e-12 if name != "alpha" else 1e-10)


def _rows_with_an_entry_at_the_threshold(n: int, count: int, seed: int = 0) -> torch.Tensor:
    """float32 rows, each with one entry set to the row's float64 sparsemax threshold, on which
    plain Michelot passes (stopping only when the support size repeats) cycle: the entry at
    the threshold is in and out of the support by turns, one ulp of t apart."""
    g = torch.Generator().manual_seed(seed)
    rows = []
    while len(rows) < count:
        c = torch.rand(1, n, generator=g) * 0.01
        c = c - c.max()
        tau = threshold_of("sparsemax", c.double(), ref_sparsemax(c.double()))
        c[0, int(torch.randint(1, n, (1,), generator=g))] = float(tau)
        c = c - c.max()
        t, k_prev = torch.full((1, 1), -1.0), None
        for _ in range(64):
            r = (c - t).relu()
            k = (r > 0).sum(-1, keepdim=True).to(c.dtype)
            if k_prev is not None and torch.equal(k, k_prev):
                break
            k_prev, t = k, t + (r.sum(-1, keepdim=True) - 1) / k
        else:
            rows.append(c)
    return torch.cat(rows)


def test_an_entry_at_the_threshold_does_not_make_the_passes_cycle(monkeypatch):
    # before, such a row took n + 1 passes (131 073 on a batch support's row of 256 x 512
    # scores: seconds for one training step)
    c = _rows_with_an_entry_at_the_threshold(2048, 3)
    passes = []
    count = solver._count
    monkeypatch.setattr(solver, "_count", lambda r, out: passes.append(1) or count(r, out))
    t, p, k = solver._michelot(c, torch.full((3, 1), -1.0), None)
    assert len(passes) <= 32
    r = ref_sparsemax(c.double())
    assert torch.allclose(p.double(), r, rtol=0, atol=1e-8)
    assert ((p > 0).sum(-1) - (r > 0).sum(-1)).abs().max() <= 1  # the entry at the threshold
    assert torch.allclose(p.sum(-1), torch.ones(3), rtol=0, atol=1e-5)
    assert torch.equal(k.view(-1), (p > 0).sum(-1).to(k.dtype))  # the size of the map returned
    # one row that cycles beside rows that do not, and every path of the public map
    x = torch.cat([c[:1], torch.rand(5, 2048) * 0.01])
    y = sparsemax(x)
    assert torch.allclose(y.double(), ref_sparsemax(x.double()), rtol=0, atol=1e-8)
    long_row = _rows_with_an_entry_at_the_threshold(1 << 14, 1, seed=1)
    y = sparsemax(long_row)
    assert torch.allclose(y.double(), ref_sparsemax(long_row.double()), rtol=0, atol=1e-8)


@pytest.mark.parametrize(
    "consts",
    [
        {"_GATHER_MIN": 64},  # gather candidate blocks on short rows too
        {"_GATHER_MIN": 64, "_RESTRICT_MIN": 0},  # ...and continue only unfinished rows
        {"_RESTRICT_MIN": 0},
        {"_SORT_MAX": 0},  # no sort-based path
    ],
)
@pytest.mark.parametrize("name", NAMES)
def test_every_internal_path_is_exact(monkeypatch, consts, name):
    for k, v in consts.items():
        monkeypatch.setattr(solver, k, v)
    fn, ref = MAPS[name]
    for n, scale in [(8, 1.0), (128, 1.0), (128, 0.05), (256, 3.0), (512, 0.3)]:
        x = rand(40, n, scale=scale, seed=n)
        y, r = fn(x), ref(x)
        assert torch.allclose(y, r, rtol=0, atol=1e-12 if name != "alpha" else 1e-10)
        assert torch.equal((y > 0).sum(-1), (r > 0).sum(-1))


def test_alpha_above_two_and_near_one():
    x = rand(16, 300, seed=3)
    for a in (1.05, 2.5, 3.0):
        y = entmax_alpha(x, a)
        assert torch.allclose(y, ref_entmax_alpha(x, a), rtol=0, atol=1e-8)
        at = torch.tensor(a, dtype=F64)
        assert torch.allclose(entmax_alpha(x, at), ref_entmax_alpha(x, a), rtol=0, atol=1e-8)


@pytest.mark.parametrize("dtype", [torch.float32, F64])
def test_alpha_above_two_takes_few_newton_passes(monkeypatch, dtype):
    # Where alpha > 2 Newton's steps close in on the root from one side; the safeguard used to
    # bisect whenever its bracket had not halved in two steps, which made every such row take
    # about 28 passes in float32 (about 60 in float64): the learned alpha of a trained entmax
    # model ends near 2.1. Some rows (alpha 3, scale 0.3) stall within an ulp of a steep root:
    # they must still stop, and be as exact as rounding allows.
    passes = []
    step = solver._norm_step
    monkeypatch.setattr(solver, "_norm_step", lambda *a: passes.append(1) or step(*a))
    for a, scale, most in [(2.1, 1.0, 12), (2.5, 1.0, 16), (3.0, 0.3, 32)]:
        x = rand(256, 512, scale=scale, seed=7, dtype=dtype)
        c = x - x.amax(-1, keepdim=True)
        passes.clear()
        t, p, lo, index = solver._newton_alpha(c, torch.full_like(c[:, :1], -1 / (a - 1)),
                                               torch.full_like(c[:, :1], a))
        assert len(passes) <= most
        if index is not None:  # the map of the entries still gathered
            p = _scatter_blocks(p, index, *c.shape)
        assert bool((lo <= t).all())
        r = ref_entmax_alpha(x.double(), a)
        atol = 1e-5 if dtype == torch.float32 else 1e-12
        assert torch.allclose((p / p.sum(-1, keepdim=True)).double(), r, rtol=0, atol=atol)


def test_alpha_passes_run_on_the_entries_above_the_bound(monkeypatch):
    # scores spread like a trained model's: few entries near the top of each row
    gathered = []
    select = solver._select_blocks
    monkeypatch.setattr(solver, "_select_blocks",
                        lambda bz, lo: gathered.append(r := select(bz, lo)) or r)
    for dtype in (torch.float32, F64):
        x = rand(64, 512, scale=3.0, seed=11, dtype=dtype)
        for a in (1.5, 1.9, 2.1, 3.0):
            gathered.clear()
            y = entmax_alpha(x, torch.tensor(a, dtype=dtype))
            assert any(g is not None and g.numel() <= 64 * 256 for g in gathered)
            r = ref_entmax_alpha(x.double(), a)
            atol = 1e-5 if dtype == torch.float32 else 1e-12
            assert torch.allclose(y.double(), r, rtol=0, atol=atol)
            assert torch.equal((y > 0).sum(-1), (r > 0).sum(-1))


def test_special_alphas():
    x = rand(8, 100, seed=4)
    assert torch.equal(entmax_alpha(x, 2), sparsemax(x))
    assert torch.equal(entmax_alpha(x, 1.5), entmax15(x))
    assert torch.allclose(entmax_alpha(x, torch.tensor(2.0, dtype=F64)), sparsemax(x), atol=1e-12)
    assert torch.allclose(entmax_alpha(x, torch.tensor(1.5, dtype=F64)), entmax15(x), atol=1e-12)


# --------------------------------------------------------------------------- properties
rows_st = st.integers(1, 4).flatmap(
    lambda r: st.integers(1, 40).flatmap(
        lambda n: st.lists(
            st.lists(st.floats(-20, 20, width=64), min_size=n, max_size=n),
            min_size=r,
            max_size=r,
        )
    )
)
prop = settings(max_examples=40, deadline=None)


@pytest.mark.parametrize("name", NAMES)
@prop
@given(data=rows_st, shift=st.floats(-100, 100), seed=st.integers(0, 2**16))
def test_properties(name, data, shift, seed):
    fn = MAPS[name][0]
    x = torch.tensor(data, dtype=F64)
    y = fn(x)
    # on the simplex
    assert (y >= 0).all()
    assert torch.allclose(y.sum(-1), torch.ones(len(data), dtype=F64), atol=1e-12)
    # shift invariance
    assert torch.allclose(fn(x + shift), y, atol=1e-9)
    # permutation equivariance
    perm = torch.randperm(x.shape[-1], generator=torch.Generator().manual_seed(seed))
    assert torch.allclose(fn(x[:, perm]), y[:, perm], atol=1e-12)
    # exact zeros below the threshold, positive values above it
    t = threshold_of(name, x, y)
    assert (y[x < t - 1e-9] == 0).all()
    assert (y[x > t + 1e-9] > 0).all()


@prop
@given(data=rows_st)
def test_sparsemax_is_idempotent_on_the_simplex(data):
    p = sparsemax(torch.tensor(data, dtype=F64))
    assert torch.allclose(sparsemax(p), p, atol=1e-12)


# --------------------------------------------------------------------------- gradients
def separated(name, shape, dim=-1, groups=1, seed=0, margin=1e-3):
    """A float64 input with no entry within `margin` of its group's threshold (no kinks)."""
    fn, ref = MAPS[name]
    for s in range(seed, seed + 1000):
        x = rand(*shape, seed=s)
        xm = x.movedim(dim, -1)
        xm = xm.reshape(*xm.shape[:-1], groups, -1)
        t = threshold_of(name, xm, ref(xm))
        if ((xm - t).abs() > margin).all():
            return x.requires_grad_()
    raise AssertionError("no separated input found")


GRAD_CASES = [  # (shape, dim, groups)
    ((3, 7), -1, 1),
    ((2, 5, 6), 1, 1),
    ((2, 12), -1, 3),
    ((6, 4), 0, 2),
    ((2, 48), -2 + 1, 1),
]


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("shape,dim,groups", GRAD_CASES)
def test_gradcheck_x(name, shape, dim, groups):
    fn = MAPS[name][0]
    x = separated(name, shape, dim, groups)
    assert torch.autograd.gradcheck(lambda v: fn(v, dim=dim, groups=groups), (x,))


def test_gradcheck_gathered_path(monkeypatch):
    monkeypatch.setattr(solver, "_GATHER_MIN", 64)
    for name in NAMES:
        x = separated(name, (1, 128))
        assert torch.autograd.gradcheck(MAPS[name][0], (x,))


@pytest.mark.parametrize("shape,dim,groups", GRAD_CASES[:4])
def test_gradcheck_alpha(shape, dim, groups):
    x = separated("alpha", shape, dim, groups)
    a = torch.tensor(ALPHA, dtype=F64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda v, b: entmax_alpha(v, b, dim, groups), (x, a))
    # one alpha per slice along dim (shared by its groups)
    per = [1 if i == (dim % len(shape)) else s for i, s in enumerate(shape)]
    a = (1.2 + 0.4 * torch.rand(per, dtype=F64)).requires_grad_()
    x = rand(*shape, seed=5).requires_grad_()
    assert torch.autograd.gradcheck(lambda v, b: entmax_alpha(v, b, dim, groups), (x, a))


def test_gradcheck_alpha_on_gathered_entries(monkeypatch):
    # the passes gather the entries above the bound, and the backward runs on those alone
    gathered = []
    select = solver._select_blocks
    monkeypatch.setattr(solver, "_select_blocks",
                        lambda bz, lo: gathered.append(r := select(bz, lo)) or r)
    x = rand(3, 128, scale=3.0, seed=12).requires_grad_()
    a = torch.tensor([[1.3], [1.8], [2.4]], dtype=F64, requires_grad=True)
    assert torch.autograd.gradcheck(entmax_alpha, (x, a))
    assert any(g is not None and g.numel() <= 3 * 64 for g in gathered)


def test_sparsemax_backward_formula():
    x = rand(5, 30, seed=6, dtype=torch.float32).requires_grad_()
    g = rand(5, 30, seed=7, dtype=torch.float32)
    y = sparsemax(x)
    y.backward(g)
    s = (y > 0).float()
    expect = s * (g - (g * s).sum(-1, keepdim=True) / s.sum(-1, keepdim=True))
    assert torch.allclose(x.grad, expect, atol=1e-6)


# --------------------------------------------------------------------------- entmax package
def test_agrees_with_entmax_package():
    for n, scale in [(10, 1.0), (256, 0.1), (1024, 1.0), (2048, 3.0)]:
        for dtype in (F64, torch.float32):
            x = rand(8, n, scale=scale, seed=n, dtype=dtype)
            assert torch.allclose(sparsemax(x), entmax.sparsemax(x, -1), atol=1e-6)
            assert torch.allclose(entmax15(x), entmax.entmax15(x, -1), atol=1e-6)
            a = torch.tensor(1.7, dtype=dtype)
            ref = entmax.entmax_bisect(x.double(), 1.7, n_iter=60).to(dtype)
            assert torch.allclose(entmax_alpha(x, a), ref, atol=1e-6)
        assert torch.allclose(sparsemax(x, 0), entmax.sparsemax(x, 0), atol=1e-6)


# --------------------------------------------------------------------------- non-finite
BAD = {
    "nan": lambda r: r.index_fill_(0, torch.tensor([3]), math.nan),
    "+inf": lambda r: r.index_fill_(0, torch.tensor([0, 5]), math.inf),
    "all -inf": lambda r: r.fill_(-math.inf),
}


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("bad", list(BAD))
@pytest.mark.parametrize("n", [8, 100, 1024])
def test_bad_row_is_nan_and_leaves_the_others_alone(name, bad, n):
    fn = MAPS[name][0]
    x = rand(5, n, seed=n)
    x[1, : n // 2] = -math.inf  # a good row with -inf entries
    BAD[bad](x[2])
    g = rand(5, n, seed=n + 1)
    x.requires_grad_()
    y = fn(x)
    y.backward(g)
    assert y[2].isnan().all() and x.grad[2].isnan().all()
    keep = [0, 1, 3, 4]
    x2 = x.detach()[keep].clone().requires_grad_()
    y2 = fn(x2)
    y2.backward(g[keep])
    assert torch.equal(y[keep], y2)  # bitwise: the bad row is left out of the shared passes
    assert torch.equal(x.grad[keep], x2.grad)


@pytest.mark.parametrize("name", NAMES)
def test_minus_inf_entries_get_exact_zeros(name):
    fn = MAPS[name][0]
    x = rand(4, 64, seed=8)
    mask = torch.rand(4, 64, generator=torch.Generator().manual_seed(9)) < 0.5
    mask[:, 0] = False
    xi = x.masked_fill(mask, -math.inf).requires_grad_()
    y = fn(xi)
    y.sum().backward()
    assert (y[mask] == 0).all() and (xi.grad[mask] == 0).all()
    for i in range(4):
        finite = x[i][~mask[i]]
        assert torch.allclose(y[i][~mask[i]], fn(finite), atol=1e-12)


@pytest.mark.parametrize("name", NAMES)
def test_never_raises_on_values(name):
    fn = MAPS[name][0]
    x = torch.tensor(
        [[math.nan, 1.0], [math.inf, math.inf], [-math.inf, -math.inf], [1e308, -1e308]],
        dtype=F64,
    )
    y = fn(x)
    assert y[:3].isnan().all() and torch.equal(y[3], torch.tensor([1.0, 0.0], dtype=F64))


def test_bad_alpha_rows_are_nan():
    x = rand(4, 20, seed=10).requires_grad_()
    a = torch.tensor([[1.5], [1.0], [math.nan], [0.5]], dtype=F64, requires_grad=True)
    y = entmax_alpha(x, a)
    y.sum().backward()
    assert torch.allclose(y[0], entmax15(x.detach()[0]), atol=1e-12)
    assert y[1:].isnan().all() and x.grad[1:].isnan().all() and a.grad[1:].isnan().all()
    assert torch.isfinite(a.grad[0]).all()
    with pytest.raises(ValueError, match="alpha"):
        entmax_alpha(x, 1.0)


@pytest.mark.parametrize("name", NAMES)
def test_empty_tensors_pass_through(name):
    fn = MAPS[name][0]
    for shape, dim in [((0, 5), -1), ((3, 0), -1), ((0,), 0), ((2, 0, 4), 1)]:
        x = torch.empty(shape, requires_grad=True)
        y = fn(x, dim=dim)
        assert y.shape == x.shape
        y.sum().backward()
    assert fn(torch.empty(0, 6), groups=3).shape == (0, 6)


# --------------------------------------------------------------------------- precision
@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("dtype,tol", [(torch.float16, 1e-3), (torch.bfloat16, 8e-3)])
def test_half_precision(name, dtype, tol):
    """Computed in float32, returned in the input dtype: within one half-precision step at 1
    of the float64 map of the same (rounded) input."""
    fn, ref = MAPS[name]
    x = rand(32, 300, scale=2.0, seed=11).to(dtype)
    y = fn(x)
    assert y.dtype == dtype
    assert (y.double() - ref(x.double())).abs().max() <= tol
    xg = x.clone().requires_grad_()
    fn(xg).float().pow(2).sum().backward()
    assert xg.grad.dtype == dtype and torch.isfinite(xg.grad).all()


def test_float32_close_to_float64():
    for name, (fn, ref) in MAPS.items():
        x = rand(64, 2048, scale=0.5, seed=12, dtype=torch.float32)
        assert (fn(x).double() - ref(x.double())).abs().max() <= 1e-6, name


def test_large_offsets():
    x = rand(8, 500, seed=13)
    for name, (fn, _) in MAPS.items():
        assert torch.allclose(fn(x + 1e6), fn(x), atol=1e-9), name


# --------------------------------------------------------------------------- layout
@pytest.mark.parametrize("name", NAMES)
def test_dims_shapes_and_groups(name):
    fn = MAPS[name][0]
    x = rand(3, 4, 24, 5, seed=14)
    for dim in range(-4, 4):
        expect = fn(x.movedim(dim, -1).reshape(-1, x.shape[dim])).reshape(
            x.movedim(dim, -1).shape
        )
        assert torch.allclose(fn(x, dim=dim), expect.movedim(-1, dim), atol=1e-12)
    grouped = fn(x, dim=2, groups=4)
    parts = fn(x.reshape(3, 4, 4, 6, 5), dim=3).reshape(3, 4, 24, 5)
    assert torch.allclose(grouped, parts, atol=1e-12)
    assert torch.allclose(grouped.reshape(3, 4, 4, 6, 5).sum(3), torch.ones(3, 4, 4, 5, dtype=F64))
    assert torch.allclose(fn(x.transpose(0, 2), dim=0), fn(x, dim=2).transpose(0, 2), atol=1e-12)
    assert fn(torch.tensor(3.0)).item() == 1.0
    assert torch.allclose(fn(x[0, 0, :, 0]), fn(x[0, 0, :, 0][None])[0])
    with pytest.raises(ValueError, match="divisible"):
        fn(x, dim=2, groups=5)
    with pytest.raises(TypeError):
        fn(torch.ones(3, dtype=torch.int64))


def test_modules():
    x = rand(6, 40, seed=15)
    assert torch.equal(Sparsemax(dim=0)(x), sparsemax(x, 0))
    assert torch.equal(Entmax15(groups=4)(x), entmax15(x, groups=4))
    fixed = EntmaxAlpha(1.5)
    assert isinstance(fixed.alpha, torch.Tensor) and fixed.alpha.item() == 1.5
    assert not list(fixed.parameters()) and torch.equal(fixed(x), entmax15(x))
    assert torch.equal(EntmaxAlpha(2.0)(x), sparsemax(x))
    assert "groups=1" in repr(Sparsemax()) and "learnable=True" in repr(EntmaxAlpha(learnable=True))
    with pytest.raises(ValueError):
        EntmaxAlpha(1.0)


def test_learnable_alpha_stays_above_one():
    m = EntmaxAlpha(alpha=1.5, learnable=True)
    assert abs(m.alpha.item() - 1.5) < 1e-6 and m.alpha.requires_grad
    x = rand(8, 64, seed=16, dtype=torch.float32)
    m(x).pow(2).sum().backward()
    assert m.alpha_raw.grad is not None and torch.isfinite(m.alpha_raw.grad)
    with torch.no_grad():
        m.alpha_raw.fill_(-1e4)  # an optimiser gone astray
    assert m.alpha.item() > 1
    y = m(x)
    assert torch.isfinite(y).all() and torch.allclose(y.sum(-1), torch.ones(8), atol=1e-5)
    opt = torch.optim.SGD(m.parameters(), lr=10.0)
    m.alpha_raw.data.fill_(0.0)
    for _ in range(5):
        opt.zero_grad()
        (-m(x).pow(2).sum()).backward()  # pushes alpha up or down: either way it stays > 1
        opt.step()
        assert m.alpha.item() > 1 and torch.isfinite(m(x)).all()


# --------------------------------------------------------------------------- compile, CUDA
def test_torch_compile_fullgraph():
    """fullgraph=True holds: the sync-free fixed-shape variant is traced (aot_eager backend:
    the same graph capture as inductor, without its C++ build)."""
    learn = EntmaxAlpha(1.4, learnable=True)

    def maps(v):
        return sparsemax(v, groups=2), entmax15(v, dim=0), learn(v)

    x = rand(6, 32, seed=17, dtype=torch.float32)
    x[4, 3] = math.nan
    xe, xc = x.clone().requires_grad_(), x.clone().requires_grad_()
    eager = maps(xe)
    compiled = torch.compile(maps, fullgraph=True, backend="aot_eager", dynamic=False)(xc)
    g = rand(6, 32, seed=18, dtype=torch.float32)
    for e, c in zip(eager, compiled, strict=True):
        assert torch.allclose(e, c, atol=1e-6, equal_nan=True)
    sum((e * g).nansum() for e in eager).backward()
    sum((c * g).nansum() for c in compiled).backward()
    assert torch.allclose(xe.grad, xc.grad, atol=1e-5, equal_nan=True)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_cuda_matches_cpu():
    for name, (fn, _) in MAPS.items():
        for n in (10, 300, 4096):
            x = rand(64, n, seed=n, dtype=torch.float32)
            x[3, 2] = math.nan
            xc = x.cuda().requires_grad_()
            y = fn(xc)
            y.nansum().backward()
            assert torch.allclose(y.cpu(), fn(x), atol=1e-6, equal_nan=True), name


# --------------------------------------------------------------------------- compiled kernels
def test_kernels_are_used_on_cpu_rows(sparsemax_path):
    x = torch.randn(4, 300)
    assert kernels.available(x) == (sparsemax_path == "kernels")
    assert not kernels.available(torch.randn(4, kernels.MAX_WIDTH + 1))
    assert not kernels.available(torch.randn(4, 300, dtype=torch.float16))


@pytest.mark.parametrize("scale", [1e-3, 1.0, 50.0, 1e12])
@pytest.mark.parametrize("dtype", [torch.float32, F64])
def test_kernels_equal_the_tensor_op_path(monkeypatch, scale, dtype):
    torch.manual_seed(0)
    x = (torch.randn(64, 700, dtype=dtype) * scale).requires_grad_()
    x.data[3, 5] = math.inf
    x.data[7, :] = -math.inf
    x.data[9, ::2] = -math.inf
    g = torch.randn(64, 700, dtype=dtype)
    y_k = sparsemax(x)
    (gx_k,) = torch.autograd.grad(y_k, x, g)
    monkeypatch.setattr(kernels, "_ENABLED", False)
    y_t = sparsemax(x)
    (gx_t,) = torch.autograd.grad(y_t, x, g)
    assert torch.equal(y_k > 0, y_t > 0)  # the same supports
    assert torch.equal(y_k.isnan(), y_t.isnan()) and y_k[3].isnan().all()
    tol = 1e-5 if dtype == torch.float32 else 1e-12
    torch.testing.assert_close(y_k, y_t, atol=tol, rtol=0, equal_nan=True)
    torch.testing.assert_close(gx_k, gx_t, atol=tol * 10, rtol=0, equal_nan=True)


def test_kernels_give_the_same_rows_in_any_batch():
    torch.manual_seed(0)
    x = torch.randn(301, 512)
    whole = kernels.sparsemax_forward(x)
    assert torch.equal(whole[7:8], kernels.sparsemax_forward(x[7:8].clone()))
    torch.testing.assert_close(whole.sum(-1), torch.ones(301))
    g = torch.randn_like(x)
    assert torch.equal(kernels.sparsemax_backward(whole, g)[7:8],
                       kernels.sparsemax_backward(whole[7:8].clone(), g[7:8].clone()))


@settings(max_examples=60, deadline=None)
@given(st.floats(1e-6, 60.0))
def test_softplus_inverse_inverts_softplus(y):
    from sae.activations import softplus_inverse

    x = softplus_inverse(y)
    assert float(torch.nn.functional.softplus(torch.tensor(x, dtype=torch.float64))) == \
        pytest.approx(y, rel=1e-9)
