r"""The solver of the sparse probability maps: the threshold and output of 2-D rows (see
:mod:`sae.activations` for the maps).

**Algorithm.** The threshold is found without sorting the rows (sorting is slow on CPU):

1. *A lower bound from a subset.* Any subset of a row's entries has a threshold no larger than
   the row's, and the maxima of a partition of the row are such a subset. Rows are reduced to the
   maxima of 16 interleaved subsets, whose threshold the sort-based formula gives exactly and
   cheaply; rows of 1024 entries or more, to the maxima of blocks of 32, solved the same way,
   recursively. Rows of at most 16 entries are solved by the sort-based formula directly.
2. *Few candidates.* Only blocks whose maximum exceeds the bound can hold support entries. In
   long rows, when these are at most half of the blocks, they are gathered into a small matrix
   and everything else runs on it: the block maxima are then the only full pass over the input,
   and the output and the input gradient are a zero fill plus a scatter of those blocks. For
   other :math:`\alpha` each Newton pass costs a ``pow`` per entry, so the passes also gather
   the single entries above the bound when these are at most half of the row; the map and its
   gradient (a ``pow`` and a ``log`` per entry) are computed on the entries gathered last.
3. *Exact threshold.* From the bound, Newton's method on :math:`f(t) = \sum_j p_j(t) - 1`, which
   is convex and decreasing for :math:`1 < \alpha \le 2`, so the iterates rise monotonically.
   For sparsemax the Newton step is Michelot's (1986)
   :math:`t \leftarrow (\sum_{x_j > t} x_j - 1) / |\{j : x_j > t\}|`; it stops, exact, when the
   support no longer changes, which the first pass usually shows (the row then has as many
   entries above the bound as the subset's support), or, exact to rounding, when rounding
   makes it grow back (an entry at the threshold: see ``_michelot``). For 1.5-entmax each pass
   also tries the closed form on the current support :math:`S`,
   :math:`t = \mu_S - \sqrt{4/|S| - \sigma_S^2}`, and keeps it when no entry of :math:`S` lies
   below it: the KKT conditions then hold, so it is exact. The support therefore equals that of
   the sort-based formula. For other :math:`\alpha` (no closed form) the Newton steps, safeguarded
   by a bracket of the root where :math:`f` is not convex (:math:`\alpha > 2`), stop at rounding
   level and the output is renormalised.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

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
    until it stops changing, and then t is exact. In exact arithmetic a support never grows; in
    floating point an entry that lies at the threshold within rounding can make it grow back by
    one and cycle, t moving by one ulp each way, for ever. So a row whose support grows goes
    back to the t of the pass before, whose smaller support holds every entry above it, and
    stays there: exact to rounding (its map sums to 1 within rounding). The passes stop when
    every row's support is unchanged or has grown. k_prev: the support size of the previous
    pass, if known. Returns (threshold, the sparsemax of c, support size): the pass that shows
    this has already computed the output, unless a support grew.
    """
    r = torch.empty_like(c)
    s = torch.empty_like(c)
    grown = t_prev = None
    for _ in range(c.shape[-1] + 2):  # a support of n entries shrinks at most n times
        torch.sub(c, t, out=r).relu_()
        k = _count(r, s)
        if k_prev is not None:
            stopped = k == k_prev
            grows = k > k_prev
            if bool(grows.any()):  # rounding: back to the previous t, and stay
                t = torch.where(grows, t_prev, t)
                grown = grows if grown is None else grown | grows
            if bool((stopped if grown is None else stopped | grown).all()):
                break
        k_prev, t_prev = k, t
        step = torch.addcdiv(t, r.sum(-1, keepdim=True).sub_(1), k)
        t = step if grown is None else torch.where(grown, t, step)
    else:  # not reached; the map at the last t
        grown = True
    if grown is not None:  # the map at the t the grown rows went back to
        torch.sub(c, t, out=r).relu_()
        k = _count(r, s)
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

    The steps are Newton's on F(t) = (sum p)^(alpha-1) - 1, the (1/(alpha-1))-norm of
    (alpha-1)(c - t)_+ minus 1: exactly linear on a fixed support of equal entries, so they
    take fewer steps than Newton's on sum(p) - 1. For alpha <= 2, F is convex (a norm of convex
    functions of t), so the steps rise monotonically to the root; those rows stop when every
    step is at rounding level. For alpha > 2, F is not convex: p_j has a vertical tangent where
    an entry joins the support, so a step can be tiny far from the root, or overshoot it. Those
    rows are safeguarded by a bracket of the root (`_Bracket`). Every pass costs a pow per
    entry, so the passes run on the entries above a lower bound of the threshold, gathered anew
    whenever these are at most half of the current ones. Returns the threshold, the
    (unnormalised) map at the last iterate, which is within rounding of it, of the entries
    still gathered, a lower bound of the threshold, and the flat indices into the [rows * n] c
    of the entries the map holds (None: all of c). Every entry left out is below the
    threshold: its map and its gradient are 0, so the caller scatters (or does not).
    """
    rows, n = c.shape
    index = None  # flat indices into the [rows * n] input of the entries c holds (None: all)
    am1 = alpha - 1
    e = 1.0 / am1
    eps = torch.finfo(c.dtype).eps
    tiny = torch.finfo(c.dtype).tiny
    guarded = alpha > 2
    guard = bool(guarded.any())
    lo, hi = t, -((1.0 / n) ** am1) * e  # p_max >= 1/n bounds t from above
    bracket = _Bracket(lo, hi, guarded, eps) if guard else None
    w = None
    for _ in range(200):
        # Only entries above a lower bound can be in the support. t is one for the rows with
        # alpha <= 2, whose iterates rise to the root.
        flat = _select_blocks(c, torch.where(guarded, bracket.lo, t) if guard else t)
        if flat is not None:
            c = c.reshape(-1).index_select(0, flat).view(rows, -1)
            index = flat if index is None else index.index_select(0, flat)
        if flat is not None or w is None:  # buffers for this many entries
            w, p = torch.empty_like(c), torch.empty_like(c)
        torch.sub(c, t, out=w).relu_().mul_(am1)
        torch.pow(w, e, out=p)
        total = p.sum(-1, keepdim=True)
        fp = torch.div(p, w.clamp_min_(tiny), out=w).sum(-1, keepdim=True)  # -f' = sum p/w
        t_new = t + _norm_step(total, fp, am1)
        done = (t_new - t).abs() <= 8 * eps * t.abs()
        if guard:
            t_new, done = bracket.step(t, total - 1, t_new, done)
        t = t_new
        if bool(done.all()):
            break
    if guard:
        # A guarded row converges from above (its Newton steps overshoot, then fall), so the
        # bracket's low end can be far below; a closed row's t is within rounding of the root.
        near = torch.maximum(bracket.lo, t - 64 * eps * t.abs())
        lo = torch.where(guarded, torch.where(bracket.closed, near, bracket.lo), t)
    else:
        lo = t
    return t, p, lo, index


class _Bracket:
    """The safeguard of `_newton_alpha`'s rows with alpha > 2 (`guarded`): a bracket
    [lo, hi] of the root with f = sum p - 1 >= 0 at lo and < 0 at hi.

    A Newton step is taken when it lands inside the bracket and |f| halves every two steps;
    otherwise the bracket's secant point (regula falsi) where both ends' f are known, else its
    midpoint; the midpoint also when |f| has not halved, which guarantees progress. A row stops
    when its Newton step is at rounding level and so is |f|; or, once the bracket is at rounding
    level, after one more pass at its secant point: p is so steep where an entry joins the
    support that a few units of rounding in t move sum p by far more than rounding, and the
    secant point is then the best estimate.
    """

    def __init__(self, lo: Tensor, hi: Tensor, guarded: Tensor, eps: float):
        self.lo, self.hi = lo, hi.expand_as(lo)
        self.f_lo = torch.full_like(lo, math.inf)
        self.f_hi = torch.full_like(lo, -math.inf)
        self.guarded, self.eps = guarded, eps
        self.residuals = [None, None]  # |f| two passes and one pass ago
        self.finishing = torch.zeros_like(guarded)
        self.closed = torch.zeros_like(guarded)  # stopped rows keep their t

    def step(self, t: Tensor, f: Tensor, t_newton: Tensor, done: Tensor):
        """(next t, done) of every row from this pass's t, f and Newton iterate."""
        eps = self.eps
        above = f >= 0
        self.lo = torch.where(above, t, self.lo)
        self.f_lo = torch.where(above, f, self.f_lo)
        self.hi = torch.where(above, self.hi, t)
        self.f_hi = torch.where(above, self.f_hi, f)
        lo, hi, f_lo, f_hi = self.lo, self.hi, self.f_lo, self.f_hi
        closed = self.closed | self.finishing | (done & (f.abs() <= 8 * eps))
        tight = hi - lo <= 2 * eps * t.abs()
        known = torch.isfinite(f_lo) & torch.isfinite(f_hi)
        midpoint = (lo + hi) / 2
        secant = torch.where(known, lo + (hi - lo) * (f_lo / (f_lo - f_hi)), midpoint)
        fallback = (t_newton <= lo) | (t_newton >= hi)
        stalled = torch.zeros_like(fallback)
        if self.residuals[0] is not None:
            stalled = f.abs() > torch.clamp_min(self.residuals[0] / 2, 64 * eps)
        self.residuals = [self.residuals[1], f.abs()]
        t_next = torch.where(stalled, midpoint, torch.where(fallback, secant, t_newton))
        # a secant point that rounds to an end (a step below rounding) would stay there
        t_next = torch.where((t_next <= lo) | (t_next >= hi), midpoint, t_next)
        t_next = torch.where(tight, secant, t_next)
        t_next = torch.where(closed, t, t_next)
        g = self.guarded
        self.finishing = g & ~closed & tight
        self.closed = closed
        return torch.where(g, t_next, t_newton), torch.where(g, closed, done)


def _norm_step(total: Tensor, fp: Tensor, am1: Tensor) -> Tensor:
    """Newton's step on F(t) = (sum p)^(alpha-1) - 1 from sum p (`total`) and -d(sum p)/dt
    (`fp`)."""
    norm = total.pow(am1)
    return (norm - 1) * total / (am1 * norm * fp)


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
    candidate blocks that p stands for (None: p covers the whole rows); blocks of one entry
    for a tensor alpha, whose passes gather single entries.
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
            # the subset's threshold (a lower bound of the row's for every alpha), less rounding
            lo = _newton_alpha(bz, torch.full_like(bz[:, :1], -1.0) * width, alpha)[2]
            lo = lo - 8 * torch.finfo(lo.dtype).eps * lo.abs()
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
        t, p, lo, index = _newton_alpha(c, lo, alpha)
        if index is not None:  # the entries p holds, as flat indices into x
            if flat is not None:
                entries = flat[:, None] * b + torch.arange(b, device=flat.device)
                index = entries.reshape(-1).index_select(0, index)
            flat = index
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
