"""Linear probes: ``linear_probe`` fits a linear classifier (softmax or sparsemax loss) on
train-set features and reports its accuracy on test-set features; the raw-pixel baseline is the
same function on pixels.

Minimises, over W [D, C] and b [C],

    (1/N) Σ_n L(z_n W + b; y_n) + (weight_decay / 2) ‖W‖²_F,

where L is a Fenchel–Young loss (see :func:`probe_loss`): the cross-entropy of softmax
(``"softmax"``, multinomial logistic regression) or the sparsemax loss (``"sparsemax"``, whose
class probabilities have exact zeros), and z_n are the features
standardised with the *train* mean and (population) std (constant features get std 1, so they
never produce NaN; ``standardize=False`` uses the raw features). The bias is not penalised.

The problem is strongly convex; it is solved full-batch with L-BFGS-B (scipy) in float64,
until the largest entry of the objective's gradient is at most ``tol`` or after ``max_iter``
iterations. The default ``tol``, 1e-4 on the gradient of the *mean* loss (the convention of
scikit-learn's L-BFGS logistic regression), stops where the test accuracy has settled: a
tighter one costs several times the iterations and moves it by a few test inputs at most
(docs/metrics.md gives the measurements). The gradient is written out (p − one-hot in the
logits, for either loss) rather than taken by autograd. Standardisation is folded into the
weights (z W + b = x (W/σ) + b − (μ/σ) W), so no
standardised copy of the features is made and sparse codes stay sparse: when at most
``SPARSE_DENSITY`` of the train features are nonzero (or ``sparse=True``), each objective
evaluation is one compiled pass over a CSR copy of x (logits, loss and both gradients row by
row, in fixed row blocks shared among ``torch.get_num_threads()`` threads); otherwise two
dense matrix products in ``dtype`` around a compiled loss loop. The work runs on the CPU;
the weights come back there. ``seed`` seeds the small random initial weights through a private
generator (the global RNG is untouched); the same inputs and seed give identical results on a
given machine, whatever the number of threads.

The defaults (weight_decay 1e-3) put the raw-pixel baseline close to the published
accuracies of multinomial logistic regression on both datasets (quoted in docs/metrics.md).
The raw-pixel baseline (``raw_pixel_baseline``, an alias of ``linear_probe``) is the same
fit on pixels::

    from sae.data.images import load_arrays, to_float
    a = load_arrays("mnist")
    baseline = linear_probe(to_float(a.train_images), torch.from_numpy(a.train_labels),
                            to_float(a.test_images), torch.from_numpy(a.test_labels))
    baseline.test_accuracy

and an SAE's probe is the same call on its train-set and test-set codes.

Large sums are accumulated in float64 (float32 on devices without float64 support).
"""

from __future__ import annotations

import math
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import torch

from sae import activations
from sae.metrics.basic import _column_mean_std, _flat
from sae.settings.config import PROBE_LOSSES
from sae.system.process import stop_signals_to_main_thread

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
    loss: str = "softmax"
    test_support: float = float("nan")
    """Mean number of classes with nonzero probability on the test set (C under softmax)."""

    def predict(self, features: torch.Tensor) -> torch.Tensor:
        """Predicted classes [N] of features [N, D]."""
        x = _flat(features, "features").to(self.weight.dtype)
        return (x @ self.weight.to(x.device) + self.bias.to(x.device)).argmax(dim=1)


SPARSE_DENSITY = 0.25
"""``linear_probe`` runs its products on a CSR copy of the train features when at most this
fraction of them is nonzero (SAE codes), as dense matrix products otherwise (pixels)."""

_PROBE_BLOCKS = 8
"""Row blocks of the sparse objective: fixed, so that the sums, hence the results, do not depend
on how many threads share the blocks."""

_DENSE_ROWS = 4096
"""Rows per block of the dense objective (8 MiB of float32 features at 512 columns)."""


def probe_probabilities(logits: torch.Tensor, loss: str) -> torch.Tensor:
    """Class probabilities [N, C] of logits [N, C]: softmax, or sparsemax (exact zeros)."""
    if loss == "softmax":
        return torch.softmax(logits, dim=1)
    if loss == "sparsemax":
        return activations.sparsemax(logits, dim=1)
    raise ValueError(f"probe loss must be one of {', '.join(PROBE_LOSSES)}, not {loss!r}")


