"""Tests of sae.metrics: each metric against its written definition, by hand and by property."""

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
from sae.metrics import dynamic


def data_dir() -> Path:
    env = os.environ.get("SAE_DATA_DIR")
    return Path(env) if env else Path(__file__).resolve().parents[2] / "shared" / "datasets"


def t(a) -> torch.Tensor:
    return torch.tensor(a, dtype=torch.float32)


finite = st.floats(-10, 10, allow_nan=False, allow_infinity=False, width=32)


def matrices(min_rows=2, max_rows=12, min_cols=1, max_cols=10, elements=finite):
    shapes = st.tuples(st.integers(min_rows, max_rows), st.integers(min_cols, max_cols))
    return arrays(np.float32, shapes, elements=elements)


# ------------------------------------------------------------------------------------------------
# reconstruction metrics


def test_mse_by_hand():
    x = t([[0.0, 1.0], [2.0, 3.0]])
    x_hat = t([[1.0, 1.0], [2.0, 5.0]])
    # squared errors 1, 0, 0, 4 over 4 entries
    assert M.mse(x, x_hat) == pytest.approx(5 / 4)


def test_fvu_and_recon_bias_by_hand():
    x = t([[0.0, 0.0], [2.0, 2.0]])
    mean = t([1.0, 1.0])
    x_hat = t([[0.0, 1.0], [3.0, 2.0]])
    # x − x̄ = [[-1, -1], [1, 1]], x̂ − x̄ = [[-1, 0], [2, 1]]
    # Σ‖x − x̂‖² = 1 + 1 = 2; Σ‖x − x̄‖² = 4; Σ‖x̂ − x̄‖² = 1 + 5 = 6; Σ⟨x̂ − x̄, x − x̄⟩ = 1 + 3 = 4
    assert M.fvu(x, x_hat, mean) == pytest.approx(2 / 4)
    assert M.recon_bias(x, x_hat, mean) == pytest.approx(6 / 4)


def test_predicting_the_mean_gives_fvu_one_and_undefined_recon_bias():
    g = torch.Generator().manual_seed(0)
    x = torch.rand(50, 16, generator=g)
    mean = x.mean(0)
    x_hat = mean.expand_as(x)
    assert M.fvu(x, x_hat, mean) == pytest.approx(1.0, abs=1e-6)
    assert math.isnan(M.recon_bias(x, x_hat, mean))  # 0 / 0


def test_perfect_reconstruction():
    g = torch.Generator().manual_seed(1)
    x = torch.rand(30, 12, generator=g)
    mean = x.mean(0)
    assert M.mse(x, x.clone()) == 0.0
    assert M.fvu(x, x.clone(), mean) == 0.0
    assert M.recon_bias(x, x.clone(), mean) == pytest.approx(1.0, abs=1e-9)


@settings(max_examples=40, deadline=None)
@given(x=matrices(), c=st.floats(-2.0, 2.0).filter(lambda c: abs(c) > 1e-3), shift=finite)
def test_scaled_deviation_gives_recon_bias_c_and_fvu_one_minus_c_squared(x, c, shift):
    x = torch.from_numpy(x).double()
    mean = x.mean(0) + shift  # any x̄ works: x − x̂ = (1 − c)(x − x̄)
    if float((x - mean).square().sum()) < 1e-3:
        return
    x_hat = mean + c * (x - mean)
    assert M.recon_bias(x, x_hat, mean) == pytest.approx(c, rel=1e-9)
    assert M.fvu(x, x_hat, mean) == pytest.approx((1 - c) ** 2, rel=1e-9, abs=1e-12)


@settings(max_examples=40, deadline=None)
@given(x=matrices(min_cols=2), m=st.integers(1, 9), seed=st.integers(0, 2**31 - 1))
def test_orthogonal_projection_is_unbiased_whatever_its_fvu(x, m, seed):
    x = torch.from_numpy(x).double()
    mean = x.mean(0)
    d = x.shape[1]
    m = min(m, d - 1)  # a proper subspace: fvu > 0 in general
    basis, _ = torch.linalg.qr(torch.randn(d, m, dtype=torch.float64,
                                           generator=torch.Generator().manual_seed(seed)))
    x_hat = mean + (x - mean) @ basis @ basis.T
    if float((x_hat - mean).square().sum()) < 1e-6:
        return
    assert M.recon_bias(x, x_hat, mean) == pytest.approx(1.0, rel=1e-9)


