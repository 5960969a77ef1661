"""Basic metrics: reconstruction error and sparsity, each a pure function of tensors with its
definition written down.

Shapes: ``N`` samples, ``D`` input features (pixels), ``H`` code units, ``C`` classes. Images may be
passed as ``[N, 28, 28]``; they are flattened to ``[N, D]``. Every function runs on the device of
its inputs and knows nothing of training.

Reconstruction (``x̄`` is the dataset mean image, normally the *training* mean, passed in):

- ``mse`` = mean over samples and pixels of (x − x̂)²;
- ``fvu`` (fraction of variance unexplained) = Σ‖x − x̂‖² / Σ‖x − x̄‖²;
  ``explained_variance`` = 1 − fvu;
- ``recon_bias`` γ = Σ‖x̂ − x̄‖² / Σ⟨x̂ − x̄, x − x̄⟩, the relative reconstruction bias of
  Rajamanoharan et al. 2024 (1 = unbiased, c for reconstructions shrunk by c towards the mean).

Sparsity (a unit *fires* on a sample when its code is strictly above a threshold, see ``active``):

- ``l0`` = per-sample number of firing units;
- ``firing_frequency`` = per-unit fraction of samples on which it fires;
- ``dead_fraction`` = fraction of units that never fire; ``dense_fraction`` = fraction of units
  firing on more than half (``limit``) of the inputs.

Large sums are accumulated in float64 (float32 on devices without float64 support).
"""

from __future__ import annotations

import math

import torch

SUMMARY_KEYS: tuple[str, ...] = (
    "mse", "fvu", "explained_variance", "recon_bias", "l0_mean", "l0_std",
    "dead_fraction", "dense_fraction", "n_samples", "n_units",
)


# --------------------------------------------------------------------------------------------------
# helpers


def _acc_dtype(t: torch.Tensor) -> torch.dtype:
    """float64 for accumulation, except on MPS, which has no float64."""
    return torch.float32 if t.device.type == "mps" else torch.float64


def _flat(x: torch.Tensor, name: str) -> torch.Tensor:
    """[N, ...] -> [N, D]."""
    if x.ndim < 2:
        raise ValueError(f"{name} must have shape [N, D] (or [N, *image]), got {tuple(x.shape)}")
    return x.reshape(x.shape[0], -1)


