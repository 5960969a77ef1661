"""Dynamic sparsity: does the number of active units adapt to the input, and does that pay?

Shapes as in :mod:`sae.metrics.basic`. ``W`` [D, H] are the decoder atoms, ``b`` the decoder
bias, S_n the support (firing units) of input n:

- ``support_fvu`` = Σ_n min_z ‖(x_n − b) − W[:, S_n] z‖² / Σ_n ‖x_n − x̄‖², the FVU of the
  least-squares code on each input's own support: how well the supports are chosen, whatever the
  values (``fvu − support_fvu`` is what the values lose);
- ``adaptive_gain`` = fvu_const − support_fvu, fvu_const the same least-squares FVU on supports of
  one constant size k̄ = mean L0 (each input's k̄ highest-scoring units; interpolated between ⌊k̄⌋
  and ⌊k̄⌋ + 1): > 0 when variable-size supports beat the same model held to a fixed budget,
  exactly 0 for TopK;
- ``adaptivity`` = Spearman correlation (average ranks for ties) of per-input L0 with a difficulty
  score, None when either is constant; the difficulty used by ``dynamic_sparsity`` is
  ``pca_residual``, the energy left after projection onto the top m = round(mean L0) principal
  components of the training set (``principal_components``). That difficulty grows with the
  input's energy E = ‖x − x̄‖², and so does the L0 of any shared threshold (BatchTopK's,
  JumpReLU's: larger inputs have larger scores), so ``adaptivity`` rewards following the energy
  for free; ``dynamic_sparsity`` therefore also reports ``adaptivity_partial``, the partial
  Spearman correlation of L0 and difficulty with E held fixed (``partial_spearman``), and
  ``adaptivity_energy``, the Spearman correlation of E itself with the difficulty: what an L0
  ranked by energy alone would score.

``dynamic_sparsity`` computes these on a fixed subset of the test set; ``summarize`` does not
(they cost least-squares solves).

Large sums are accumulated in float64 (float32 on devices without float64 support).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from sae.metrics.basic import _acc_dtype, _codes, _column_mean_std, _flat, _image, active, l0

# --------------------------------------------------------------------------------------------------
# dynamic sparsity: supports, adaptivity, adaptive gain

_RIDGE = 1e-10
"""Relative ridge δ of the support least squares: δ = _RIDGE × the mean diagonal of W_Sᵀ W_S."""

_SOLVE_ENTRIES = 1 << 22
"""At most this many entries of gathered Gram blocks [B, k, k] per batched solve (32 MiB)."""

_SOLVE_ROWS = 4096
"""At most this many inputs per batched solve (bounds the [B, H] product W_Sᵀ y)."""

DYNAMIC_SUBSET = 2000
"""Default number of test inputs ``dynamic_sparsity`` evaluates (evenly spaced, see there)."""

DYNAMIC_KEYS: tuple[str, ...] = (
    "support_fvu", "support_fvu_const", "adaptive_gain", "adaptivity", "adaptivity_partial",
    "adaptivity_energy", "adaptivity_m", "n_inputs",
)


def _subset(n: int, max_inputs: int | None) -> torch.Tensor | None:
    """Indices of ``max_inputs`` inputs evenly spaced over ``n`` ([max_inputs]); None = all of them.

    Evenly spaced rather than the first ones: the MNIST test set is ordered by writer population
    (its first 5 000 images are cleaner than its last 5 000), so a prefix is not representative.
    """
    if max_inputs is None or max_inputs >= n:
        return None
    if max_inputs < 1:
        raise ValueError(f"max_inputs must be at least 1, got {max_inputs}")
    return torch.arange(max_inputs) * n // max_inputs


def _take(index: torch.Tensor | None, *tensors: torch.Tensor | None) -> list[torch.Tensor | None]:
    """The rows ``index`` of each tensor (None passes through; index None keeps all rows)."""
    if index is None:
        return list(tensors)
    return [None if t is None else t[index.to(t.device)] for t in tensors]


@dataclass
class _Decoder:
    """A linear decoder x̂ = W z + b, in the accumulation dtype, with its Gram matrix WᵀW."""

    atoms: torch.Tensor  # W [D, H]
    offset: torch.Tensor  # b [D]
    gram: torch.Tensor  # WᵀW [H, H]


def _decoder(x: torch.Tensor, codes: torch.Tensor, atoms: torch.Tensor,
             offset: torch.Tensor) -> _Decoder:
    """Check atoms [D, H] and offset [D] against inputs x [N, D] and codes [N, H]."""
    if atoms.ndim != 2 or atoms.shape != (x.shape[1], codes.shape[1]):
        raise ValueError(f"atoms must have shape [D, H] = [{x.shape[1]}, {codes.shape[1]}], "
                         f"got {tuple(atoms.shape)}")
    if codes.shape[0] != x.shape[0]:
        raise ValueError(f"{codes.shape[0]} code rows for {x.shape[0]} inputs")
    w = atoms.to(device=x.device, dtype=_acc_dtype(x))
    return _Decoder(w, _image(offset, x, "offset"), w.T @ w)


def _support_residuals(x: torch.Tensor, support: torch.Tensor, dec: _Decoder) -> torch.Tensor:
    """Each input's least-squares residual energy on its own support: [N] in the accumulation dtype.

    r_n = min_z ‖(x_n − b) − W[:, S_n] z‖², S_n = the True entries of ``support[n]``.

    Inputs are grouped by support size k, so each group is one batched problem without padding:
    the Gram blocks G_S = W_Sᵀ W_S [B, k, k] are gathered from WᵀW (computed once), the normal
    equations (G_S + δ I) z = W_Sᵀ y solved by batched Cholesky, with δ = 1e-10 × mean(diag G_S) so
    that linearly dependent atoms (rank deficiency) do not break the factorisation (a block whose
    factorisation still fails is solved by pseudo-inverse), and r = ‖y‖² − 2 zᵀW_Sᵀy + zᵀ G_S z,
    which holds for any z (in float64 its rounding error is ~1e-15 ‖y‖²). The ridge costs at most
    δ‖z*‖² over the exact minimum. Empty supports give r = ‖y‖².

    Args:
        x: inputs [N, D].
        support: BoolTensor [N, H].
        dec: the decoder (atoms, offset, Gram matrix).
    """
    y = x.to(dec.offset.dtype) - dec.offset  # [N, D]
    residual = y.square().sum(dim=1)  # [N], the empty-support value
    support = support.to(y.device)
    sizes = support.sum(dim=1)
    for k in sizes.unique().tolist():
        if k == 0:
            continue
        rows = (sizes == k).nonzero().squeeze(1)
        step = max(1, min(_SOLVE_ROWS, _SOLVE_ENTRIES // (k * k)))
        for start in range(0, rows.shape[0], step):
            r = rows[start:start + step]
            idx = support[r].nonzero()[:, 1].reshape(-1, k)  # [B, k], ascending unit indices
            gram = dec.gram[idx.unsqueeze(2), idx.unsqueeze(1)]  # [B, k, k]
            wty = (y[r] @ dec.atoms).gather(1, idx).unsqueeze(2)  # [B, k, 1]
            delta = _RIDGE * gram.diagonal(dim1=1, dim2=2).mean(dim=1)
            delta = torch.where(delta > 0, delta, torch.full_like(delta, _RIDGE))
            eye = torch.eye(k, dtype=gram.dtype, device=gram.device)
            chol, info = torch.linalg.cholesky_ex(gram + delta[:, None, None] * eye)
            z = torch.cholesky_solve(wty, chol)  # [B, k, 1]
            failed = info != 0
            if bool(failed.any()):
                z[failed] = torch.linalg.pinv(gram[failed], hermitian=True) @ wty[failed]
            fit = 2 * (z * wty).sum(dim=(1, 2)) - (z * (gram @ z)).sum(dim=(1, 2))
            residual[r] = (residual[r] - fit).clamp(min=0)
    return residual


def input_energy(x: torch.Tensor, mean_image: torch.Tensor) -> torch.Tensor:
    """Each input's energy ‖x_n − x̄‖², [N] in the accumulation dtype (the FVU's per-input
    denominator)."""
    x = _flat(x, "x")
    m = _image(mean_image, x, "mean_image")
    return (x.to(m.dtype) - m).square().sum(dim=1)


def _variance(x: torch.Tensor, mean_image: torch.Tensor) -> torch.Tensor:
    """Σ_n ‖x_n − x̄‖², the denominator of every FVU (0-dim, accumulation dtype)."""
    x = _flat(x, "x")
    m = _image(mean_image, x, "mean_image")
    return (x.to(m.dtype) - m).square().sum()


def support_fvu(
    x: torch.Tensor,
    codes: torch.Tensor,
    atoms: torch.Tensor,
    offset: torch.Tensor,
    mean_image: torch.Tensor,
    threshold: float = 0.0,
    max_inputs: int | None = None,
) -> float:
    """FVU of the least-squares code on each input's own support: how well the supports are chosen.

    For every input n with support S_n (the units that fire, see ``active``),

        support_fvu = Σ_n min_z ‖(x_n − b) − W[:, S_n] z‖² / Σ_n ‖x_n − x̄‖²,

    W [D, H] the decoder atoms and b the offset the decoder adds (b_dec); an input with empty
    support contributes ‖x_n − b‖². It is the best any code with those supports could do through
    the model's linear decoder, so ``fvu − support_fvu`` is what the model's *values* on its
    supports lose, and support_fvu alone scores its choice of *supports*. When every unit outside
    the support has code exactly 0 (threshold 0, non-negative codes) and x̂ = W h + b,
    support_fvu ≤ fvu; with a positive threshold compare it with ``fvu_at_l0`` instead. It depends
    on the supports only, not on any rescaling of the codes. It is solved by batched Cholesky on
    float64 Gram blocks (see ``_support_residuals``); the Gram matrix WᵀW takes H² × 8 bytes.

    Args:
        x: inputs [N, D] (or [N, *image]).
        codes: [N, H] code activations; only their support (``codes > threshold``) is used.
        atoms: W [D, H], the decoder's columns.
        offset: b [D], the decoder bias.
        mean_image: x̄ [D], normally the training mean.
        threshold: firing threshold (see ``active``).
        max_inputs: evaluate on this many inputs evenly spaced over the set (a fixed subset, the
            same for every model of the same set); None = all.

    Returns:
        support_fvu as a float (nan when the inputs have no variance around x̄).
    """
    x, codes = _flat(x, "x"), _codes(codes)
    dec = _decoder(x, codes, atoms, offset)
    x, codes = _take(_subset(x.shape[0], max_inputs), x, codes)
    residual = _support_residuals(x, active(codes, threshold), dec)
    return float(residual.sum() / _variance(x, mean_image))


def _constant_supports(scores: torch.Tensor, k: int) -> torch.Tensor:
    """Each row's k highest-scoring units as a BoolTensor [N, H] (ties: the lower unit index)."""
    k = min(max(k, 0), scores.shape[1])
    order = torch.sort(scores, dim=1, descending=True, stable=True).indices[:, :k]
    fixed = torch.zeros(scores.shape, dtype=torch.bool, device=scores.device)
    return fixed.scatter_(1, order, True)


