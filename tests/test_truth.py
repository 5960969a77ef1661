"""Data whose features are known (python -m sae.synth) and the scores against them."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from sae import metrics
from sae.data import synth
from sae.data.matrix import MatrixError, load_data
from sae.data.matrixdata import MatrixDataModule

SMALL = synth.SynthConfig(dim=16, features=64, train=3000, test=500, mean_l0=6.0, seed=3)


@pytest.fixture(scope="module")
def small():
    return synth.generate(SMALL)


def test_the_generator_draws_what_it_is_asked_for(small):
    true_l0 = small.train_active.sum(1)
    assert small.train_x.shape == (3000, 16) and small.test_active.shape == (500, 64)
    assert small.train_x.dtype == np.float32 and small.features.dtype == np.float32
    assert np.allclose(np.linalg.norm(small.features, axis=1), 1.0, atol=1e-6)
    assert abs(true_l0.mean() - 6.0) < 0.6  # about the mean asked for
    assert true_l0.min() >= 1 and true_l0.max() >= 4 * 6  # a wide range, from 1
    freq = small.train_active.mean(0)
    assert freq.max() > 5 * np.median(freq)  # heavy-tailed firing frequencies
    # the same settings give the same data; another seed other data
    again = synth.generate(SMALL)
    assert np.array_equal(again.train_x, small.train_x)
    assert np.array_equal(again.test_active, small.test_active)
    other = synth.generate(synth.SynthConfig(**{**SMALL.__dict__, "seed": 4}))
    assert not np.array_equal(other.train_x, small.train_x)


def test_rows_are_their_features_plus_noise():
    cfg = synth.SynthConfig(dim=16, features=64, train=400, test=100, mean_l0=5.0, noise=0.0,
                            pair_share=0.0)
    data = synth.generate(cfg)
    # without noise each row lies in the span of its own true features, with positive weights
    for x, on in zip(data.test_x[:50], data.test_active[:50], strict=True):
        g = data.features[on].astype(np.float64)
        w, *_ = np.linalg.lstsq(g.T, x.astype(np.float64), rcond=None)
        assert np.allclose(g.T @ w, x, atol=1e-4)
        if on.sum() <= 16:  # identifiable: the weights are the positive values drawn
            assert (w > 0).all()


def test_the_number_of_features_follows_the_latent_complexity():
    # the latent complexity is shared by K and the partners: with pairs off, K - 1 is Poisson
    # given c, so its variance far exceeds its mean (an over-dispersed, wide distribution)
    cfg = synth.SynthConfig(dim=16, features=256, train=200, test=20_000, mean_l0=8.0,
                            pair_share=0.0)
    k = synth.generate(cfg).test_active.sum(1).astype(float)
    assert k.var() > 3 * (k.mean() - 1)
    flat = synth.SynthConfig(**{**cfg.__dict__, "complexity_sigma": 0.0})
    k_flat = synth.generate(flat).test_active.sum(1).astype(float)
    assert k_flat.var() == pytest.approx(k_flat.mean() - 1, rel=0.15)  # Poisson alone


def test_bad_settings_are_refused():
    for kw, word in (({"dim": 1}, "--dim"), ({"mean_l0": 40.0}, "quarter"),
                     ({"noise": float("nan")}, "--noise"), ({"features": 10**6}, "--features")):
        with pytest.raises(ValueError, match=word):
            synth.SynthConfig(**{**SMALL.__dict__, **kw}).check()


# --------------------------------------------------------------------------- the measures


def test_the_true_dictionary_scores_one_and_a_random_one_near_zero(small):
    features = torch.from_numpy(small.features)
    exact = metrics.match_features(features.T.clone(), features)
    assert exact.recovery == 1.0 and exact.mcc == pytest.approx(1.0)
    assert torch.equal(exact.unit_of, torch.arange(64))
    # a wider dictionary holding the truth among random atoms, shuffled and rescaled
    g = torch.Generator().manual_seed(0)
    wide = torch.cat([features.T * 3.0, torch.randn(16, 64, generator=g)], dim=1)
    wide = wide[:, torch.randperm(128, generator=g)]
    match = metrics.match_features(wide, features)
    assert match.recovery == 1.0 and match.mcc == pytest.approx(1.0)
    random = metrics.match_features(torch.randn(16, 128, generator=g), features)
    assert random.recovery < 0.1 and random.mcc < 0.8
    # in many dimensions a random dictionary is far from every feature
    truth = torch.randn(128, 512, generator=g)
    random = metrics.match_features(torch.randn(512, 32, generator=g), truth)
    assert random.recovery == 0.0 and random.mcc < 0.2


def test_recovery_is_signed_and_mcc_is_not():
    features = torch.eye(4)
    flipped = -torch.eye(4)  # atoms pointing the other way
    match = metrics.match_features(flipped, features)
    assert match.recovery == 0.0 and match.mcc == pytest.approx(1.0)


def test_fewer_atoms_than_features_leave_features_unmatched():
    features = torch.eye(4)
    match = metrics.match_features(torch.eye(4)[:, :2], features)
    assert match.mcc == pytest.approx(0.5) and match.recovery == pytest.approx(0.5)
    assert sorted(match.unit_of.tolist()) == [-1, -1, 0, 1]


def hand_case():
    """4 features in R^4 (the axes); 5 atoms: 0-3 the features in another order, 4 a stray."""
    features = torch.eye(4)
    atoms = torch.tensor([[0, 1, 0, 0, 1], [1, 0, 0, 0, 1], [0, 0, 0, 1, 0], [0, 0, 1, 0, 0]],
                         dtype=torch.float32)  # atom 0 = feature 1, 1 = 0, 2 = 3, 3 = 2
    truth = torch.tensor([[1, 1, 0, 0], [0, 0, 1, 0], [1, 1, 1, 1]], dtype=torch.bool)
    return features, atoms, truth


def test_precision_recall_and_l0_on_a_hand_built_case():
    features, atoms, truth = hand_case()
    codes = torch.tensor([[1.0, 2.0, 0, 0, 0],      # features 1, 0: both right
                          [0, 0, 0, 0.5, 0.5],     # feature 2 right, the stray unit wrong
                          [0, 0, 0, 1.0, 0]])      # 1 of 4
    x = torch.tensor([[1.0, 1, 0, 0], [0, 0, 1, 0], [1, 1, 1, 1]])
    out = metrics.ground_truth(codes, truth, atoms, features, x, torch.zeros(4))
    assert out["gt_recovery"] == 1.0 and out["gt_mcc"] == pytest.approx(1.0)
    assert out["gt_precision"] == pytest.approx((1 + 0.5 + 1) / 3)
    assert out["gt_recall"] == pytest.approx((1 + 1 + 0.25) / 3)
    # L0 (2, 2, 1) against true L0 (2, 1, 4)
    assert out["gt_l0_error"] == pytest.approx((0 + 1 + 0.75) / 3)
    assert out["gt_l0_spearman"] == pytest.approx(metrics.adaptivity(
        torch.tensor([2.0, 2, 1]), torch.tensor([2.0, 1, 4])))
    assert out["gt_l0_energy"] == pytest.approx(1.0)  # energy 2, 1, 4 ranks as true L0


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 1000), n=st.integers(2, 30))
def test_the_measures_stay_in_their_ranges(seed, n):
    g = torch.Generator().manual_seed(seed)
    features = torch.randn(6, 5, generator=g)
    atoms = torch.randn(5, 9, generator=g)
    truth = torch.rand(n, 6, generator=g) < 0.4
    codes = torch.relu(torch.randn(n, 9, generator=g))
    out = metrics.ground_truth(codes, truth, atoms, features, torch.randn(n, 5, generator=g),
                               torch.zeros(5))
    for key in ("gt_recovery", "gt_mcc", "gt_precision", "gt_recall"):
        assert out[key] != out[key] or 0.0 <= out[key] <= 1.0  # NaN only when undefined
    for key in ("gt_l0_spearman", "gt_l0_energy"):
        assert out[key] is None or -1.0 <= out[key] <= 1.0
    assert out["gt_l0_error"] != out["gt_l0_error"] or out["gt_l0_error"] >= 0


# --------------------------------------------------------------------------- the files


def write(tmp_path: Path, cfg=SMALL) -> Path:
    out = tmp_path / "gt"
    synth.write(out, cfg, synth.generate(cfg), "test")
    return out / "dataset.json"


def test_the_manifest_round_trips_and_the_data_module_carries_the_truth(tmp_path, small):
    manifest = write(tmp_path)
    data = load_data(manifest)
    assert np.array_equal(data.truth_features, small.features)
    dm = MatrixDataModule(manifest, val_size=300)
    dm.setup()
    assert dm.truth.test.shape == (500, 64) and dm.truth.val.shape == (300, 64)
    assert torch.equal(dm.truth.test, torch.from_numpy(small.test_active))
    # each validation row's truth is that of the training row it was carved from
    rows = {tuple(r) for r in small.train_x[:, :4].round(5).tolist()}
    assert {tuple(r) for r in dm.val_x[:, :4].numpy().round(5).tolist()} <= rows
    spec = json.loads(manifest.read_text())
    assert spec["source"]["true_l0_mean"]["test"] == pytest.approx(
        float(small.test_active.sum(1).mean()), abs=1e-4)


@pytest.mark.parametrize("edit, words", [
    (lambda s: s.pop("truth"), "\"active\" needs \"truth\""),
    (lambda s: s["test"].pop("active"), "every split needs \"active\""),
    (lambda s: s.update(truth={"features": "test.npy"}), "bytes per row for 500 true"),
    (lambda s: s.update(truth={"features": "test_active.npy"}), "true features of shape"),
    (lambda s: s["train"].update(active="test_active.npy"), "true features of shape"),
    (lambda s: s.update(truth="features.npy"), "\"truth\" must be"),
])
def test_a_damaged_truth_is_refused_in_one_line(tmp_path, edit, words):
    manifest = write(tmp_path)
    spec = json.loads(manifest.read_text())
    edit(spec)
    manifest.write_text(json.dumps(spec))
    with pytest.raises(MatrixError, match=words):
        load_data(manifest)


def run_synth(args, cwd):
    env = dict(os.environ)
    return subprocess.run([sys.executable, "-m", "sae.synth", *map(str, args)], cwd=cwd,
                          env=env, capture_output=True, text=True, timeout=120)


@pytest.mark.slow
def test_the_command_writes_a_dataset_and_refuses_bad_input(tmp_path):
    done = run_synth(["--out", "gt", "--dim", "8", "--features", "32", "--train", "500",
                      "--test", "100", "--mean-l0", "4"], tmp_path)
    assert done.returncode == 0, done.stderr
    assert "true L0 per test row: mean" in done.stdout
    assert load_data(tmp_path / "gt" / "dataset.json").truth_features.shape == (32, 8)
    for args, words in ((["--out", "gt"], "not an empty folder"),
                        (["--out", "g2", "--dim", "0"], "--dim must be in"),
                        (["--out", "g2", "--mean-l0", "x"], "invalid float value"),
                        (["--out", "g2", "--lamda", "1"], "unrecognized arguments")):
        bad = run_synth(args, tmp_path)
        assert bad.returncode == 2, bad.stderr
        lines = bad.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: ") and words in lines[0], lines
    assert not (tmp_path / "g2").exists()


@pytest.mark.slow
def test_a_run_on_data_with_known_features_is_scored_against_them(tmp_path):
    manifest = write(tmp_path)
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env.pop("SAE_RUN_DIR", None)
    done = subprocess.run([sys.executable, "-m", "sae.run", "--data", str(manifest),
                           "--hidden", "128", "--max-steps", "60", "--val-size", "300",
                           "--batch-size", "128", "--out", "run", "--no-figures",
                           "--no-report", "--no-features"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    result = json.loads((tmp_path / "run" / "metrics.json").read_text())
    for key in (*metrics.GROUND_TRUTH_KEYS, "val_gt_l0_spearman", "val_fvu", "val_l0"):
        assert key in result, key
    assert 0.0 <= result["gt_mcc"] <= 1.0 and -1.0 <= result["gt_l0_spearman"] <= 1.0
    assert result["val_l0"] > 0
    # its report defines every metric it shows, the scores against the truth included
    from test_report import metric_rows

    from sae.pages import report
    from sae.settings.metric_defs import METRIC

    rows = metric_rows(report.render_report(tmp_path / "run"))
    assert set(metrics.GROUND_TRUTH_KEYS) <= set(rows)
    assert all(note == METRIC[name].definition for name, (_, note) in rows.items())
    assert len(rows) == len(result) - len(set(result) & set(report._RUN_FACTS))  # all but facts


def test_the_truth_figure_draws_every_model_and_the_energy_baseline():
    import pandas as pd

    from sae.sweep import plots

    rows = []
    for model, param in (("sparsemax", "lambda"), ("batchtopk", "k")):
        for value, l0 in ((0.1, 5.0), (0.03, 10.0)):
            rows.append({"dataset": "synthetic", "model": model, "param": param,
                         "value": value if param == "lambda" else l0, "n_seeds": 3,
                         "l0_mean_mean": l0, "l0_mean_std": 0.1,
                         "gt_recovery_mean": 0.9, "gt_recovery_std": 0.01,
                         "gt_l0_spearman_mean": 0.85, "gt_l0_spearman_std": 0.01,
                         "gt_l0_energy_mean": 0.817, "gt_l0_energy_std": 0.0})
    fig = plots.truth_vs_l0(pd.DataFrame(rows))
    recovery, tracking = fig.axes[:2]
    assert len(recovery.lines) >= 2 and len(tracking.lines) >= 3
    assert any("energy" in line.get_label() and "0.817" in line.get_label()
               for line in tracking.lines)
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert {"sparsemax", "batchtopk"} <= set(legend)


def test_the_two_mccs_with_fewer_units_than_features():
    """Two atoms for four features: atom 0 is feature 2 exactly, atom 1 is 0.6·feature 0 +
    0.8·feature 3. The matching takes (2, 0) at cosine 1 and feature 3 with atom 1 at 0.8; MCC
    over the features counts the two unmatched as 0, SAELens' MCC averages the two pairs."""
    features = torch.eye(4)
    atoms = torch.tensor([[0.0, 0.6], [0, 0], [1, 0], [0, 0.8]])
    match = metrics.match_features(atoms, features)
    assert match.unit_of.tolist() == [-1, -1, 0, 1]
    assert match.mcc == pytest.approx((1 + 0.8) / 4)
    assert match.mcc_pairs == pytest.approx((1 + 0.8) / 2)
    wide = metrics.match_features(torch.eye(4)[:, [3, 1, 0, 2]], features)  # H = F: equal
    assert wide.mcc == pytest.approx(1.0) and wide.mcc_pairs == pytest.approx(1.0)