def _pair(x: torch.Tensor, x_hat: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Flatten and check that inputs and reconstructions match: two [N, D] tensors."""
    x, x_hat = _flat(x, "x"), _flat(x_hat, "x_hat")
    if x.shape != x_hat.shape:
        raise ValueError(f"x {tuple(x.shape)} and x_hat {tuple(x_hat.shape)} differ in shape")
    return x, x_hat


def _centred(
    x: torch.Tensor, x_hat: torch.Tensor, mean_image: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(x − x̄, x̂ − x̄) in the accumulation dtype, both [N, D]."""
    x, x_hat = _pair(x, x_hat)
    m = _image(mean_image, x, "mean_image")
    return x.to(m.dtype) - m, x_hat.to(m.dtype) - m


def _image(v: torch.Tensor, x: torch.Tensor, name: str) -> torch.Tensor:
    """One image-shaped vector (mean image, decoder bias) checked against inputs x [N, D]: [D] in
    the accumulation dtype on x's device."""
    v = v.reshape(-1)
    if v.shape[0] != x.shape[1]:
        raise ValueError(f"{name} has {v.shape[0]} entries, the inputs have {x.shape[1]} features")
    return v.to(device=x.device, dtype=_acc_dtype(x))


def _column_mean_std(x: torch.Tensor, chunk: int = 8192) -> tuple[torch.Tensor, torch.Tensor]:
    """Column mean and population std of x [N, D], summed over row chunks: two [D] tensors.

    Sums accumulate in float64 (where available) without a float64 copy of x. Constant columns get
    std 1 (they then contribute a constant, absorbed by the bias).
    """
    dt, n = _acc_dtype(x), x.shape[0]
    total = torch.zeros(x.shape[1], dtype=dt, device=x.device)
    for i in range(0, n, chunk):
        total += x[i:i + chunk].sum(dim=0, dtype=dt)
    mean = total / n
    centre = mean.to(x.dtype)
    sq = torch.zeros_like(total)
    for i in range(0, n, chunk):
        sq += (x[i:i + chunk] - centre).square().sum(dim=0, dtype=dt)
    # c = the mean rounded to x's dtype; exactly, Σ(x − μ)² = Σ(x − c)² − n (μ − c)²
    var = (sq / n - (mean - centre.to(dt)).square()).clamp(min=0)
    std = var.sqrt()
    std = torch.where(std > 1e-12 * (1 + mean.abs()), std, torch.ones_like(std))
    return mean, std


def _codes(codes: torch.Tensor) -> torch.Tensor:
    if codes.ndim != 2:
        raise ValueError(f"codes must have shape [N, H], got {tuple(codes.shape)}")
    return codes


# --------------------------------------------------------------------------------------------------
# reconstruction


def mse(x: torch.Tensor, x_hat: torch.Tensor) -> float:
    """Mean squared error: mean over samples and pixels of (x − x̂)².

    Args:
        x: inputs [N, D].
        x_hat: reconstructions [N, D].

    Returns:
        (1 / (N·D)) Σ_n Σ_d (x_nd − x̂_nd)².
    """
    x, x_hat = _pair(x, x_hat)
    return _mse(x.to(_acc_dtype(x)), x_hat.to(_acc_dtype(x)))


def _mse(x: torch.Tensor, x_hat: torch.Tensor) -> float:
    return float((x - x_hat).square().mean())


def fvu(x: torch.Tensor, x_hat: torch.Tensor, mean_image: torch.Tensor) -> float:
    """Fraction of variance unexplained: Σ‖x − x̂‖² / Σ‖x − x̄‖².

    Predicting the mean image gives 1, a perfect reconstruction 0; ``explained_variance`` is
    1 − fvu. With a held-out set and the train mean as x̄, fvu can exceed 1. A set with no variance
    around x̄ gives nan (0/0) or inf.

    Args:
        x: inputs [N, D].
        x_hat: reconstructions [N, D].
        mean_image: x̄ [D], the dataset mean image (normally the training mean).

    Returns:
        Σ_n ‖x_n − x̂_n‖² / Σ_n ‖x_n − x̄‖².
    """
    return _fvu(*_centred(x, x_hat, mean_image))


def _fvu(xc: torch.Tensor, hc: torch.Tensor) -> float:
    """fvu of inputs and reconstructions centred on x̄ ([N, D] each)."""
    return float((xc - hc).square().sum() / xc.square().sum())


def recon_bias(x: torch.Tensor, x_hat: torch.Tensor, mean_image: torch.Tensor) -> float:
    """Relative reconstruction bias γ = Σ‖x̂ − x̄‖² / Σ⟨x̂ − x̄, x − x̄⟩ (Gated SAEs, 2024).

    γ is the factor by which the reconstructions' deviations from the mean are systematically
    scaled: x̂ = x̄ + c(x − x̄) gives exactly c (c² / c), and any orthogonal projection of x − x̄
    gives 1 (‖Pv‖² = ⟨Pv, v⟩), however much variance it leaves unexplained, so γ measures bias, not
    fit. γ < 1 means shrinkage towards the mean (typical of L1 penalties), γ > 1 overshoot.
    (The ratio Σ⟨x̂ − x̄, x − x̄⟩ / Σ‖x − x̄‖² would not do: it equals 1 − fvu for every orthogonal
    projection.) Predicting the mean everywhere gives 0/0 = nan.

    Args:
        x: inputs [N, D].
        x_hat: reconstructions [N, D].
        mean_image: x̄ [D], the dataset mean image (normally the training mean).

    Returns:
        Σ_n ‖x̂_n − x̄‖² / Σ_n ⟨x̂_n − x̄, x_n − x̄⟩.
    """
    return _recon_bias(*_centred(x, x_hat, mean_image))


def _recon_bias(xc: torch.Tensor, hc: torch.Tensor) -> float:
    """recon_bias of inputs and reconstructions centred on x̄ ([N, D] each)."""
    return float(hc.square().sum() / (hc * xc).sum())


def ink(x: torch.Tensor) -> torch.Tensor:
    """Ink of each image: the sum of its pixel values.

    Args:
        x: images [N, D] (or [N, 28, 28]).

    Returns:
        [N] tensor, Σ_d x_nd, in the dtype of ``x`` (accumulated in float64 where available).
    """
    x = _flat(x, "x")
    if not x.is_floating_point():
        return x.sum(dim=1, dtype=torch.float64).to(torch.get_default_dtype())
    return x.sum(dim=1, dtype=_acc_dtype(x)).to(x.dtype)


# --------------------------------------------------------------------------------------------------
# sparsity


def active(codes: torch.Tensor, threshold: float = 0.0) -> torch.Tensor:
    """Which units fire: ``codes > threshold`` (strict). The one definition of "fires".

    A code exactly at the threshold does not fire; NaN never fires. ReLU, TopK, sparsemax and entmax
    codes use threshold 0 (their zeros are exact); sigmoid (KL) codes are never exactly 0 and need a
    stated positive threshold.

    Args:
        codes: [N, H] code activations.
        threshold: firing threshold.

    Returns:
        BoolTensor [N, H].
    """
    return _codes(codes) > threshold


def l0(codes: torch.Tensor, threshold: float = 0.0) -> torch.Tensor:
    """Per-sample L0: the number of units that fire on each sample (see ``active``).

    Args:
        codes: [N, H] code activations.
        threshold: firing threshold.

    Returns:
        float32 tensor [N], Σ_j [h_nj > threshold].
    """
    return active(codes, threshold).sum(dim=1).to(torch.float32)


def firing_frequency(codes: torch.Tensor, threshold: float = 0.0) -> torch.Tensor:
    """Per-unit firing frequency: the fraction of samples on which each unit fires.

    Its sum over units equals the mean L0.

    Args:
        codes: [N, H] code activations, N ≥ 1.
        threshold: firing threshold.

    Returns:
        float32 tensor [H] in [0, 1], (1/N) Σ_n [h_nj > threshold].
    """
    fires = active(codes, threshold)
    if fires.shape[0] == 0:
        raise ValueError("firing_frequency needs at least one sample")
    return (fires.sum(dim=0).to(torch.float64) / fires.shape[0]).to(torch.float32)


def dead_fraction(freq: torch.Tensor) -> float:
    """Fraction of units that never fire over the evaluation set: #{j : freq_j = 0} / H.

    Args:
        freq: [H] firing frequencies (``firing_frequency``).
    """
    return float((freq == 0).to(torch.float64).mean())


def dense_fraction(freq: torch.Tensor, limit: float = 0.5) -> float:
    """Fraction of units firing on more than ``limit`` of the inputs: #{j : freq_j > limit} / H.

    Args:
        freq: [H] firing frequencies (``firing_frequency``).
        limit: frequency above which a unit counts as dense (strict).
    """
    return float((freq > limit).to(torch.float64).mean())


def class_firing_frequency(
    codes: torch.Tensor, labels: torch.Tensor, n_classes: int, threshold: float = 0.0
) -> torch.Tensor:
    """Per-class firing frequency: the fraction of samples of class c on which unit j fires.

    Rows of classes without samples are 0.

    Args:
        codes: [N, H] code activations.
        labels: [N] integer class labels in [0, n_classes).
        n_classes: C.
        threshold: firing threshold.

    Returns:
        float32 tensor [C, H], (1/N_c) Σ_{n : y_n = c} [h_nj > threshold].
    """
    fires = active(codes, threshold)
    labels = labels.reshape(-1).to(device=fires.device, dtype=torch.long)
    if labels.shape[0] != fires.shape[0]:
        raise ValueError(f"{labels.shape[0]} labels for {fires.shape[0]} code rows")
    if labels.numel() and (int(labels.min()) < 0 or int(labels.max()) >= n_classes):
        raise ValueError(f"labels must lie in [0, {n_classes})")
    counts = torch.zeros(n_classes, fires.shape[1], dtype=torch.float32, device=fires.device)
    counts.index_add_(0, labels, fires.to(torch.float32))
    per_class = torch.bincount(labels, minlength=n_classes).to(torch.float32)
    return counts / per_class.clamp(min=1).unsqueeze(1)


def class_selectivity(class_rate: torch.Tensor, present: torch.Tensor | None = None
                      ) -> tuple[torch.Tensor, torch.Tensor]:
    r"""Preferred class and class selectivity of each unit, from per-class firing rates.

    A unit's class distribution is its firing rate in each class normalised to sum to 1, so each
    class weighs the same whatever its number of inputs, and its selectivity is

    .. math:: s_j = 1 - \frac{H(p_j)}{\log C'}, \qquad p_{cj} = \frac{r_{cj}}{\sum_c r_{cj}},

    with H the Shannon entropy (natural log) and C' the number of classes present: 1 for a unit
    that fires in one class only, 0 for one that fires at the same rate in every class.

    Args:
        class_rate: [C, H] share of the inputs of each class on which each unit fires
            (:func:`class_firing_frequency`).
        present: [C] bool, the classes that have inputs (default: all); absent classes have no
            rate to compare and are left out of C'.

    Returns:
        ``(preferred, selectivity)``: [H] int64, the class of the highest rate (-1 for a unit that
        never fires), and [H] float64, NaN for a unit that never fires and when C' < 2.
    """
    rate = class_rate.to(torch.float64)
    c, h = rate.shape
    present = torch.ones(c, dtype=torch.bool) if present is None else present.to(torch.bool)
    rate = rate[present]
    total = rate.sum(0)
    dead = total <= 0
    dist = rate / torch.where(dead, torch.ones_like(total), total)
    entropy = -(dist * torch.log(torch.where(dist > 0, dist, torch.ones_like(dist)))).sum(0)
    n_present = int(present.sum())
    selectivity = ((1.0 - entropy / math.log(n_present)).clamp(0.0, 1.0) if n_present >= 2
                   else torch.full((h,), math.nan, dtype=torch.float64))
    preferred = class_rate.to(torch.float64).argmax(0) if c else torch.full((h,), -1)
    return (torch.where(dead, torch.full_like(preferred, -1), preferred),
            torch.where(dead, torch.full_like(selectivity, math.nan), selectivity))


def summarize(
    x: torch.Tensor,
    x_hat: torch.Tensor,
    codes: torch.Tensor,
    mean_image: torch.Tensor,
    threshold: float = 0.0,
) -> dict[str, float]:
    """All scalar metrics of one evaluation set, as plain floats.

    Keys: ``mse``, ``fvu``, ``explained_variance`` (1 − fvu), ``recon_bias``, ``l0_mean``,
    ``l0_std`` (the *population* standard deviation of per-sample L0 over the set, ddof = 0),
    ``dead_fraction``, ``dense_fraction`` (limit 0.5), ``n_samples`` (N), ``n_units`` (H).
    The dynamic-sparsity measures, which need the decoder and least-squares solves, are
    ``dynamic_sparsity``'s.

    Args:
        x: inputs [N, D].
        x_hat: reconstructions [N, D].
        codes: [N, H] code activations.
        mean_image: x̄ [D], normally the training mean.
        threshold: firing threshold (see ``active``).
    """
    codes = _codes(codes)
    if codes.shape[0] != x.shape[0]:
        raise ValueError(f"{codes.shape[0]} code rows for {x.shape[0]} inputs")
    x, x_hat = _pair(x, x_hat)
    m = _image(mean_image, x, "mean_image")
    xa, ha = x.to(m.dtype), x_hat.to(m.dtype)  # converted once for all three (large sets)
    xc, hc = xa - m, ha - m
    f = _fvu(xc, hc)
    counts = l0(codes, threshold).to(torch.float64)
    freq = firing_frequency(codes, threshold)
    return {
        "mse": _mse(xa, ha),
        "fvu": f,
        "explained_variance": 1.0 - f,
        "recon_bias": _recon_bias(xc, hc),
        "l0_mean": float(counts.mean()),
        "l0_std": float(counts.std(correction=0)),
        "dead_fraction": dead_fraction(freq),
        "dense_fraction": dense_fraction(freq),
        "n_samples": float(codes.shape[0]),
        "n_units": float(codes.shape[1]),
    }
