"""A suite of worlds: one sweep file whose common ``data`` lists several data files trains every
model on each, with a run folder, a results row and tables per world."""

import csv

import pytest
from cli_helpers import assert_one_line_error, run_cli
from sweep_helpers import write_yaml

from sae.data import synth
from sae.sweep import spec

TINY = dict(dim=16, features=48, train=1200, test=300, mean_l0=4.0)


def _world(folder, **axes):
    cfg = synth.SynthConfig(**TINY, **axes)
    synth.write(folder, cfg, synth.generate(cfg), "test")
    return folder / "dataset.json"


@pytest.fixture(scope="module")
def worlds(tmp_path_factory):
    root = tmp_path_factory.mktemp("worlds")
    return [_world(root / "base"), _world(root / "heavy", value_sigma=1.5),
            _world(root / "fixed", counts="fixed", pair_share=0.0)]


def _suite(worlds):
    return {"description": "three worlds", "seeds": [0],
            "common": {"data": [str(w) for w in worlds], "hidden": 32, "epochs": 1,
                       "batch_size": 128, "val_size": 200, "no_figures": True},
            "models": {"l1": {"lambda": [0.05]}, "topk": {"k": [4]}}}


def test_each_model_runs_on_each_world_named_after_its_settings(tmp_path, worlds):
    sweep = spec.load_sweep(write_yaml(tmp_path / "suite.yaml", _suite(worlds)))
    assert sweep.datasets == ("synthetic-d16-f48-mean-l0-4-seed-0",
                              "synthetic-d16-f48-mean-l0-4-value-sigma-1.5-seed-0",
                              "synthetic-d16-f48-mean-l0-4-pair-share-0-counts-fixed-seed-0")
    runs = spec.plan(sweep)
    assert len(runs) == 6
    for run in runs:  # each run names its own world's file, not the list
        data = run.argv[run.argv.index("--data") + 1]
        assert data in map(str, worlds) and str(run.rel).split("/")[1] == run.dataset
    # one search budget per model across the worlds: equal here, so no reason is needed
    spec.check_budgets(sweep)


def test_a_list_with_two_worlds_of_one_name_is_refused(tmp_path, worlds):
    path = write_yaml(tmp_path / "suite.yaml", _suite([worlds[0], worlds[0]]))
    with pytest.raises(spec.UsageError, match="two files have the data set name"):
        spec.load_sweep(path)
    result = run_cli([path, "--dry-run"], tmp_path, tmp_path, module="sae.compare")
    assert_one_line_error(result)


@pytest.mark.slow
def test_a_suite_sweep_writes_a_results_row_per_world_and_model(tmp_path, worlds, data_dir):
    path = write_yaml(tmp_path / "suite.yaml", _suite(worlds[:2]))
    result = run_cli([path, "--out", tmp_path / "out", "--jobs", "2"], tmp_path, data_dir,
                     module="sae.compare", timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    with open(tmp_path / "out" / "results.csv") as f:
        rows = list(csv.DictReader(f))
    assert sorted((r["dataset"], r["model"]) for r in rows) == sorted(
        (w, m) for w in spec.load_sweep(path).datasets for m in ("l1", "topk"))
    page = (tmp_path / "out" / "comparison.md").read_text()
    assert all(w in page for w in spec.load_sweep(path).datasets)
