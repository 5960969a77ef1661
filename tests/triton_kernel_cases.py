"""Tests of the fused Triton kernels (sae.activations.triton_kernels) behind sparsemax and
1.5-entmax: against float64 references (the `entmax` package and the tensor-op path), simplex
properties, non-finite rows, batch independence, dispatch (eager and torch.compile) and
compilation for an H100/H200.

Without a GPU the kernels run on CPU tensors in Triton's interpreter: TRITON_INTERPRET must be
set before triton defines a kernel, which sae.activations.triton_kernels does lazily, on first use.
"""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"

import importlib  # noqa: E402
import math  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402

import entmax  # noqa: E402
import pytest  # noqa: E402
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from sae.activations import (  # noqa: E402
    entmax15,
    kernels,  # noqa: E402
    sparsemax,
)
from sae.activations import triton_kernels as T  # noqa: E402

pytest.importorskip("triton")

DEV = "cuda" if torch.cuda.is_available() else "cpu"
F64 = torch.float64
MAPS = {  # name: (public map, float64 reference, alpha)
    "sparsemax": (sparsemax, entmax.sparsemax, 2.0),
    "entmax15": (entmax15, entmax.entmax15, 1.5),
}
NAMES = list(MAPS)


@pytest.fixture(autouse=True)
def triton_path(monkeypatch):
    """The public maps take the Triton path here: on CPU tensors in the interpreter, ahead of
    the compiled CPU sparsemax kernels (sae.activations.kernels), which would otherwise come
    first."""
    monkeypatch.setattr(T, "ON_CPU", True)
    monkeypatch.setattr(kernels, "_ENABLED", False)


@pytest.fixture
def calls(monkeypatch):
    """Records the kernels launched through sae.activations: ('fwd' | 'bwd', alpha)."""
    seen: list[tuple[str, float]] = []
    fwd, bwd = T.forward, T.backward
    monkeypatch.setattr(T, "forward", lambda x, a: seen.append(("fwd", a)) or fwd(x, a))
    monkeypatch.setattr(T, "backward", lambda y, g, a: seen.append(("bwd", a)) or bwd(y, g, a))
    return seen