def probe_loss(logits: torch.Tensor, target: torch.Tensor, loss: str
               ) -> tuple[torch.Tensor, torch.Tensor]:
    r"""Per-sample loss [N] of logits [N, C] against integer targets [N], and its gradient [N, C].

    Both losses are Fenchel–Young losses :math:`L(z; y) = \Omega^*(z) + \Omega(e_y) - z_y`
    (Blondel, Martins & Niculae, 2020), whose gradient is :math:`p(z) - e_y`:

    - ``softmax``: Ω the negative entropy; :math:`L = \log\sum_j e^{z_j} - z_y` (cross-entropy),
      p = softmax(z).
    - ``sparsemax`` (Martins & Astudillo, 2016): Ω(p) = ½‖p‖²;
      :math:`L = \tfrac12 \sum_{j \in S}(z_j^2 - \tau^2) + \tfrac12 - z_y` with S and τ the
      support and threshold of p = sparsemax(z). L ≥ 0, and L = 0 exactly when p = e_y, which a
      finite margin reaches: unlike cross-entropy, the loss stops pushing once the true class
      leads the others by 1.

    This is the reference definition; ``linear_probe`` evaluates the same losses in compiled
    loops, which the tests hold equal to it.
    """
    target = target.reshape(-1, 1).to(torch.long)
    p = probe_probabilities(logits, loss)
    if loss == "softmax":
        per_sample = torch.logsumexp(logits, dim=1) - logits.gather(1, target).squeeze(1)
    else:
        # ⟨p, z⟩ − ½‖p‖² = ½ Σ_S (z_j² − τ²), written without τ
        per_sample = (p * logits).sum(1) - 0.5 * p.square().sum(1) + 0.5 \
            - logits.gather(1, target).squeeze(1)
    grad = p.scatter_add(1, target, torch.full_like(target, -1, dtype=p.dtype))
    return per_sample, grad


# The probe's loops, compiled by numba on first use (and cached on disk). They are plain functions
# here so that numba finds the row loss as a module global, which keeps its disk cache valid.
_probe_kernel_cache: dict = {}


def _probe_row_loss(z, y, sparsemax, g, buf):  # pragma: no cover - compiled
    """Loss of one logit row z [C] at class y; writes its gradient p − e_y into g [C]."""
    n_classes = z.shape[0]
    if sparsemax:
        for c in range(n_classes):  # insertion sort into buf, descending: C is small
            v = z[c]
            k = c
            while k > 0 and buf[k - 1] < v:
                buf[k] = buf[k - 1]
                k -= 1
            buf[k] = v
        cum, tau = 0.0, 0.0
        for k in range(n_classes):  # the support is the largest prefix with 1 + k z_(k) > Σ
            cum += buf[k]
            if 1.0 + (k + 1) * buf[k] > cum:
                tau = (cum - 1.0) / (k + 1)
        loss = 0.5 - z[y]
        for c in range(n_classes):
            p = max(z[c] - tau, 0.0)
            loss += p * z[c] - 0.5 * p * p  # ⟨p, z⟩ − ½‖p‖², as in probe_loss
            g[c] = p
    else:
        m = z[0]
        for c in range(1, n_classes):
            m = max(m, z[c])
        total = 0.0
        for c in range(n_classes):
            g[c] = math.exp(z[c] - m)
            total += g[c]
        for c in range(n_classes):
            g[c] /= total
        loss = m + math.log(total) - z[y]
    g[y] -= 1.0
    return loss


def _probe_dense_rows(logits, y, sparsemax, grad):  # pragma: no cover - compiled
    """Σ_n L(logits_n; y_n) over the rows of logits [N, C]; writes p − e_y into grad [N, C]."""
    buf = np.empty(logits.shape[1])
    total = 0.0
    for i in range(logits.shape[0]):
        total += _probe_row_loss_kernel(logits[i], y[i], sparsemax, grad[i], buf)
    return total


def _probe_csr_rows(indptr, indices, data, lo, hi, y, w, b, sparsemax, gw, gb
                    ):  # pragma: no cover - compiled
    """Σ_n L(x_n w + b; y_n) over CSR rows lo..hi of x, without storing the logits.

    Overwrites gw [D, C] with Σ_n x_nᵀ (p_n − e_y) and gb [C] with Σ_n (p_n − e_y).
    """
    n_classes = w.shape[1]
    z, g, buf = np.empty(n_classes), np.empty(n_classes), np.empty(n_classes)
    gw[:] = 0.0
    gb[:] = 0.0
    total = 0.0
    for i in range(lo, hi):
        for c in range(n_classes):
            z[c] = b[c]
        for k in range(indptr[i], indptr[i + 1]):
            j, v = indices[k], data[k]
            for c in range(n_classes):
                z[c] += v * w[j, c]
        total += _probe_row_loss_kernel(z, y[i], sparsemax, g, buf)
        for c in range(n_classes):
            gb[c] += g[c]
        for k in range(indptr[i], indptr[i + 1]):
            j, v = indices[k], data[k]
            for c in range(n_classes):
                gw[j, c] += v * g[c]
    return total