@dataclass
class _Gain:
    """The two sides of ``adaptive_gain`` (residual sums, not yet divided by the variance)."""

    own: torch.Tensor  # Σ_n r_n on the model's own supports
    const: torch.Tensor  # Σ_n r_n on supports of constant size k̄ (interpolated)
    mean_l0: float


def _gain(x: torch.Tensor, codes: torch.Tensor, scores: torch.Tensor | None, dec: _Decoder,
          threshold: float) -> _Gain:
    """Residual sums on own supports and on constant-size supports (see ``adaptive_gain``)."""
    own = active(codes, threshold)
    own_res = _support_residuals(x, own, dec)
    scores = codes if scores is None else scores
    if scores.shape != codes.shape:
        raise ValueError(f"scores {tuple(scores.shape)} and codes {tuple(codes.shape)} differ")
    mean_l0 = float(own.sum(dim=1).to(torch.float64).mean())

    def const_sum(k: int) -> torch.Tensor:
        fixed = _constant_supports(scores, k)
        same = (fixed == own).all(dim=1)  # inputs whose support is already of size k by score
        res = own_res.clone()
        if not bool(same.all()):
            res[~same] = _support_residuals(x[~same], fixed[~same], dec)
        return res.sum()

    k_lo = math.floor(mean_l0)
    frac = mean_l0 - k_lo
    const = const_sum(k_lo)
    if frac > 0:
        const = (1 - frac) * const + frac * const_sum(k_lo + 1)
    return _Gain(own_res.sum(), const, mean_l0)


