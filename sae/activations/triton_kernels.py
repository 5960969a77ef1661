r"""Fused GPU kernels (Triton) for sparsemax and 1.5-entmax on rows, used by :mod:`sae.activations`.

On a GPU the tensor-op path of ``sae.activations`` launches dozens of small kernels per call,
and for the SAE's rows (a few hundred to a few thousand entries) the launches, not the
arithmetic, set its speed. Here each map is one kernel forward and one backward: one program per
row of a 2-D tensor [rows, n], the whole row held as one ``BLOCK = next_power_of_2(n)`` vector
(registers / shared memory), loaded once, reduced a few times, stored once.

Rows are shifted to max 0, :math:`c = x - \max x`, and the threshold :math:`t` is found in those
coordinates, in float32 whatever the input dtype (float32, bfloat16, float16; the output is in
the input dtype):

- **sparsemax**: Michelot's (1986) fixed point
  :math:`t \leftarrow (\sum_{c_j > t} c_j - 1) / |\{j : c_j > t\}|` from the bound
  :math:`t \ge -1`; the support shrinks until its size stops changing, and :math:`t` is then the
  threshold of its own support, exactly (as in :mod:`sae.activations.kernels`). Output
  :math:`[c - t]_+`.
- **1.5-entmax** (:math:`p_j = [(c_j - t)/2]_+^2`): from the bound :math:`t \ge -2`, each pass
  tries the closed form on the current support :math:`S = \{c_j > t\}`, the smaller root of
  :math:`\sum_S (c_j - t')^2 = 4`, i.e. :math:`t' = \mu_S - \sqrt{4/|S| - \sigma_S^2}`, and keeps
  it when no entry of :math:`S` lies below it (the KKT conditions then hold: exact); otherwise a
  Newton step on the convex :math:`f(t) = \sum_j (c_j - t)_+^2 / 4 - 1`, which rises
  monotonically towards the root, gives the next :math:`t` (as the tensor-op path does).
- **backward**, from the output :math:`y` and the output gradient :math:`g`, with
  :math:`s = y^{2-\alpha}` on the support (sparsemax: the support indicator; 1.5-entmax:
  :math:`\sqrt{y}`): :math:`\partial L/\partial x = s \odot (g - \langle s, g\rangle / \sum_j s_j)`.

**Non-finite input** follows ``torch.softmax`` exactly as the tensor-op path does (each program
checks its own row, so rows never affect one another): a row with a NaN or a ``+inf``, or with
no finite entry, gives a NaN row and a NaN gradient row; ``-inf`` entries of other rows get
exactly 0 and zero gradient.

**Limits.** Rows of up to :data:`MAX_WIDTH` entries; wider rows (and float64, and CPU tensors)
take the tensor-op path, which gathers candidate blocks and is efficient there. The output is
saved for the backward in the input dtype, so a float16/bfloat16 backward reads the rounded
output (an error at the level of that dtype's rounding).

**Switches.** ``SAE_NO_TRITON=1`` turns the kernels off. Triton is imported, and the kernels
defined, on first use on a CUDA tensor (``triton.jit`` reads ``TRITON_INTERPRET`` when it defines
a kernel, and importing triton costs about a second that CPU runs need not pay). With
``TRITON_INTERPRET=1`` set before that, setting :data:`ON_CPU` runs the kernels on CPU tensors
in Triton's interpreter: this is how the tests check them on machines without a GPU.
"""

from __future__ import annotations

import os
import threading

import torch
from torch import Tensor

__all__ = ["MAX_WIDTH", "ON_CPU", "available", "forward", "backward", "compile_for"]

MAX_WIDTH = 16384  # widest row held in one program (16384 float32 = 32 registers a thread)
ON_CPU = False  # tests: run the kernels on CPU tensors (needs TRITON_INTERPRET=1, see above)
_ENABLED = os.environ.get("SAE_NO_TRITON", "") in ("", "0")
_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
_F32_EPS = float(torch.finfo(torch.float32).eps)

_lock = threading.Lock()
_state: dict = {}  # "kernels": the jitted kernels by name, or None without triton


