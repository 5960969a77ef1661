"""Sweeps that name target L0s instead of λ grids (``target_l0``), and the equal search budget
every model of a sweep gets unless the file says why (``unequal_budget``)."""

from pathlib import Path

import pandas as pd
import pytest
import yaml
from sweep_helpers import results, write_yaml
from test_compare import PRESETS, one_line_error, run_compare

from sae.settings.config import NO_BUDGET
from sae.sweep import command as compare
from sae.sweep import spec
from sae.sweep.matching import at_l0, matched_label

TARGETS = {
    "datasets": ["mnist"], "seeds": [0, 1], "targets": [16, 32],
    "common": {"hidden": 64, "target_l0": "targets"},
    "models": {"l1": {}, "topk": {}, "jumprelu": {"lambda": 0.03},
               "sparsemax-attention": {}},
}


def error_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: "), err
    return err[0]


def test_targets_expand_to_one_run_per_target_and_seed(tmp_path, capsys):
    sweep = spec.load_sweep(write_yaml(tmp_path / "s.yaml", TARGETS))
    runs = spec.plan(sweep)
    by_model = {}
    for run in runs:
        by_model.setdefault(run.model, []).append(run)
    # every mechanism with a λ: one run aimed at each target, per seed
    for model in ("l1", "jumprelu"):
        got = [(r.param, r.value, r.seed, r.config.sae.target_l0) for r in by_model[model]]
        assert got == [("target_l0", 16, 0, 16), ("target_l0", 16, 1, 16),
                       ("target_l0", 32, 0, 32), ("target_l0", 32, 1, 32)]
        assert all(r.argv[r.argv.index("--target-l0") + 1] in ("16", "32")
                   for r in by_model[model])
    assert {r.rel.as_posix() for r in by_model["l1"]} == {
        f"runs/mnist/l1/target{t}/seed{s}" for t in (16, 32) for s in (0, 1)}
    assert {r.config.sae.lam for r in by_model["jumprelu"]} == {0.03}  # where λ starts
    # topk: k is the target
    assert [(r.param, r.value, r.config.sae.k) for r in by_model["topk"]] == \
        [("k", 16, 16), ("k", 16, 16), ("k", 32, 32), ("k", 32, 32)]
    assert all("--target-l0" in r.argv for r in by_model["topk"])
    # the published Sparsemax-SAE keeps its one run per seed at its own L0
    assert [(r.param, r.config.sae.target_l0) for r in by_model["sparsemax-attention"]] == \
        [("none", None), ("none", None)]
    spec.check_budgets(sweep)  # two configurations per seed for each: equal
    # a model's own list, and the dry run shows the commands
    data = {**TARGETS, "models": {"l1": {"target_l0": [8, 24]}, "topk": {"target_l0": [8, 24]}}}
    path = write_yaml(tmp_path / "own.yaml", data)
    assert compare.main([str(path), "--out", str(tmp_path / "out"), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "runs/mnist/l1/target24/seed1" in out and "--target-l0 24" in out
    assert "runs/mnist/topk/k8/seed0" in out and "8 runs (8 new)" in out
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("models, common, words", [
    ({"l1": {"lambda": [0.01, 0.1], "target_l0": [16, 32]}}, {}, "not both"),
    ({"topk": {"k": [16], "target_l0": [16]}}, {}, "not both"),
    ({"l1": {"lambda": [0.01, 0.1]}}, {"target_l0": [16, 32]}, "target_l0 from common"),
    ({"sparsemax-attention": {"target_l0": [16]}}, {}, "its L0 is its own"),
    ({"topk": {"target_l0": [16.5]}}, {}, "whole number"),
    ({"l1": {"target_l0": [16, 0]}}, {}, "target_l0"),
    ({"l1": {"target_l0": "targets"}}, {"hidden": 64}, "needs the sweep's `targets`"),
])
def test_a_grid_and_targets_for_one_model_are_refused_in_one_line(tmp_path, capsys, models,
                                                                  common, words):
    data = {"datasets": ["mnist"], "seeds": [0], "common": {"hidden": 64, **common},
            "models": models}
    path = write_yaml(tmp_path / "s.yaml", data)
    assert compare.main([str(path), "--out", str(tmp_path / "out"), "--dry-run"]) == 2
    assert words in error_line(capsys)
    assert not (tmp_path / "out").exists()


def test_a_model_keeps_its_grid_against_common_targets_with_null(tmp_path):
    data = {"datasets": ["mnist"], "seeds": [0], "common": {"hidden": 64, "target_l0": [16, 32]},
            "models": {"l1": {}, "kl": {"target_l0": None, "lambda": [0.01, 1]}}}
    runs = spec.plan(spec.load_sweep(write_yaml(tmp_path / "s.yaml", data)))
    assert [(r.model, r.param, r.value) for r in runs] == [
        ("l1", "target_l0", 16), ("l1", "target_l0", 32), ("kl", "lambda", 0.01),
        ("kl", "lambda", 1)]
    assert all(r.config.sae.target_l0 is None for r in runs if r.model == "kl")


UNEQUAL = {"datasets": ["mnist"], "seeds": [0], "common": {"hidden": 64},
           "models": {"l1": {"lambda": [0.01, 0.02, 0.04]}, "kl": {"lambda": [0.01, 1, 10]},
                      "topk": {"k": [16, 32]}, "sparsemax-attention": {}}}


def test_an_unequal_budget_is_refused_in_one_line_unless_declared(tmp_path, capsys):
    path = write_yaml(tmp_path / "s.yaml", UNEQUAL)
    out = tmp_path / "out"
    assert compare.main([str(path), "--out", str(out), "--dry-run"]) == 2
    line = error_line(capsys)
    assert "search budgets differ" in line and "l1, kl 3; topk 2" in line
    assert "unequal_budget" in line and "sparsemax-attention" not in line
    # declared: accepted, and the reason kept for the page
    reason = "k is the target for TopK; the λ models need three λ to bracket L0 16 and 32"
    write_yaml(path, {**UNEQUAL, "unequal_budget": reason})
    assert compare.main([str(path), "--out", str(out), "--dry-run"]) == 0
    assert "9 runs" in capsys.readouterr().out
    sweep = spec.load_sweep(path)
    assert sweep.unequal_budget == reason
    assert sweep.description.endswith(f"(training configurations per seed: l1, kl 3; topk 2): "
                                      f"{reason}")
    # a declaration must be a reason
    for bad in ("", "  ", 3, ["a"]):
        write_yaml(path, {**UNEQUAL, "unequal_budget": bad})
        assert compare.main([str(path), "--out", str(out), "--dry-run"]) == 2
        assert "`unequal_budget` must be the reason" in error_line(capsys)


def test_budgets_count_targets_and_data_groups(tmp_path):
    data = {"seeds": [0], "datasets": ["mnist"], "common": {"hidden": 64},
            "models": {"l1": {"target_l0": [8, 16, 32]}, "topk": {"k": [8, 16, 32]},
                       "kl": {"lambda": 0.1}, "entmax": {"data": "acts.npy", "lambda": [0.1]}}}
    sweep = spec.load_sweep(write_yaml(tmp_path / "s.yaml", data))
    # a model without a grid is one configuration; a model on a data file is compared with
    # the others on it only
    assert spec.budgets(sweep) == {"": {"l1": 3, "topk": 3, "kl": 1}, "acts.npy": {"entmax": 1}}
    with pytest.raises(spec.UsageError, match="l1, topk 3; kl 1"):
        spec.check_budgets(sweep)
    del data["models"]["kl"]
    spec.check_budgets(spec.load_sweep(write_yaml(tmp_path / "s.yaml", data)))


@pytest.mark.parametrize("preset", PRESETS, ids=lambda p: p.name)
def test_presets_declare_exactly_the_unequal_budgets(preset):
    sweep = spec.load_sweep(preset)
    spec.check_budgets(sweep)  # no data file needed: the check is on the file
    counts = {len(e.values) for e in sweep.models if e.kind not in NO_BUDGET}
    assert bool(sweep.unequal_budget) == (len(counts) > 1)
    if sweep.unequal_budget:  # the page says it
        assert sweep.description.endswith(sweep.unequal_budget)


def _landed(runs: list[spec.Run], place: dict) -> pd.DataFrame:
    """A results frame of planned runs, each at the mean L0 ``place`` gives its (model, value,
    seed)."""
    rows = [(r.dataset, r.model, r.kind, r.param, r.value, r.seed, 0.1 + r.seed / 100,
             place[(r.model, r.value, r.seed)], 0.9) for r in runs]
    return results(rows)


def test_runs_landing_within_tolerance_of_their_target_get_a_cell(tmp_path):
    data = {**TARGETS, "models": {"l1": {}, "sparsemax": {}, "topk": {}}}
    runs = spec.plan(spec.load_sweep(write_yaml(tmp_path / "s.yaml", data)))
    place = {("l1", 16, 0): 15.8, ("l1", 16, 1): 16.6, ("l1", 32, 0): 32.5, ("l1", 32, 1): 31.2,
             # seed 1 misses 16 by 10 % (nothing beyond it to interpolate with)
             ("sparsemax", 16, 0): 16.3, ("sparsemax", 16, 1): 17.6,
             ("sparsemax", 32, 0): 33.4, ("sparsemax", 32, 1): 30.9,
             ("topk", 16, 0): 16.0, ("topk", 16, 1): 16.0, ("topk", 32, 0): 32.0,
             ("topk", 32, 1): 32.0}
    matched = at_l0(_landed(runs, place), [16.0, 32.0]).set_index(["model", "target"])
    l1_16 = matched.loc[("l1", 16.0)]
    assert l1_16["n_seeds"] == 2 and l1_16["n_missing"] == 0
    assert l1_16["l0"] == pytest.approx((15.8 + 16.6) / 2)  # each run as it landed
    assert l1_16["lo_value"] == l1_16["hi_value"] == 16
    assert matched_label(l1_16) == "target L0 = 16"
    assert matched.loc[("l1", 32.0)]["l0"] == pytest.approx((32.5 + 31.2) / 2)
    # beyond the tolerance a seed has no cell; the seed within it still does
    sm = matched.loc[("sparsemax", 16.0)]
    assert sm["n_seeds"] == 1 and sm["n_missing"] == 1 and sm["l0"] == pytest.approx(16.3)
    assert matched.loc[("sparsemax", 32.0)]["n_seeds"] == 2
    assert matched.loc[("topk", 16.0)]["lo_value"] == 16
    # between the targets the runs aimed at them are interpolated as a grid's would be
    mid = at_l0(_landed(runs, place), [22.0]).set_index("model")
    assert matched_label(mid.loc["l1"]) == "target L0 = 16 … 32"


@pytest.mark.slow
def test_a_target_sweep_runs_end_to_end(tmp_path, data_dir):
    data = {"description": "two models aimed at two L0s", "datasets": ["mnist"], "seeds": [0],
            "targets": [4, 8],
            "common": {"hidden": 16, "limit_train": 300, "val_size": 100, "limit_test": 200,
                       "batch_size": 64, "epochs": 3, "no_figures": True, "no_report": True,
                       "target_l0": "targets"},
            "models": {"l1": {"lambda": 0.05}, "topk": {}}}
    write_yaml(tmp_path / "targets.yaml", data)
    result = run_compare(["targets.yaml", "--out", "sweep"], tmp_path, data_dir)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    sweep = tmp_path / "sweep"
    frame = pd.read_csv(sweep / "results.csv")
    assert sorted(zip(frame["model"], frame["param"], frame["value"], strict=True)) == [
        ("l1", "target_l0", 4), ("l1", "target_l0", 8), ("topk", "k", 4), ("topk", "k", 8)]
    config = yaml.safe_load((sweep / "runs/mnist/l1/target8/seed0/config.yaml").read_text())
    assert config["target_l0"] == 8 and config["lambda"] == 0.05  # where λ started
    assert (frame.loc[frame["model"] == "topk", "l0_mean"] <= 8 + 1e-9).all()
    page = (sweep / "comparison.md").read_text()
    assert "target L0 = 8" in page
    # an unequal budget is refused before anything trains
    data["models"]["topk"] = {"target_l0": [4]}
    write_yaml(tmp_path / "targets.yaml", data)
    refused = run_compare(["targets.yaml", "--out", "sweep2"], tmp_path, data_dir)
    assert "l1 2; topk 1" in one_line_error(refused.returncode, refused.stderr)
    assert not Path(tmp_path / "sweep2").exists()
