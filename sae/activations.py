r"""Sparse probability maps: sparsemax, 1.5-entmax and alpha-entmax.

All three solve, for every row :math:`x \in \mathbb{R}^d`,

.. math::
    p^\star = \operatorname*{argmax}_{p \in \Delta^d}\; \langle p, x\rangle + H^T_\alpha(p),
    \qquad H^T_\alpha(p) = \frac{1}{\alpha(\alpha-1)} \sum_j (p_j - p_j^\alpha),

whose solution is :math:`p^\star_j = [(\alpha-1)(x_j - t)]_+^{1/(\alpha-1)}` with the
threshold :math:`t` fixed by :math:`\sum_j p^\star_j = 1` (Peters, Niculae & Martins, 2019).
:math:`\alpha = 2` is sparsemax, the Euclidean projection onto the simplex (Martins &
Astudillo, 2016); :math:`\alpha \to 1` tends to softmax. Entries below the threshold get
exact zeros.

Each map comes as a function and an ``nn.Module``, works along any ``dim`` (negative ones
included), on any shape, on CPU and CUDA, and can be applied independently to ``groups`` equal
slices ("heads") of ``dim``. float64 and float32 are computed in their own precision; float16 and
bfloat16 are computed in float32 and returned in the input dtype.

**Non-finite input** follows ``torch.softmax``: a row (one group of one slice along ``dim``)
that holds a NaN or a ``+inf``, or whose entries are all ``-inf``, gives a NaN row and a NaN
input gradient for that row; ``-inf`` entries of an otherwise finite row get exactly 0 (and zero
gradient) while the other entries get the map of the finite ones. Nothing raises on data values.
Bad rows are left out of the computation, so the other rows and their gradients are exactly
(bitwise) what they would be without them. Empty tensors pass through.

**Algorithm.** The threshold is found without sorting the rows (sorting is slow on CPU):

1. *A lower bound from a subset.* Any subset of a row's entries has a threshold no larger than
   the row's, and the maxima of a partition of the row are such a subset. Rows are reduced to the
   maxima of 16 interleaved subsets, whose threshold the sort-based formula gives exactly and
   cheaply; rows of 1024 entries or more, to the maxima of blocks of 32, solved the same way,
   recursively. Rows of at most 16 entries are solved by the sort-based formula directly.
2. *Few candidates.* Only blocks whose maximum exceeds the bound can hold support entries. In
   long rows, when these are at most half of the blocks, they are gathered into a small matrix
   and everything else runs on it: the block maxima are then the only full pass over the input,
   and the output and the input gradient are a zero fill plus a scatter of those blocks.
3. *Exact threshold.* From the bound, Newton's method on :math:`f(t) = \sum_j p_j(t) - 1`, which
   is convex and decreasing for :math:`1 < \alpha \le 2`, so the iterates rise monotonically.
   For sparsemax the Newton step is Michelot's (1986)
   :math:`t \leftarrow (\sum_{x_j > t} x_j - 1) / |\{j : x_j > t\}|`; it stops, exact, when the
   support no longer changes, which the first pass usually shows (the row then has as many
   entries above the bound as the subset's support). For 1.5-entmax each pass also tries the
   closed form on the current support :math:`S`,
   :math:`t = \mu_S - \sqrt{4/|S| - \sigma_S^2}`, and keeps it when no entry of :math:`S` lies
   below it: the KKT conditions then hold, so it is exact. The support therefore equals that of
   the sort-based formula. For other :math:`\alpha` (no closed form) the Newton steps, safeguarded
   by bisection where :math:`f` is not convex (:math:`\alpha > 2`), stop at rounding level and the
   output is renormalised.

**Compiled CPU kernels.** On CPU, sparsemax of float32/float64 rows of up to
``sae.kernels.MAX_WIDTH`` entries runs in compiled loops instead (:mod:`sae.kernels`, numba):
the same exact threshold (Michelot's fixed point on the entries above max − 1), without the
per-op overhead that dominates the tensor-op path on such rows. ``SAE_NO_KERNELS=1`` switches
them off; the tests run every map on both paths.

**Fused GPU kernels.** On CUDA, sparsemax and 1.5-entmax of float32/bfloat16/float16 rows of up
to ``sae.triton_kernels.MAX_WIDTH`` entries run as one Triton kernel forward and one backward
(:mod:`sae.triton_kernels`): the same exact thresholds and non-finite conventions, without the
dozens of launches of the tensor-op path. ``SAE_NO_TRITON=1`` switches them off.

**torch.compile.** Each map is registered as an opaque operator (``torch.library.custom_op``,
with its backward), so compiled graphs call the same exact code and ``fullgraph=True`` holds.

The ``entmax`` package (Peters et al.) is the reference these are tested against. It is not
called: the code here is faster at every benchmarked size (``benchmarks/bench_activations.py``)
and handles the non-finite cases above.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from sae import kernels, triton_kernels

__all__ = [
    "softplus_inverse",
    "sparsemax",
    "entmax15",
    "entmax_alpha",
    "Sparsemax",
    "Entmax15",
    "EntmaxAlpha",
]

_ALPHA_MIN_GAP = 1e-3  # EntmaxAlpha keeps alpha >= 1 + this, whatever its parameter does
_SORT_MAX = 16  # rows this short: exact sort-based threshold (sorting longer rows is slow on CPU)
_GATHER_MIN = 1024  # rows at least this long gather their candidate blocks...
_GATHER_MAX_SHARE = 0.5  # ...when these are at most this share of the blocks
_RESTRICT_MIN = 1 << 17  # candidate matrices this large continue only their unfinished rows


# --------------------------------------------------------------------------- maps on rows
# Everything below works on a 2-D float tensor of rows, shifted so that every row's max is 0,
# with the threshold t in the same shifted coordinates. `alpha` is the python float 2.0
# (sparsemax), 1.5 (1.5-entmax) or a float tensor of shape [rows, 1] (any alpha > 1).
# Two CPU facts shape the code: comparisons, integer ops and sorting are several times slower
# than float arithmetic (so counts are sums of sign() of non-negative values), and a
# reduction is fast only over contiguous runs of at least 32 entries.


def _width(alpha: float | Tensor) -> float | Tensor:
    """1/(alpha-1): the threshold of a max-0 row lies in [-width, 0)."""
    return 1.0 / (alpha - 1.0)


def _probs(c: Tensor, t: Tensor, alpha: float | Tensor, out: Tensor | None = None) -> Tensor:
    """p = [(alpha-1)(c - t)]_+^(1/(alpha-1)), written into `out` (default: a new tensor)."""
    p = torch.sub(c, t, out=out) if out is not None else c - t
    p.relu_()
    if isinstance(alpha, Tensor):
        p.mul_(alpha - 1).pow_(1.0 / (alpha - 1))
    elif alpha == 1.5:
        p.mul_(0.5).square_()
    return p


def _sorted_threshold(z: Tensor, alpha: float, size: bool = True):
    """Exact threshold and (if `size`) support size of short rows by the sort-based formula
    (sparsemax, 1.5-entmax)."""
    n = z.shape[-1]
    rho = torch.arange(1, n + 1, dtype=z.dtype, device=z.device)
    if alpha == 2.0:
        # tau_k = (sum of the k largest - 1) / k rises while z_(k+1) > tau_k, then falls; the
        # first maximiser is the support size (-inf entries give tau_k = -inf: harmless).
        tau = z.sort(-1, descending=True).values.cumsum(-1).sub_(1).div_(rho)
        if not size:
            return tau.amax(-1, keepdim=True), None
        t, k = tau.max(-1, keepdim=True)
        return t, (k + 1).to(z.dtype)
    # 1.5-entmax on u = z/2 (Peters, Niculae & Martins, 2019, Algorithm 2). Entries below -4
    # never reach the support; clamping keeps -inf out of the sums.
    u = z.clamp_min(-4.0).sort(-1, descending=True).values.mul_(0.5)
    mean = u.cumsum(-1).div_(rho)
    var = (u * u).cumsum(-1).div_(rho).sub_(mean * mean)
    tau = mean.sub_(var.neg_().add_(1 / rho).clamp_min_(0).sqrt_())
    k = (tau <= u).sum(-1, keepdim=True)
    return 2 * tau.gather(-1, k - 1), k.to(z.dtype)


def _subset_maxima(z: Tensor) -> Tensor | None:
    """Maxima of the 16 interleaved subsets {j, j+16, j+32, ...} of each row (None if the
    length is not a multiple of 16), reduced first over runs of 64 or 32 for speed."""
    rows, n = z.shape
    if n % 16:
        return None
    for run in (64, 32):
        if n % run == 0:
            return z.view(rows, -1, run).amax(1).view(rows, -1, 16).amax(1)
    return z.view(rows, -1, 16).amax(1)


def _count(r: Tensor, out: Tensor) -> Tensor:
    """Number of positive entries per row of a non-negative r."""
    return torch.sign(r, out=out).sum(-1, keepdim=True)


def _finished(k: Tensor, k_sub: Tensor, total: Tensor) -> Tensor:
    """Rows where a subset's exact threshold t is exact for the full row: the full row has as
    many entries above t as the subset's support (which it contains), so both supports agree.
    `total`, the sum of the map at t, guards against a count that matches only because rounding
    moved an entry across t."""
    return (k == k_sub) & ((total - 1).abs() <= 8 * torch.finfo(total.dtype).eps * (k + 1))


def _michelot(c: Tensor, t: Tensor, k_prev: Tensor | None) -> tuple[Tensor, Tensor, Tensor]:
    """Exact sparsemax threshold of the rows of c from a lower bound t (Michelot, 1986).

    Each pass sets t to (sum of the entries above t - 1) / (their number); the support shrinks
    until it stops changing, and then t is exact. k_prev: the support size of the previous
    pass, if known. Returns (threshold, the sparsemax of c, support size): the pass that shows
    the support unchanged has already computed the output.
    """
    r = torch.empty_like(c)
    s = torch.empty_like(c)
    for _ in range(c.shape[-1] + 1):  # at most n + 1 passes
        torch.sub(c, t, out=r).relu_()
        k = _count(r, s)
        if k_prev is not None and torch.equal(k, k_prev):
            break
        k_prev = k
        t = torch.addcdiv(t, r.sum(-1, keepdim=True).sub_(1), k)
    else:  # out of passes (only if rounding made the support cycle): the map at the last t
        torch.sub(c, t, out=r).relu_()
    return t, r, k


def _entmax15_exact(c: Tensor, t: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Exact 1.5-entmax threshold of the rows of c from a lower bound t.

    Every pass takes the closed form on the current support S = {c > t}, the smaller root of
    sum_S (c - t')^2 = 4, and accepts it when it lies above t and below every entry of S: the
    KKT conditions then hold, so it is exact. Otherwise a Newton step on
    f(t) = sum((c - t)_+^2) / 4 - 1, which rises monotonically to the root, gives the next t.
    Returns (threshold, map, support size).
    """
    eps = torch.finfo(c.dtype).eps
    s = torch.empty_like(c)
    q = torch.empty_like(c)
    for _ in range(100):
        torch.sub(c, t, out=s).relu_()
        k = torch.sign(s, out=q).sum(-1, keepdim=True)
        # min over S of c - t: entries off S are lifted by 8 (> any c - t, as t >= -2)
        lowest = torch.add(s, q.neg_().add_(1), alpha=8).amin(-1, keepdim=True)
        s1 = s.sum(-1, keepdim=True)
        s2 = torch.mul(s, s, out=q).sum(-1, keepdim=True)
        step = (s1 - (s1 * s1 - k * (s2 - 4)).clamp_min_(0).sqrt_()) / k
        tol = 4 * eps * (1 - t)
        if bool(((step >= -tol) & (lowest >= step - tol)).all()):
            t = t + step
            break
        t = t + (s2 - 4) / (2 * s1)
    return t, _probs(c, t, 1.5, out=s), k


