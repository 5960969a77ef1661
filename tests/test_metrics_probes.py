"""sae.metrics' linear probes: the probe, its losses (softmax and sparsemax) and its solver."""

from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from sae import metrics as M


def data_dir() -> Path:
    env = os.environ.get("SAE_DATA_DIR")
    return Path(env) if env else Path(__file__).resolve().parents[2] / "shared" / "datasets"


# ------------------------------------------------------------------------------------------------
# linear probe


def blobs(n_per_class: int, n_classes: int, dim: int, spread: float, seed: int, draw: int = 0):
    """Gaussian blobs around random centres (fixed by ``seed``), one sample per ``draw``.

    Returns features [N, dim] and labels [N]; a train and a test set share ``seed``, not ``draw``.
    """
    centres = torch.randn(n_classes, dim, generator=torch.Generator().manual_seed(seed)) * 10
    g = torch.Generator().manual_seed(10_000 * (seed + 1) + draw)
    labels = torch.arange(n_classes).repeat_interleave(n_per_class)
    feats = centres[labels] + spread * torch.randn(len(labels), dim, generator=g)
    perm = torch.randperm(len(labels), generator=g)
    return feats[perm], labels[perm]


@settings(max_examples=60, deadline=None)
@given(arrays(np.float32, st.tuples(st.integers(1, 40), st.integers(1, 12)),
              elements=st.sampled_from([0.0, 0.0, 0.0, 1.0, -2.5, 0.125, 3e4])))
