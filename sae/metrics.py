"""Metrics of sparse autoencoders, each a pure function of tensors with its definition written down.

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

Features: ``linear_probe`` trains a multinomial logistic regression on train-set features and
reports its accuracy on test-set features; the raw-pixel baseline is the same function on pixels.

Large sums are accumulated in float64 (float32 on devices without float64 support).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import torch

__all__ = [
    "SPARSE_DENSITY",
    "SUMMARY_KEYS",
    "ProbeResult",
    "active",
    "class_firing_frequency",
    "dead_fraction",
    "dense_fraction",
    "firing_frequency",
    "fvu",
    "ink",
    "l0",
    "linear_probe",
    "mse",
    "raw_pixel_baseline",
    "recon_bias",
    "summarize",
]

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
    mean_image = mean_image.reshape(-1)
    if mean_image.shape[0] != x.shape[1]:
        raise ValueError(
            f"mean_image has {mean_image.shape[0]} entries, the inputs have {x.shape[1]} features")
    dt = _acc_dtype(x)
    m = mean_image.to(device=x.device, dtype=dt)
    return x.to(dt) - m, x_hat.to(dt) - m


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
    err = x.to(_acc_dtype(x)) - x_hat.to(_acc_dtype(x))
    return float(err.square().mean())


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
    xc, hc = _centred(x, x_hat, mean_image)
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
    xc, hc = _centred(x, x_hat, mean_image)
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
    f = fvu(x, x_hat, mean_image)
    counts = l0(codes, threshold).to(torch.float64)
    freq = firing_frequency(codes, threshold)
    return {
        "mse": mse(x, x_hat),
        "fvu": f,
        "explained_variance": 1.0 - f,
        "recon_bias": recon_bias(x, x_hat, mean_image),
        "l0_mean": float(counts.mean()),
        "l0_std": float(counts.std(correction=0)),
        "dead_fraction": dead_fraction(freq),
        "dense_fraction": dense_fraction(freq),
        "n_samples": float(codes.shape[0]),
        "n_units": float(codes.shape[1]),
    }


# --------------------------------------------------------------------------------------------------
# linear probe


@dataclass
class ProbeResult:
    """Outcome of ``linear_probe``.

    ``weight`` [D, C] and ``bias`` [C] act on the *raw* (unstandardised) features:
    ``logits = features @ weight + bias``.
    """

    test_accuracy: float
    train_accuracy: float
    train_loss: float
    n_iter: int
    sparse: bool
    weight: torch.Tensor
    bias: torch.Tensor

    def predict(self, features: torch.Tensor) -> torch.Tensor:
        """Predicted classes [N] of features [N, D]."""
        x = _flat(features, "features").to(self.weight.dtype)
        return (x @ self.weight.to(x.device) + self.bias.to(x.device)).argmax(dim=1)


SPARSE_DENSITY = 0.05
"""``linear_probe`` uses sparse products when at most this fraction of features is nonzero."""


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


def _csr_transpose(a: torch.Tensor) -> torch.Tensor:
    """Transpose of a CSR matrix [N, D] as a CSR matrix [D, N] (stable, hence deterministic)."""
    crow, col, val = a.crow_indices(), a.col_indices(), a.values()
    n, d = a.shape
    rows = torch.repeat_interleave(torch.arange(n, device=col.device), crow.diff())
    order = torch.argsort(col, stable=True)
    new_crow = torch.zeros(d + 1, dtype=crow.dtype, device=crow.device)
    new_crow[1:] = torch.bincount(col, minlength=d).cumsum(0)
    return torch.sparse_csr_tensor(new_crow, rows[order].to(crow.dtype), val[order], (d, n))


def _products(x: torch.Tensor, sparse: bool) -> tuple[Callable, Callable]:
    """The two products L-BFGS needs, for features x [N, D]: w [D, C] -> x w, g [N, C] -> xᵀ g."""
    if not sparse:
        return (lambda w: x @ w), (lambda g: (g.T @ x).T)  # gᵀx is the faster layout
    with warnings.catch_warnings():  # torch flags sparse CSR support as beta
        warnings.simplefilter("ignore", UserWarning)
        xs = x.to_sparse_csr()
        xt = _csr_transpose(xs)
    return (lambda w: xs @ w), (lambda g: xt @ g)


def _accuracy(x: torch.Tensor, y: torch.Tensor, w: torch.Tensor, b: torch.Tensor,
              chunk: int = 16384) -> float:
    correct = 0
    for i in range(0, x.shape[0], chunk):
        logits = x[i:i + chunk].to(device=w.device, dtype=w.dtype) @ w + b
        correct += int((logits.argmax(dim=1) == y[i:i + chunk].to(w.device)).sum())
    return correct / max(x.shape[0], 1)


def linear_probe(
    train_features: torch.Tensor,
    train_labels: torch.Tensor,
    test_features: torch.Tensor,
    test_labels: torch.Tensor,
    *,
    seed: int = 0,
    max_iter: int = 200,
    weight_decay: float = 1e-3,
    standardize: bool = True,
    n_classes: int | None = None,
    sparse: bool | None = None,
    history_size: int = 20,
    dtype: torch.dtype = torch.float32,
) -> ProbeResult:
    """Linear probe: multinomial logistic regression on train features, scored on test features.

    Minimises, over W [D, C] and b [C],

        (1/N) Σ_n CE(softmax(z_n W + b), y_n) + (weight_decay / 2) ‖W‖²_F,

    where z_n are the features standardised with the *train* mean and (population) std (constant
    features get std 1, so they never produce NaN; ``standardize=False`` uses the raw features).
    The bias is not penalised. The problem is convex; it is solved full-batch with L-BFGS
    (strong-Wolfe line search) for at most ``max_iter`` iterations, with the gradient written out
    (softmax − one-hot) rather than taken by autograd. Standardisation is folded into the weights
    (z W + b = x (W/σ) + b − (μ/σ) W), so no standardised copy of the features is made and sparse
    codes stay sparse: when at most ``SPARSE_DENSITY`` of the train features are nonzero (or
    ``sparse=True``), the products run on CSR copies of x and xᵀ, several times faster for SAE
    codes. ``seed`` seeds the small random initial weights through a private generator (the global
    RNG is untouched); the same inputs and seed give identical results on CPU.

    The defaults (weight_decay 1e-3, max_iter 200) put the raw-pixel baseline close to the
    published multinomial logistic regression numbers (92.6 % MNIST, 84.6 % Fashion-MNIST).
    The raw-pixel baseline (also available as ``raw_pixel_baseline``) is this same function on
    pixels::

        from sae.data import load_arrays, to_float
        a = load_arrays("mnist")
        baseline = linear_probe(to_float(a.train_images), torch.from_numpy(a.train_labels),
                                to_float(a.test_images), torch.from_numpy(a.test_labels))
        baseline.test_accuracy  # ≈ 0.927

    and an SAE's probe is the same call on its train-set and test-set codes.

    Args:
        train_features: [N, D] (or [N, *image]) features of the training set.
        train_labels: [N] integer labels.
        test_features: [M, D] features of the test set.
        test_labels: [M] integer labels.
        seed: seed of the initial weights.
        max_iter: maximum L-BFGS iterations.
        weight_decay: L2 penalty on the weights of the standardised features (see formula).
        standardize: standardise features with train statistics first.
        n_classes: C; default 1 + the largest label seen.
        sparse: use sparse products; default (None) decides by the density of the train features.
        history_size: L-BFGS memory.
        dtype: dtype of the optimisation (float32 or float64).

    Returns:
        ``ProbeResult`` with train / test accuracy, final training objective, iterations used,
        whether sparse products were used, and the weights in raw feature space.
    """
    xtr, xte = _flat(train_features, "train_features"), _flat(test_features, "test_features")
    ytr = train_labels.reshape(-1).to(device=xtr.device, dtype=torch.long)
    yte = test_labels.reshape(-1).to(device=xte.device, dtype=torch.long)
    if xtr.shape[0] != ytr.shape[0] or xte.shape[0] != yte.shape[0]:
        raise ValueError("features and labels differ in length")
    if xtr.shape[1] != xte.shape[1]:
        raise ValueError(f"train has {xtr.shape[1]} features, test {xte.shape[1]}")
    if xtr.shape[0] == 0:
        raise ValueError("linear_probe needs at least one training sample")
    if n_classes is None:
        n_classes = 1 + max(int(ytr.max()), int(yte.max()) if yte.numel() else 0)
    for y in (ytr, yte):
        if y.numel() and (int(y.min()) < 0 or int(y.max()) >= n_classes):
            raise ValueError(f"labels must lie in [0, {n_classes})")
    xtr = xtr.to(dtype)  # no copy when already in dtype
    n, d = xtr.shape

    if standardize:
        mean, std = _column_mean_std(xtr)
        scale, shift = (1.0 / std).to(dtype), (mean / std).to(dtype)
    else:
        scale = torch.ones(d, dtype=dtype, device=xtr.device)
        shift = torch.zeros(d, dtype=dtype, device=xtr.device)
    if sparse is None:
        density = int(xtr.count_nonzero()) / max(xtr.numel(), 1)
        sparse = xtr.device.type == "cpu" and density <= SPARSE_DENSITY
    forward, backward = _products(xtr, sparse)

    gen = torch.Generator().manual_seed(seed)
    w0 = torch.randn(d, n_classes, generator=gen, dtype=torch.float64) * (0.01 / math.sqrt(d))
    w = w0.to(device=xtr.device, dtype=dtype).requires_grad_(True)
    b = torch.zeros(n_classes, device=xtr.device, dtype=dtype, requires_grad=True)
    target = ytr.unsqueeze(1)  # [N, 1]
    minus_one = torch.full((n, 1), -1.0, dtype=dtype, device=xtr.device)

    def raw_params() -> tuple[torch.Tensor, torch.Tensor]:
        # z W + b with z = (x − μ)/σ equals x (W/σ) + (b − (μ/σ) W)
        return w * scale.unsqueeze(1), b - shift @ w

    def objective() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Loss, dLoss/dW [D, C], dLoss/db [C]."""
        w_raw, b_raw = raw_params()
        log_p = torch.log_softmax(forward(w_raw) + b_raw, dim=1)  # [N, C]
        loss = -log_p.gather(1, target).sum() / n + 0.5 * weight_decay * w.square().sum()
        g = log_p.exp_().scatter_add_(1, target, minus_one).div_(n)  # dLoss/dlogits [N, C]
        g_b = g.sum(dim=0)
        g_w = backward(g) * scale.unsqueeze(1) - shift.unsqueeze(1) * g_b + weight_decay * w
        return loss, g_w.contiguous(), g_b

    opt = torch.optim.LBFGS(
        [w, b], lr=1.0, max_iter=max_iter, history_size=history_size,
        line_search_fn="strong_wolfe", tolerance_grad=1e-7, tolerance_change=1e-12)

    def closure() -> torch.Tensor:
        with torch.no_grad():
            loss, w.grad, b.grad = objective()
        return loss

    opt.step(closure)
    with torch.no_grad():
        loss = float(objective()[0])
        w_raw, b_raw = raw_params()
        return ProbeResult(
            test_accuracy=_accuracy(xte, yte, w_raw, b_raw),
            train_accuracy=_accuracy(xtr, ytr, w_raw, b_raw),
            train_loss=loss,
            n_iter=int(opt.state[w].get("n_iter", 0)),
            sparse=sparse,
            weight=w_raw.clone(),
            bias=b_raw.clone(),
        )


raw_pixel_baseline = linear_probe
"""The raw-pixel baseline row: ``linear_probe`` called on flattened pixels instead of codes."""