def _probe_kernels() -> dict:
    """The compiled loops: ``dense`` (``_probe_dense_rows``) and ``csr`` (``_probe_csr_rows``)."""
    global _probe_row_loss_kernel
    if not _probe_kernel_cache:
        import numba  # slow to import: only where a probe is first fitted

        opts = {"nogil": True, "cache": True}
        _probe_row_loss_kernel = numba.njit(**opts)(_probe_row_loss)
        _probe_kernel_cache["dense"] = numba.njit(**opts)(_probe_dense_rows)
        _probe_kernel_cache["csr"] = numba.njit(**opts)(_probe_csr_rows)
    return _probe_kernel_cache


_probe_row_loss_kernel = None  # set by _probe_kernels


def _csr_mean_std(indices: np.ndarray, data: np.ndarray, n: int, d: int):
    """Column mean and population std (float64 [d] each) of an [n, d] matrix given by its
    nonzeros (CSR column ``indices`` and ``data``), as :func:`sae.metrics.basic._column_mean_std`
    defines them (a constant column gets std 1): Σ(x − μ)² = Σ_nonzero (x − μ)² + zeros · μ²."""
    values = data.astype(np.float64)
    mean = np.bincount(indices, weights=values, minlength=d) / n
    zeros = n - np.bincount(indices, minlength=d)
    dev = values - mean[indices]
    var = (np.bincount(indices, weights=dev * dev, minlength=d) + zeros * mean * mean) / n
    std = np.sqrt(var)
    return mean, np.where(std > 1e-12 * (1 + np.abs(mean)), std, 1.0)