def test_sparse_probe_standardisation_is_the_dense_one(x):
    """The sparse probe's column mean and std, taken from the nonzeros alone, are those of the
    whole matrix (float64), with std 1 for a constant column as in the dense path."""
    import scipy.sparse

    from sae.metrics.probes import _csr_mean_std

    csr = scipy.sparse.csr_matrix(x)
    mean, std = _csr_mean_std(csr.indices.astype(np.int64), csr.data, *x.shape)
    dense = x.astype(np.float64)
    np.testing.assert_allclose(mean, dense.mean(0), rtol=1e-12, atol=1e-12)
    want = dense.std(0)
    constant = want <= 1e-12 * (1 + np.abs(dense.mean(0)))
    np.testing.assert_allclose(std[~constant], want[~constant], rtol=1e-9)
    assert (std[constant] == 1.0).all()
    ref_mean, ref_std = (t.double().numpy() for t in M.basic._column_mean_std(torch.from_numpy(x)))
    np.testing.assert_allclose(mean, ref_mean, rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(std, ref_std, rtol=1e-5, atol=1e-9)


def test_probe_separates_separable_classes():
    xtr, ytr = blobs(100, 10, 20, 1.0, seed=0)
    xte, yte = blobs(50, 10, 20, 1.0, seed=0, draw=1)
    r = M.linear_probe(xtr, ytr, xte, yte)
    assert r.train_accuracy >= 0.99
    assert r.test_accuracy >= 0.99
    assert r.weight.shape == (20, 10) and r.bias.shape == (10,)
    assert (r.predict(xte) == yte).float().mean().item() == pytest.approx(r.test_accuracy)


def test_probe_on_random_labels_is_near_chance():
    g = torch.Generator().manual_seed(4)
    xtr, xte = torch.randn(2000, 50, generator=g), torch.randn(2000, 50, generator=g)
    ytr = torch.randint(0, 10, (2000,), generator=g)
    yte = torch.randint(0, 10, (2000,), generator=g)
    r = M.linear_probe(xtr, ytr, xte, yte)
    # test labels are independent of everything: accuracy ~ Binomial(2000, 0.1) / 2000, sd 0.0067;
    # the band is ±4.5 sd around chance (0.1)
    assert 0.07 <= r.test_accuracy <= 0.13


def test_probe_is_deterministic_and_leaves_global_rng_alone():
    xtr, ytr = blobs(60, 5, 30, 40.0, seed=1)  # overlapping blobs: the optimum is not trivial
    xte, yte = blobs(40, 5, 30, 40.0, seed=1, draw=1)
    state = torch.random.get_rng_state()
    a = M.linear_probe(xtr, ytr, xte, yte, seed=7)
    b = M.linear_probe(xtr, ytr, xte, yte, seed=7)
    assert torch.equal(torch.random.get_rng_state(), state)
    assert a.test_accuracy == b.test_accuracy and a.train_accuracy == b.train_accuracy
    assert torch.equal(a.weight, b.weight) and torch.equal(a.bias, b.bias)
    assert 0.2 < a.test_accuracy < 1.0


def test_probe_constant_features_do_not_produce_nan():
    xtr, ytr = blobs(50, 3, 5, 1.0, seed=2)
    xte, yte = blobs(20, 3, 5, 1.0, seed=2, draw=1)

    def pad(x):
        return torch.cat([torch.zeros(len(x), 2), torch.full((len(x), 1), 5.0), x], dim=1)

    r = M.linear_probe(pad(xtr), ytr, pad(xte), yte)
    assert math.isfinite(r.train_loss)
    assert bool(torch.isfinite(r.weight).all() and torch.isfinite(r.bias).all())
    assert r.test_accuracy >= 0.99


def test_probe_standardization_makes_it_scale_invariant():
    xtr, ytr = blobs(60, 4, 10, 20.0, seed=3)
    xte, yte = blobs(40, 4, 10, 20.0, seed=3, draw=1)
    scale = torch.logspace(-3, 3, 10)
    a = M.linear_probe(xtr, ytr, xte, yte)
    b = M.linear_probe(xtr * scale, ytr, xte * scale, yte)
    c = M.linear_probe(xtr, ytr, xte, yte, dtype=torch.float64)
    assert abs(a.test_accuracy - b.test_accuracy) <= 0.02
    assert a.train_loss == pytest.approx(b.train_loss, rel=1e-4)
    assert a.train_loss == pytest.approx(c.train_loss, rel=1e-4)
    assert c.weight.dtype == torch.float64


def test_probe_without_standardization():
    xtr, ytr = blobs(50, 3, 5, 1.0, seed=5)
    xte, yte = blobs(20, 3, 5, 1.0, seed=5, draw=1)
    r = M.linear_probe(xtr, ytr, xte, yte, standardize=False)
    assert r.test_accuracy >= 0.99


def test_probe_rejects_mismatched_inputs():
    with pytest.raises(ValueError):
        M.linear_probe(torch.zeros(4, 3), torch.zeros(5), torch.zeros(2, 3), torch.zeros(2))
    with pytest.raises(ValueError):
        M.linear_probe(torch.zeros(4, 3), torch.zeros(4), torch.zeros(2, 4), torch.zeros(2))
    with pytest.raises(ValueError):
        M.linear_probe(torch.zeros(4, 3), torch.tensor([0, 1, 2, -1]), torch.zeros(2, 3),
                       torch.zeros(2))
    with pytest.raises(ValueError):
        M.linear_probe(torch.zeros(4, 3), torch.tensor([0, 1, 2, 3]), torch.zeros(2, 3),
                       torch.zeros(2), n_classes=3)


@pytest.mark.slow
def test_probe_on_mnist_pixels_subset():
    folder = data_dir()
    if not (folder / "mnist").is_dir():
        pytest.skip(f"no MNIST files under {folder}")
    from sae.data.images import load_arrays, to_float

    a = load_arrays("mnist", data_dir=folder, download=False)
    xtr, ytr = to_float(a.train_images[:10000]), torch.from_numpy(a.train_labels[:10000])
    xte, yte = to_float(a.test_images[:2000]), torch.from_numpy(a.test_labels[:2000])
    r = M.raw_pixel_baseline(xtr, ytr, xte, yte, max_iter=100)
    # logistic regression on 10k MNIST images scores about 0.9; chance is 0.1
    assert r.test_accuracy > 0.85
    assert r.train_accuracy >= r.test_accuracy - 0.02


@pytest.mark.parametrize("loss", ["softmax", "sparsemax"])
def test_dense_probe_objective_over_row_blocks_is_the_whole_one(monkeypatch, loss):
    """The dense objective taken a row block at a time (blocks of 7 rows here, the last one
    short) is the sum and gradient of the per-row losses over all rows, as the sparse pass
    computes them from the same features."""
    from sae.metrics import probes

    monkeypatch.setattr(probes, "_DENSE_ROWS", 7)
    g = torch.Generator().manual_seed(2)
    x = torch.rand(52, 9, generator=g) * (torch.rand(52, 9, generator=g) < 0.5)
    y = torch.randint(0, 4, (52,), generator=g)
    w = torch.randn(9, 4, generator=g, dtype=torch.float64).numpy()
    b = torch.randn(4, generator=g, dtype=torch.float64).numpy()
    dense = probes._ProbeProblem(x, y, 4, False, False, torch.float32)
    sparse = probes._ProbeProblem(x, y, 4, False, True, torch.float32)
    total, gw, gb = dense.objective(w, b, loss)
    want_total, want_gw, want_gb = sparse.objective(w, b, loss)
    sparse.close()
    assert gw.shape == (9, 4) and gb.shape == (4,)
    assert total == pytest.approx(want_total, rel=1e-6)
    np.testing.assert_allclose(gw, want_gw, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(gb, want_gb, rtol=1e-5, atol=1e-6)


def test_probe_sparse_products_match_dense():
    # sparse non-negative codes: each class switches on its own few units out of 200
    g = torch.Generator().manual_seed(6)
    labels = torch.randint(0, 5, (600,), generator=g)
    owner = torch.arange(200) % 5
    on = (owner[None, :] == labels[:, None]) & (torch.rand(600, 200, generator=g) < 0.15)
    codes = torch.where(on, torch.rand(600, 200, generator=g) + 0.5, torch.zeros(()))
    noise = torch.rand(600, 200, generator=g) < 0.005  # a few units firing off-class
    codes = codes + noise * torch.rand(600, 200, generator=g)
    assert float((codes != 0).float().mean()) <= M.SPARSE_DENSITY
    xtr, ytr, xte, yte = codes[:400], labels[:400], codes[400:], labels[400:]
    auto = M.linear_probe(xtr, ytr, xte, yte)
    again = M.linear_probe(xtr, ytr, xte, yte)
    dense = M.linear_probe(xtr, ytr, xte, yte, sparse=False)
    assert auto.sparse and not dense.sparse
    assert torch.equal(auto.weight, again.weight)
    assert auto.train_loss == pytest.approx(dense.train_loss, rel=1e-3, abs=1e-4)
    assert abs(auto.test_accuracy - dense.test_accuracy) <= 0.01
    assert auto.test_accuracy >= 0.9


# ------------------------------------------------------------------------------------------------
# the probe losses (Fenchel–Young): softmax cross-entropy and the sparsemax loss


def sparsemax_loss_reference(z: np.ndarray, y: int) -> tuple[float, np.ndarray]:
    """Martins & Astudillo (2016), eqs. for the sparsemax loss, by sorting, in float64."""
    s = np.sort(z)[::-1]
    cums = np.cumsum(s)
    ks = np.arange(1, len(z) + 1)
    k = ks[1 + ks * s > cums].max()
    tau = (cums[k - 1] - 1) / k
    p = np.maximum(z - tau, 0.0)
    support = z > tau
    loss = 0.5 * np.sum(z[support] ** 2 - tau**2) + 0.5 - z[y]
    grad = p.copy()
    grad[y] -= 1
    return float(loss), grad


logit_rows = arrays(np.float64, st.tuples(st.integers(1, 6), st.integers(2, 12)),
                    elements=st.floats(-5, 5, allow_nan=False, allow_infinity=False))


@settings(max_examples=80, deadline=None)
@given(logit_rows, st.data())
def test_sparsemax_loss_matches_float64_reference(z, data):
    y = np.array([data.draw(st.integers(0, z.shape[1] - 1)) for _ in range(z.shape[0])])
    loss, grad = M.probe_loss(torch.from_numpy(z), torch.from_numpy(y), "sparsemax")
    assert loss.dtype == torch.float64
    for i in range(z.shape[0]):
        ref_loss, ref_grad = sparsemax_loss_reference(z[i], int(y[i]))
        assert float(loss[i]) == pytest.approx(ref_loss, abs=1e-10)
        np.testing.assert_allclose(grad[i].numpy(), ref_grad, atol=1e-12)
    assert bool((loss >= -1e-12).all())  # a Fenchel–Young loss is non-negative
    np.testing.assert_allclose(grad.sum(1).numpy(), 0.0, atol=1e-12)  # p and e_y both sum to 1


@pytest.mark.parametrize("loss", ["softmax", "sparsemax"])
def test_probe_loss_gradient_is_the_derivative_of_the_loss(loss):
    g = torch.Generator().manual_seed(0)
    z = (3 * torch.randn(7, 5, generator=g, dtype=torch.float64)).requires_grad_(True)
    y = torch.randint(0, 5, (7,), generator=g)
    # gradcheck compares autograd with finite differences, and the written-out gradient
    # (p − onehot) with autograd
    assert torch.autograd.gradcheck(lambda t: M.probe_loss(t, y, loss)[0], (z,))
    value, grad = M.probe_loss(z, y, loss)
    (auto,) = torch.autograd.grad(value.sum(), z)
    torch.testing.assert_close(grad, auto, atol=1e-12, rtol=0)


def test_softmax_probe_loss_is_cross_entropy_and_sparsemax_loss_reaches_zero():
    g = torch.Generator().manual_seed(1)
    z, y = torch.randn(20, 10, generator=g, dtype=torch.float64), torch.randint(0, 10, (20,))
    loss, _ = M.probe_loss(z, y, "softmax")
    torch.testing.assert_close(loss, torch.nn.functional.cross_entropy(z, y, reduction="none"))
    # the sparsemax loss is exactly 0 once the true class leads every other by a margin of 1,
    # where cross-entropy is still positive
    z = torch.zeros(3, 4, dtype=torch.float64)
    y = torch.tensor([0, 2, 3])
    z[torch.arange(3), y] = torch.tensor([1.0, 1.5, 4.0], dtype=torch.float64)
    sparse, grad = M.probe_loss(z, y, "sparsemax")
    assert torch.equal(sparse, torch.zeros(3, dtype=torch.float64))
    assert torch.equal(grad, torch.zeros_like(grad))
    assert bool((M.probe_loss(z, y, "softmax")[0] > 0).all())
    with pytest.raises(ValueError, match="probe loss"):
        M.probe_loss(z, y, "hinge")


def test_sparsemax_probe_is_accurate_with_sparse_class_probabilities():
    xtr, ytr = blobs(100, 10, 20, 1.0, seed=0)
    xte, yte = blobs(50, 10, 20, 1.0, seed=0, draw=1)
    soft = M.linear_probe(xtr, ytr, xte, yte)
    sparse = M.linear_probe(xtr, ytr, xte, yte, loss="sparsemax")
    assert sparse.loss == "sparsemax" and soft.loss == "softmax"
    assert sparse.test_accuracy >= 0.99
    assert soft.test_support == 10.0  # softmax gives every class some probability
    assert 1.0 <= sparse.test_support < 2.0  # separable blobs: nearly always one class
    p = M.probe_probabilities(xte @ sparse.weight + sparse.bias, "sparsemax")
    assert float((p > 0).sum(1).double().mean()) == pytest.approx(sparse.test_support)
    torch.testing.assert_close(p.sum(1), torch.ones(len(p)))
    # overlapping blobs: the sparsemax probe keeps several classes where it is unsure
    xtr, ytr = blobs(60, 5, 30, 40.0, seed=1)
    xte, yte = blobs(40, 5, 30, 40.0, seed=1, draw=1)
    unsure = M.linear_probe(xtr, ytr, xte, yte, loss="sparsemax")
    assert unsure.test_support > sparse.test_support
    with pytest.raises(ValueError, match="probe loss"):
        M.linear_probe(xtr, ytr, xte, yte, loss="hinge")


# ------------------------------------------------------------------------------------------------
# the probe solver: against the previous solver, the reference loss, and itself


def sae_like_codes(n: int, draw: int, units: int = 256, k: int = 20, classes: int = 10):
    """Non-negative codes with k of ``units`` firing per row, like an SAE's, and their labels.

    Each class prefers its own 40 units (they overlap between classes); a row draws about half
    its units among its class's and the rest anywhere, so that classes are separable only in
    part. The preferences are fixed; ``draw`` picks the rows.
    """
    prefs = torch.stack([torch.randperm(units, generator=torch.Generator().manual_seed(c))[:40]
                         for c in range(classes)])
    g = torch.Generator().manual_seed(1_000 + draw)
    labels = torch.randint(0, classes, (n,), generator=g)
    own = prefs[labels][torch.arange(n)[:, None], torch.randint(0, 40, (n, k // 2), generator=g)]
    anywhere = torch.randint(0, units, (n, k - k // 2), generator=g)
    codes = torch.zeros(n, units)
    idx = torch.cat([own, anywhere], dim=1)
    codes.scatter_(1, idx, torch.empty(n, k).exponential_(generator=g))
    return codes, labels


# The previous solver (torch.optim.LBFGS on float32 dense products, strong-Wolfe line search,
# defaults: weight decay 1e-3, at most 200 iterations) scored these codes once, with seed 0:
# sae_like_codes(6000, 0) for training, sae_like_codes(2000, 1) for testing.
PREVIOUS_PROBE_ACCURACY = {"softmax": 0.837, "sparsemax": 0.8125}


def test_probe_matches_previous_solver_accuracy():
    xtr, ytr = sae_like_codes(6000, 0)
    xte, yte = sae_like_codes(2000, 1)
    probes = M.linear_probes(xtr, ytr, xte, yte)
    assert set(probes) == set(M.PROBE_LOSSES)
    for loss, previous in PREVIOUS_PROBE_ACCURACY.items():
        assert probes[loss].sparse and probes[loss].loss == loss
        # within 0.1 point (2 of the 2 000 test rows), inclusive
        assert abs(probes[loss].test_accuracy - previous) <= 0.001 + 1e-12


@pytest.mark.parametrize("sparse", [True, False])
@pytest.mark.parametrize("loss", M.PROBE_LOSSES)
def test_probe_reaches_the_optimum_of_the_reference_objective(loss, sparse):
    # the objective rebuilt from probe_loss and autograd in float64: the compiled loops compute
    # the same value, and the solver stops where the gradient's largest entry is below tol
    xtr, ytr = sae_like_codes(1500, 2)
    xte, yte = sae_like_codes(200, 3)
    x = xtr.double()
    mean, std = x.mean(0), x.std(0, unbiased=False)
    std = torch.where(std > 0, std, torch.ones_like(std))
    for tol in (1e-4, 3e-6):  # the default, and one that reaches the optimum closely
        r = M.linear_probe(xtr, ytr, xte, yte, loss=loss, sparse=sparse, dtype=torch.float64,
                           tol=tol)
        assert r.sparse == sparse and r.n_iter < 200
        w = (r.weight * std[:, None]).detach().requires_grad_(True)  # on standardised features
        b = (r.bias + (mean / std) @ (r.weight * std[:, None])).detach().requires_grad_(True)
        logits = ((x - mean) / std) @ w + b
        value = M.probe_loss(logits, ytr, loss)[0].mean() + 0.5 * 1e-3 * w.square().sum()
        value.backward()
        assert r.train_loss == pytest.approx(float(value.detach()), rel=1e-9)
        # the solver's own gradient is the rebuilt one up to float64 rounding
        assert float(w.grad.abs().max()) <= 1.01 * tol and float(b.grad.abs().max()) <= 1.01 * tol


def test_probes_equal_single_calls_and_do_not_depend_on_threads():
    xtr, ytr = sae_like_codes(2000, 4)
    xte, yte = sae_like_codes(300, 5)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        both = M.linear_probes(xtr, ytr, xte, yte, seed=3)
        torch.set_num_threads(1)
        one_thread = M.linear_probes(xtr, ytr, xte, yte, seed=3)
    finally:
        torch.set_num_threads(threads)
    for loss in M.PROBE_LOSSES:
        single = M.linear_probe(xtr, ytr, xte, yte, seed=3, loss=loss)
        for other in (single, one_thread[loss]):
            assert torch.equal(both[loss].weight, other.weight)
            assert torch.equal(both[loss].bias, other.bias)
            assert both[loss].train_loss == other.train_loss
            assert both[loss].n_iter == other.n_iter
            assert both[loss].test_accuracy == other.test_accuracy
    with pytest.raises(ValueError, match="probe loss"):
        M.linear_probes(xtr, ytr, xte, yte, losses=("softmax", "hinge"))