def _define():
    """Import triton and define the kernels (None if triton is missing)."""
    try:
        import triton  # optional, and slow to import: only where a kernel is first used
        import triton.language as tl  # likewise
    except ImportError:
        return None

    # One kernel per direction; SPARSEMAX (constexpr) picks the map at compile time.
    @triton.jit
    def fwd_kernel(X, Y, n, stride_x, stride_y, SPARSEMAX: tl.constexpr, BLOCK: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        offs = tl.arange(0, BLOCK)
        mask = offs < n
        x = tl.load(X + row * stride_x + offs, mask=mask, other=-float("inf")).to(tl.float32)
        m = tl.max(x, 0)
        nans = tl.sum((x != x).to(tl.int32), 0)
        good = (nans == 0) & (m > -float("inf")) & (m < float("inf"))
        # shifted to max 0 (bad rows: all -inf, and they skip the loop)
        c = tl.where(good, x - tl.where(good, m, 0.0), -float("inf"))
        it = 0
        go = good
        if SPARSEMAX:
            # Michelot's fixed point from t = -1 (the threshold of a max-0 row is in [-1, 0)).
            t = -1.0
            k_prev = -1.0
            while go:
                on = c > t
                k = tl.sum(on.to(tl.float32), 0)
                s = tl.sum(tl.where(on, c, 0.0), 0)
                go = (k != k_prev) & (it <= n)
                t = tl.where(go, (s - 1.0) / k, t)
                k_prev = k
                it += 1
            p = tl.maximum(c - t, 0.0)
        else:
            t = -2.0  # the 1.5-entmax threshold of a max-0 row is in [-2, 0)
            while go:
                r = tl.maximum(c - t, 0.0)
                on = c > t
                k = tl.sum(on.to(tl.float32), 0)
                s1 = tl.sum(r, 0)
                s2 = tl.sum(r * r, 0)
                lowest = tl.min(tl.where(on, r, 8.0), 0)  # min over S of c - t (> 0)
                # closed form on S, relative to t: smaller root of k d^2 - 2 s1 d + s2 - 4 = 0
                step = (s1 - tl.sqrt(tl.maximum(s1 * s1 - k * (s2 - 4.0), 0.0))) / k
                tol = 4.0 * 1.1920928955078125e-07 * (1.0 - t)  # 4 float32 eps
                exact = (step >= -tol) & (lowest >= step - tol)
                t = tl.where(exact, t + step, t + (s2 - 4.0) / (2.0 * s1))  # else Newton
                it += 1
                go = (~exact) & (it < 100)
            r = tl.maximum(c - t, 0.0) * 0.5
            p = r * r
        p = tl.where(good, p, float("nan"))
        tl.store(Y + row * stride_y + offs, p.to(Y.dtype.element_ty), mask=mask)

    @triton.jit
    def bwd_kernel(Y, G, DX, n, stride_y, stride_g, stride_dx, SPARSEMAX: tl.constexpr,
                   BLOCK: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        offs = tl.arange(0, BLOCK)
        mask = offs < n
        y = tl.load(Y + row * stride_y + offs, mask=mask, other=0.0).to(tl.float32)
        g = tl.load(G + row * stride_g + offs, mask=mask, other=0.0).to(tl.float32)
        if SPARSEMAX:  # the support indicator; NaN output rows keep NaN
            s = tl.where(y > 0.0, 1.0, tl.where(y == y, 0.0, float("nan")))
        else:
            s = tl.sqrt(y)
        sg = s * g
        dx = sg - s * (tl.sum(sg, 0) / tl.sum(s, 0))
        tl.store(DX + row * stride_dx + offs, dx.to(DX.dtype.element_ty), mask=mask)

    return {"triton": triton, "fwd": fwd_kernel, "bwd": bwd_kernel}


def _kernels():
    if "kernels" not in _state:
        with _lock:
            if "kernels" not in _state:
                _state["kernels"] = _define()
    return _state["kernels"]


def available(x: Tensor) -> bool:
    """Whether the kernels handle the rows of x: a 2-D CUDA (or, with :data:`ON_CPU` under the
    interpreter, CPU) float32/bfloat16/float16 tensor of 1 to MAX_WIDTH columns, triton
    importable, and not switched off by ``SAE_NO_TRITON=1``."""
    if not (_ENABLED and x.dim() == 2 and x.dtype in _DTYPES and 0 < x.shape[1] <= MAX_WIDTH):
        return False
    on_device = x.is_cuda or (
        ON_CPU and x.device.type == "cpu" and os.environ.get("TRITON_INTERPRET") == "1"
    )
    return on_device and _kernels() is not None


def _num_warps(block: int) -> int:
    """Warps per program: 8 entries of the row per thread, at most 16 warps (32 entries)."""
    return max(1, min(16, block // 256))


def _rowwise(x: Tensor) -> Tensor:
    """x with unit column stride (rows may be strided)."""
    return x if x.stride(1) == 1 else x.contiguous()


def _block(n: int) -> int:
    """The row vector's length: the next power of 2 >= n (at least 16)."""
    return max(16, 1 << (n - 1).bit_length())


def _launch(kernel, alpha: float, *tensors: Tensor) -> None:
    """One program per row of the [rows, n] tensors (unit column stride), on their device."""
    rows, n = tensors[0].shape
    block = _block(n)
    args = (*tensors, n, *(a.stride(0) for a in tensors))
    meta = {"SPARSEMAX": alpha == 2.0, "BLOCK": block, "num_warps": _num_warps(block)}
    device = tensors[0].device
    if device.type == "cuda" and device.index != torch.cuda.current_device():
        with torch.cuda.device(device):
            kernel[(rows,)](*args, **meta)
    else:
        kernel[(rows,)](*args, **meta)


def forward(x: Tensor, alpha: float) -> Tensor:
    """Sparsemax (alpha 2.0) or 1.5-entmax (alpha 1.5) of the rows of x [rows, n], where
    :func:`available` (x): a new tensor of x's shape and dtype (see the module doc)."""
    x = _rowwise(x.detach())
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    _launch(_kernels()["fwd"], alpha, x, y)
    return y


def backward(y: Tensor, g: Tensor, alpha: float) -> Tensor:
    """Input gradient [rows, n] of :func:`forward` from its output y and the output gradient g
    (cast to y's dtype); NaN output rows give NaN gradient rows."""
    y = _rowwise(y.detach())
    g = _rowwise(g.detach().to(y.dtype))
    dx = torch.empty(y.shape, dtype=y.dtype, device=y.device)
    _launch(_kernels()["bwd"], alpha, y, g, dx)
    return dx


def compile_for(arch: int = 90, widths=(16, 1024, MAX_WIDTH), dtypes=("fp32", "bf16", "fp16")):
    """Compile both kernels, for both maps, to CUDA binaries for the compute capability `arch`
    (90: H100/H200) without a GPU; returns {(kernel, map, dtype, BLOCK): cubin size in bytes}.

    A check that the kernels compile (the interpreter runs code that the compiler may reject);
    it needs triton's NVIDIA backend and must run without ``TRITON_INTERPRET``.
    """
    k = _kernels()
    # triton's compiler: only for this check
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource  # likewise

    target = GPUTarget("cuda", arch, 32)
    sizes = {}
    for kind, names in (("fwd", ("X", "Y")), ("bwd", ("Y", "G", "DX"))):
        for sparsemax in (True, False):
            for dt in dtypes:
                for block in sorted({_block(n) for n in widths}):
                    sig = {name: f"*{dt}" for name in names} | {"n": "i32"}
                    sig |= {f"stride_{name.lower()}": "i64" for name in names}
                    sig |= {"SPARSEMAX": "constexpr", "BLOCK": "constexpr"}
                    src = ASTSource(k[kind], sig, {"SPARSEMAX": sparsemax, "BLOCK": block})
                    out = k["triton"].compile(
                        src, target=target, options={"num_warps": _num_warps(block)}
                    )
                    name = "sparsemax" if sparsemax else "entmax15"
                    sizes[(kind, name, dt, block)] = len(out.asm["cubin"])
    return sizes
