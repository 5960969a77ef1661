r"""Compiled CPU kernels (numba): sparsemax on rows, used by :mod:`sae.activations`, and top-k
selection, used by :mod:`sae.activations.thresholds`.

On a CPU, the tensor-op algorithm of ``sae.activations`` costs a few dozen small passes per
call, each paying PyTorch's per-op overhead; for rows of up to a few thousand entries that
overhead, not arithmetic, sets its speed. These kernels do the same exact computation row by
row in compiled loops, with each row in cache:

- **sparsemax forward**: the row max by ``torch.amax`` (which also exposes NaN rows), then
  Michelot's (1986) fixed point
  :math:`\tau \leftarrow (\sum_{x_j > \tau} x_j - 1) / |\{j : x_j > \tau\}|`
  from the bound :math:`\tau \ge \max x - 1`, each iteration one vectorised pass over the row
  in cache, until the support stops changing (exact: :math:`\tau` is then the threshold of its own
  support; 4-8 passes on random rows), and one pass for :math:`[x - \tau]_+`. The first pass
  also shifts the row to max 0 (``x - max``, in the input's precision) into the output row, which
  the later passes read; sums are in float64.
- **sparsemax backward**: :math:`g - \operatorname{mean}_S(g)` on the support :math:`S`, 0
  elsewhere.
- **top-k** (``topk_relu``): ReLU of the k largest entries of each row, by selection rather
  than sorting (see the function).

Non-finite rows of sparsemax follow ``torch.softmax`` as the tensor-op path does: a NaN or
``+inf`` entry, or no finite entry, gives a NaN row (and a NaN gradient row); ``-inf`` entries
get 0. The kernels find those rows themselves (from the bits of the row max, or of the
output's first entry) and report how many they skipped, so that the usual all-finite call costs
one torch op (the max) besides the kernel: at the SAE's size (256 x 512) each small torch op
around the kernel costs a noticeable share of the call.

The sparsemax kernels split their rows over as many threads as PyTorch uses
(``torch.get_num_threads()``; one for fewer than PARALLEL_MIN entries), on PyTorch's own OpenMP
workers: numba's "omp" threading layer binds to the OpenMP runtime already loaded, PyTorch's.
Threads of our own (Python threads, or numba's tbb/workqueue pools) were slower, because
PyTorch's workers keep spinning on the other cores for a while after each torch op; under any
layer but "omp" the kernels therefore run on the calling thread. On one thread a kernel starts
at a handicap of the thread count against ``torch.softmax``, which splits its rows likewise.
Forward+backward against ``torch.softmax`` (256 float32 rows, 2 threads, 2 shared cores under
load ~6; 10th percentiles of alternating calls) at d = 256 / 512 / 1024 / 4096: 2.5 / 2.4 / 2.6
times on one thread (4096 not measurable under that load), 2.3 / 2.0 / 1.8 / 1.5 on two. At
d = 512 (~180 us on two threads) the two kernel calls with their torch.amax and allocations take
~105 us, an autograd Function's own overhead ~25 us, and ~45 us is unaccounted for between
them. The kernels' floor is passes per row: the max, Michelot's ~4 (measured on such rows), and
the output forward, two backward, where softmax needs three and two.
The kernels are compiled on first use and cached on disk. Without numba, :func:`available` and
:func:`compiled` are false and the callers use their tensor-op paths, which are also the paths
on CUDA, under ``torch.compile`` and for 1.5-/alpha-entmax: those spend their time in
vectorised arithmetic (the power function, many entries per row on the support), which
scalar compiled loops did not beat.
"""

from __future__ import annotations

import math
import os
import threading

import numpy as np
import torch
from torch import Tensor

MAX_WIDTH = 4096  # longer rows: the tensor-op path (block gathering) is as fast or faster
PARALLEL_MIN = 8192  # fewer entries: the kernels run on one thread (a launch costs more)
_ENABLED = os.environ.get("SAE_NO_KERNELS", "") in ("", "0")

_lock = threading.Lock()
_state: dict = {}  # the numba kernels, or None if numba is missing


def _compile():
    """The kernels, compiled (on first use; cached on disk), or None without numba."""
    try:
        import numba  # optional, and slow to import: only where a kernel is first used
    except ImportError:
        return None
    # "nnan" lets LLVM vectorise the masked sums (many times faster); NaN rows are skipped on
    # integer tests of their bits (torch.amax propagates NaN to the row max), and -inf entries
    # are fine: nnan does not assume finite values.
    fast = {"nogil": True, "cache": True,
            "fastmath": {"reassoc", "contract", "nsz", "arcp", "nnan"}}
    exact = {"nogil": True, "cache": True}  # no fastmath: these test for NaN and infinities
    kth_largest = _kth_largest_kernel(numba, exact, _select_kernel(numba, exact))
    return {"forward": _forward_kernel(numba, fast), "backward": _backward_kernel(numba, fast),
            "topk_relu": _topk_relu_kernel(numba, exact, kth_largest),
            "parallel": _parallel_kernels(numba, fast), "numba": numba}