def rand(*shape, scale=1.0, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return (scale * torch.randn(*shape, generator=g, dtype=F64)).to(dtype).to(DEV)


def reference(name: str, x: torch.Tensor, g: torch.Tensor):
    """float64 output and input gradient of the entmax package on x (as float64)."""
    xd = x.detach().to(F64).requires_grad_()
    y = MAPS[name][1](xd, -1)
    y.backward(g.to(F64))
    return y.detach(), xd.grad


def run(name: str, x: torch.Tensor, g: torch.Tensor):
    """Output and input gradient of the public map (the Triton path)."""
    x = x.detach().clone().requires_grad_()
    y = MAPS[name][0](x)
    y.backward(g)
    return y.detach(), x.grad


# --------------------------------------------------------------------------- exactness
@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("n", [1, 2, 7, 16, 100, 512, 1000, T.MAX_WIDTH])
@pytest.mark.parametrize("scale", [0.05, 10.0])
def test_matches_float64_references(calls, name, n, scale):
    rows = 2 if n > 1000 else 4
    x, g = rand(rows, n, scale=scale, seed=n), rand(rows, n, seed=n + 1)
    y, gx = run(name, x, g)
    assert calls == [("fwd", MAPS[name][2]), ("bwd", MAPS[name][2])]
    assert y.dtype == x.dtype and gx.dtype == x.dtype
    r, gr = reference(name, x, g)
    torch.testing.assert_close(y.double(), r, atol=2e-6, rtol=0)
    torch.testing.assert_close(gx.double(), gr, atol=2e-5, rtol=0)
    assert torch.equal((y > 0).sum(-1), (r > 0).sum(-1))  # support sizes
    # and the tensor-op path of sae.activations in float64 (not dispatched to the kernels)
    own = MAPS[name][0](x.double())
    torch.testing.assert_close(y.double(), own, atol=2e-6, rtol=0)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("dtype,tol", [(torch.float16, 1e-3), (torch.bfloat16, 8e-3)])
def test_half_precision(calls, name, dtype, tol):
    """float16/bfloat16 rows go to the kernels as they are (float32 inside), and come back in
    their dtype within one rounding step at 1 of the float64 map of the same input."""
    x, g = rand(6, 300, scale=2.0, seed=11, dtype=dtype), rand(6, 300, seed=12, dtype=dtype)
    y, gx = run(name, x, g)
    assert calls == [("fwd", MAPS[name][2]), ("bwd", MAPS[name][2])]
    assert y.dtype == dtype and gx.dtype == dtype
    r, gr = reference(name, x, g)
    assert (y.double() - r).abs().max() <= tol
    assert (gx.double() - gr).abs().max() <= 40 * tol  # reads the rounded output


def test_ties_and_constant_rows():
    x = torch.tensor([[0.0] * 5, [1.0, 1.0, 0.0, 0.0, -3.0], [2.0, 2.0, 2.0, 2.0, 1.0]], device=DEV)
    for name in NAMES:
        r = MAPS[name][1](x.double(), -1)
        torch.testing.assert_close(MAPS[name][0](x).double(), r, atol=1e-7, rtol=0)


# --------------------------------------------------------------------------- properties
rows_st = st.integers(1, 3).flatmap(
    lambda r: st.integers(1, 40).flatmap(
        lambda n: st.lists(
            st.lists(st.floats(-20, 20, width=32), min_size=n, max_size=n),
            min_size=r,
            max_size=r,
        )
    )
)


@pytest.mark.parametrize("name", NAMES)
@settings(max_examples=25, deadline=None)
@given(data=rows_st)
def test_properties(name, data):
    x = torch.tensor(data, dtype=torch.float32, device=DEV)
    y = MAPS[name][0](x)
    assert (y >= 0).all()
    torch.testing.assert_close(y.sum(-1), torch.ones(len(data), device=DEV), atol=1e-5, rtol=0)
    # the reference's support, up to entries within float32 rounding of the threshold
    r = MAPS[name][1](x.double(), -1)
    j = r.argmax(-1, keepdim=True)
    alpha = MAPS[name][2]
    t = x.double().gather(-1, j) - r.gather(-1, j) ** (alpha - 1) / (alpha - 1)
    near = (x.double() - t).abs() <= 1e-5 * (1 + x.abs().amax(-1, keepdim=True))
    assert torch.equal((y > 0)[~near], (r > 0)[~near])


# --------------------------------------------------------------------------- non-finite input
BAD = {
    "nan": lambda r: r.__setitem__(3, math.nan),
    "+inf": lambda r: r.__setitem__(0, math.inf),
    "all -inf": lambda r: r.fill_(-math.inf),
}


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("bad", list(BAD))
def test_bad_rows_are_nan_and_leave_the_others_alone(name, bad):
    x, g = rand(5, 100, seed=3), rand(5, 100, seed=4)
    x[1, :50] = -math.inf  # a good row with -inf entries
    BAD[bad](x[2])
    y, gx = run(name, x, g)
    assert y[2].isnan().all() and gx[2].isnan().all()
    assert (y[1, :50] == 0).all() and (gx[1, :50] == 0).all()
    fin = x[1, 50:][None]  # the map of the finite entries (summed in another order)
    torch.testing.assert_close(y[1, 50:][None], MAPS[name][0](fin), atol=1e-6, rtol=0)
    keep = [0, 1, 3, 4]
    y2, gx2 = run(name, x[keep], g[keep])
    assert torch.equal(y[keep], y2) and torch.equal(gx[keep], gx2)  # bitwise


def test_rows_do_not_depend_on_their_batch():
    x, g = rand(33, 200, seed=5), rand(33, 200, seed=6)
    for name in NAMES:
        y, gx = run(name, x, g)
        y1, gx1 = run(name, x[7:8], g[7:8])
        assert torch.equal(y[7:8], y1) and torch.equal(gx[7:8], gx1)


# --------------------------------------------------------------------------- dispatch
def test_availability(monkeypatch):
    x = rand(3, 10)
    assert T.available(x) and T.available(x.half()) and T.available(x.bfloat16())
    assert not T.available(x.double())  # float64: the tensor-op path
    assert not T.available(rand(2, T.MAX_WIDTH + 1))  # wider rows: the tensor-op path
    assert not T.available(rand(2, 3, 4))
    monkeypatch.setenv("SAE_NO_TRITON", "1")  # read when the module loads
    try:
        importlib.reload(T)
        T.ON_CPU = True
        assert not T.available(x)
    finally:
        monkeypatch.delenv("SAE_NO_TRITON")
        importlib.reload(T)
    T.ON_CPU = True
    assert T.available(x)


def test_other_inputs_take_the_tensor_op_path(calls):
    x = rand(2, T.MAX_WIDTH + 1, scale=0.05, seed=7)
    y = sparsemax(x)
    assert calls == []
    torch.testing.assert_close(y.double(), entmax.sparsemax(x.double(), -1), atol=1e-6, rtol=0)
    sparsemax(rand(3, 10, dtype=F64))
    entmax15(rand(2, 3, 10), dim=1)  # not the last dim: rows are moved there, then the kernels
    assert calls == [("fwd", 1.5)]


@pytest.mark.parametrize("name", NAMES)
def test_torch_compile_calls_the_kernels(calls, name):
    fn = MAPS[name][0]
    x, g = rand(6, 40, seed=8), rand(6, 40, seed=9)
    x[2, 5] = math.nan
    compiled = torch.compile(fn, fullgraph=True, backend="aot_eager", dynamic=False)
    xc = x.clone().requires_grad_()
    yc = compiled(xc)
    yc.backward(g)
    assert ("fwd", MAPS[name][2]) in calls and ("bwd", MAPS[name][2]) in calls
    y, gx = run(name, x, g)
    torch.testing.assert_close(yc, y, atol=0, rtol=0, equal_nan=True)
    torch.testing.assert_close(xc.grad, gx, atol=0, rtol=0, equal_nan=True)


def test_kernels_compile_for_hopper():
    """The interpreter runs code that the compiler may reject: compile both kernels for sm_90
    (H100/H200) in a process without the interpreter; no GPU is needed for that."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    code = (
        "import sys\n"
        "try:\n"
        "    from triton.backends.compiler import GPUTarget  # noqa: F401\n"
        "except ImportError:\n"
        "    sys.exit(77)\n"
        "from sae.activations.triton_kernels import compile_for\n"
        "sizes = compile_for(90, widths=(512,), dtypes=('fp32', 'bf16'))\n"
        "assert len(sizes) == 8 and min(sizes.values()) > 0, sizes\n"
    )
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    if out.returncode == 77:
        pytest.skip("triton has no NVIDIA backend here")
    assert out.returncode == 0, out.stderr[-2000:]