def adaptive_gain(
    x: torch.Tensor,
    codes: torch.Tensor,
    atoms: torch.Tensor,
    offset: torch.Tensor,
    mean_image: torch.Tensor,
    scores: torch.Tensor | None = None,
    threshold: float = 0.0,
    max_inputs: int | None = None,
) -> float:
    """Whether adapting the number of active units to the input pays: fvu_const − support_fvu.

        adaptive_gain = fvu_const − support_fvu_own

    support_fvu_own is ``support_fvu`` on the model's own supports (of varying size, mean L0 = k̄);
    fvu_const is the same least-squares FVU on supports of one constant size built from the same
    model: each input keeps its k̄ highest-scoring units (``scores``, default the codes; pass the
    pre-activations to rank the units a code zeroed too; ties go to the lower unit index). When k̄ is
    not an integer, fvu_const interpolates linearly between ⌊k̄⌋ and ⌊k̄⌋ + 1, so both sides spend
    the same mean number of units. Both sides use least-squares values, so the gain compares
    supports only.

    Positive: the model's variable-size supports reconstruct better than the same model forced to
    a constant budget. Zero by construction for a fixed-k TopK code whose k non-zeros are its k
    highest scores (both supports are the same, and inputs whose two supports agree reuse the same
    residual, so the gain is exactly 0.0). Negative: the variation of L0 hurts.

    Args:
        x: inputs [N, D] (or [N, *image]).
        codes: [N, H] code activations; their support (``codes > threshold``) is the model's own.
        atoms: W [D, H], the decoder's columns.
        offset: b [D], the decoder bias.
        mean_image: x̄ [D], normally the training mean.
        scores: [N, H] unit scores for the constant-size supports; None = ``codes``.
        threshold: firing threshold (see ``active``).
        max_inputs: evaluate on this many inputs evenly spaced over the set; None = all.

    Returns:
        adaptive_gain as a float.
    """
    x, codes = _flat(x, "x"), _codes(codes)
    dec = _decoder(x, codes, atoms, offset)
    x, codes, scores = _take(_subset(x.shape[0], max_inputs), x, codes, scores)
    g = _gain(x, codes, scores, dec, threshold)
    return float((g.const - g.own) / _variance(x, mean_image))


