"""Models at equal L0: runs placed by validation L0, interpolated per seed, reported on test."""

import math

import numpy as np
import pandas as pd
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from sae import metrics
from sae.sweep import aggregate, display, matching


def runs(rows):
    """A results frame from (model, value, seed, val_l0, test_l0, fvu, val_fvu) rows."""
    records = []
    for model, value, seed, val_l0, l0, fvu, val_fvu in rows:
        records.append({"dataset": "mnist", "model": model, "kind": model,
                        "param": "k" if model == "topk" else "lambda", "value": value,
                        "seed": seed, "val_l0": val_l0, "l0_mean": l0, "fvu": fvu,
                        "fvu_at_l0": fvu, "val_fvu": val_fvu, "dead_fraction": 0.0})
    return aggregate.results_frame(records)


def test_runs_are_placed_by_validation_l0_and_scored_on_test():
    # validation puts λ 0.02 below the target and λ 0.01 above it; the test L0s would put
    # both above it, so a choice on test would find no bracket at all
    r = runs([("l1", 0.02, 0, 12.0, 17.0, 0.30, 0.31),
              ("l1", 0.01, 0, 24.0, 30.0, 0.20, 0.21)])
    row = matching.at_l0(r, [16.0]).iloc[0]
    w = math.log(16 / 12) / math.log(24 / 12)  # the weight comes from validation L0
    assert row["fvu"] == pytest.approx(0.30 + w * (0.20 - 0.30))  # the values from test
    assert row["val_fvu"] == pytest.approx(0.31 + w * (0.21 - 0.31))
    # the L0 it stands for: test L0 interpolated in log L0 with the same weight
    assert row["l0"] == pytest.approx(math.exp(math.log(17) + w * math.log(30 / 17)))
    assert bool(row["on_validation"]) and (row["lo_value"], row["hi_value"]) == (0.02, 0.01)
    # a frame without validation L0 (an earlier version's) is placed by test L0
    legacy = r.assign(val_l0=float("nan"))
    assert matching.at_l0(legacy, [16.0]).empty  # both test L0s lie above 16
    assert not matching.choice_l0(legacy)[1]


def test_each_seed_is_interpolated_on_its_own_and_the_std_is_over_seeds():
    rows, expected = [], []
    for seed, (lo, hi) in enumerate([(10.0, 20.0), (14.0, 40.0), (8.0, 18.0)]):
        f_lo, f_hi = 0.3 + 0.01 * seed, 0.1 + 0.02 * seed
        rows += [("sparsemax", 0.05, seed, lo, lo, f_lo, f_lo),
                 ("sparsemax", 0.01, seed, hi, hi, f_hi, f_hi)]
        w = math.log(16 / lo) / math.log(hi / lo)
        expected.append(f_lo + w * (f_hi - f_lo))
    row = matching.at_l0(runs(rows), [16.0]).iloc[0]
    assert row["n_seeds"] == 3 and row["n_missing"] == 0
    assert row["fvu"] == pytest.approx(np.mean(expected))
    assert row["fvu_std"] == pytest.approx(np.std(expected, ddof=1))
    # not the interpolation of the seed means (whose L0s bracket 16 differently)
    means = aggregate.summarize_seeds(runs(rows))
    lo_l0, hi_l0 = means["l0_mean_mean"].min(), means["l0_mean_mean"].max()
    w = math.log(16 / lo_l0) / math.log(hi_l0 / lo_l0)
    of_means = means["fvu_mean"].max() + w * (means["fvu_mean"].min() - means["fvu_mean"].max())
    assert abs(of_means - row["fvu"]) > 1e-4


def test_a_seed_that_does_not_reach_the_target_is_left_out_and_counted():
    r = runs([("jumprelu", 0.05, 0, 12.0, 12.0, 0.3, 0.3), ("jumprelu", 0.01, 0, 30.0, 30.0,
                                                             0.1, 0.1),
              ("jumprelu", 0.05, 1, 18.0, 18.0, 0.2, 0.2), ("jumprelu", 0.01, 1, 30.0, 30.0,
                                                             0.1, 0.1)])
    row = matching.at_l0(r, [16.0]).iloc[0]
    assert (row["n_seeds"], row["n_missing"]) == (1, 1)
    assert math.isnan(row["fvu_std"])  # one seed: no spread measured
    shown = display.headline_display(r.assign(dataset="mnist"), "mnist")
    assert shown.loc[0, "seeds"] == "1 of 2" if len(shown) else True
    assert matching.at_l0(r, [50.0]).empty  # nothing is extrapolated


def test_a_run_within_five_percent_is_taken_as_it_is():
    r = runs([("topk", 32, 0, 31.0, 33.0, 0.09, 0.095), ("topk", 32, 1, 32.5, 32.5, 0.08, 0.085)])
    row = matching.at_l0(r, [32.0]).iloc[0]
    assert (row["lo_value"], row["hi_value"]) == (32, 32)
    assert row["l0"] == pytest.approx(32.75) and row["fvu"] == pytest.approx(0.085)
    judged = matching.verdict(r)
    fvu = judged[judged["criterion"] == "FVU at L0"].iloc[0]
    assert fvu["winners"] == [("topk", 32)]


# --------------------------------------------------------------------------- fair adaptivity