def _parallel_kernels(numba, fast):
    """(forward, backward, the process id) with their rows split over threads, or None where
    those threads would not be PyTorch's own.

    numba's "omp" threading layer calls the OpenMP runtime already loaded, PyTorch's, so the
    kernels run on PyTorch's worker threads, which take them between torch ops without a
    second pool competing for the cores (a pool of our own was slower: PyTorch's workers keep
    spinning for a while after each op). Any other layer (tbb, workqueue) has its own pool.
    """
    if "OpenMP" not in torch.__config__.parallel_info():
        return None
    par = dict(fast, parallel=True, _name="parallel")
    forward, backward = _forward_kernel(numba, par), _backward_kernel(numba, par)
    threads = torch.get_num_threads()
    try:  # the first parallel call starts the layer, which resets OpenMP's thread count
        forward(np.zeros((1, 1), np.float32), np.zeros(1, np.float32), np.zeros(1, np.int32),
                np.int32(0x7F800000), np.zeros((1, 1), np.float32))
        layer = numba.threading_layer()
    except Exception:  # noqa: BLE001 - no threading layer at all: the serial kernels
        layer = None
    finally:
        torch.set_num_threads(threads)
    # numba's layer kills a forked child that starts a parallel loop (GNU OpenMP is not
    # fork-safe): children of this process run the kernels on their calling thread
    return (forward, backward, os.getpid()) if layer == "omp" else None


def _forward_kernel(numba, opts):
    """Sparsemax of each row of ``x`` into ``out``; the number of rows skipped as bad."""

    def forward(x, m, m_bits, exp_mask, out):  # pragma: no cover - compiled
        rows, n = x.shape
        bad = 0
        for i in numba.prange(rows):  # range unless compiled with parallel=True
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
            t_prev = -1.0  # where k_prev was counted
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
                if k > k_prev:  # rounding (an entry at the threshold): the previous t, as
                    t = t_prev  # the tensor-op path does
                    break
                k_prev = k
                t_prev = t
                t = (s - 1.0) / k
            for j in range(n):
                d = np.float64(c[j]) - t
                c[j] = d if d > 0.0 else 0.0
        return bad

    return _jit(numba, opts, forward)


def _backward_kernel(numba, opts):
    """Sparsemax's backward pass of each row; the number of rows skipped as bad."""

    def backward(y, y_bits, exp_mask, g, out):  # pragma: no cover - compiled
        rows, n = y.shape
        bad = 0
        for i in numba.prange(rows):
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

    return _jit(numba, opts, backward)


def _jit(numba, opts: dict, fn):
    """fn compiled with opts; a variant (opts["_name"]: parallel) gets a name of its own, as
    numba's disk cache tells functions apart by name and code, not by their options."""
    opts = dict(opts)
    variant = opts.pop("_name", None)
    if variant:
        fn.__qualname__ += "_" + variant
    return numba.njit(**opts)(fn)


def _select_kernel(numba, opts):
    """The value of a given rank of a buffer, by selection (it reorders the buffer)."""

    @numba.njit(**opts)
    def select(buf, n, target):  # pragma: no cover - compiled
        # the value of rank `target` (ascending) of buf[:n], which it reorders (Hoare's find,
        # median-of-three pivots; equal values split evenly, so ties cost no extra passes)
        lo, hi = 0, n - 1
        while lo < hi:
            a, b, c = buf[lo], buf[(lo + hi) >> 1], buf[hi]
            pivot = max(min(a, b), min(max(a, b), c))
            i, j = lo, hi
            while i <= j:
                while buf[i] < pivot:
                    i += 1
                while pivot < buf[j]:
                    j -= 1
                if i <= j:
                    buf[i], buf[j] = buf[j], buf[i]
                    i += 1
                    j -= 1
            if j < target:
                lo = i
            if target < i:
                hi = j
        return buf[target]

    return select


def _kth_largest_kernel(numba, opts, select):
    """The k-th largest entry of a row, selecting from few candidates."""

    @numba.njit(**opts)
    def kth_largest(x, k, buf):  # pragma: no cover - compiled
        # (the k-th largest entry of the 1-d x, the number of candidates) or (NaN, -1) if x
        # holds a NaN. The minimum of the maxima of k groups bounds it from below (they are k
        # entries), so only the entries at or above that bound, gathered into buf, are selected
        # from: one pass for the group maxima, one to gather, then a selection on few entries.
        n = len(x)
        size = n // k
        bound = math.inf
        nan = False
        for b in range(k):
            top = -math.inf
            end = n if b == k - 1 else (b + 1) * size
            for j in range(b * size, end):
                v = x[j]
                nan |= v != v
                top = max(top, v)
            bound = min(bound, top)
        if nan:
            return math.nan, -1
        count = 0
        for j in range(n):
            if x[j] >= bound:
                buf[count] = x[j]
                count += 1
        return select(buf, count, count - k), count

    return kth_largest


