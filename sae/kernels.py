r"""Compiled CPU kernels for sparsemax on rows (numba), used by :mod:`sae.activations`.

On a CPU, the tensor-op algorithm of ``sae.activations`` costs a few dozen small passes per
call, each paying PyTorch's per-op overhead; for rows of up to a few thousand entries that
overhead, not arithmetic, sets its speed. These kernels do the same exact computation row by
row in compiled loops, with each row in cache:

- **forward**: the row max by ``torch.amax`` (which also exposes NaN rows), then Michelot's
  (1986) fixed point :math:`\tau \leftarrow (\sum_{x_j > \tau} x_j - 1) / |\{j : x_j > \tau\}|`
  from the bound :math:`\tau \ge \max x - 1`, each iteration one vectorised pass over the row
  in cache, until the support stops changing (exact: :math:`\tau` is then the threshold of its own
  support; 4-8 passes on random rows), and one pass for :math:`[x - \tau]_+`. Rows are
  shifted to max 0 first (``x - amax``) and summed in float64.
- **backward**: :math:`g - \operatorname{mean}_S(g)` on the support :math:`S`, 0 elsewhere.

Non-finite rows follow ``torch.softmax`` as the tensor-op path does: a NaN or ``+inf`` entry, or
no finite entry, gives a NaN row (and a NaN gradient row); ``-inf`` entries get 0.

The kernels run on one thread: splitting rows across threads of our own was slower, because
PyTorch's OpenMP workers keep spinning on the other cores for a while after each torch op. They
are compiled on first use and cached on disk. Without numba, :func:`available` is false
and ``sae.activations`` uses its tensor-op path, which is also the path on CUDA, under
``torch.compile`` and for 1.5-/alpha-entmax.
"""

from __future__ import annotations

import math
import os
import threading

import torch
from torch import Tensor

MAX_WIDTH = 4096  # longer rows: the tensor-op path (block gathering) is as fast or faster
_ENABLED = os.environ.get("SAE_NO_KERNELS", "") in ("", "0")

_lock = threading.Lock()
_state: dict = {}  # the numba kernels, or None if numba is missing


def _compile():
    try:
        import numba
        import numpy as np
    except ImportError:
        return None
    # "nnan" lets LLVM vectorise the masked sums (about 10x faster); NaN rows never reach the
    # kernels (the caller finds them with torch.amax, which propagates NaN), and -inf entries
    # are fine: nnan does not assume finite values.
    opts = {"nogil": True, "cache": True,
            "fastmath": {"reassoc", "contract", "nsz", "arcp", "nnan"}}

    @numba.njit(**opts)
    def forward(c, good, out):  # pragma: no cover - compiled
        rows, n = c.shape
        for i in range(rows):
            if not good[i]:
                continue
            # Michelot (1986) on rows shifted to max 0, c = x - max (by the caller: reassoc
            # would fold (x - max) - t into x - (max + t), which loses huge values), from the
            # lower bound tau >= -1: each pass sets
            # t = (sum_{y > t} y - 1) / #{y > t}, and the support shrinks until its size stops
            # changing; t is then the threshold of its own support, exactly.
            t = -1.0
            k_prev = -1.0
            for _ in range(n + 1):
                s = 0.0
                k = 0.0
                for j in range(n):
                    y = np.float64(c[i, j])
                    on = y > t
                    s += y if on else 0.0
                    k += 1.0 if on else 0.0
                if k == k_prev:
                    break
                k_prev = k
                t = (s - 1.0) / k
            for j in range(n):
                d = np.float64(c[i, j]) - t
                out[i, j] = d if d > 0.0 else 0.0

    @numba.njit(**opts)
    def backward(y, g, out):  # pragma: no cover - compiled
        rows, n = y.shape
        for i in range(rows):
            s = 0.0
            k = 0.0
            for j in range(n):
                on = y[i, j] > 0.0
                s += np.float64(g[i, j]) if on else 0.0
                k += 1.0 if on else 0.0
            mean = s / k if k > 0.0 else 0.0
            for j in range(n):
                out[i, j] = g[i, j] - mean if y[i, j] > 0.0 else 0.0

    return forward, backward


def _kernels():
    if "kernels" not in _state:
        with _lock:
            if "kernels" not in _state:
                _state["kernels"] = _compile()
    return _state["kernels"]


def available(x: Tensor) -> bool:
    """Whether the kernels handle these rows: CPU, float32/float64, at most MAX_WIDTH wide,
    numba installed, and not switched off by the environment variable ``SAE_NO_KERNELS=1``."""
    return (_ENABLED and x.device.type == "cpu" and x.dtype in (torch.float32, torch.float64)
            and 0 < x.shape[-1] <= MAX_WIDTH and _kernels() is not None)


def sparsemax_forward(x: Tensor) -> Tensor:
    """Sparsemax of the rows of a contiguous CPU float [rows, n] tensor (see the module doc)."""
    forward, _ = _kernels()
    x = x.detach()
    m = x.amax(-1, keepdim=True)  # NaN for a row with a NaN
    good = torch.isfinite(m)  # no NaN, no +inf, some finite entry
    c = x - m  # shifted to max 0, in the input's precision as on the tensor-op path
    out = torch.empty_like(x)
    forward(c.numpy(), good.view(-1).numpy(), out.numpy())
    if not bool(good.all()):
        out.masked_fill_(~good, math.nan)
    return out


def sparsemax_backward(y: Tensor, g: Tensor) -> Tensor:
    """Input gradient of sparsemax rows from the output y and the output gradient g."""
    _, backward = _kernels()
    y = y.detach()
    out = torch.empty_like(y)
    backward(y.numpy(), g.detach().contiguous().numpy(), out.numpy())
    bad = y[:, :1].isnan()  # the NaN rows of the output get NaN gradients
    if bool(bad.any()):
        out.masked_fill_(bad, math.nan)
    return out