def test_partial_spearman_removes_what_the_control_explains():
    g = torch.Generator().manual_seed(0)
    energy = torch.rand(4000, generator=g, dtype=torch.float64)
    rest = torch.rand(4000, generator=g, dtype=torch.float64)
    difficulty = energy + rest
    follows_energy = energy + 1e-3 * torch.rand(4000, generator=g, dtype=torch.float64)
    follows_rest = rest + 1e-3 * torch.rand(4000, generator=g, dtype=torch.float64)
    # an L0 ranked by energy scores well on the plain measure, not once energy is held fixed
    assert metrics.adaptivity(follows_energy, difficulty) > 0.6
    assert abs(metrics.partial_spearman(follows_energy, difficulty, energy)) < 0.1
    # an L0 that follows what the energy does not explain keeps a high partial correlation
    assert metrics.partial_spearman(follows_rest, difficulty, energy) > 0.8
    # undefined cases
    assert metrics.partial_spearman(energy, difficulty, energy) is None  # control = a
    assert metrics.partial_spearman(torch.ones(10), torch.arange(10.0), torch.rand(10)) is None
    assert metrics.partial_spearman(torch.arange(2.0), torch.arange(2.0), torch.arange(2.0)) \
        is None


@settings(max_examples=50, deadline=None)
@given(st.lists(st.tuples(st.floats(-1e3, 1e3), st.floats(-1e3, 1e3), st.floats(-1e3, 1e3)),
                min_size=3, max_size=40))
def test_partial_spearman_is_a_correlation_and_rank_based(rows):
    a, b, c = (torch.tensor(v, dtype=torch.float64) for v in zip(*rows, strict=True))
    value = metrics.partial_spearman(a, b, c)
    if value is None:
        return
    assert -1.0 <= value <= 1.0
    # an increasing map of any side (here exact in floating point) leaves it unchanged
    again = metrics.partial_spearman(a * 2, b * 4, c * 2)
    assert again is not None and again == pytest.approx(value, abs=1e-9)
    flipped = metrics.partial_spearman(-a, b, c)
    assert flipped == pytest.approx(-value, abs=1e-9)


def test_dynamic_sparsity_reports_the_energy_baseline_and_the_partial_measure():
    g = torch.Generator().manual_seed(1)
    D, H, N = 20, 40, 600
    x = torch.randn(N, D, generator=g) * torch.rand(N, 1, generator=g) * 3
    atoms = torch.nn.functional.normalize(torch.randn(D, H, generator=g), dim=0)
    scores = x @ atoms
    energy_rank = x.square().sum(1).argsort().argsort().float() / N  # L0 from energy alone
    k = (4 + 12 * energy_rank).long()
    order = scores.abs().argsort(dim=1, descending=True)
    codes = torch.zeros(N, H)
    for n in range(N):
        codes[n, order[n, :k[n]]] = 1.0
    out = metrics.dynamic_sparsity(x, codes, atoms, torch.zeros(D), torch.zeros(D), x,
                                   max_inputs=None)
    assert out["adaptivity_energy"] == pytest.approx(
        metrics.adaptivity(metrics.input_energy(x, torch.zeros(D)), metrics.pca_residual(
            x, metrics.principal_components(x).basis[:, :int(out["adaptivity_m"])],
            x.mean(0))))
    # an L0 that follows the energy: its adaptivity is about the energy baseline, and holding
    # the energy fixed leaves next to nothing
    assert out["adaptivity"] == pytest.approx(out["adaptivity_energy"], abs=0.05)
    assert abs(out["adaptivity_partial"]) < 0.15
    assert pd.notna(out["adaptivity_partial"])


def test_a_sweep_file_sets_its_own_targets(tmp_path):
    from sae.settings.cli import UsageError
    from sae.sweep import spec

    path = tmp_path / "gt.yaml"
    path.write_text("datasets: [mnist]\nseeds: [0]\ntargets: [20, 5, 10]\n"
                    "models:\n  topk: {k: [5, 10, 20]}\n")
    assert spec.load_sweep(path).targets == (5.0, 10.0, 20.0)
    for bad in ("[]", "[0, 5]", "[1, 2, 3, 4, 5]", "[a]"):
        path.write_text(f"datasets: [mnist]\nseeds: [0]\ntargets: {bad}\n"
                        "models:\n  topk: {k: [5]}\n")
        with pytest.raises(UsageError, match="targets"):
            spec.load_sweep(path)
    assert matching.bands([5, 10, 20])[1] == pytest.approx((math.sqrt(50), math.sqrt(200), 10))
    r = runs([("topk", k, 0, float(k), float(k), 1 / k, 1 / k) for k in (5, 10, 20)])
    judged = matching.verdict(r, targets=(5.0, 10.0, 20.0))
    assert list(judged.loc[judged["criterion"] == "FVU at L0", "target"]) == [5.0, 10.0, 20.0]
    assert list(display.headline_display(r, "mnist", (5.0, 10.0, 20.0))["target"]) == [
        "5", "10", "20"]


def test_one_table_across_comparisons():
    a = runs([("topk", 16, 0, 16.0, 16.0, 0.2, 0.2), ("topk", 16, 1, 16.0, 16.0, 0.4, 0.4),
              ("l1", 0.1, 0, 40.0, 40.0, 0.1, 0.1)])
    b = runs([("l1", 0.1, 0, 10.0, 10.0, 0.5, 0.5), ("l1", 0.01, 0, 20.0, 20.0, 0.3, 0.3)])
    table = display.across_display([("A at 16", a, "mnist", 16.0, "fvu_at_l0"),
                                    ("B at 16", b, "mnist", 16.0, "fvu_at_l0")])
    assert list(table.columns) == ["model", "A at 16", "B at 16"]
    rows = table.set_index("model")
    assert rows.loc["topk", "A at 16"] == "0.3000 ± 0.1414"  # mean ± std over seeds
    assert rows.loc["topk", "B at 16"] == "–" and rows.loc["l1", "A at 16"] == "–"
    w = math.log(16 / 10) / math.log(2)
    assert rows.loc["l1", "B at 16"] == f"{0.5 + w * (0.3 - 0.5):.4f}"