@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_reconstruction_metrics_match_numpy_reference(data):
    x = data.draw(matrices())
    x_hat = data.draw(arrays(np.float32, x.shape, elements=finite))
    mean = data.draw(arrays(np.float32, x.shape[1:], elements=finite))
    xd, hd, md = x.astype(np.float64), x_hat.astype(np.float64), mean.astype(np.float64)
    den = sum(float(np.dot(r - md, r - md)) for r in xd)
    if den < 1e-3:
        return
    num = sum(float(np.dot(r - s, r - s)) for r, s in zip(xd, hd, strict=True))
    inner = sum(float(np.dot(s - md, r - md)) for r, s in zip(xd, hd, strict=True))
    spread = sum(float(np.dot(s - md, s - md)) for s in hd)
    X, H, m = torch.from_numpy(x), torch.from_numpy(x_hat), torch.from_numpy(mean)
    assert M.mse(X, H) == pytest.approx(num / x.size, rel=1e-6, abs=1e-9)
    assert M.fvu(X, H, m) == pytest.approx(num / den, rel=1e-6, abs=1e-9)
    if abs(inner) > 1e-3:
        assert M.recon_bias(X, H, m) == pytest.approx(spread / inner, rel=1e-6)


def test_images_are_flattened():
    g = torch.Generator().manual_seed(2)
    x, x_hat = torch.rand(5, 4, 4, generator=g), torch.rand(5, 4, 4, generator=g)
    mean = x.mean(0)
    assert M.fvu(x, x_hat, mean) == M.fvu(x.reshape(5, 16), x_hat.reshape(5, 16), mean.reshape(16))
    assert M.mse(x, x_hat) == M.mse(x.reshape(5, 16), x_hat.reshape(5, 16))


def test_shape_mismatch_raises():
    with pytest.raises(ValueError):
        M.mse(torch.zeros(3, 4), torch.zeros(3, 5))
    with pytest.raises(ValueError):
        M.fvu(torch.zeros(3, 4), torch.zeros(3, 4), torch.zeros(5))


def test_ink_by_hand():
    x = t([[0.0, 0.5, 1.0], [0.25, 0.25, 0.0]])
    assert M.ink(x).tolist() == [1.5, 0.5]
    assert M.ink(torch.ones(2, 28, 28)).tolist() == [784.0, 784.0]


# ------------------------------------------------------------------------------------------------
# sparsity metrics

CODES = t([
    [0.0, 2.0, 0.0, 0.5],
    [0.0, 1.0, 0.0, 0.0],
    [0.0, 3.0, 0.1, 0.5],
    [0.0, 0.0, 0.0, 0.7],
])


def test_active_and_l0_by_hand():
    assert M.active(CODES).tolist() == [
        [False, True, False, True],
        [False, True, False, False],
        [False, True, True, True],
        [False, False, False, True],
    ]
    assert M.l0(CODES).tolist() == [2.0, 1.0, 3.0, 1.0]
    assert M.l0(CODES).dtype == torch.float32


def test_threshold_is_strict():
    # codes exactly at the threshold do not fire
    assert M.l0(CODES, threshold=0.5).tolist() == [1.0, 1.0, 1.0, 1.0]
    assert M.active(t([[0.0, -1.0, 1e-30]])).tolist() == [[False, False, True]]
    assert M.active(t([[float("nan")]])).tolist() == [[False]]


def test_firing_frequency_dead_dense_by_hand():
    freq = M.firing_frequency(CODES)
    assert freq.tolist() == [0.0, 0.75, 0.25, 0.75]
    assert M.dead_fraction(freq) == 0.25
    assert M.dense_fraction(freq) == 0.5
    assert M.dense_fraction(t([0.5, 0.5, 0.51, 0.0])) == 0.25  # exactly the limit is not dense
    assert M.dense_fraction(freq, limit=0.8) == 0.0
    freq_half = M.firing_frequency(CODES, threshold=0.5)
    assert freq_half.tolist() == [0.0, 0.75, 0.0, 0.25]
    assert M.dead_fraction(freq_half) == 0.5


def test_firing_frequency_needs_samples():
    with pytest.raises(ValueError):
        M.firing_frequency(torch.zeros(0, 3))


sparse_codes = matrices(min_rows=1, max_rows=20, max_cols=16,
                        elements=st.sampled_from([0.0, 0.0, 0.0, -0.5, 0.25, 1.0, 3.0]))


@settings(max_examples=60, deadline=None)
@given(codes=sparse_codes, threshold=st.sampled_from([0.0, 0.25, 0.5, 2.0]))
def test_sparsity_properties(codes, threshold):
    codes = torch.from_numpy(codes)
    n, h = codes.shape
    counts = M.l0(codes, threshold)
    freq = M.firing_frequency(codes, threshold)
    assert counts.shape == (n,) and freq.shape == (h,)
    assert bool(((counts >= 0) & (counts <= h)).all())
    assert bool(((freq >= 0) & (freq <= 1)).all())
    assert float(counts.mean()) == pytest.approx(float(freq.sum()), abs=1e-5)
    alive = float((freq > 0).double().mean())
    assert M.dead_fraction(freq) + alive == pytest.approx(1.0)
    assert M.dense_fraction(freq) <= alive + 1e-12
    # a higher threshold never makes more units fire
    assert bool((M.l0(codes, threshold + 0.5) <= counts).all())


