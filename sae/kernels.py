r"""Compiled CPU kernels for sparsemax on rows (numba), used by :mod:`sae.activations`.

On a CPU, the tensor-op algorithm of ``sae.activations`` costs a few dozen small passes per
call, each paying PyTorch's per-op overhead; for rows of up to a few thousand entries that
overhead, not arithmetic, sets its speed. These kernels do the same exact computation row by
row in compiled loops, with each row in cache:

- **forward**: one pass for the row max (and a sum that exposes NaN), one pass that copies
  the candidates :math:`x_j - \max x > -1` (only these can be in the support, since
  :math:`\tau \ge \max x - 1`), shifted to max 0, into a buffer, Michelot's (1986) fixed point
  :math:`\tau \leftarrow (\sum_{x_j > \tau} x_j - 1) / |\{j : x_j > \tau\}|` on the buffer
  until the support stops changing (exact: it is then the threshold of its own support), and one
  pass for :math:`[x - \tau]_+`. Sums are accumulated in float64.
- **backward**: :math:`g - \operatorname{mean}_S(g)` on the support :math:`S`, 0 elsewhere.

Non-finite rows follow ``torch.softmax`` as the tensor-op path does: a NaN or ``+inf`` entry, or
no finite entry, gives a NaN row (and a NaN gradient row); ``-inf`` entries get 0.

Rows are split across ``torch.get_num_threads()`` threads (the kernels release the GIL). The
kernels are compiled on first use and cached on disk. Without numba, :func:`available` is false
and ``sae.activations`` uses its tensor-op path, which is also the path on CUDA, under
``torch.compile`` and for 1.5-/alpha-entmax.
"""

from __future__ import annotations

import math
import os
import threading
from concurrent.futures import ThreadPoolExecutor

import torch
from torch import Tensor

MAX_WIDTH = 2048  # longer rows: the tensor-op path's block gathering is as fast or faster
_MIN_SPLIT = 1 << 15  # entries per thread below which splitting rows costs more than it saves
_ENABLED = os.environ.get("SAE_NO_KERNELS", "") in ("", "0")

_lock = threading.Lock()
_state: dict = {}  # numba kernels (or None if numba is missing), and the thread pool per pid


def _compile():
    try:
        import numba
        import numpy as np
    except ImportError:
        return None
    opts = {"nogil": True, "cache": True, "fastmath": {"reassoc", "contract"}}

    @numba.njit(**opts)
    def forward(x, out):  # pragma: no cover - compiled
        rows, n = x.shape
        buf = np.empty(n, dtype=np.float64)
        for i in range(rows):
            m = -math.inf
            total = 0.0
            for j in range(n):
                v = x[i, j]
                m = max(m, v)
                total += v
            # NaN (max skips it, the sum does not), +inf, or no finite entry: a NaN row
            if m == math.inf or m == -math.inf or total != total:
                for j in range(n):
                    out[i, j] = math.nan
                continue
            # in coordinates shifted to max 0 (x - m, exact in float64), so that huge values
            # keep max - 1 below the max
            c = 0
            for j in range(n):
                v = x[i, j] - m
                if v > -1.0:
                    buf[c] = v
                    c += 1
            t = -1.0
            k_prev = -1
            for _ in range(c + 1):
                s = 0.0
                k = 0
                for j in range(c):
                    v = buf[j]
                    if v > t:
                        s += v
                        k += 1
                if k == k_prev:
                    break
                k_prev = k
                t = (s - 1.0) / k
            for j in range(n):
                d = (x[i, j] - m) - t
                out[i, j] = d if d > 0.0 else 0.0

    @numba.njit(**opts)
    def backward(y, g, out):  # pragma: no cover - compiled
        rows, n = y.shape
        for i in range(rows):
            if y[i, 0] != y[i, 0]:  # a NaN row of the output: a NaN gradient row
                for j in range(n):
                    out[i, j] = math.nan
                continue
            s = 0.0
            k = 0.0
            for j in range(n):
                on = y[i, j] > 0.0
                s += g[i, j] if on else 0.0
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


def _pool(workers: int) -> ThreadPoolExecutor:
    """A thread pool of this process (a forked child makes its own: threads do not survive)."""
    key = (os.getpid(), workers)
    with _lock:
        if _state.get("pool_key") != key:
            _state["pool"] = ThreadPoolExecutor(workers, thread_name_prefix="sae-kernel")
            _state["pool_key"] = key
        return _state["pool"]


def _run(fn, arrays: list) -> None:
    """fn(*row-chunks of arrays) over row chunks, one per thread, the last on this thread."""
    rows, n = arrays[0].shape
    parts = min(torch.get_num_threads(), rows, max(rows * n // _MIN_SPLIT, 1))
    if parts <= 1:
        fn(*arrays)
        return
    bounds = [rows * p // parts for p in range(parts + 1)]
    chunks = [[a[lo:hi] for a in arrays] for lo, hi in zip(bounds, bounds[1:], strict=False)]
    futures = [_pool(parts - 1).submit(fn, *c) for c in chunks[:-1]]
    fn(*chunks[-1])
    for f in futures:
        f.result()


def sparsemax_forward(x: Tensor) -> Tensor:
    """Sparsemax of the rows of a contiguous CPU float [rows, n] tensor (see the module doc)."""
    forward, _ = _kernels()
    out = torch.empty_like(x)
    _run(forward, [x.detach().numpy(), out.numpy()])
    return out


def sparsemax_backward(y: Tensor, g: Tensor) -> Tensor:
    """Input gradient of sparsemax rows from the output y and the output gradient g."""
    _, backward = _kernels()
    out = torch.empty_like(y)
    _run(backward, [y.detach().numpy(), g.detach().contiguous().numpy(), out.numpy()])
    return out