class _ProbeProblem:
    """Train features, labels and standardisation, prepared once for any number of probe losses.

    ``objective(w, b, loss)`` returns Σ_n L(x_n w + b; y_n) over the raw features x and its
    gradients in w [D, C] and b [C], all float64 numpy. Sparse features run in one compiled pass
    per row block (blocks in parallel threads, summed in a fixed order); dense ones as two matrix
    products around a compiled loss loop.
    """

    def __init__(self, x: torch.Tensor, y: torch.Tensor, n_classes: int, standardize: bool,
                 sparse: bool | None, dtype: torch.dtype):
        x = x.detach().to(device="cpu", dtype=dtype)  # no copy when already there
        self.n, self.d = x.shape
        self.n_classes = n_classes
        self.y = y.detach().cpu().numpy().astype(np.int64)
        if sparse is None:
            sparse = int(x.count_nonzero()) <= SPARSE_DENSITY * max(x.numel(), 1)
        self.sparse = sparse
        self.kernels = _probe_kernels()
        if sparse:
            import scipy.sparse  # only for sparse features
            csr = scipy.sparse.csr_matrix(x.numpy())
            self.csr = (csr.indptr.astype(np.int64), csr.indices.astype(np.int64), csr.data)
            edges = [self.n * i // _PROBE_BLOCKS for i in range(_PROBE_BLOCKS + 1)]
            self.blocks = list(zip(edges[:-1], edges[1:], strict=True))
            self.gw = np.zeros((len(self.blocks), self.d, n_classes))
            self.gb = np.zeros((len(self.blocks), n_classes))
        else:
            self.x = x
        if not standardize:
            self.scale, self.shift = np.ones(self.d), np.zeros(self.d)
        else:
            if sparse:  # from the nonzeros alone: a pass over the dense rows costs more
                mean, std = _csr_mean_std(self.csr[1], self.csr[2], self.n, self.d)
            else:
                mean, std = (t.double().numpy() for t in _column_mean_std(x))
            self.scale, self.shift = 1.0 / std, mean / std
        self.dtype = dtype
        self.pool, self.pool_threads = None, 0

    def objective(self, w, b, loss: str):
        sparsemax = loss == "sparsemax"
        if not self.sparse:
            return self._dense_objective(w, b, sparsemax)
        kernel = self.kernels["csr"]

        def block(i: int) -> float:
            lo, hi = self.blocks[i]
            return kernel(*self.csr, lo, hi, self.y, w, b, sparsemax, self.gw[i], self.gb[i])

        threads = min(torch.get_num_threads(), len(self.blocks))
        if threads > 1:
            totals = list(self._pool(threads).map(block, range(len(self.blocks))))
        else:
            totals = [block(i) for i in range(len(self.blocks))]
        return math.fsum(totals), self.gw.sum(axis=0), self.gb.sum(axis=0)

    def _dense_objective(self, w, b, sparsemax: bool):
        """The objective of dense features, a row block at a time: the block's logits, loss and
        gradient while its rows are still in cache (the two products over all rows at once read
        the features from memory twice, at about half the speed). The products are taken as
        wᵀ xᵀ and gᵀ x, the layouts BLAS runs fastest for a [N, D] @ [D, C] with C this small."""
        wt = torch.from_numpy(np.ascontiguousarray(w.T)).to(self.dtype)  # [C, D]
        gw = torch.zeros(self.n_classes, self.d, dtype=torch.float64)
        gb, total = np.zeros(self.n_classes), 0.0
        for lo in range(0, self.n, _DENSE_ROWS):
            rows = self.x[lo:lo + _DENSE_ROWS]
            logits = (wt @ rows.T).T.double().numpy() + b  # [rows, C]
            grad = np.empty_like(logits)
            total += self.kernels["dense"](logits, self.y[lo:lo + _DENSE_ROWS], sparsemax, grad)
            gw += (torch.from_numpy(grad).to(self.dtype).T @ rows).double()
            gb += grad.sum(axis=0)
        return total, gw.T.numpy(), gb

    def _pool(self, threads: int):
        """The block threads, started once per problem rather than once per evaluation."""
        if self.pool is None or self.pool_threads != threads:
            self.close()
            self.pool = ThreadPoolExecutor(threads, initializer=stop_signals_to_main_thread)
            self.pool_threads = threads
        return self.pool

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown()
            self.pool = None


def _support(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, loss: str,
             chunk: int = 16384) -> float:
    """Mean number of classes with nonzero probability over the rows of x."""
    total = 0
    for i in range(0, x.shape[0], chunk):
        logits = x[i:i + chunk].to(device=w.device, dtype=w.dtype) @ w + b
        total += int((probe_probabilities(logits, loss) > 0).sum())
    return total / x.shape[0] if x.shape[0] else float("nan")


def _accuracy(x: torch.Tensor, y: torch.Tensor, w: torch.Tensor, b: torch.Tensor,
              chunk: int = 16384) -> float:
    correct = 0
    for i in range(0, x.shape[0], chunk):
        logits = x[i:i + chunk].to(device=w.device, dtype=w.dtype) @ w + b
        correct += int((logits.argmax(dim=1) == y[i:i + chunk].to(w.device)).sum())
    return correct / max(x.shape[0], 1)


def _fit_probe(problem: _ProbeProblem, loss: str, w0, *, weight_decay: float, max_iter: int,
               history_size: int, tol: float):
    """Minimise the probe objective of one loss from standardised weights w0 [D, C] (b = 0).

    Returns the weights [D, C] and bias [C] on the raw features, the objective and the
    iterations used (float64 numpy).
    """
    from scipy.optimize import minimize  # only where a probe is fitted

    n, d, c = problem.n, problem.d, problem.n_classes
    scale, shift = problem.scale, problem.shift

    def raw(theta):
        # z W + b with z = (x − μ)/σ equals x (W/σ) + (b − (μ/σ) W)
        w, b = theta[:d * c].reshape(d, c), theta[d * c:]
        return w, w * scale[:, None], b - shift @ w

    def fun(theta):
        w, w_raw, b_raw = raw(theta)
        total, g_raw, g_b = problem.objective(w_raw, b_raw, loss)
        g_b = g_b / n
        g_w = (g_raw / n) * scale[:, None] - shift[:, None] * g_b + weight_decay * w
        value = total / n + 0.5 * weight_decay * float(np.dot(w.ravel(), w.ravel()))
        return value, np.concatenate([g_w.ravel(), g_b])

    theta0 = np.concatenate([np.asarray(w0, dtype=np.float64).ravel(), np.zeros(c)])
    res = minimize(fun, theta0, jac=True, method="L-BFGS-B",
                   options={"maxcor": history_size, "maxiter": max_iter, "gtol": tol,
                            "ftol": 0.0})
    w, w_raw, b_raw = raw(res.x)
    return w_raw, b_raw, float(res.fun), int(res.nit)


def linear_probes(
    train_features: torch.Tensor,
    train_labels: torch.Tensor,
    test_features: torch.Tensor,
    test_labels: torch.Tensor,
    *,
    losses: tuple[str, ...] = PROBE_LOSSES,
    seed: int = 0,
    max_iter: int = 200,
    weight_decay: float = 1e-3,
    standardize: bool = True,
    n_classes: int | None = None,
    sparse: bool | None = None,
    history_size: int = 20,
    dtype: torch.dtype = torch.float32,
    tol: float = 1e-4,
) -> dict[str, ProbeResult]:
    """Linear probes: linear classifiers fitted on train features, scored on test features,
    one per loss in ``losses``, as the module's docstring states (the objective, the solver,
    the sparse pass, the defaults).

    Each loss is fitted from the same start on one preparation of the features (the checks, the
    standardisation statistics and the CSR copy are shared), so that each result equals the
    one-loss call ``linear_probe(..., loss=loss)`` with the same arguments.

    Args:
        train_features: [N, D] (or [N, *image]) features of the training set.
        train_labels: [N] integer labels.
        test_features: [M, D] features of the test set.
        test_labels: [M] integer labels.
        losses: the losses to fit, each ``"softmax"`` or ``"sparsemax"`` (:data:`PROBE_LOSSES`).
        seed: seed of the initial weights.
        max_iter: maximum L-BFGS iterations.
        weight_decay: L2 penalty on the weights of the standardised features (see formula).
        standardize: standardise features with train statistics first.
        n_classes: C; default 1 + the largest label seen.
        sparse: use the sparse pass; default (None) decides by the density of the train features.
        history_size: L-BFGS memory.
        dtype: dtype of the features in the dense products and of the returned weights.
        tol: stop once no entry of the objective's gradient exceeds this.

    Returns:
        loss -> ``ProbeResult`` with train / test accuracy, final training objective,
        iterations used, whether the sparse pass was used, the weights in raw feature space, and
        the mean number of classes with nonzero test probability.
    """
    xtr, ytr, xte, yte, n_classes = _probe_data(train_features, train_labels, test_features,
                                                test_labels, losses, n_classes)
    problem = _ProbeProblem(xtr, ytr, n_classes, standardize, sparse, dtype)
    d = problem.d
    gen = torch.Generator().manual_seed(seed)
    w0 = (torch.randn(d, n_classes, generator=gen, dtype=torch.float64)
          * (0.01 / math.sqrt(d))).numpy()
    fits = {}
    try:
        for loss in losses:
            fits[loss] = _fit_probe(problem, loss, w0, weight_decay=weight_decay,
                                    max_iter=max_iter, history_size=history_size, tol=tol)
    finally:
        problem.close()
    xtr_cpu, ytr_cpu = xtr.detach().cpu(), ytr.cpu()
    xte_cpu, yte_cpu = xte.detach().cpu(), yte.cpu()
    results = {}
    for loss, (w_raw, b_raw, value, n_iter) in fits.items():
        w, b = torch.from_numpy(w_raw).to(dtype), torch.from_numpy(b_raw).to(dtype)
        results[loss] = ProbeResult(
            test_accuracy=_accuracy(xte_cpu, yte_cpu, w, b),
            train_accuracy=_accuracy(xtr_cpu, ytr_cpu, w, b),
            train_loss=value, n_iter=n_iter, sparse=problem.sparse, weight=w, bias=b,
            loss=loss, test_support=_support(xte_cpu, w, b, loss))
    return results


def _probe_data(train_features, train_labels, test_features, test_labels, losses, n_classes):
    """(train x [N, D], train y, test x, test y, C) of :func:`linear_probes`, checked."""
    for loss in losses:
        if loss not in PROBE_LOSSES:
            raise ValueError(f"probe loss must be one of {', '.join(PROBE_LOSSES)}, not {loss!r}")
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
    return xtr, ytr, xte, yte, n_classes


def linear_probe(
    train_features: torch.Tensor,
    train_labels: torch.Tensor,
    test_features: torch.Tensor,
    test_labels: torch.Tensor,
    *,
    loss: str = "softmax",
    **options,
) -> ProbeResult:
    """Linear probe under one loss (``"softmax"``, multinomial logistic regression, or
    ``"sparsemax"``): ``linear_probes(..., losses=(loss,), **options)[loss]``.

    The objective, the solver and the options (``seed``, ``max_iter``, ``weight_decay``,
    ``standardize``, ``n_classes``, ``sparse``, ``history_size``, ``dtype``, ``tol``) are those of
    :func:`linear_probes`. The raw-pixel baseline (``raw_pixel_baseline``) is this function on
    flattened pixels, an SAE's probe the same call on its train-set and test-set codes.
    """
    if loss not in PROBE_LOSSES:
        raise ValueError(f"probe loss must be one of {', '.join(PROBE_LOSSES)}, not {loss!r}")
    return linear_probes(train_features, train_labels, test_features, test_labels,
                         losses=(loss,), **options)[loss]


raw_pixel_baseline = linear_probe
"""The raw-pixel baseline row: ``linear_probe`` called on flattened pixels instead of codes."""