def _newton_alpha(c: Tensor, t: Tensor, alpha: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Threshold of the rows of c for a per-row alpha, from a lower bound t.

    For alpha <= 2 the steps are Newton's on F(t) = (sum p)^(alpha-1) - 1, the
    (1/(alpha-1))-norm of (alpha-1)(c - t)_+ minus 1: a norm of convex functions of t, so
    convex, and the steps rise monotonically to the root; and nearly linear (exactly so on a
    fixed support of equal entries), so they take fewer steps than Newton's on sum(p) - 1. For
    alpha > 2 neither is convex, so those rows take Newton steps on f(t) = sum(p) - 1 within a
    bracket and bisect whenever a step leaves it or the bracket has not halved in two steps.
    Stops when every step is at rounding level. Returns the threshold, the (unnormalised) map
    at the last iterate, which is within rounding of it, and a lower bound of the threshold.
    """
    n = c.shape[-1]
    am1 = alpha - 1
    e = 1.0 / am1
    eps = torch.finfo(c.dtype).eps
    tiny = torch.finfo(c.dtype).tiny
    guarded = alpha > 2
    guard = bool(guarded.any())
    lo, hi = t, -((1.0 / n) ** am1) * e  # p_max >= 1/n bounds t from above
    widths = [hi - lo, hi - lo]
    w = torch.empty_like(c)
    for _ in range(200):
        torch.sub(c, t, out=w).relu_().mul_(am1)
        p = w.pow(e)
        total = p.sum(-1, keepdim=True)
        f = total - 1
        fp = torch.div(p, w.clamp_min_(tiny), out=w).sum(-1, keepdim=True)  # -f' = sum p/w
        t_new = t + _norm_step(total, fp, am1, guarded if guard else None)
        done = (t_new - t).abs() <= 8 * eps * t.abs()
        if guard:
            lo = torch.where(f >= 0, t, lo)
            hi = torch.where(f < 0, t, hi)
            width = hi - lo
            bisect = guarded & ((t_new <= lo) | (t_new >= hi) | (width > widths[0] / 2))
            t_new = torch.where(bisect, (lo + hi) / 2, t_new)
            widths = [widths[1], width]
            done = torch.where(guarded, width <= 8 * eps * t.abs(), done)
        t = t_new
        if bool(done.all()):
            break
    return t, p, (torch.where(guarded, lo, t) if guard else t)


def _norm_step(total: Tensor, fp: Tensor, am1: Tensor, guarded: Tensor | None) -> Tensor:
    """Newton's step on F(t) = (sum p)^(alpha-1) - 1 from sum p (`total`) and -d(sum p)/dt
    (`fp`); on f(t) = sum p - 1 for the `guarded` rows (alpha > 2; None: no such row)."""
    norm = total.pow(am1)
    step = (norm - 1) * total / (am1 * norm * fp)
    return step if guarded is None else torch.where(guarded, (total - 1) / fp, step)


def _alpha_bound(z: Tensor, alpha: Tensor, steps: int = 3) -> Tensor:
    """A lower bound of the alpha-entmax threshold of the rows of z: a few Newton steps on F
    (`_newton_alpha`) from -width, without synchronising. Each step stays below the root where
    F is convex (alpha <= 2); rows with alpha > 2 keep -width."""
    am1 = alpha - 1
    t = torch.full_like(z[:, :1], -1.0) / am1
    for _ in range(steps):
        w = (z - t).relu_().mul_(am1)
        p = w.pow(1 / am1)
        total = p.sum(-1, keepdim=True)
        t = t + _norm_step(total, p.div_(w.clamp_min_(1e-30)).sum(-1, keepdim=True), am1, None)
    return torch.where(alpha > 2, -1.0 / am1, t)


def _sparsemax_exact(c: Tensor, t: Tensor, k_sub: Tensor | None):
    """Exact sparsemax threshold, map and support size of the rows of c from a lower bound t;
    k_sub: if t is the exact threshold of a subset of each row's entries, that subset's support
    size.

    The first pass, over all rows, usually proves t exact (`_finished`). Otherwise Michelot's
    passes continue; on large candidate matrices only for the unfinished rows, so that a few
    slow rows do not make every row pay for more passes.
    """
    if k_sub is None:
        return _michelot(c, t, None)
    p = _probs(c, t, 2.0)
    k = _count(p, torch.empty_like(p))
    total = p.sum(-1, keepdim=True)
    if torch.equal(k, k_sub) and bool(_finished(k, k_sub, total).all()):
        return t, p, k
    t = t + (total - 1) / k  # Michelot's step from this pass
    if c.numel() < _RESTRICT_MIN:
        return _michelot(c, t, k)
    left = (~_finished(k, k_sub, total)).reshape(-1).nonzero().reshape(-1)
    if 2 * left.numel() > c.shape[0]:
        return _michelot(c, t, k)
    t_l, p_l, k_l = _michelot(c.index_select(0, left), t.index_select(0, left), k[left])
    return t.index_copy(0, left, t_l), p.index_copy_(0, left, p_l), k.index_copy(0, left, k_l)


def _gather_block(n: int) -> int:
    """Length of the contiguous blocks whose candidates long rows gather (0: do not gather).
    At least 32 blocks of at least 32 entries: fewer blocks rarely leave few candidates, and
    shorter blocks make the block maxima slow."""
    if n < _GATHER_MIN:
        return 0
    return 32 if n % 32 == 0 else 0


def _partial_maxima(x: Tensor) -> Tensor | None:
    """The maxima that bound the threshold: of contiguous blocks for rows that gather, else of
    16 interleaved subsets (None for short rows or lengths that are not multiples of 16)."""
    rows, n = x.shape
    b = _gather_block(n)
    if b:
        return x.view(rows, -1, b).amax(-1)
    return _subset_maxima(x) if n > _SORT_MAX else None


def _solve(x: Tensor, alpha: float | Tensor, m: Tensor | None, part: Tensor | None):
    """Threshold and map of the rows of x - m (m None: x is already shifted to max 0); part:
    `_partial_maxima(x)`.

    Returns (t, lo, p, k, flat): the threshold, a lower bound of it, the map of the candidates,
    the support size (None for a tensor alpha), and flat, the indices of the gathered
    candidate blocks that p stands for (None: p covers the whole rows).
    """
    rows, n = x.shape
    tensor_alpha = isinstance(alpha, Tensor)
    width = _width(alpha)
    if n <= _SORT_MAX and not tensor_alpha:
        c = x if m is None else x - m
        t, k = _sorted_threshold(c, alpha, size=m is None)  # the top level needs no size
        return t, t, _probs(c, t, alpha, out=c if c is not x else None), k, None
    b = _gather_block(n)
    flat = k_sub = None
    if part is None:
        lo = torch.full_like(x[:, :1], -1.0) * width
    else:
        # The threshold of any subset of a row's entries (here: of partial maxima) is a lower
        # bound of the row's, and often equal to it.
        bz = part if m is None else part - m
        if b:
            _, lo, _, k_sub, _ = _solve(bz, alpha, None, _partial_maxima(bz))
            flat = _select_blocks(bz, lo)
        elif tensor_alpha:
            lo = _alpha_bound(bz, alpha)
        else:
            lo, k_sub = _sorted_threshold(bz, alpha)
    if flat is not None:
        # Only blocks whose max exceeds the bound can hold support entries: solve on those.
        c = x.view(-1, b).index_select(0, flat).view(rows, -1)
        if m is not None:
            c.sub_(m)
    else:
        c = x if m is None else x - m
    if tensor_alpha:
        t, p, lo = _newton_alpha(c, lo, alpha)
        return t, lo, p, None, flat
    if alpha == 2.0:
        t, p, k = _sparsemax_exact(c, lo, k_sub)
    else:
        t, p, k = _entmax15_exact(c, lo)
    return t, t, p, k, flat


def _select_blocks(bz: Tensor, lo: Tensor) -> Tensor | None:
    """Flat indices (into [rows * nb] blocks) of each row's candidate blocks (block max > lo),
    padded to the largest count with that row's other blocks, all distinct; None when the
    candidates are too large a share to be worth gathering.
    """
    rows, nb = bz.shape
    cand = (bz - lo).relu_().sign_()
    cnt = cand.sum(-1, keepdim=True)
    k = int(cnt.max())
    if k > _GATHER_MAX_SHARE * nb:
        return None
    # A stable partition, candidates first, from running counts (sort and topk are slow on
    # CPU): candidate j goes to cs_j - 1, any other block to cnt + j - cs_j.
    cs = cand.cumsum(-1)
    j = torch.arange(nb, dtype=bz.dtype, device=bz.device)
    other = cnt + j - cs
    pos = other.addcmul_(cand, cs - 1 - other).long()
    idx = torch.empty_like(pos).scatter_(1, pos, torch.arange(nb, device=bz.device).expand_as(pos))
    return (idx[:, :k] + torch.arange(0, rows * nb, nb, device=bz.device)[:, None]).reshape(-1)


# --------------------------------------------------------------------------- autograd
def _support_weights(y: Tensor, alpha: Tensor) -> Tensor:
    """s = y^(2-alpha) on the support, 0 elsewhere (a tensor alpha)."""
    return torch.where(y > 0, y.pow(2 - alpha), 0.0)


def _grad_x(y: Tensor, g: Tensor, alpha: float | Tensor, s: Tensor | None = None) -> Tensor:
    r"""Vector-Jacobian product on rows: with s = y^(2-alpha) on the support and 0 elsewhere,
    dx = s * g - s * <s, g> / sum(s); for sparsemax s is the support indicator, so
    dx = g - mean_S(g) on S and 0 elsewhere. s may be given (a tensor alpha)."""
    if not isinstance(alpha, Tensor) and triton_kernels.available(y):  # CUDA rows: fused
        return triton_kernels.backward(y, g, alpha)
    if s is None and isinstance(alpha, Tensor):
        s = _support_weights(y, alpha)
    elif s is None:
        s = y.sign() if alpha == 2.0 else y.sqrt()
    sg = s * g
    q = sg.sum(-1, keepdim=True).div_(s.sum(-1, keepdim=True))
    return sg.addcmul_(s, q, value=-1)


def _grad_alpha(y: Tensor, g: Tensor, alpha: Tensor, s: Tensor | None = None) -> Tensor:
    r"""d<g, y>/d alpha per row (Correia, Niculae & Martins, 2019):
    with s = y^(2-alpha), s~ = s / sum(s), h_j = y_j log y_j and H = sum(h),
    sum_j g_j [(y_j - s~_j)/(alpha-1)^2 - (h_j - s~_j H)/(alpha-1)]. s may be given."""
    pos = y > 0
    s = _support_weights(y, alpha) if s is None else s
    s = s / s.sum(-1, keepdim=True)
    h = torch.where(pos, y * torch.log(torch.where(pos, y, 1.0)), 0.0)
    ent = h.sum(-1, keepdim=True)
    am1 = alpha - 1
    return (g * ((y - s) / am1**2 - (h - s * ent) / am1)).sum(-1, keepdim=True)


def _scatter_blocks(vals: Tensor, flat: Tensor, rows: int, n: int) -> Tensor:
    """A [rows, n] zero matrix with the gathered blocks `vals` written back at `flat`."""
    b = vals.numel() // flat.numel()
    out = vals.new_zeros(rows * n // b, b)
    return out.index_copy_(0, flat, vals.view(-1, b)).view(rows, n)


def _rows_forward(x: Tensor, alpha: float | Tensor):
    """The map of the rows of x: (output, (p, flat, good, alpha) for `_rows_backward`)."""
    rows, n = x.shape
    tensor_alpha = isinstance(alpha, Tensor)
    if not tensor_alpha and triton_kernels.available(x):  # CUDA rows: one fused kernel
        out = triton_kernels.forward(x, alpha)
        return out, (out, None, None, alpha)
    part = _partial_maxima(x)
    m = (x if part is None else part).amax(-1, keepdim=True)
    # softmax's conventions: a NaN, a +inf, or no finite entry makes the row NaN; so does an
    # alpha <= 1 or non-finite. One reduction tells whether any row is bad at all.
    probe = m.sum()
    if tensor_alpha:
        probe = probe + torch.log(alpha - 1).sum()
    good = None
    if not math.isfinite(probe.item()):
        bad = ~torch.isfinite(m)
        if tensor_alpha:
            bad |= ~(alpha > 1) | ~torch.isfinite(alpha)
        # The rows are solved together (shared passes and gathers): leave the bad ones out, so
        # that the others get exactly the result they would get without them.
        good = (~bad).reshape(-1).nonzero().reshape(-1)
        x, m = x.index_select(0, good), m.index_select(0, good)
        part = part.index_select(0, good) if part is not None else None
        alpha = alpha.index_select(0, good) if tensor_alpha else alpha
    if x.shape[0] == 0:  # no good row
        p, flat = x.clone(), None
    else:
        _, _, p, _, flat = _solve(x, alpha, m, part)
    if tensor_alpha:
        p = p / p.sum(-1, keepdim=True)
    out = p if flat is None else _scatter_blocks(p, flat, p.shape[0], n)
    if good is not None:
        out = out.new_full((rows, n), math.nan).index_copy_(0, good, out)
    return out, (p, flat, good, alpha)


def _rows_backward(g: Tensor, alpha: float | Tensor, y: Tensor, flat, good, need_alpha: bool):
    """(dx, dalpha or None) of the rows, from `_rows_forward`'s saved tensors."""
    rows, n = g.shape
    if good is not None:
        g = g.index_select(0, good)
    if flat is not None:  # only the gathered candidate blocks can carry gradient
        g = g.reshape(-1, y.numel() // flat.numel()).index_select(0, flat).view(y.shape[0], -1)
    s = _support_weights(y, alpha) if isinstance(alpha, Tensor) else None  # shared by both
    gx = _grad_x(y, g, alpha, s)
    ga = _grad_alpha(y, g, alpha, s) if need_alpha else None
    if flat is not None:
        gx = _scatter_blocks(gx, flat, y.shape[0], n)
    if good is not None:  # bad rows: NaN gradients, as softmax gives them
        gx = gx.new_full((rows, n), math.nan).index_copy_(0, good, gx)
        if ga is not None:
            ga = ga.new_full((rows, 1), math.nan).index_copy_(0, good, ga)
    return gx, ga


class _EntmaxFunction(torch.autograd.Function):
    """The map on [rows, n] float rows; alpha: 2.0, 1.5 or a [rows, 1] tensor."""

    @staticmethod
    def forward(ctx, x: Tensor, alpha: float | Tensor) -> Tensor:
        ctx.kernel = not isinstance(alpha, Tensor) and alpha == 2.0 and kernels.available(x)
        if ctx.kernel:  # compiled CPU rows (sae.kernels): same result, a fraction of the time
            out = kernels.sparsemax_forward(x.contiguous())
            ctx.save_for_backward(out)
            return out
        out, (p, flat, good, alpha) = _rows_forward(x, alpha)  # alpha of the good rows
        tensor_alpha = isinstance(alpha, Tensor)
        ctx.save_for_backward(p, flat, good, alpha if tensor_alpha else None)
        ctx.alpha = None if tensor_alpha else alpha
        return out

    @staticmethod
    def backward(ctx, g: Tensor):
        if ctx.kernel:
            (y,) = ctx.saved_tensors
            return kernels.sparsemax_backward(y, g), None
        y, flat, good, alpha_t = ctx.saved_tensors
        alpha = ctx.alpha if alpha_t is None else alpha_t
        gx, ga = _rows_backward(g, alpha, y, flat, good, ctx.needs_input_grad[1])
        return gx, ga


# torch.compile sees each map as one opaque operator (the data-dependent loops above cannot be
# traced), so that compiled graphs run the same exact code and fullgraph=True holds. The
# operator takes the input with `dim` moved last and reshapes it to rows itself: a reshape by
# groups in the traced graph compiles to slow code under dynamic shapes. Its backward
# recomputes from the full output (gathered blocks have data-dependent shapes). alpha is a
# tensor here: [..., 1] (one per slice), or 0-d for kind 2 (sparsemax) and 1 (1.5-entmax).
def _op_rows(x: Tensor, alpha: Tensor, kind: int, groups: int):
    rows = x.reshape(-1, x.shape[-1] // groups)
    if kind == 2 or kind == 1:
        return rows, 2.0 if kind == 2 else 1.5
    return rows, alpha.expand(*x.shape[:-1], groups).reshape(-1, 1)


# torch.library.custom_op needs torch >= 2.4; older versions compile with a graph break here.
_is_compiling = getattr(torch.compiler, "is_compiling", lambda: False)
_entmax_op = None
if hasattr(torch.library, "custom_op"):
    @torch.library.custom_op("sae::entmax", mutates_args=())
    def _entmax_op(x: Tensor, alpha: Tensor, kind: int, groups: int) -> Tensor:
        rows, a = _op_rows(x, alpha, kind, groups)
        return _rows_forward(rows, a)[0].view(x.shape)

    @_entmax_op.register_fake
    def _(x: Tensor, alpha: Tensor, kind: int, groups: int) -> Tensor:
        return torch.empty_like(x, memory_format=torch.contiguous_format)

    @torch.library.custom_op("sae::entmax_backward", mutates_args=())
    def _entmax_op_backward(
        y: Tensor, g: Tensor, alpha: Tensor, kind: int, groups: int
    ) -> tuple[Tensor, Tensor]:
        rows, a = _op_rows(y, alpha, kind, groups)
        g_rows = g.reshape(rows.shape)
        gx = _grad_x(rows, g_rows, a).view(y.shape)  # NaN rows of y give NaN rows, as in eager
        if kind != 0:
            return gx, torch.zeros_like(alpha)
        ga = _grad_alpha(rows, g_rows, a).view(*y.shape[:-1], groups).sum(-1, keepdim=True)
        return gx, ga

    @_entmax_op_backward.register_fake
    def _(y: Tensor, g: Tensor, alpha: Tensor, kind: int, groups: int) -> tuple[Tensor, Tensor]:
        return torch.empty_like(y), torch.empty_like(alpha)

    def _op_setup(ctx, inputs, output) -> None:
        ctx.save_for_backward(output, inputs[1])
        ctx.kind, ctx.groups = inputs[2], inputs[3]

    def _op_backward(ctx, g: Tensor):
        y, alpha = ctx.saved_tensors
        gx, ga = _entmax_op_backward(y, g, alpha, ctx.kind, ctx.groups)
        return gx, (ga if ctx.kind == 0 else None), None, None

    _entmax_op.register_autograd(_op_backward, setup_context=_op_setup)


# --------------------------------------------------------------------------- public API
def _entmax(x: Tensor, alpha: float | Tensor, dim: int, groups: int, name: str) -> Tensor:
    """Reshape to [rows, n] rows (n = size of dim / groups), apply, and reshape back."""
    if not x.is_floating_point():
        raise TypeError(f"{name}: expected a floating-point tensor, got {x.dtype}")
    if isinstance(groups, bool) or not isinstance(groups, int) or groups < 1:
        raise ValueError(f"{name}: groups must be a positive int, got {groups!r}")
    if x.dim() == 0:
        if dim not in (0, -1):
            raise IndexError(f"{name}: dim {dim} out of range for a 0-d tensor")
        return _entmax(x.reshape(1), alpha, 0, groups, name).reshape(())
    if not -x.dim() <= dim < x.dim():
        raise IndexError(f"{name}: dim {dim} out of range for a {x.dim()}-d tensor")
    size = x.shape[dim]
    if size % groups:
        raise ValueError(
            f"{name}: size {size} of dim {dim} is not divisible by groups={groups}"
        )
    if x.numel() == 0:
        return x.clone()
    tensor_alpha = isinstance(alpha, Tensor)
    fast = x.dim() == 2 and groups == 1 and dim in (-1, 1) and not tensor_alpha
    compiling = _is_compiling() and _entmax_op is not None
    if fast and not compiling and (
        x.dtype in (torch.float32, torch.float64) or triton_kernels.available(x)
    ):
        return _EntmaxFunction.apply(x, alpha)  # the common case: rows as they are
    work = torch.float32 if x.dtype in (torch.float16, torch.bfloat16) else x.dtype
    xm = x.movedim(dim, -1).to(work)
    if tensor_alpha:
        # One alpha per slice along dim, shared by its groups.
        shape = list(x.shape)
        shape[dim] = 1
        alpha = alpha.to(device=x.device, dtype=work).expand(shape).movedim(dim, -1)
    if compiling:
        kind = 0 if tensor_alpha else (2 if alpha == 2.0 else 1)
        a = alpha if tensor_alpha else xm.new_tensor(alpha)
        return _entmax_op(xm, a, kind, groups).movedim(-1, dim).to(x.dtype)
    rows = xm.reshape(-1, size // groups)  # a view in the common case
    if tensor_alpha:
        alpha = alpha.expand(*alpha.shape[:-1], groups).reshape(-1, 1)
    y = _EntmaxFunction.apply(rows, alpha)
    return y.view(xm.shape).movedim(-1, dim).to(x.dtype)


def sparsemax(x: Tensor, dim: int = -1, groups: int = 1) -> Tensor:
    r"""Sparsemax (Martins & Astudillo, 2016): the Euclidean projection onto the simplex.

    .. math::
        \operatorname{sparsemax}(x) = \operatorname*{argmin}_{p \in \Delta^d} \|p - x\|_2^2
        = [x - \tau]_+, \qquad \tau = \frac{\sum_{j \in S} x_j - 1}{|S|},
        \quad S = \{j : x_j > \tau\}.

    The threshold is exact (see the module docstring), so entries below it are exactly 0 and
    the support equals that of the sort-based formula. Backward: on the support,
    :math:`\partial L/\partial x = g - \operatorname{mean}_S(g)`, and 0 elsewhere.

    Args:
        x: input of any shape and floating dtype (float16/bfloat16 computed in float32).
        dim: the dimension to normalise over; negative values count from the end.
        groups: split ``dim`` into this many equal groups and normalise each independently
            (each group sums to 1); ``x.shape[dim]`` must be divisible by it.

    Returns:
        A tensor like ``x`` whose groups along ``dim`` lie on the simplex. Non-finite input
        follows ``torch.softmax`` (module docstring). Under ``torch.compile``,
        ``fullgraph=True`` holds.
    """
    return _entmax(x, 2.0, dim, groups, "sparsemax")


def entmax15(x: Tensor, dim: int = -1, groups: int = 1) -> Tensor:
    r"""1.5-entmax (Peters, Niculae & Martins, 2019): alpha-entmax with alpha = 1.5.

    .. math::
        \operatorname{entmax}_{1.5}(x) = [x/2 - \tau]_+^2, \qquad \sum_j [x_j/2 - \tau]_+^2 = 1,

    between softmax and sparsemax: sparse, but smoother than sparsemax. The threshold is exact
    (closed form on the support, found by Newton's method; module docstring). Backward: with
    :math:`s = \sqrt{p}`, :math:`\partial L/\partial x = s \odot g - s\,\langle s, g\rangle /
    \textstyle\sum_j s_j`.

    Args and returns as for :func:`sparsemax`.
    """
    return _entmax(x, 1.5, dim, groups, "entmax15")


def entmax_alpha(x: Tensor, alpha: float | Tensor, dim: int = -1, groups: int = 1) -> Tensor:
    r"""alpha-entmax (Peters, Niculae & Martins, 2019), differentiable in ``x`` and ``alpha``.

    .. math::
        \operatorname{entmax}_\alpha(x)_j = [(\alpha - 1) x_j - \tau]_+^{1/(\alpha-1)},
        \qquad \sum_j \operatorname{entmax}_\alpha(x)_j = 1.

    alpha = 2 is :func:`sparsemax`, alpha = 1.5 is :func:`entmax15`, alpha -> 1 tends to
    softmax. The gradient with respect to alpha follows Correia, Niculae & Martins (2019).

    Args:
        x: as for :func:`sparsemax`.
        alpha: a python float > 1, or a tensor (0-d, or broadcastable to ``x.shape`` with
            ``x.shape[dim]`` replaced by 1: one alpha per slice, shared by its groups) that may
            require grad. A python float equal to 2 or 1.5 takes the exact sparsemax / 1.5-entmax
            path; other values and tensors are solved to machine precision and renormalised.
            Tensor entries <= 1 or non-finite are treated like bad data: those rows are NaN,
            nothing raises; :class:`EntmaxAlpha` keeps alpha above 1 by construction.
        dim, groups: as for :func:`sparsemax`.
    """
    if not isinstance(alpha, Tensor):
        alpha = float(alpha)
        if not alpha > 1:
            raise ValueError(f"entmax_alpha: alpha must be > 1, got {alpha}")
        if alpha not in (1.5, 2.0):
            alpha = torch.tensor(alpha, dtype=torch.float64)  # rounded once, to x's dtype
    return _entmax(x, alpha, dim, groups, "entmax_alpha")


class Sparsemax(nn.Module):
    """Module form of :func:`sparsemax`."""

    def __init__(self, dim: int = -1, groups: int = 1) -> None:
        super().__init__()
        self.dim = dim
        self.groups = groups

    def forward(self, x: Tensor) -> Tensor:
        return sparsemax(x, self.dim, self.groups)

    def extra_repr(self) -> str:
        return f"dim={self.dim}, groups={self.groups}"


class Entmax15(nn.Module):
    """Module form of :func:`entmax15`."""

    def __init__(self, dim: int = -1, groups: int = 1) -> None:
        super().__init__()
        self.dim = dim
        self.groups = groups

    def forward(self, x: Tensor) -> Tensor:
        return entmax15(x, self.dim, self.groups)

    def extra_repr(self) -> str:
        return f"dim={self.dim}, groups={self.groups}"


def softplus_inverse(y: float) -> float:
    """x with softplus(x) = y > 0: log(exp(y) − 1), computed without overflow. Initialises a
    parameter that passes through softplus (a learnable alpha, the Sparsemax-SAE's scale)."""
    return y + math.log(-math.expm1(-y))


class EntmaxAlpha(nn.Module):
    r"""Module form of :func:`entmax_alpha`, with an optionally learnable alpha.

    A learnable alpha is parameterised as :math:`\alpha = 1 + 10^{-3} + \operatorname{softplus}
    (\theta)`, so it stays above 1 whatever the optimiser does to :math:`\theta` (a learned
    alpha that reaches 1 gives NaN in implementations that clamp or take alpha directly).
    ``alpha`` (property) is the current value as a 0-d tensor.

    Args:
        alpha: initial (or fixed) alpha, > 1.001 when learnable, > 1 otherwise.
        learnable: make alpha a parameter (``alpha_raw``, i.e. :math:`\theta`).
        dim, groups: as for :func:`sparsemax`.
    """

    def __init__(
        self, alpha: float = 1.5, learnable: bool = False, dim: int = -1, groups: int = 1
    ) -> None:
        super().__init__()
        alpha = float(alpha)
        floor = 1 + _ALPHA_MIN_GAP if learnable else 1.0
        if not alpha > floor:
            raise ValueError(f"EntmaxAlpha: alpha must be > {floor}, got {alpha}")
        self.learnable = learnable
        self.dim = dim
        self.groups = groups
        if learnable:
            self.alpha_raw = nn.Parameter(torch.tensor(softplus_inverse(alpha - floor)))
        else:
            self.register_buffer("alpha_value", torch.tensor(alpha))
            self._alpha = alpha

    @property
    def alpha(self) -> Tensor:
        if self.learnable:
            return 1 + _ALPHA_MIN_GAP + F.softplus(self.alpha_raw)
        return self.alpha_value

    def forward(self, x: Tensor) -> Tensor:
        alpha = self.alpha if self.learnable else self._alpha
        return entmax_alpha(x, alpha, self.dim, self.groups)

    def extra_repr(self) -> str:
        return f"learnable={self.learnable}, dim={self.dim}, groups={self.groups}"