@dataclass
class PCA:
    """Principal components of a data set: ``mean`` [D] and orthonormal ``basis`` [D, m] (columns
    by decreasing variance), ``variances`` [m] (population variance along each column)."""

    mean: torch.Tensor
    basis: torch.Tensor
    variances: torch.Tensor

    def top(self, m: int) -> PCA:
        """The first m components (0 ≤ m; more than there are keeps them all)."""
        if m < 0:
            raise ValueError(f"the number of components must be >= 0, got {m}")
        return PCA(self.mean, self.basis[:, :m], self.variances[:m])


def principal_components(x_train: torch.Tensor, m: int | None = None,
                         chunk: int = 8192) -> PCA:
    """The top-m principal components of x_train, by eigh of its covariance in float64.

    C = (1/N) Σ_n (x_n − μ)(x_n − μ)ᵀ [D, D], accumulated over row chunks (no float64 copy of the
    whole set); its eigenvectors with the m largest eigenvalues form the basis. Compute it once
    with m = None (all D components) and take ``.top(m)`` for each model.

    Args:
        x_train: training inputs [N, D] (or [N, *image]), N ≥ 1.
        m: number of components; None = all D.
        chunk: rows per accumulation step.
    """
    x = _flat(x_train, "x_train")
    if x.shape[0] == 0:
        raise ValueError("principal_components needs at least one sample")
    mean, _ = _column_mean_std(x)
    if x.device.type == "cpu" and mean.dtype == torch.float64:
        cov = _cpu_scatter(x, mean, chunk)
    else:
        cov = torch.zeros(x.shape[1], x.shape[1], dtype=mean.dtype, device=x.device)
        for i in range(0, x.shape[0], chunk):
            y = x[i:i + chunk].to(mean.dtype) - mean
            cov += y.T @ y
    values, vectors = torch.linalg.eigh(cov / x.shape[0])  # ascending
    pca = PCA(mean, vectors.flip(1), values.flip(0).clamp(min=0))
    return pca if m is None else pca.top(m)