def test_the_partial_rho_holds_energy_fixed():
    """An L0 that is a function of energy alone scores ρ as energy does and a partial ρ of ~0;
    one that follows the true L0 beyond energy keeps a partial ρ."""
    gen = torch.Generator().manual_seed(0)
    n = 400
    true_l0 = torch.randint(1, 20, (n,), generator=gen)
    x = torch.randn(n, 8, generator=gen) * (true_l0[:, None].float().sqrt()
                                           + torch.rand(n, 1, generator=gen) * 3)
    truth = torch.arange(20)[None, :] < true_l0[:, None]
    features, atoms = torch.eye(20, 8), torch.eye(8, 20)
    energy = (x ** 2).sum(1)
    ranks = energy.argsort().argsort()  # L0 from 1 to 20 by the input's energy rank
    by_energy = (torch.arange(20)[None, :] < (ranks[:, None] * 20 // n + 1)).float()
    follows = truth.float()
    out_e = metrics.ground_truth(by_energy, truth, atoms, features, x, torch.zeros(8))
    out_t = metrics.ground_truth(follows, truth, atoms, features, x, torch.zeros(8))
    assert out_e["gt_l0_spearman"] == pytest.approx(out_e["gt_l0_energy"], abs=0.02)
    assert abs(out_e["gt_l0_partial"]) < 0.1
    assert out_t["gt_l0_spearman"] == pytest.approx(1.0) and out_t["gt_l0_partial"] > 0.9


def _counts(cfg):
    data = synth.generate(cfg)
    k = data.train_active.sum(1).astype(float)
    return data, k


WORLD = dict(dim=32, features=128, train=8000, test=100, mean_l0=8.0, seed=1)


def test_the_count_axis_gives_its_stated_dispersion():
    """latent: over-dispersed (variance / mean well above 1); fixed: every row round(mean_l0);
    independent: each feature on its own, variance / mean below 1 (Poisson-binomial)."""
    _, latent = _counts(synth.SynthConfig(**WORLD))
    _, fixed = _counts(synth.SynthConfig(**WORLD, counts="fixed", pair_share=0.0))
    _, independent = _counts(synth.SynthConfig(**WORLD, counts="independent"))
    assert latent.var() / latent.mean() > 3
    assert (fixed == 8).all()
    assert independent.var() / independent.mean() < 1
    assert independent.mean() == pytest.approx(8 * 1.1, rel=0.15)  # pairs add ~10 %


def test_heavy_tailed_magnitudes_make_energy_a_worse_guide_to_the_count():
    """With log-normal values of σ 1.5 a row's energy says less about its number of features
    than with σ 0.5 (the world where a temperature that reads energy has it easy)."""
    def rho(sigma):
        data, k = _counts(synth.SynthConfig(**WORLD, value_sigma=sigma))
        energy = (data.train_x.astype(float) ** 2).sum(1)
        return metrics.adaptivity(torch.from_numpy(energy), torch.from_numpy(k))

    light, heavy = rho(0.5), rho(1.5)
    assert light > 0.7 and heavy < light - 0.15
    data, k = _counts(synth.SynthConfig(**WORLD, value_sigma=1.5, counts="fixed",
                                        pair_share=0.0, noise=0.0))
    norms = np.linalg.norm(data.train_x, axis=1)
    assert np.quantile(norms, 0.99) / np.median(norms) > 5  # the tails, at a fixed count


def test_a_child_feature_is_active_only_with_its_parent():
    cfg = synth.SynthConfig(**WORLD, hierarchy=0.3)
    data = synth.generate(cfg)
    parent = synth._dictionary(cfg, np.random.default_rng(cfg.seed)).parent
    children = np.flatnonzero(parent >= 0)
    assert len(children) == round(0.3 * 128)
    active = data.train_active
    assert active[:, children].any()
    assert not (active[:, children] & ~active[:, parent[children]]).any()


def test_the_axes_are_checked_and_the_default_world_is_unchanged(tmp_path):
    with pytest.raises(ValueError, match="--counts must be one of"):
        synth.SynthConfig(counts="poison").check()
    with pytest.raises(ValueError, match="--pair-share 0"):
        synth.SynthConfig(counts="fixed").check()
    manifest = synth.manifest(SMALL, synth.generate(SMALL), "cmd")
    assert "counts" not in manifest["source"] and "hierarchy" not in manifest["source"]
