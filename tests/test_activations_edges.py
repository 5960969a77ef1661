"""The sparse maps of sae.activations at their edges: non-finite input, precision, memory
layout, torch.compile and CUDA, and the compiled CPU kernels."""

from __future__ import annotations

import math

import pytest
import torch
from activation_helpers import (
    F64,
    MAPS,
    NAMES,
    rand,
    use_path,
)
from hypothesis import given, settings
from hypothesis import strategies as st

from sae.activations import (
    Entmax15,
    EntmaxAlpha,
    Sparsemax,
    entmax15,
    entmax_alpha,
    kernels,
    sparsemax,
)


@pytest.fixture(autouse=True, params=["kernels", "tensor-ops"])
def sparsemax_path(request, monkeypatch):
    """Every test runs twice: with the compiled CPU sparsemax kernels, and on the tensor-op path."""
    return use_path(request.param, monkeypatch)


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
@pytest.mark.slow
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