def _cpu_scatter(x: torch.Tensor, mean: torch.Tensor, chunk: int) -> torch.Tensor:
    """Σ_n (x_n − μ)(x_n − μ)ᵀ in float64 on the CPU by BLAS ``dsyrk``, which computes one
    triangle of the symmetric product: half the work of the full matrix product (the largest
    cost of a run's test metrics), the same sums up to rounding."""
    from scipy.linalg.blas import dsyrk  # only for the CPU's scatter matrix

    d = x.shape[1]
    upper = np.zeros((d, d), order="F")
    for i in range(0, x.shape[0], chunk):
        y = (x[i:i + chunk].to(torch.float64) - mean).numpy()
        # y.T is a Fortran-ordered view: no copy; C += yᵀ y, upper triangle only
        upper = dsyrk(1.0, y.T, beta=1.0, c=upper, trans=0, lower=0, overwrite_c=1)
    return torch.from_numpy(np.triu(upper) + np.triu(upper, 1).T)


def pca_residual(x: torch.Tensor, basis: torch.Tensor, mean: torch.Tensor) -> torch.Tensor:
    """Each input's energy left after projection onto a subspace: ‖(x − μ) − B Bᵀ(x − μ)‖².

    With B the top-m principal components of the *training* set (``principal_components``), it is
    a difficulty score: how much of the input the best fixed m-dimensional linear code misses.

    Args:
        x: inputs [N, D] (or [N, *image]).
        basis: B [D, m] with orthonormal columns (m may be 0).
        mean: μ [D], the centre of the projection (the PCA mean).

    Returns:
        [N] tensor in the accumulation dtype (float64 where available).
    """
    x = _flat(x, "x")
    if basis.ndim != 2 or basis.shape[0] != x.shape[1]:
        raise ValueError(f"basis must have shape [{x.shape[1]}, m], got {tuple(basis.shape)}")
    y = x.to(_acc_dtype(x)) - _image(mean, x, "mean")
    b = basis.to(device=y.device, dtype=y.dtype)
    return (y - (y @ b) @ b.T).square().sum(dim=1)


