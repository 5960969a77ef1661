"""Tests of the sparse maps in sae.activations: exactness against float64 sort-based references,
simplex properties, gradients and the `entmax` package (non-finite input, precision, layout,
compilation and the CPU kernels: test_activations_edges.py)."""

from __future__ import annotations

import entmax
import pytest
import torch
from activation_helpers import (
    ALPHA,
    F64,
    MAPS,
    NAMES,
    rand,
    ref_entmax_alpha,
    ref_sparsemax,
    threshold_of,
    use_path,
)
from hypothesis import given, settings
from hypothesis import strategies as st

from sae.activations import (
    entmax15,
    entmax_alpha,
    solver,
    sparsemax,
)
from sae.activations.autograd import _scatter_blocks


@pytest.fixture(autouse=True, params=["kernels", "tensor-ops"])
def sparsemax_path(request, monkeypatch):
    """Every test runs twice: with the compiled CPU sparsemax kernels, and on the tensor-op path."""
    return use_path(request.param, monkeypatch)


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


@pytest.mark.slow
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