def test_class_firing_frequency_by_hand():
    labels = torch.tensor([0, 0, 2, 2])
    cf = M.class_firing_frequency(CODES, labels, n_classes=3)
    assert cf.shape == (3, 4)
    assert cf.tolist() == [
        [0.0, 1.0, 0.0, 0.5],
        [0.0, 0.0, 0.0, 0.0],  # class 1 has no samples
        [0.0, 0.5, 0.5, 1.0],
    ]
    assert M.class_firing_frequency(CODES, labels, 3, threshold=0.5)[2].tolist() == [
        0.0, 0.5, 0.0, 0.5]


@settings(max_examples=30, deadline=None)
@given(codes=sparse_codes, data=st.data())
def test_class_rows_average_to_overall_frequency(codes, data):
    codes = torch.from_numpy(codes)
    labels = torch.tensor(data.draw(st.lists(st.integers(0, 3), min_size=len(codes),
                                             max_size=len(codes))))
    cf = M.class_firing_frequency(codes, labels, n_classes=4)
    weights = torch.bincount(labels, minlength=4).float() / len(labels)
    assert torch.allclose(weights @ cf, M.firing_frequency(codes), atol=1e-6)


def test_class_firing_frequency_rejects_bad_labels():
    with pytest.raises(ValueError):
        M.class_firing_frequency(CODES, torch.tensor([0, 1, 2, 3]), n_classes=3)
    with pytest.raises(ValueError):
        M.class_firing_frequency(CODES, torch.tensor([0, 1]), n_classes=3)


def test_summarize_keys_and_values():
    g = torch.Generator().manual_seed(3)
    x = torch.rand(4, 6, generator=g)
    x_hat = torch.rand(4, 6, generator=g)
    mean = torch.rand(6, generator=g)
    s = M.summarize(x, x_hat, CODES, mean)
    assert set(s) == {"mse", "fvu", "explained_variance", "recon_bias", "l0_mean", "l0_std",
                      "dead_fraction", "dense_fraction", "n_samples", "n_units"}
    assert set(s) == set(M.SUMMARY_KEYS)
    assert all(type(v) is float for v in s.values())
    assert s["mse"] == M.mse(x, x_hat)
    assert s["fvu"] == M.fvu(x, x_hat, mean)
    assert s["explained_variance"] == pytest.approx(1 - s["fvu"])
    assert s["recon_bias"] == M.recon_bias(x, x_hat, mean)
    # per-sample L0 is 2, 1, 3, 1: mean 7/4, population variance (1/16 + 9/16 + 25/16 + 9/16) / 4
    assert s["l0_mean"] == pytest.approx(7 / 4)
    assert s["l0_std"] == pytest.approx(math.sqrt(44 / 64))
    assert s["dead_fraction"] == 0.25 and s["dense_fraction"] == 0.5
    assert s["n_samples"] == 4.0 and s["n_units"] == 4.0


def test_summarize_rejects_mismatched_codes():
    with pytest.raises(ValueError):
        M.summarize(torch.zeros(3, 6), torch.zeros(3, 6), CODES, torch.zeros(6))


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
# dynamic sparsity: support_fvu, adaptive_gain, PCA residual, adaptivity


def dictionary(d: int, h: int, seed: int, orthonormal: bool = False) -> torch.Tensor:
    """Decoder atoms W [d, h] in float64: unit-norm random columns, or orthonormal (h ≤ d)."""
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(d, h, generator=g, dtype=torch.float64)
    return torch.linalg.qr(w)[0] if orthonormal else w / w.norm(dim=0)


def sparse_codes_of_sizes(sizes: torch.Tensor, h: int, seed: int) -> torch.Tensor:
    """Non-negative codes [N, h] (float64): row n has exactly sizes[n] random units at 0.5 … 1.5."""
    g = torch.Generator().manual_seed(seed)
    order = torch.rand(len(sizes), h, generator=g).argsort(dim=1)
    on = order < sizes.unsqueeze(1)
    return torch.where(on, 0.5 + torch.rand(len(sizes), h, generator=g, dtype=torch.float64),
                       torch.zeros((), dtype=torch.float64))


def lstsq_fvu(x, support, atoms, offset, mean):
    """Reference support FVU: one least-squares solve (SVD-based gelsd) per input."""
    total = 0.0
    for xn, s in zip(x, support, strict=True):
        y = xn - offset
        cols = atoms[:, s]
        if cols.shape[1]:
            z = torch.linalg.lstsq(cols, y.unsqueeze(1), driver="gelsd").solution.squeeze(1)
            y = y - cols @ z
        total += float(y @ y)
    return total / float((x - mean).square().sum())


@settings(max_examples=30, deadline=None)
@given(n=st.integers(1, 25), d=st.integers(4, 24), h=st.integers(4, 40), kmax=st.integers(0, 4),
       orthonormal=st.booleans(), seed=st.integers(0, 2**31 - 1))
