"""sae.metrics' dynamic sparsity: support_fvu, adaptive_gain, the PCA residual and adaptivity."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from metric_helpers import t

from sae import metrics as M
from sae.metrics import dynamic

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


def _condition(cols) -> float:
    """The condition number of a support's atoms [d, k] (1 for an empty support)."""
    if cols.shape[1] == 0:
        return 1.0
    sv = torch.linalg.svdvals(cols)
    return float(sv.max() / sv.min()) if float(sv.min()) > 0 else float("inf")


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
    # the normal equations square the support's condition number: a square, full support of
    # random atoms (n 1, d = h = 11) left 2e-8 where the exact answer is 0; past a condition
    # number of 1e4 (1e8 squared) the relative ridge of 1e-10 sets the solve's accuracy (a
    # 9-atom support in 9 dimensions at 2.4e5 moved one input's residual, FVU 0.4937 against
    # 0.4904): there only the bounds below are asserted (singular supports, repeated atoms or
    # more atoms than dimensions, agree with the minimum-norm solution and are compared)
    ridge_limited = any(1e4 <= _condition(atoms[:, s]) <= 1e12 for s in support
                        if 0 < s.sum() <= d)
    if not ridge_limited:
        assert got == pytest.approx(lstsq_fvu(x, support, atoms, offset, mean), rel=1e-8,
                                    abs=1e-7)
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