def _average_ranks(v: torch.Tensor) -> torch.Tensor:
    """1-based ranks of v [N] with ties given the mean of the ranks they span (float64 [N])."""
    values, order = torch.sort(v, stable=True)
    _, counts = torch.unique_consecutive(values, return_counts=True)
    last = counts.cumsum(0).to(torch.float64)  # rank of each tie group's last member
    mean_rank = last - (counts.to(torch.float64) - 1) / 2
    ranks = torch.empty(v.shape[0], dtype=torch.float64, device=v.device)
    ranks[order] = mean_rank.repeat_interleave(counts)
    return ranks


def adaptivity(l0: torch.Tensor, difficulty: torch.Tensor) -> float | None:
    """Spearman rank correlation between per-input L0 and a per-input difficulty score.

    The Pearson correlation of the two rank vectors, ties given their average rank. +1: harder
    inputs always get more units; 0: the number of units ignores difficulty (a fixed-k TopK code,
    whose L0 is constant, gives None); −1: harder inputs get fewer. Rank-based, so any monotone
    transform of either side leaves it unchanged. With difficulty = ``pca_residual`` onto the top
    round(mean L0) training components it asks "does L0 follow how much the best fixed linear code
    of that size misses?".

    Args:
        l0: [N] per-input number of active units (see ``l0``).
        difficulty: [N] per-input difficulty score, finite.

    Returns:
        The correlation in [−1, 1], or None when either side is constant (undefined) or N < 2.
    """
    a, b = l0.reshape(-1), difficulty.reshape(-1)
    if a.shape != b.shape:
        raise ValueError(f"{a.shape[0]} L0 values for {b.shape[0]} difficulty scores")
    if not bool(torch.isfinite(a).all() and torch.isfinite(b).all()):
        raise ValueError("adaptivity needs finite values")
    if a.shape[0] < 2:
        return None
    ra, rb = _average_ranks(a), _average_ranks(b.to(a.device))
    ra, rb = ra - ra.mean(), rb - rb.mean()
    denom = float((ra.square().sum() * rb.square().sum()).sqrt())
    return float((ra * rb).sum() / denom) if denom > 0 else None


def _spearman_ranks(v: torch.Tensor) -> torch.Tensor:
    """Centred average ranks of v [N] (float64): what a Spearman correlation correlates."""
    r = _average_ranks(v.reshape(-1))
    return r - r.mean()


def _corr(a: torch.Tensor, b: torch.Tensor) -> float | None:
    """Pearson correlation of two centred vectors; None when either is constant."""
    denom = float((a.square().sum() * b.square().sum()).sqrt())
    return float((a * b).sum() / denom) if denom > 0 else None


def partial_spearman(a: torch.Tensor, b: torch.Tensor, control: torch.Tensor) -> float | None:
    """Spearman correlation of a and b [N] with ``control`` [N] held fixed (partial, on ranks).

        ρ_ab·c = (ρ_ab − ρ_ac ρ_bc) / sqrt((1 − ρ_ac²)(1 − ρ_bc²))

    with ρ the Spearman correlations (average ranks for ties): the rank correlation of what a
    and b do not share with c. With a = an input's L0, b = its difficulty and c = its energy,
    it asks whether L0 follows the difficulty beyond what the energy already explains: a shared
    threshold's L0 grows with the input's energy for free, and so does the difficulty.

    Returns:
        The partial correlation in [−1, 1], or None when any side is constant, N < 3, or c
        determines a or b (|ρ| = 1: nothing is left to correlate).
    """
    a, b, c = (v.reshape(-1) for v in (a, b, control))
    if not a.shape == b.shape == c.shape:
        raise ValueError(f"lengths differ: {a.shape[0]}, {b.shape[0]}, {c.shape[0]}")
    if not all(bool(torch.isfinite(v).all()) for v in (a, b, c)):
        raise ValueError("partial_spearman needs finite values")
    if a.shape[0] < 3:
        return None
    ra, rb, rc = (_spearman_ranks(v.to(a.device)) for v in (a, b, c))
    ab, ac, bc = _corr(ra, rb), _corr(ra, rc), _corr(rb, rc)
    if ab is None or ac is None or bc is None:
        return None
    denom = math.sqrt(max(1 - ac * ac, 0.0) * max(1 - bc * bc, 0.0))
    if denom < 1e-12:
        return None
    return max(-1.0, min(1.0, (ab - ac * bc) / denom))


