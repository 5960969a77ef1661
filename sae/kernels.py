r"""Compiled CPU kernels for sparsemax on rows (numba), used by :mod:`sae.activations`.

On a CPU, the tensor-op algorithm of ``sae.activations`` costs a few dozen small passes per
call, each paying PyTorch's per-op overhead; for rows of up to a few thousand entries that
overhead, not arithmetic, sets its speed. These kernels do the same exact computation row by
row in compiled loops, with each row in cache:

- **forward**: the row max by ``torch.amax`` (which also exposes NaN rows), then Michelot's
  (1986) fixed point :math:`\tau \leftarrow (\sum_{x_j > \tau} x_j - 1) / |\{j : x_j > \tau\}|`
  from the bound :math:`\tau \ge \max x - 1`, each iteration one vectorised pass over the row
  in cache, until the support stops changing (exact: :math:`\tau` is then the threshold of its own
  support; 4-8 passes on random rows), and one pass for :math:`[x - \tau]_+`. The first pass
  also shifts the row to max 0 (``x - max``, in the input's precision) into the output row, which
  the later passes read; sums are in float64.
- **backward**: :math:`g - \operatorname{mean}_S(g)` on the support :math:`S`, 0 elsewhere.

Non-finite rows follow ``torch.softmax`` as the tensor-op path does: a NaN or ``+inf`` entry, or
no finite entry, gives a NaN row (and a NaN gradient row); ``-inf`` entries get 0. The kernels
find those rows themselves (from the bits of the row max, or of the output's first entry) and
report how many they skipped, so that the usual all-finite call costs one torch op (the max)
besides the kernel: at the SAE's size (256 x 512) each small torch op around the kernel costs
a noticeable share of the call.

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

import numpy as np
import torch
from torch import Tensor

MAX_WIDTH = 4096  # longer rows: the tensor-op path (block gathering) is as fast or faster
_ENABLED = os.environ.get("SAE_NO_KERNELS", "") in ("", "0")

_lock = threading.Lock()
_state: dict = {}  # the numba kernels, or None if numba is missing


def _compile():
    try:
        import numba
    except ImportError:
        return None
    # "nnan" lets LLVM vectorise the masked sums (about 10x faster); NaN rows are skipped on
    # integer tests of their bits (torch.amax propagates NaN to the row max), and -inf entries
    # are fine: nnan does not assume finite values.
    opts = {"nogil": True, "cache": True,
            "fastmath": {"reassoc", "contract", "nsz", "arcp", "nnan"}}

    @numba.njit(**opts)
    def forward(x, m, m_bits, exp_mask, out):  # pragma: no cover - compiled
        rows, n = x.shape
        bad = 0
        for i in range(rows):
            # A row is bad when its max (torch.amax: NaN if the row has a NaN) is not finite;
            # tested on its bits, as nnan makes float tests for NaN meaningless.
            if (m_bits[i] & exp_mask) == exp_mask:
                bad += 1
                continue
            # Michelot (1986) on the row shifted to max 0, from the lower bound t = -1: each
            # pass sets t = (sum_{c > t} c - 1) / #{c > t}, and the support shrinks until its
            # size stops changing; t is then the threshold of its own support, exactly. The
            # shifted row c = x - max goes into the output row (in the input's precision, as on
            # the tensor-op path) during the first pass, and later passes read it back: folding
            # (x - max) - t into x - (max + t), which reassoc would allow, loses huge values.
            c = out[i]
            mi = m[i]
            s = 0.0
            k = 0.0
            for j in range(n):
                d = x[i, j] - mi
                c[j] = d
                y = np.float64(d)
                on = y > -1.0
                s += y if on else 0.0
                k += 1.0 if on else 0.0
            k_prev = k
            t = (s - 1.0) / k
            for _ in range(n):
                s = 0.0
                k = 0.0
                for j in range(n):
                    y = np.float64(c[j])
                    on = y > t
                    s += y if on else 0.0
                    k += 1.0 if on else 0.0
                if k == k_prev:
                    break
                k_prev = k
                t = (s - 1.0) / k
            for j in range(n):
                d = np.float64(c[j]) - t
                c[j] = d if d > 0.0 else 0.0
        return bad

    @numba.njit(**opts)
    def backward(y, y_bits, exp_mask, g, out):  # pragma: no cover - compiled
        rows, n = y.shape
        bad = 0
        for i in range(rows):
            if (y_bits[i, 0] & exp_mask) == exp_mask:  # a NaN output row (bad input row)
                bad += 1
                continue
            s = 0.0
            k = 0.0
            for j in range(n):
                on = y[i, j] > 0.0
                s += np.float64(g[i, j]) if on else 0.0
                k += 1.0 if on else 0.0
            mean = s / k if k > 0.0 else 0.0
            for j in range(n):
                out[i, j] = g[i, j] - mean if y[i, j] > 0.0 else 0.0
        return bad

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


def _bits(x: Tensor) -> tuple:
    """The bits of a float32/float64 tensor as a numpy integer array, and its exponent mask."""
    if x.dtype == torch.float32:
        return x.view(torch.int32).numpy(), np.int32(0x7F800000)
    return x.view(torch.int64).numpy(), np.int64(0x7FF0000000000000)


def sparsemax_forward(x: Tensor) -> Tensor:
    """Sparsemax of the rows of a contiguous CPU float [rows, n] tensor (see the module doc)."""
    forward, _ = _kernels()
    x = x.detach()
    m = x.amax(-1)  # NaN for a row with a NaN
    out = torch.empty_like(x)
    if forward(x.numpy(), m.numpy(), *_bits(m), out.numpy()):
        out.masked_fill_(~torch.isfinite(m)[:, None], math.nan)  # the rows the kernel skipped
    return out


def sparsemax_backward(y: Tensor, g: Tensor) -> Tensor:
    """Input gradient of sparsemax rows from the output y and the output gradient g."""
    _, backward = _kernels()
    y = y.detach()
    out = torch.empty_like(y)
    if backward(y.numpy(), *_bits(y), g.detach().contiguous().numpy(), out.numpy()):
        out.masked_fill_(y[:, :1].isnan(), math.nan)  # NaN output rows: NaN gradients
    return out
