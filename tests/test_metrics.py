"""Tests of sae.metrics: reconstruction, sparsity and class selectivity against their written
definitions, by hand and by property."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays
from metric_helpers import finite, matrices, t

from sae import metrics as M

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