def test_support_fvu_is_zero_on_the_true_supports(n, d, h, kmax, orthonormal, seed):
    h = min(h, d) if orthonormal else h
    atoms = dictionary(d, h, seed, orthonormal)
    g = torch.Generator().manual_seed(seed + 1)
    sizes = torch.randint(0, kmax + 1, (n,), generator=g)
    true = sparse_codes_of_sizes(sizes, h, seed + 2)
    offset = torch.randn(d, generator=g, dtype=torch.float64)
    x = true @ atoms.T + offset
    mean = offset + 0.1 * torch.randn(d, generator=g, dtype=torch.float64)  # x̄ ≠ b: variance > 0
    # the model's values need not be right: any codes with the true supports will do
    model = true.sign() * torch.rand(n, h, generator=g, dtype=torch.float64)
    assert M.support_fvu(x, model, atoms, offset, mean) == pytest.approx(0.0, abs=1e-10)


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 20), d=st.integers(2, 12), h=st.integers(1, 16),
       density=st.floats(0.0, 1.0), repeats=st.booleans(), seed=st.integers(0, 2**31 - 1))
def test_support_fvu_matches_lstsq_and_never_exceeds_the_model_fvu(n, d, h, density, repeats,
                                                                   seed):
    # supports may hold more atoms than dimensions (k > d) and, with repeats, identical atoms:
    # rank-deficient least squares
    atoms = dictionary(d, h, seed)
    if repeats and h > 1:
        atoms[:, h // 2:] = atoms[:, :h - h // 2]
    g = torch.Generator().manual_seed(seed + 1)
    x = torch.rand(n, d, generator=g, dtype=torch.float64) * 3
    mean = x.mean(0) + 0.1
    offset = torch.rand(d, generator=g, dtype=torch.float64)
    codes = torch.rand(n, h, generator=g, dtype=torch.float64) * 2
    codes = codes * (torch.rand(n, h, generator=g) < density)
    x_hat = codes @ atoms.T + offset
    support = codes > 0
    got = M.support_fvu(x, codes, atoms, offset, mean)
    assert got == pytest.approx(lstsq_fvu(x, support, atoms, offset, mean), rel=1e-8, abs=1e-10)
    assert got <= M.fvu(x, x_hat, mean) + 1e-9
    assert got >= 0.0


def test_support_fvu_falls_back_to_the_pseudo_inverse_when_cholesky_fails(monkeypatch):
    # without the ridge, duplicated atoms make the Gram blocks singular: Cholesky fails
    monkeypatch.setattr(dynamic, "_RIDGE", 0.0)
    atoms = dictionary(6, 4, seed=6)
    atoms = torch.cat([atoms, atoms], dim=1)  # units j and j + 4 are the same atom
    g = torch.Generator().manual_seed(6)
    x = torch.rand(10, 6, generator=g, dtype=torch.float64)
    codes = torch.zeros(10, 8, dtype=torch.float64)
    codes[:, [0, 4, 1]] = 1.0  # every support holds a duplicated pair
    offset, mean = torch.zeros(6, dtype=torch.float64), x.mean(0)
    expected = lstsq_fvu(x, codes > 0, atoms, offset, mean)
    assert M.support_fvu(x, codes, atoms, offset, mean) == pytest.approx(expected, rel=1e-9)


def test_support_fvu_of_empty_supports_is_the_offset_error():
    g = torch.Generator().manual_seed(7)
    x = torch.rand(6, 5, generator=g, dtype=torch.float64)
    offset, mean = torch.rand(5, dtype=torch.float64, generator=g), x.mean(0)
    atoms = dictionary(5, 8, seed=7)
    codes = torch.zeros(6, 8, dtype=torch.float64)
    expected = float((x - offset).square().sum() / (x - mean).square().sum())
    assert M.support_fvu(x, codes, atoms, offset, mean) == pytest.approx(expected, rel=1e-12)


def test_support_fvu_uses_the_threshold_and_ignores_code_values():
    atoms = dictionary(6, 6, seed=8, orthonormal=True)
    offset = torch.zeros(6, dtype=torch.float64)
    x = torch.tensor([[3.0, 1.0, 0.0, 0.0, 0.0, 0.0]], dtype=torch.float64) @ atoms.T
    mean = torch.zeros(6, dtype=torch.float64)  # Σ‖x − x̄‖² = 10
    codes = torch.tensor([[0.9, 0.2, 0.0, 0.0, 0.0, 0.0]], dtype=torch.float64)
    assert M.support_fvu(x, codes, atoms, offset, mean) == pytest.approx(0.0, abs=1e-12)
    assert M.support_fvu(x, 5 * codes, atoms, offset, mean) == pytest.approx(0.0, abs=1e-12)
    # at threshold 0.5 only the first atom is in the support: the 1² along the second is lost
    assert M.support_fvu(x, codes, atoms, offset, mean, threshold=0.5) == pytest.approx(0.1)


def test_support_fvu_on_a_subset_takes_evenly_spaced_inputs():
    g = torch.Generator().manual_seed(9)
    atoms = dictionary(10, 20, seed=9)
    x = torch.rand(100, 10, generator=g, dtype=torch.float64)
    codes = sparse_codes_of_sizes(torch.randint(0, 6, (100,), generator=g), 20, seed=9)
    offset, mean = x.mean(0), x.mean(0)
    every_fifth = torch.arange(0, 100, 5)
    assert M.support_fvu(x, codes, atoms, offset, mean, max_inputs=20) == pytest.approx(
        M.support_fvu(x[every_fifth], codes[every_fifth], atoms, offset, mean), rel=1e-12)
    assert M.support_fvu(x, codes, atoms, offset, mean, max_inputs=1000) == M.support_fvu(
        x, codes, atoms, offset, mean)
    with pytest.raises(ValueError):
        M.support_fvu(x, codes, atoms, offset, mean, max_inputs=0)


def test_support_fvu_handles_float32_inputs_and_a_large_support_mix():
    # many support sizes at once (0 … 60 of 128 units), float32 tensors in, float64 inside
    g = torch.Generator().manual_seed(10)
    atoms = dictionary(64, 128, seed=10)
    sizes = torch.randint(0, 61, (200,), generator=g)
    x = torch.rand(200, 64, generator=g, dtype=torch.float64)
    codes = sparse_codes_of_sizes(sizes, 128, seed=10)
    offset, mean = x.mean(0), x.mean(0)
    expected = lstsq_fvu(x, codes > 0, atoms, offset, mean)
    got = M.support_fvu(x.float(), codes.float(), atoms.float(), offset.float(), mean.float())
    assert got == pytest.approx(expected, rel=1e-5)  # the float32 rounding of the inputs


def test_dynamic_measures_reject_bad_shapes():
    x, codes = torch.zeros(4, 6), torch.zeros(4, 8)
    atoms, vec = torch.zeros(6, 8), torch.zeros(6)
    with pytest.raises(ValueError):
        M.support_fvu(x, codes, atoms.T, vec, vec)
    with pytest.raises(ValueError):
        M.support_fvu(x, codes[:3], atoms, vec, vec)
    with pytest.raises(ValueError):
        M.support_fvu(x, codes, atoms, torch.zeros(5), vec)
    with pytest.raises(ValueError):
        M.adaptive_gain(x, codes, atoms, vec, vec, scores=torch.zeros(4, 7))


topk_cases = st.tuples(st.integers(1, 30), st.integers(3, 16), st.integers(2, 24),
                       st.integers(0, 2**31 - 1))


@settings(max_examples=40, deadline=None)
@given(case=topk_cases, k=st.integers(0, 24), scores_are_pre=st.booleans())
def test_adaptive_gain_of_topk_codes_is_exactly_zero(case, k, scores_are_pre):
    n, d, h, seed = case
    k = min(k, h)
    g = torch.Generator().manual_seed(seed)
    atoms = dictionary(d, h, seed)
    x = torch.rand(n, d, generator=g, dtype=torch.float64)
    pre = torch.randn(n, h, generator=g, dtype=torch.float64)
    # TopK code: the k largest pre-activations, shifted so that all k are positive
    top = pre.topk(k, dim=1).indices
    codes = torch.zeros_like(pre).scatter_(1, top, pre.gather(1, top) - pre.min() + 0.1)
    assert bool((M.l0(codes) == k).all())
    scores = pre if scores_are_pre else None
    mean = x.mean(0) + 0.1  # variance > 0 even for one input
    assert M.adaptive_gain(x, codes, atoms, x.mean(0), mean, scores=scores) == 0.0


def test_adaptive_gain_is_positive_when_variable_supports_fit_better():
    # orthonormal atoms; half the inputs are made of 1 atom, half of 5: mean L0 = 3.
    # Own supports are the true ones (support fvu 0); the constant budget of 3 drops the two
    # smallest components of every 5-atom input and gains nothing on the 1-atom ones.
    d = h = 12
    atoms = dictionary(d, h, seed=11, orthonormal=True)
    sizes = torch.tensor([1, 5] * 10)
    true = sparse_codes_of_sizes(sizes, h, seed=11)
    offset = torch.zeros(d, dtype=torch.float64)
    x = true @ atoms.T
    mean = torch.zeros(d, dtype=torch.float64)
    dropped = true.sort(dim=1, descending=True).values[sizes == 5][:, 3:5].square().sum()
    expected = float(dropped / true.square().sum())
    gain = M.adaptive_gain(x, true, atoms, offset, mean)
    assert gain == pytest.approx(expected, rel=1e-9)
    assert gain > 0.05
    assert M.support_fvu(x, true, atoms, offset, mean) == pytest.approx(0.0, abs=1e-12)
    # a constant L0 whose supports are right is the best any budget can do: gain 0
    fixed = sparse_codes_of_sizes(torch.full((20,), 3), h, seed=12)
    assert M.adaptive_gain(fixed @ atoms.T, fixed, atoms, offset, mean) == 0.0


def test_adaptive_gain_interpolates_between_budgets():
    # sizes 1, 2, 2, 3: mean L0 = 2; sizes 1, 2, 3, 3: mean 2.25 -> 3/4 budget 2 + 1/4 budget 3
    d = h = 6
    atoms = dictionary(d, h, seed=13, orthonormal=True)
    offset = mean = torch.zeros(d, dtype=torch.float64)
    true = sparse_codes_of_sizes(torch.tensor([1, 2, 3, 3]), h, seed=13)
    x = true @ atoms.T
    total = true.square().sum()

    def const_fvu(k):  # orthonormal atoms: the dropped components' energy
        kept = true.sort(dim=1, descending=True).values[:, :k]
        return float((total - kept.square().sum()) / total)

    expected = 0.75 * const_fvu(2) + 0.25 * const_fvu(3)
    assert M.adaptive_gain(x, true, atoms, offset, mean) == pytest.approx(expected, rel=1e-9)


def test_adaptive_gain_ranks_constant_supports_by_scores():
    d = h = 4
    atoms = dictionary(d, h, seed=14, orthonormal=True)
    offset = mean = torch.zeros(d, dtype=torch.float64)
    x = torch.tensor([[2.0, 1.0, 0.0, 0.0], [0.0, 0.0, 0.0, 1.0]], dtype=torch.float64) @ atoms.T
    codes = torch.tensor([[1.0, 1.0, 0.0, 0.0], [0.0, 0.0, 0.0, 1.0]], dtype=torch.float64)
    # mean L0 = 1.5: budgets 1 and 2, each half. Scores put unit 1 before unit 0 on input 0.
    scores = torch.tensor([[0.5, 0.9, 0.0, 0.0], [0.0, 0.0, 0.0, 1.0]], dtype=torch.float64)
    # budget 1 keeps unit 1 on input 0 (loses 4 of 6); budget 2 keeps units 0, 1 (loses 0)
    assert M.adaptive_gain(x, codes, atoms, offset, mean, scores=scores) == pytest.approx(
        0.5 * 4 / 6)
    # by codes the tie on input 0 goes to the lower index, unit 0 (loses 1 of 6)
    assert M.adaptive_gain(x, codes, atoms, offset, mean) == pytest.approx(0.5 * 1 / 6)


@settings(max_examples=30, deadline=None)
@given(n=st.integers(2, 40), d=st.integers(2, 12), m=st.integers(0, 12),
       seed=st.integers(0, 2**31 - 1))
def test_pca_residual_vanishes_on_data_in_an_m_dimensional_subspace(n, d, m, seed):
    m = min(m, d)
    n = max(n, m + 1)  # n centred points span at most n − 1 dimensions
    g = torch.Generator().manual_seed(seed)
    span = torch.linalg.qr(torch.randn(d, d, generator=g, dtype=torch.float64))[0][:, :m]
    centre = torch.randn(d, generator=g, dtype=torch.float64)
    x = centre + torch.randn(n, m, generator=g, dtype=torch.float64) * 3 @ span.T
    pca = M.principal_components(x, m)
    assert pca.basis.shape == (d, m) and pca.variances.shape == (m,)
    assert torch.allclose(pca.basis.T @ pca.basis, torch.eye(m, dtype=torch.float64), atol=1e-10)
    assert bool((pca.variances[:-1] >= pca.variances[1:]).all())
    fresh = centre + torch.randn(5, m, generator=g, dtype=torch.float64) @ span.T
    assert float(M.pca_residual(fresh, pca.basis, pca.mean).max()) < 1e-18 * d + 1e-20
    # and off the subspace the residual is exactly the energy of the orthogonal part
    if m < d:
        other = torch.linalg.qr(torch.cat([span, torch.randn(d, 1, generator=g,
                                                             dtype=torch.float64)], 1))[0][:, m]
        assert M.pca_residual((centre + 2 * other)[None], pca.basis, pca.mean).item() == (
            pytest.approx(4.0, rel=1e-9))


def test_principal_components_match_svd_and_truncate():
    g = torch.Generator().manual_seed(15)
    x = torch.rand(300, 8, generator=g) * torch.arange(1.0, 9.0)
    pca = M.principal_components(x, chunk=64)  # several chunks
    centred = x.double() - x.double().mean(0)
    s = torch.linalg.svdvals(centred)
    assert torch.allclose(pca.variances, s.square() / 300, rtol=1e-10)
    assert torch.allclose(pca.mean, x.double().mean(0), rtol=1e-12)
    top3 = pca.top(3)
    assert top3.basis.shape == (8, 3) and torch.equal(top3.basis, pca.basis[:, :3])
    # residual after m components, summed over the set, is N × the variance left over
    left = M.pca_residual(x, top3.basis, top3.mean).sum()
    assert float(left) == pytest.approx(300 * float(pca.variances[3:].sum()), rel=1e-9)
    with pytest.raises(ValueError):
        pca.top(-1)
    with pytest.raises(ValueError):
        M.pca_residual(x, torch.zeros(7, 2), pca.mean)


def average_ranks_reference(v):
    """1-based ranks by definition: #smaller + (#equal + 1) / 2."""
    v = np.asarray(v, dtype=np.float64)
    return np.array([(v < a).sum() + ((v == a).sum() + 1) / 2 for a in v])


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_adaptivity_is_the_pearson_correlation_of_average_ranks(data):
    n = data.draw(st.integers(2, 30))
    l0_values = data.draw(st.lists(st.integers(0, 5), min_size=n, max_size=n))
    difficulty = data.draw(st.lists(st.floats(-5, 5, allow_nan=False), min_size=n, max_size=n))
    ra, rb = average_ranks_reference(l0_values), average_ranks_reference(difficulty)
    got = M.adaptivity(torch.tensor(l0_values, dtype=torch.float32),
                       torch.tensor(difficulty, dtype=torch.float64))
    if ra.std() == 0 or rb.std() == 0:
        assert got is None
    else:
        assert got == pytest.approx(float(np.corrcoef(ra, rb)[0, 1]), abs=1e-12)
        # symmetric, invariant under increasing maps (exact ones here: a² + 1 on the integers,
        # 2b in floating point), sign-flipping
        b = torch.tensor(difficulty, dtype=torch.float64)
        a = torch.tensor(l0_values, dtype=torch.float64)
        assert M.adaptivity(b, a) == pytest.approx(got, abs=1e-12)
        assert M.adaptivity(a.square() + 1, 2 * b) == pytest.approx(got, abs=1e-12)
        assert M.adaptivity(a, -b) == pytest.approx(-got, abs=1e-12)


def test_adaptivity_by_hand():
    assert M.adaptivity(t([1, 2, 3, 4]), t([10, 20, 30, 40])) == pytest.approx(1.0)
    assert M.adaptivity(t([1, 2, 3, 4]), t([0.1, 5, 7, 1e6])) == pytest.approx(1.0)
    assert M.adaptivity(t([4, 3, 2, 1]), t([10, 20, 30, 40])) == pytest.approx(-1.0)
    # ranks of [1, 1, 2] are [1.5, 1.5, 3]; of [1, 2, 3] are [1, 2, 3]: correlation √3 / 2
    assert M.adaptivity(t([1, 1, 2]), t([1, 2, 3])) == pytest.approx(math.sqrt(3) / 2)
    assert M.adaptivity(t([3, 3, 3]), t([1, 2, 3])) is None
    assert M.adaptivity(t([1]), t([1])) is None
    with pytest.raises(ValueError):
        M.adaptivity(t([1, 2]), t([1, 2, 3]))
    with pytest.raises(ValueError):
        M.adaptivity(t([1, 2]), t([1, float("nan")]))


def components_data(counts: torch.Tensor, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs in 16 dims: a shared 2-dim part with large variance (what PCA's top 2 components
    capture) plus counts[n] further orthonormal components of size 1.

    Returns the inputs [N, 16] and the orthonormal directions [16, 16]."""
    g = torch.Generator().manual_seed(seed)
    basis = torch.linalg.qr(torch.randn(16, 16, generator=g, dtype=torch.float64))[0]
    n = len(counts)
    shared = torch.randn(n, 2, generator=g, dtype=torch.float64) * 20 @ basis[:, :2].T
    extra = sparse_codes_of_sizes(counts, 14, seed).sign()  # counts[n] ones
    return shared + extra @ basis[:, 2:].T, basis


def test_adaptivity_follows_the_number_of_components():
    g = torch.Generator().manual_seed(16)
    counts = torch.randint(0, 8, (400,), generator=g)
    x, _ = components_data(counts, seed=16)
    train, _ = components_data(torch.randint(0, 8, (2000,), generator=g), seed=16)
    pca = M.principal_components(train, 2)
    difficulty = M.pca_residual(x, pca.basis, pca.mean)
    noisy = counts + (torch.rand(400, generator=g) < 0.2).long()  # more units for more components
    assert M.adaptivity(noisy.float(), difficulty) > 0.8
    assert M.adaptivity((10 - noisy).float(), difficulty) < -0.8
    # PCA's top 2 components leave the extra components (around their mean): difficulty grows
    # with counts
    assert M.adaptivity(counts.float(), difficulty) > 0.9
    ranks = difficulty.argsort().argsort()  # the identical ranking, without ties
    assert M.adaptivity(ranks.float(), difficulty) == pytest.approx(1.0, abs=1e-12)
    assert M.adaptivity(torch.full((400,), 3.0), difficulty) is None  # fixed-k code


def test_dynamic_sparsity_combines_the_measures_on_a_fixed_subset():
    d, h = 16, 24
    atoms = dictionary(d, h, seed=17)
    g = torch.Generator().manual_seed(17)
    x_train = torch.rand(500, d, generator=g, dtype=torch.float64)
    x = torch.rand(300, d, generator=g, dtype=torch.float64)
    codes = sparse_codes_of_sizes(torch.randint(0, 9, (300,), generator=g), h, seed=18)
    offset, mean = x_train.mean(0), x_train.mean(0)
    out = M.dynamic_sparsity(x, codes, atoms, offset, mean, x_train, max_inputs=100)
    assert tuple(out) == M.DYNAMIC_KEYS
    pick = torch.arange(0, 300, 3)
    xs, cs = x[pick], codes[pick]
    assert out["n_inputs"] == 100.0
    assert out["support_fvu"] == pytest.approx(M.support_fvu(xs, cs, atoms, offset, mean),
                                               rel=1e-12)
    assert out["adaptive_gain"] == pytest.approx(M.adaptive_gain(xs, cs, atoms, offset, mean),
                                                 rel=1e-9, abs=1e-12)
    assert out["support_fvu_const"] == pytest.approx(out["support_fvu"] + out["adaptive_gain"])
    m = math.floor(float(M.l0(cs).mean()) + 0.5)
    assert out["adaptivity_m"] == float(m)
    pca = M.principal_components(x_train)
    expected = M.adaptivity(M.l0(cs), M.pca_residual(xs, pca.basis[:, :m], pca.mean))
    assert out["adaptivity"] == pytest.approx(expected, abs=1e-12)
    # a precomputed PCA gives the same numbers
    again = M.dynamic_sparsity(x, codes, atoms, offset, mean, pca, max_inputs=100)
    assert again == pytest.approx(out, abs=1e-12)
    with pytest.raises(ValueError):
        M.dynamic_sparsity(x, codes, atoms, offset, mean, pca.top(2), max_inputs=100)


def test_dynamic_sparsity_of_a_topk_code():
    d, h, k = 16, 24, 4
    atoms = dictionary(d, h, seed=19)
    g = torch.Generator().manual_seed(19)
    x = torch.rand(200, d, generator=g, dtype=torch.float64)
    pre = (x - x.mean(0)) @ atoms
    top = pre.topk(k, dim=1).indices
    codes = torch.zeros_like(pre).scatter_(1, top, pre.gather(1, top).exp())
    out = M.dynamic_sparsity(x, codes, atoms, x.mean(0), x.mean(0), x, scores=pre,
                             max_inputs=None)
    assert out["adaptive_gain"] == 0.0 and out["support_fvu"] == out["support_fvu_const"]
    assert out["adaptivity"] is None and out["adaptivity_m"] == k and out["n_inputs"] == 200


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
# class selectivity: one definition for the feature browser and the class x unit heatmap


def test_class_selectivity_extremes_and_absent_classes():
    rate = torch.tensor([[0.5, 0.2, 0.0, 0.1],
                         [0.0, 0.2, 0.0, 0.3],
                         [0.0, 0.2, 0.0, 0.0]], dtype=torch.float64)  # [C = 3, H = 4]
    preferred, sel = M.class_selectivity(rate)
    assert preferred.tolist() == [0, 0, -1, 1]  # ties go to the first class; dead: -1
    assert sel[0] == pytest.approx(1.0) and sel[1] == pytest.approx(0.0, abs=1e-12)
    assert math.isnan(sel[2])
    p = np.array([0.25, 0.75])
    assert float(sel[3]) == pytest.approx(1 + (p * np.log(p)).sum() / math.log(3))
    # class 2 had no inputs: it is left out of C', so unit 3 is judged over two classes
    _, sel2 = M.class_selectivity(rate, torch.tensor([True, True, False]))
    assert float(sel2[3]) == pytest.approx(1 + (p * np.log(p)).sum() / math.log(2))
    _, one = M.class_selectivity(rate, torch.tensor([True, False, False]))
    assert torch.isnan(one).all()  # one class: selectivity undefined


@settings(max_examples=40, deadline=None)
@given(arrays(np.float64, st.tuples(st.integers(2, 6), st.integers(1, 5)),
              elements=st.floats(0, 1)), st.randoms(use_true_random=False))
def test_class_selectivity_ignores_class_order_and_matches_the_browser(rate, rnd):
    order = list(range(rate.shape[0]))
    rnd.shuffle(order)
    _, a = M.class_selectivity(torch.from_numpy(rate))
    _, b = M.class_selectivity(torch.from_numpy(rate[order]))
    np.testing.assert_allclose(a.numpy(), b.numpy(), atol=1e-12)
    assert bool(((a >= 0) & (a <= 1) | a.isnan()).all())
    from sae.figures.run import class_selectivity as heatmap_selectivity

    np.testing.assert_array_equal(heatmap_selectivity(rate)[1], a.numpy())


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