def _topk_relu_kernel(numba, opts, kth_largest):
    """ReLU of the k largest entries of each row (ties: the first ones)."""

    @numba.njit(**opts)
    def topk_relu(x, k, buf, out, smallest):  # pragma: no cover - compiled
        rows, n = x.shape
        for i in range(rows):
            row = x[i]
            kth, count = kth_largest(row, k, buf)
            if count < 0:
                return 1  # a NaN: the caller takes torch.topk's path
            above = 0
            for j in range(count):  # every entry above the k-th is a candidate
                above += 1 if buf[j] > kth else 0
            ties = k - above  # entries equal to the k-th value to keep: the first ones
            low = math.inf
            for j in range(n):
                v = row[j]
                keep = v > kth
                if v == kth and ties > 0:
                    keep = True
                    ties -= 1
                if keep and v > 0:
                    out[i, j] = v
                    low = min(low, v)
                else:
                    out[i, j] = 0.0
            smallest[i] = low if low < math.inf else 0.0
        return 0

    return topk_relu


def _kernels():
    if "kernels" not in _state:
        with _lock:
            if "kernels" not in _state:
                _state["kernels"] = _compile()
    return _state["kernels"]


def compiled(x: Tensor) -> bool:
    """Whether the kernels can take this tensor at all: CPU, float32/float64, numba installed,
    and not switched off by the environment variable ``SAE_NO_KERNELS=1``."""
    return (_ENABLED and x.device.type == "cpu" and x.dtype in (torch.float32, torch.float64)
            and _kernels() is not None)


def available(x: Tensor) -> bool:
    """Whether the map kernels handle these rows: ``compiled(x)`` and at most MAX_WIDTH wide."""
    return 0 < x.shape[-1] <= MAX_WIDTH and compiled(x)


def _bits(x: Tensor) -> tuple:
    """The bits of a float32/float64 tensor as a numpy integer array, and its exponent mask."""
    if x.dtype == torch.float32:
        return x.view(torch.int32).numpy(), np.int32(0x7F800000)
    return x.view(torch.int64).numpy(), np.int64(0x7FF0000000000000)


def _rows_kernel(x: Tensor, which: int):
    """The forward (0) or backward (1) kernel for the rows of x: on as many threads as PyTorch
    uses (when the rows are many enough to share), else on the calling one."""
    k = _kernels()
    threads = torch.get_num_threads()
    par = k["parallel"]
    if (par is None or threads < 2 or x.shape[0] < 2 or x.numel() < PARALLEL_MIN
            or par[2] != os.getpid()):
        return k["backward" if which else "forward"]
    k["numba"].set_num_threads(min(threads, k["numba"].config.NUMBA_NUM_THREADS))
    return par[which]


def sparsemax_forward(x: Tensor) -> Tensor:
    """Sparsemax of the rows of a contiguous CPU float [rows, n] tensor (see the module doc)."""
    forward = _rows_kernel(x, 0)
    x = x.detach()
    m = x.amax(-1)  # NaN for a row with a NaN
    out = torch.empty_like(x)
    if forward(x.numpy(), m.numpy(), *_bits(m), out.numpy()):
        out.masked_fill_(~torch.isfinite(m)[:, None], math.nan)  # the rows the kernel skipped
    return out


def sparsemax_backward(y: Tensor, g: Tensor) -> Tensor:
    """Input gradient of sparsemax rows from the output y and the output gradient g."""
    backward = _rows_kernel(y, 1)
    y = y.detach()
    out = torch.empty_like(y)
    if backward(y.numpy(), *_bits(y), g.detach().contiguous().numpy(), out.numpy()):
        out.masked_fill_(y[:, :1].isnan(), math.nan)  # NaN output rows: NaN gradients
    return out


def topk_relu(x: Tensor, k: int) -> tuple[Tensor, Tensor] | None:
    """Per row of a CPU float [rows, n] tensor (1 <= k <= n): ReLU of its k largest entries,
    zeros elsewhere, and the smallest positive value kept ([rows]; 0 where none is positive).

    The k-th largest value is found by selection, not by sorting: the entries at or above the
    smallest of the maxima of k groups of the row (k entries, so a lower bound) are gathered and
    Hoare's find runs on those. Ties at it are broken by position (the first ones are kept), so
    exactly k entries are kept. Returns None when a row holds a NaN: ``torch.topk`` orders NaN above
    every number, and callers take its path then.
    """
    x = x.detach().contiguous()
    rows, n = x.shape
    out = torch.empty_like(x)
    smallest = torch.empty(rows, dtype=x.dtype)
    buf = np.empty(n, dtype=x.numpy().dtype)  # the candidates of one row
    if _kernels()["topk_relu"](x.numpy(), k, buf, out.numpy(), smallest.numpy()):
        return None
    return out, smallest