def dynamic_sparsity(
    x_test: torch.Tensor,
    codes: torch.Tensor,
    atoms: torch.Tensor,
    offset: torch.Tensor,
    mean_image: torch.Tensor,
    x_train: torch.Tensor | PCA,
    *,
    scores: torch.Tensor | None = None,
    threshold: float = 0.0,
    max_inputs: int | None = DYNAMIC_SUBSET,
) -> dict[str, float | None]:
    """The dynamic-sparsity measures of one model on a fixed subset of the test set.

    Keys (``DYNAMIC_KEYS``):

    - ``support_fvu``: ``support_fvu`` on the model's own supports;
    - ``support_fvu_const``: the same on constant-size supports (see ``adaptive_gain``);
    - ``adaptive_gain``: support_fvu_const − support_fvu;
    - ``adaptivity``: ``adaptivity`` of per-input L0 against ``pca_residual`` onto the top m
      principal components of the training set, m = ``adaptivity_m`` = the subset's mean L0
      rounded half up (capped at D); None when L0 or the residual is constant;
    - ``adaptivity_partial``: ``partial_spearman`` of L0 and that difficulty with the input's
      energy ‖x − x̄‖² held fixed (None where undefined);
    - ``adaptivity_energy``: the Spearman correlation of the energy with the difficulty, the
      score of an L0 ranked by energy alone (the baseline of ``adaptivity``);
    - ``n_inputs``: the number of inputs evaluated.

    The subset is ``max_inputs`` (default 2 000) test inputs evenly spaced over the set, the same
    for every model of a data set, which keeps the least-squares solves to about a second; None
    evaluates all. Values are floats, except an undefined ``adaptivity`` (None).

    Args:
        x_test: test inputs [N, D] (or [N, *image]).
        codes: [N, H] the model's codes of x_test.
        atoms: W [D, H], the decoder's columns.
        offset: b [D], the decoder bias.
        mean_image: x̄ [D], the training mean image.
        x_train: training inputs [M, D], or their ``principal_components(x_train)`` (all
            components) to reuse across models.
        scores: [N, H] unit scores for the constant-size supports; None = ``codes``.
        threshold: firing threshold (see ``active``).
        max_inputs: subset size; None = all test inputs.
    """
    x, codes = _flat(x_test, "x_test"), _codes(codes)
    dec = _decoder(x, codes, atoms, offset)
    x, codes, scores = _take(_subset(x.shape[0], max_inputs), x, codes, scores)
    gain = _gain(x, codes, scores, dec, threshold)
    variance = _variance(x, mean_image)
    pca = x_train if isinstance(x_train, PCA) else principal_components(x_train)
    m = min(math.floor(gain.mean_l0 + 0.5), x.shape[1])
    if pca.basis.shape[0] != x.shape[1] or pca.basis.shape[1] < m:
        raise ValueError(f"the PCA has basis {tuple(pca.basis.shape)}; needed: {x.shape[1]} "
                         f"features and at least {m} components")
    difficulty = pca_residual(x, pca.basis[:, :m], pca.mean)
    energy = input_energy(x, mean_image)
    counts = l0(codes, threshold)
    return {
        "support_fvu": float(gain.own / variance),
        "support_fvu_const": float(gain.const / variance),
        "adaptive_gain": float((gain.const - gain.own) / variance),
        "adaptivity": adaptivity(counts, difficulty),
        "adaptivity_partial": partial_spearman(counts, difficulty, energy),
        "adaptivity_energy": adaptivity(energy, difficulty),
        "adaptivity_m": float(m),
        "n_inputs": float(x.shape[0]),
    }
