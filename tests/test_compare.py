"""sae.compare and sae.sweep: sweep files, the runner as a user calls it, tables and plots."""

import json
import math
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from sae import figures
from sae.data.matrixdata import data_name
from sae.models import MODELS
from sae.settings.cli import UsageError, build_parser
from sae.settings.config import FIXED_BUDGET, NO_BUDGET
from sae.sweep import aggregate, analysis, display, launch, matching, plots, render, spec
from sae.sweep import command as compare

REPO = Path(__file__).resolve().parents[1]
PRESETS = sorted((REPO / "experiments").glob("*.yaml"))

TINY = {
    "description": "two models on 200 images",
    "datasets": ["mnist"],
    "seeds": [0],
    "common": {"hidden": 16, "k": 4, "limit_train": 200, "val_size": 100, "limit_test": 200,
               "batch_size": 64, "epochs": 1, "no_figures": True, "no_report": True},
    "models": {"kl": {"lambda": [0.1]}, "topk": {"k": [4]}},
}


def quick_preset() -> dict:
    """experiments/quick.yaml with its datasets, models and seeds, the first grid value of each
    model, and a few steps per run: the preset's structure end to end in the tests (the preset
    itself takes a few minutes)."""
    preset = yaml.safe_load((REPO / "experiments" / "quick.yaml").read_text())
    preset["common"].update(limit_train=256, val_size=128, limit_test=200, batch_size=64,
                            hidden=32, epochs=1, no_figures=True, no_report=True,
                            no_features=True)
    for entry in preset["models"].values():
        key = "k" if "k" in entry else "lambda"
        if key in entry:  # the published Sparsemax-SAE has no grid
            entry[key] = entry[key][:1]
    return preset


def write_yaml(path: Path, data) -> Path:
    path.write_text(yaml.safe_dump(data, sort_keys=False) if not isinstance(data, str) else data)
    return path


def run_compare(args, cwd, data_dir, timeout=240):
    env = dict(os.environ, SAE_DATA_DIR=str(data_dir), SAE_OFFLINE="1", OMP_NUM_THREADS="2",
               SAE_CACHE_DIR=str(Path(cwd) / "cache"))
    env.pop("SAE_RUN_DIR", None)
    return subprocess.run([sys.executable, "-m", "sae.compare", *map(str, args)], cwd=cwd,
                          env=env, capture_output=True, text=True, timeout=timeout)


def one_line_error(rc: int, stderr: str) -> str:
    assert rc == 2, stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), stderr
    return lines[0]


# --------------------------------------------------------------------------- sweep files


@pytest.mark.parametrize("preset", PRESETS, ids=lambda p: p.name)
def test_presets_are_valid(preset):
    sweep = spec.load_sweep(preset)
    runs = spec.plan(sweep)  # every combination checked by sae.run's own parser
    per_dataset = sum(len(e.grid or (None,)) for e in sweep.models)
    assert len(runs) == len(sweep.datasets) * per_dataset * len(sweep.seeds)
    # every model, except the KL-SAE (no exact zeros) in the wide presets; the Sparsemax-SAE's
    # candidate, energy and inference sweeps compare its variants with BatchTopK only, and its
    # energy-power and batch-support sweeps its variants alone (the dataset's preset or the
    # threshold sweep holds BatchTopK at those settings); the 40-epoch MLP-layer check its two
    # supports and BatchTopK, the 40-epoch MNIST, Fashion-MNIST and wide checks (and the wide
    # check's seeds) its default and BatchTopK
    expected = set(MODELS) - ({"kl"} if preset.stem.startswith("wide") else set())
    if preset.stem not in ("quick", "ground-truth", "mnist", "fashion-mnist", "mlp-layer"):
        expected -= {"sparsemax-attention"}  # pages published before it joined
    if preset.stem.startswith(("sparsemax-energy-power-", "sparsemax-batch-")):
        expected = {"sparsemax"}
    elif preset.stem.startswith(("sparsemax-candidates-", "sparsemax-energy-",
                                 "sparsemax-threshold-", "mlp-layer-40", "mnist-40",
                                 "fashion-mnist-40", "wide-40")):
        expected = {"sparsemax", "batchtopk"}
    assert {e.kind for e in sweep.models} == expected
    parser = build_parser(suppress=True)
    for run in runs:
        parsed = vars(parser.parse_args(run.argv))  # every setting is a valid sae.run flag
        assert parsed["model"] == run.kind
        # runs on a data file are named after it; image runs after their dataset
        assert run.dataset == (data_name(parsed["data"]) if parsed.get("data")
                               else parsed["dataset"])
        assert str(run.rel).startswith(f"runs/{run.dataset}/{run.model}/")
    if preset.stem == "quick":
        assert set(sweep.datasets) == {"mnist", "fashion-mnist"} and len(sweep.seeds) == 1
        assert all(len(e.grid) == 2 for e in sweep.models if e.kind not in NO_BUDGET)
    if preset.stem in ("mnist", "fashion-mnist", "mlp-layer"):  # published: three seeds,
        # every model at the levels that bracket L0 16 and 32 (k itself for the fixed budgets)
        assert len(sweep.seeds) == 3
        for e in sweep.models:
            if e.kind in NO_BUDGET:  # its L0 is its own: one configuration
                assert e.grid is None
                continue
            assert ({16, 32} <= set(e.grid)) if e.kind in FIXED_BUDGET else len(e.grid) >= 3
    if preset.stem.startswith("wide"):  # one seed each; the seed check adds seeds 1 and 2
        # to the 40-epoch page's seed 0
        assert all(r.settings["hidden"] == 4096 for r in runs)
        assert list(sweep.seeds) == ([1, 2] if preset.stem == "wide-40-seeds" else [0])
    if preset.stem != "quick":  # a published page names its support, so that a later change
        # of default leaves its preset training what the page shows
        assert all("support" in {**sweep.common, **e.settings}
                   for e in sweep.models if e.kind == "sparsemax")


def test_presets_exist():
    assert {p.stem for p in PRESETS} >= {"quick", "mnist", "fashion-mnist"}


def test_plan_layers_common_model_and_grid(tmp_path):
    data = {"datasets": "mnist", "seeds": [0, 1], "common": {"hidden": 64, "epochs": 2},
            "models": {"l1": {"lambda": [0.1, 0.2], "epochs": 3},
                       "anneal": {"model": "entmax", "alpha-mode": "anneal"},
                       "topk": {"k": 8}}}
    runs = spec.plan(spec.load_sweep(write_yaml(tmp_path / "s.yaml", data)))
    assert len(runs) == (2 + 1 + 1) * 2
    l1 = [r for r in runs if r.model == "l1"]
    assert [r.value for r in l1] == [0.1, 0.1, 0.2, 0.2]
    assert all(r.settings["epochs"] == 3 and r.settings["hidden"] == 64 for r in l1)
    anneal = [r for r in runs if r.model == "anneal"]
    assert anneal[0].kind == "entmax" and anneal[0].settings["alpha_mode"] == "anneal"
    assert anneal[0].value == 0.01  # no grid: sae.run's default λ
    assert {r.rel.as_posix() for r in runs if r.model == "topk"} == {
        "runs/mnist/topk/k8/seed0", "runs/mnist/topk/k8/seed1"}


@pytest.mark.parametrize("text, words", [
    ("datasets: [mnist\n", "not valid YAML"),
    ("- a\n- b\n", "mapping"),
    ("datasets: [mnist]\nseeds: [0]\nmodels: {l1: {}}\nbudget: 3\n", "unknown key 'budget'"),
    ("datasets: [cifar]\nseeds: [0]\nmodels: {l1: {}}\n", "unknown dataset"),
    ("datasets: [mnist]\nseeds: [0]\nmodels: {l1: {}}\nprobe_loss: hinge\n", "probe_loss"),
    ("datasets: [mnist]\nseeds: 3\nmodels: {l1: {}}\n", "seeds"),
    ("datasets: [mnist]\nseeds: [-1]\nmodels: {l1: {}}\n", "seeds"),
    ("datasets: [mnist]\nseeds: [0]\nmodels: {}\n", "models"),
    ("datasets: [mnist]\nseeds: [0]\nmodels: {pca: {}}\n", "unknown model 'pca'"),
    ("datasets: [mnist]\nseeds: [0]\ncommon: {bogus: 1}\nmodels: {l1: {}}\n", "'bogus'"),
    ("datasets: [mnist]\nseeds: [0]\ncommon: {seed: 1}\nmodels: {l1: {}}\n", "'seed'"),
    ("datasets: [mnist]\nseeds: [0]\ncommon: {out: x}\nmodels: {l1: {}}\n", "'out'"),
    ("datasets: [mnist]\nseeds: [0]\ncommon: {hidden: [8, 16]}\nmodels: {l1: {}}\n", "list"),
    ("datasets: [mnist]\nseeds: [0]\ncommon: {hidden: -4}\nmodels: {l1: {}}\n",
     "hidden must be >= 1"),
    ("datasets: [mnist]\nseeds: [0]\ncommon: {no_figures: 3}\nmodels: {l1: {}}\n",
     "true or false"),
    ("datasets: [mnist]\nseeds: [0]\nmodels: {l1: {}, l1: {}}\n", "repeated key 'l1'"),
    ("datasets: [mnist]\nseeds: [0]\nmodels: {l1: {lambda: [0.1, -1]}}\n", "lambda must be >= 0"),
    ("datasets: [mnist]\nseeds: [0]\nmodels: {l1: {lambda: [0.1, 0.10]}}\n", "repeats"),
    ("datasets: [mnist]\nseeds: [0]\nmodels: {l1: {lambda: []}}\n", "lambda"),
    ("datasets: [mnist]\nseeds: [0]\nmodels: {l1: {k: [4, 8]}}\n", "lambda"),
    ("datasets: [mnist]\nseeds: [0]\ncommon: {hidden: 16}\nmodels: {topk: {k: [8, 32]}}\n",
     "--k"),
])
def test_bad_sweep_file_is_one_line_exit_2(tmp_path, capsys, text, words):
    path = write_yaml(tmp_path / "bad.yaml", text)
    rc = compare.main([str(path), "--out", str(tmp_path / "sweep")])
    line = one_line_error(rc, capsys.readouterr().err)
    assert words in line
    assert not (tmp_path / "sweep").exists()  # nothing was started


@pytest.mark.parametrize("args, words", [
    (["missing.yaml"], "does not exist"),
    (["{sweep}", "--jobs", "0"], "--jobs"),
    (["{sweep}", "--jobs", "two"], "--jobs"),
    (["{sweep}", "--bogus"], "unrecognized"),
    ([], "required"),
])
def test_bad_command_line_is_one_line_exit_2(tmp_path, capsys, args, words):
    sweep = write_yaml(tmp_path / "s.yaml", TINY)
    rc = compare.main([a.format(sweep=sweep) for a in args])
    assert words in one_line_error(rc, capsys.readouterr().err)


def test_foreign_folder_is_never_touched(tmp_path, capsys):
    sweep = write_yaml(tmp_path / "s.yaml", TINY)
    foreign = tmp_path / "out" / "runs" / "mnist" / "kl" / "lambda0.1" / "seed0"
    foreign.mkdir(parents=True)
    (foreign / "notes.txt").write_text("mine")
    rc = compare.main([str(sweep), "--out", str(tmp_path / "out")])
    assert "not a run folder" in one_line_error(rc, capsys.readouterr().err)
    assert [p.name for p in foreign.iterdir()] == ["notes.txt"]


def test_publish_folder_with_other_files_is_refused_before_any_work(tmp_path, capsys):
    sweep = write_yaml(tmp_path / "s.yaml", TINY)
    mine = tmp_path / "pub"
    mine.mkdir()
    (mine / "paper.tex").write_text("mine")
    rc = compare.main([str(sweep), "--out", str(tmp_path / "out"), "--publish", str(mine)])
    assert "paper.tex" in one_line_error(rc, capsys.readouterr().err)
    assert [p.name for p in mine.iterdir()] == ["paper.tex"] and not (tmp_path / "out").exists()


def test_publish_copies_the_outputs_but_not_the_runs(tmp_path):
    sweep = spec.load_sweep(write_yaml(tmp_path / "s.yaml", TINY))
    out = tmp_path / "out"
    (out / "runs").mkdir(parents=True)
    (out / "sweep.yaml").write_text(sweep.text)
    render.write_outputs(out, sweep, spec.plan(sweep), {})
    pub = tmp_path / "figures" / "compare"
    copies = compare.publish(out, pub)
    names = sorted(p.name for p in pub.iterdir())
    assert sorted(p.name for p in copies) == sorted(compare.PUBLISHED)
    assert names == sorted([*compare.PUBLISHED, compare.PUBLISH_MARKER])
    assert (pub / "results.csv").read_bytes() == (out / "results.csv").read_bytes()
    compare.check_publish_dir(pub)  # an earlier publication may be refreshed


def test_dry_run_writes_nothing(tmp_path, capsys):
    sweep = write_yaml(tmp_path / "s.yaml", TINY)
    assert compare.main([str(sweep), "--out", str(tmp_path / "out"), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "2 runs (2 new)" in out and "--model topk" in out
    assert not (tmp_path / "out").exists()


# --------------------------------------------------------------------------- run folders


def test_run_state_and_commands(tmp_path):
    run = spec.plan(spec.load_sweep(write_yaml(tmp_path / "s.yaml", TINY)))[0]
    folder = tmp_path / "run"
    assert launch.run_state(folder) == "new"
    folder.mkdir()
    assert launch.run_state(folder) == "new"  # empty: sae.run may use it
    (folder / "config.yaml").write_text("model: kl\n")
    assert launch.run_state(folder) == "restart"
    assert launch.train_command(run, folder, "restart")[-1] == "--overwrite"
    (folder / "checkpoints").mkdir()
    (folder / "checkpoints" / "last.ckpt").write_bytes(b"")
    assert launch.run_state(folder) == "resume"
    assert launch.train_command(run, folder, "resume")[3:] == ["--out", str(folder), "--resume"]
    (folder / "metrics.json").write_text("{}")
    assert launch.run_state(folder) == "done"
    other = tmp_path / "other"
    other.mkdir()
    (other / "x").write_text("")
    assert launch.run_state(other) == "foreign"


def test_job_env_splits_threads_and_gpus(monkeypatch):
    monkeypatch.setenv("SAE_RUN_DIR", "somewhere")
    env = launch.job_env(1, 3, "2")
    assert env["OMP_NUM_THREADS"] == "3" and env["CUDA_VISIBLE_DEVICES"] == "2"
    assert "SAE_RUN_DIR" not in env
    monkeypatch.setenv("OMP_NUM_THREADS", "6")
    assert launch.total_threads() == 6


def test_run_pool_gives_each_job_a_gpu_and_a_thread_share(tmp_path):
    tiny = {**TINY, "common": {**TINY["common"], "accelerator": "gpu"}}
    runs = spec.plan(spec.load_sweep(write_yaml(tmp_path / "s.yaml", tiny)))
    # each job marks its start and waits (at most 30 s) until the other has started too
    started = tmp_path / "started"
    started.mkdir()
    show = [sys.executable, "-c", "import os, pathlib, sys, time\n"
            "here = pathlib.Path(sys.argv[1])\n"
            "(here / os.environ['CUDA_VISIBLE_DEVICES']).touch()\n"
            "end = time.time() + 30\n"
            "while len(list(here.iterdir())) < 2 and time.time() < end:\n"
            "    time.sleep(0.01)\n"
            "print('env', os.environ['CUDA_VISIBLE_DEVICES'], os.environ['OMP_NUM_THREADS'])",
            str(started)]
    pool = launch.RunPool(jobs=2, threads=3, gpus=["4", "7"])
    futures = [pool.submit(run, show, tmp_path / f"{i}.log") for i, run in enumerate(runs)]
    assert [f.result()[0] for f in futures] == [0, 0]
    pool.executor.shutdown()
    seen = sorted(line.split()[1:] for i in range(2) for line in
                  (tmp_path / f"{i}.log").read_text().splitlines() if line.startswith("env"))
    assert seen == [["4", "3"], ["7", "3"]]  # both ran at once, on different GPUs


def test_run_pool_stop_interrupts_and_starts_nothing_new(tmp_path):
    runs = spec.plan(spec.load_sweep(write_yaml(tmp_path / "s.yaml", TINY)))
    sleep = [sys.executable, "-c", "import time; time.sleep(60)"]
    pool = launch.RunPool(jobs=1, threads=1, gpus=[])
    first = pool.submit(runs[0], sleep, tmp_path / "a.log")
    second = pool.submit(runs[1], sleep, tmp_path / "b.log")
    while not pool.live:
        time.sleep(0.05)
    start = time.perf_counter()
    pool.stop()
    assert time.perf_counter() - start < 30
    assert first.result()[0] != 0  # interrupted
    assert second.cancelled() or second.result()[0] is None  # never started
    assert not (tmp_path / "b.log").is_file() or "$ " not in (tmp_path / "b.log").read_text()


def test_outputs_of_a_sweep_with_no_finished_run(tmp_path):
    sweep = spec.load_sweep(write_yaml(tmp_path / "s.yaml", TINY))
    written = render.write_outputs(tmp_path, sweep, spec.plan(sweep), {})
    assert {p.name for p in written} >= {"results.csv", "comparison.md", "comparison.html"}
    assert list(pd.read_csv(tmp_path / "results.csv").columns) == aggregate.RESULT_COLUMNS
    assert "0 of 2 runs finished" in (tmp_path / "comparison.md").read_text()


def test_pearson():
    assert analysis.pearson([1, 2, 3], [2, 4, 6]) == pytest.approx(1.0)
    assert analysis.pearson([1, 2, 3], [3, 2, 1]) == pytest.approx(-1.0)
    assert analysis.pearson([4, 4, 4], [1, 2, 3]) is None  # constant L0 (TopK): undefined


# --------------------------------------------------------------------------- tables


def results(rows):
    """A results frame from (dataset, model, kind, param, value, seed, fvu, l0, probe) rows."""
    records = [dict(zip(["dataset", "model", "kind", "param", "value", "seed", "fvu", "l0_mean",
                         "probe_accuracy"], r, strict=True)) for r in rows]
    for r in records:
        r.update(mse=r["fvu"] / 10, l0_std=1.0, dead_fraction=0.1, wall_time_s=60.0,
                 l0_ink_corr=0.5,
                 # the sparsemax-loss probe ranks the other way round
                 probe_sparsemax_accuracy=1.9 - r["probe_accuracy"], probe_sparsemax_classes=1.5,
                 # like a KL-SAE, whose sub-threshold units also reconstruct
                 fvu_at_l0=r["fvu"] + (0.5 if r["kind"] == "kl" else 0.0))
    return aggregate.results_frame(records)


def test_results_frame_has_documented_columns():
    frame = aggregate.results_frame([{"dataset": "mnist", "fvu": 0.2, "extra": 1}])
    assert list(frame.columns) == aggregate.RESULT_COLUMNS
    assert math.isnan(frame.loc[0, "probe_accuracy"])


def test_summarize_seeds_mean_and_sample_std():
    frame = results([
        ("mnist", "l1", "l1", "lambda", 0.1, 0, 0.2, 10, 0.90),
        ("mnist", "l1", "l1", "lambda", 0.1, 1, 0.4, 20, 0.92),
        ("mnist", "l1", "l1", "lambda", 0.1, 2, 0.3, 30, 0.94),
        ("mnist", "l1", "l1", "lambda", 0.01, 0, 0.1, 50, 0.95),
        ("mnist", "topk", "topk", "k", 8, 0, 0.5, 8, 0.80),
    ])
    s = aggregate.summarize_seeds(frame)
    assert list(zip(s["model"], s["value"], strict=True)) == [("l1", 0.01), ("l1", 0.1),
                                                              ("topk", 8)]
    row = s[(s["model"] == "l1") & (s["value"] == 0.1)].iloc[0]
    assert row["n_seeds"] == 3
    assert row["fvu_mean"] == pytest.approx(0.3)
    assert row["fvu_std"] == pytest.approx(0.1)  # sample std (ddof = 1)
    assert row["l0_mean_std"] == pytest.approx(10.0)
    assert row["probe_accuracy_mean"] == pytest.approx(0.92)
    assert math.isnan(s.iloc[0]["fvu_std"])  # one seed: no spread measured
    assert aggregate.summarize_seeds(aggregate.results_frame([])).empty


def test_summarize_seeds_ignores_missing_probe():
    frame = results([("mnist", "l1", "l1", "lambda", 0.1, 0, 0.2, 10, 0.9),
                     ("mnist", "l1", "l1", "lambda", 0.1, 1, 0.2, 10, float("nan"))])
    assert aggregate.summarize_seeds(frame).loc[0, "probe_accuracy_mean"] == pytest.approx(0.9)


def summary(rows):
    return aggregate.summarize_seeds(results(rows))


def test_match_kl_nearest_l0_and_deltas():
    s = summary([
        ("mnist", "kl", "kl", "lambda", 0.1, 0, 0.30, 10, 0.90),
        ("mnist", "kl", "kl", "lambda", 1.0, 0, 0.50, 50, 0.80),
        ("mnist", "l1", "l1", "lambda", 0.01, 0, 0.20, 12, 0.95),
        ("mnist", "topk", "topk", "k", 32, 0, 0.10, 45, 0.85),
    ])
    m = aggregate.match_kl(s).set_index("model")
    assert len(m) == 2 and "kl" not in m.index
    assert m.loc["l1", "kl_value"] == 0.1 and m.loc["l1", "kl_l0"] == 10
    assert m.loc["l1", "d_fvu"] == pytest.approx(-0.1)
    assert m.loc["l1", "kl_fvu_at_l0"] == pytest.approx(0.8)
    assert m.loc["l1", "d_fvu_at_l0"] == pytest.approx(-0.6)
    assert m.loc["l1", "d_probe"] == pytest.approx(0.05)
    assert m.loc["topk", "kl_value"] == 1.0 and m.loc["topk", "d_fvu"] == pytest.approx(-0.4)


def test_match_kl_tie_goes_to_smaller_lambda():
    s = summary([
        ("mnist", "kl", "kl", "lambda", 1.0, 0, 0.5, 10, 0.8),
        ("mnist", "kl", "kl", "lambda", 0.1, 0, 0.3, 30, 0.9),
        ("mnist", "l1", "l1", "lambda", 0.01, 0, 0.2, 20, 0.95),
    ])
    assert aggregate.match_kl(s).loc[0, "kl_value"] == 0.1


def test_match_kl_stays_within_dataset_and_handles_missing_kl():
    s = summary([
        ("mnist", "kl", "kl", "lambda", 0.1, 0, 0.3, 10, 0.9),
        ("fashion-mnist", "l1", "l1", "lambda", 0.01, 0, 0.2, 10, 0.8),
    ])
    m = aggregate.match_kl(s)
    assert len(m) == 1 and m.loc[0, "dataset"] == "fashion-mnist"
    assert math.isnan(m.loc[0, "kl_l0"]) and math.isnan(m.loc[0, "d_fvu"])
    assert "no KL-SAE run" in display.to_markdown(display.kl_display(m, "fashion-mnist"))
    only_kl = summary([("mnist", "kl", "kl", "lambda", 0.1, 0, 0.3, 10, 0.9)])
    assert aggregate.match_kl(only_kl).empty
    # the pages say it once instead of a table of "no KL-SAE run" rows
    from sae.sweep.render import _kl_missing

    assert _kl_missing(display.kl_display(m, "fashion-mnist")).startswith("No KL-SAE runs")
    assert _kl_missing(display.kl_display(aggregate.match_kl(only_kl), "mnist")) == \
        "No non-KL configurations."
    both = summary([("mnist", "kl", "kl", "lambda", 0.1, 0, 0.3, 10, 0.9),
                    ("mnist", "l1", "l1", "lambda", 0.01, 0, 0.2, 10, 0.8)])
    assert _kl_missing(display.kl_display(aggregate.match_kl(both), "mnist")) is None


def test_summary_display_and_markdown():
    s = summary([
        ("mnist", "l1", "l1", "lambda", 0.01, 0, 0.2, 10, 0.90),
        ("mnist", "l1", "l1", "lambda", 0.01, 1, 0.4, 14, 0.92),
        ("mnist", "topk", "topk", "k", 32, 0, 0.1, 32, 0.95),
    ])
    shown = display.summary_display(s, "mnist", raw_probe=0.926)
    assert list(shown["model"]) == ["l1", "topk", "raw input"]
    assert shown.loc[0, "λ / k"] == "λ = 0.01" and shown.loc[1, "λ / k"] == "k = 32"
    assert shown.loc[0, "FVU"] == "0.3000 ± 0.1414"
    assert shown.loc[1, "FVU"] == "0.1000"  # one seed: no ± part
    assert shown.loc[1, "FVU at L0"] == "0.1000"
    assert shown.loc[2, "probe acc. %"] == "92.60"
    md = display.to_markdown(shown).splitlines()
    assert md[0].startswith("| model | λ / k |") and set(md[1]) <= set("|-:")
    assert len(md) == 2 + 3
    assert "<td class=\"num\">92.60</td>" in display.to_html(shown)


def verdict_frame():
    return results([
        # dataset, model, kind, param, value, seed, fvu, l0, probe
        ("mnist", "kl", "kl", "lambda", 1.0, 0, 0.03, 14, 0.94),      # band <= 20
        ("mnist", "l1", "l1", "lambda", 0.03, 0, 0.28, 13, 0.96),
        ("mnist", "sparsemax", "sparsemax", "lambda", 0.03, 0, 0.20, 16, 0.97),
        ("mnist", "topk", "topk", "k", 16, 0, 0.17, 16, 0.965),
        ("mnist", "l1", "l1", "lambda", 0.01, 0, 0.14, 37, 0.976),  # 20 < L0 <= 50
        ("mnist", "kl", "kl", "lambda", 0.1, 0, 0.02, 30, 0.93),
        ("mnist", "topk", "topk", "k", 32, 0, 0.11, 32, 0.973),
        ("mnist", "topk", "topk", "k", 64, 0, 0.07, 64, 0.97),       # > 50, alone
        ("fashion-mnist", "sparsemax", "sparsemax", "lambda", 0.03, 0, 0.16, 9, 0.85),
        ("fashion-mnist", "topk", "topk", "k", 16, 0, 0.12, 16, 0.86),
    ])


def winners(judged, dataset, band, criterion):
    row = judged[(judged["dataset"] == dataset) & (judged["band"] == band)
                 & (judged["criterion"] == criterion)]
    assert len(row) == 1
    return row.iloc[0]


def test_verdict_names_the_best_per_dataset_band_and_criterion():
    s = verdict_frame()
    judged = matching.verdict(s)
    assert list(dict.fromkeys(judged["band"])) == ["L0 ≤ 20", "20 < L0 ≤ 50", "L0 > 50"]
    # outcomes lead; the ground-truth criteria have no values on images, so no rows
    assert list(dict.fromkeys(judged["criterion"])) == ["FVU at L0", "probe accuracy",
                                                        "dead units"]
    # FVU at L0 is compared at L0 16 on every model's curve: topk and sparsemax sit there,
    # l1 is interpolated between L0 13 and 37, the KL-SAE (14 … 30) is out (no exact zeros)
    low = winners(judged, "mnist", "L0 ≤ 20", "FVU at L0")
    assert low["winner"] == "topk at L0 16.0 (k = 16)" and low["score"] == pytest.approx(0.17)
    assert low["runner_up"] == "sparsemax at L0 16.0 (λ = 0.03)"
    assert low["margin"] == pytest.approx(0.03)
    assert low["excluded"] == "kl at L0 16 (λ = 1 … 0.1)"  # said, not silently dropped
    assert low["n_candidates"] == 3 and low["models"] == ["topk"]
    l1 = matching.at_l0(s, [16.0]).set_index(["dataset", "model"]).loc[("mnist", "l1")]
    w = math.log(16 / 13) / math.log(37 / 13)
    assert l1["fvu_at_l0"] == pytest.approx(0.28 + w * (0.14 - 0.28))
    assert (l1["lo_value"], l1["hi_value"]) == (0.03, 0.01)
    assert winners(judged, "mnist", "L0 ≤ 20", "probe accuracy")["winner"].startswith(
        "sparsemax")
    assert winners(judged, "mnist", "20 < L0 ≤ 50", "FVU at L0")["winner"].startswith("topk")
    assert winners(judged, "mnist", "20 < L0 ≤ 50", "probe accuracy")["winner"].startswith("l1")
    alone = winners(judged, "mnist", "L0 > 50", "FVU at L0")
    assert alone["runner_up"] == "" and math.isnan(alone["margin"])
    assert not ((matching.at_l0(s)["model"] == "sparsemax")
                & (matching.at_l0(s)["target"] == 32)).any()  # never extrapolated
    # dead units are judged at L0 16 too: all 10 %, a four-way tie of the models reaching 16;
    # only the two taken as they are (sparsemax, topk) have a summary row to mark
    dead = winners(judged, "mnist", "L0 ≤ 20", "dead units")
    assert sorted(dead["models"]) == ["kl", "l1", "sparsemax", "topk"]
    assert sorted(dead["winners"]) == [("sparsemax", 0.03), ("topk", 16)]
    assert winners(judged, "fashion-mnist", "L0 ≤ 20", "FVU at L0")["winner"].startswith("topk")
    assert matching.l0_band(20.0) == "L0 ≤ 20" and matching.l0_band(20.01) == "20 < L0 ≤ 50"
    assert matching.l0_band(0.0) == "L0 ≤ 20" and matching.l0_band(float("nan")) is None


def test_probe_and_dead_units_are_judged_at_equal_l0():
    """In the band 20 < L0 ≤ 50, a setting at L0 48 would beat one at L0 32 on probe accuracy
    and dead units only by being less sparse: both criteria are judged at L0 32 on each
    model's curve, so the model that is better there wins."""
    s = results([
        ("mnist", "entmax", "entmax", "lambda", 0.03, 0, 0.20, 16, 0.950),
        ("mnist", "entmax", "entmax", "lambda", 0.003, 0, 0.12, 108, 0.990),  # best, at L0 108
        ("mnist", "topk", "topk", "k", 32, 0, 0.13, 32, 0.970),
        ("mnist", "topk", "topk", "k", 64, 0, 0.10, 64, 0.975),
    ])
    s.loc[s["value"] == 0.003, "dead_fraction"] = 0.0  # few dead units at L0 108 only
    judged = matching.verdict(s)
    probe = winners(judged, "mnist", "L0 > 50", "probe accuracy")
    at64 = matching.at_l0(s, [64.0]).set_index("model")
    assert probe["target"] == 64
    assert probe["winner"].startswith("entmax at L0 64 (λ = 0.03 … 0.003)")  # interpolated
    assert probe["score"] == pytest.approx(at64.loc["entmax", "probe_accuracy"])
    assert probe["score"] < 0.99  # not the L0 108 setting's own accuracy
    mid = winners(judged, "mnist", "20 < L0 ≤ 50", "probe accuracy")
    at32 = matching.at_l0(s, [32.0]).set_index("model")
    best = "topk" if at32.loc["topk", "probe_accuracy"] > at32.loc["entmax", "probe_accuracy"] \
        else "entmax"
    assert mid["models"] == [best] and mid["n_candidates"] == 2
    dead = winners(judged, "mnist", "20 < L0 ≤ 50", "dead units")
    assert dead["score"] == pytest.approx(min(at32["dead_fraction"]))
    assert dead["models"] == [at32["dead_fraction"].idxmin()]


@settings(max_examples=40, deadline=None)
@given(kl_fvu=st.floats(0.0, 1.0), kl_extra=st.floats(1e-3, 1.0),
       others=st.lists(st.tuples(st.floats(0.0, 1.0), st.floats(1.0, 80.0)), min_size=1,
                       max_size=5))
def test_a_code_without_exact_zeros_never_wins_fvu_at_l0(kl_fvu, kl_extra, others):
    rows = [("mnist", "kl", "kl", "lambda", 1.0, 0, kl_fvu, 10.0, 0.9),  # its curve spans
            ("mnist", "kl", "kl", "lambda", 0.1, 0, kl_fvu, 90.0, 0.9)]  # every target L0
    rows += [("mnist", "l1", "l1", "lambda", 0.001 * (i + 1), 0, fvu, l0, 0.9)
             for i, (fvu, l0) in enumerate(others)]
    s = results(rows)  # the KL rows' FVU at L0 is their FVU + 0.5 (see results())
    judged = matching.verdict(s)
    fvu_rows = judged[judged["criterion"] == "FVU at L0"]
    assert not any("kl" in w for w in fvu_rows["winner"])
    assert not any("kl" in models for models in fvu_rows["models"])
    assert all(model != "kl" for ws in fvu_rows["winners"] for model, _ in ws)
    target = {"L0 ≤ 20": 16, "20 < L0 ≤ 50": 32, "L0 > 50": 64}
    assert all(r["excluded"].startswith(f"kl at L0 {target[r['band']]} ")
               for _, r in fvu_rows.iterrows())
    summary_ = aggregate.summarize_seeds(s)
    assert list(aggregate.exact_zeros(summary_)) == [k != "kl" for k in summary_["kind"]]


def test_best_cells_are_marked_in_markdown_and_html():
    r = verdict_frame()
    s = aggregate.summarize_seeds(r)
    judged = matching.verdict(r)
    best = display.best_cells(s, "mnist", judged)
    shown = display.summary_display(s, "mnist")
    row = list(zip(shown["model"], shown["λ / k"], strict=True)).index(("topk", "k = 16"))
    assert (row, "FVU at L0") in best
    kl_row = list(shown["model"]).index("kl")
    assert (kl_row, "FVU at L0") not in best and (kl_row, "FVU") not in best
    md = display.to_markdown(shown, best).splitlines()
    assert "**0.1700**" in md[2 + row] and "**" not in md[2 + kl_row].split("|")[6]
    html = display.to_html(shown, best)
    assert html.count('class="num best"') == len(best)
    assert '<td class="num best">0.1700</td>' in html
    # the new measures have their columns
    assert {"recon bias", "support FVU", "adaptive gain", "adaptivity"} <= set(shown.columns)


def test_comparison_page_states_the_verdict_and_findings(tmp_path):
    sweep = spec.load_sweep(write_yaml(tmp_path / "s.yaml", TINY))
    r = verdict_frame()
    s = aggregate.summarize_seeds(r)
    (tmp_path / "runs").mkdir()
    raw = {"mnist": {"probe_accuracy": 0.926}}
    page = render.comparison_html(sweep, r, raw, {}, 9, 9)
    md = render.comparison_markdown(sweep, r, raw, 9, 9)
    for text in (page, md):
        assert "Only models with exact zeros (FVU at L0 = FVU) compete on FVU at L0" in text
        assert "Lowest FVU at equal L0, per L0 band: topk in 3 of 3" in text
        assert "Out of the FVU-at-L0 contest: kl (no exact zeros)" in text
    assert 'class="num best"' in page and "**0.1700**" in md
    lines = render.findings(s, matching.verdict(r), "mnist")
    assert any(line.startswith("Best probe accuracy: L0 ≤ 20: sparsemax") for line in lines)
    assert "This results table predates validation metrics" in md  # no val_l0 column


def test_headline_sets_every_model_at_l0_16_and_32():
    s = results([
        ("mnist", "l1", "l1", "lambda", 0.03, 0, 0.28, 13, 0.96),
        ("mnist", "l1", "l1", "lambda", 0.01, 0, 0.14, 37, 0.976),
        ("mnist", "l1", "l1", "lambda", 0.01, 1, 0.16, 37, 0.976),
        ("mnist", "kl", "kl", "lambda", 1.0, 0, 0.03, 14, 0.94),     # never reaches 16
        ("mnist", "topk", "topk", "k", 16, 0, 0.17, 16, 0.965),
        ("mnist", "topk", "topk", "k", 32, 0, 0.11, 31.0, 0.973),   # within 5 % of 32
        ("fashion-mnist", "topk", "topk", "k", 16, 0, 0.12, 16, 0.86),
    ])
    head = matching.headline(s)
    assert list(zip(head["dataset"], head["target"], head["model"], strict=True)) == [
        ("mnist", 16, "l1"), ("mnist", 16, "topk"), ("mnist", 32, "l1"), ("mnist", 32, "topk"),
        ("fashion-mnist", 16, "topk")]
    shown = display.headline_display(s, "mnist")
    assert list(shown["target"]) == ["16", "16", "32", "32"]
    assert list(shown["L0"]) == ["16.0", "16.0", "32.0", "31.0"]  # the L0 each row stands for
    assert list(shown["from"]) == ["λ = 0.03 … 0.01", "k = 16", "λ = 0.03 … 0.01", "k = 32"]
    # per seed: only seed 0 of l1 brackets L0 16 (seed 1 has no run below it), so the row is
    # seed 0's interpolation, not one of seed means, and says one of two seeds
    w = math.log(16 / 13) / math.log(37 / 13)
    assert shown.loc[0, "FVU at L0"] == f"{0.28 + w * (0.14 - 0.28):.4f}"
    assert shown.loc[0, "seeds"] == "1 of 2"
    assert shown.loc[1, "FVU at L0"] == "0.1700" and shown.loc[3, "FVU at L0"] == "0.1100"
    assert matching.headline(s.iloc[:0]).empty


def test_the_sweep_file_chooses_the_probe_the_verdict_judges(tmp_path):
    r = verdict_frame()
    s = aggregate.summarize_seeds(r)
    soft = winners(matching.verdict(r), "mnist", "L0 ≤ 20", "probe accuracy")
    judged = matching.verdict(r, "sparsemax")
    sparse = winners(judged, "mnist", "L0 ≤ 20", "probe accuracy")
    assert soft["winner"].startswith("sparsemax") and soft["metric"] == "probe_accuracy"
    assert sparse["winner"].startswith("kl at L0 16 (λ = 1 … 0.1)")
    assert sparse["metric"] == "probe_sparsemax_accuracy"
    kl16 = matching.at_l0(r, [16.0]).set_index(["dataset", "model"]).loc[("mnist", "kl")]
    assert sparse["score"] == pytest.approx(kl16["probe_sparsemax_accuracy"])
    assert 0.96 < sparse["score"] < 0.97  # between its settings at L0 14 (0.96) and 30 (0.97)
    raw = {"probe_accuracy": 0.926, "probe_sparsemax_accuracy": 0.91,
           "probe_sparsemax_classes": 1.7}
    shown = display.summary_display(s, "mnist", raw)
    kl_row = list(zip(shown["model"], shown["λ / k"], strict=True)).index(("kl", "λ = 1"))
    topk_row = list(zip(shown["model"], shown["λ / k"], strict=True)).index(("topk", "k = 32"))
    best = display.best_cells(s, "mnist", judged)
    # at L0 32 topk (taken as it is) has the best sparsemax probe; the softmax probe's winner
    # there is l1, interpolated; the KL-SAE's win at L0 16 is interpolated: no cell to mark
    assert (topk_row, "sparsemax probe %") in best and (topk_row, "probe acc. %") not in best
    assert (kl_row, "sparsemax probe %") not in best
    # both probes are tabled whichever one the verdict judges
    assert shown.loc[kl_row, "probe acc. %"] == "94.00"
    assert shown.loc[kl_row, "sparsemax probe %"] == "96.00"
    assert shown.loc[kl_row, "probe classes"] == "1.50"
    last = shown.iloc[-1]
    assert last["model"] == "raw input" and last["probe acc. %"] == "92.60"
    assert last["sparsemax probe %"] == "91.00" and last["probe classes"] == "1.70"
    lines = render.findings(s, judged, "mnist")
    assert any(line.startswith("Best sparsemax-probe accuracy: L0 ≤ 20: kl") for line in lines)
    sweep = spec.load_sweep(write_yaml(tmp_path / "s.yaml", {**TINY, "probe_loss": "sparsemax"}))
    assert sweep.probe_loss == "sparsemax"
    assert spec.load_sweep(write_yaml(tmp_path / "t.yaml", TINY)).probe_loss == "softmax"
    md = render.comparison_markdown(sweep, r, {"mnist": raw}, 9, 9)
    assert "Best sparsemax-probe accuracy" in md and "| 91.00 |" in md


def test_related_links_exist_or_are_left_out(tmp_path):
    sweeps = tmp_path / "sweeps"
    here = sweeps / "mnist"
    (sweeps / "fashion-mnist").mkdir(parents=True)
    (sweeps / "fashion-mnist" / "comparison.html").write_text("x")
    (sweeps / "wide").mkdir()
    (sweeps / "wide" / "comparison.html").write_text("x")  # another preset on the same dataset
    (sweeps / "empty").mkdir()  # no page: no link
    (tmp_path / "figures" / "gallery").mkdir(parents=True)
    (tmp_path / "figures" / "gallery" / "README.md").write_text("x")  # raw text: not linked
    (tmp_path / "figures" / "gallery" / "index.html").write_text("x")
    frame = aggregate.results_frame([
        {"dataset": "mnist", "model": "l1", "param": "lambda", "value": 0.01, "seed": 0,
         "run": "runs/mnist/l1/lambda0.01/seed0"},
        {"dataset": "mnist", "model": "l1", "param": "lambda", "value": 0.01, "seed": 1,
         "run": "runs/mnist/l1/lambda0.01/seed1"}])
    (here / frame.loc[0, "run"]).mkdir(parents=True)
    (here / frame.loc[0, "run"] / "report.html").write_text("x")
    links = render.related_links(here, ["mnist"], frame)
    assert links["pages"] == [("fashion-mnist comparison", "../fashion-mnist/comparison.html"),
                              ("wide comparison", "../wide/comparison.html"),
                              ("figure gallery", "../../figures/gallery/index.html")]
    assert links["runs"] == {"mnist": [("l1 λ = 0.01 seed 0",
                                        "runs/mnist/l1/lambda0.01/seed0/report.html")]}
    assert links["unbuilt"] == [] and render.build_note(links) is None
    (here / frame.loc[1, "run"]).mkdir(parents=True)  # a sweep run: no report until asked for
    links = render.related_links(here, ["mnist"], frame)
    assert links["unbuilt"] == [(here / frame.loc[1, "run"]).as_posix()]
    assert f"python -m sae.report {links['unbuilt'][0]}" in render.build_note(links)
    # a published copy beside the gallery, without runs/
    published = tmp_path / "figures" / "compare" / "mnist"
    published.mkdir(parents=True)
    links = render.related_links(published, ["mnist"], frame)
    assert links == {"pages": [("figure gallery", "../../gallery/index.html")], "runs": {},
                     "unbuilt": []}
    (tmp_path / "figures" / "gallery" / "index.html").unlink()  # a README alone is no page
    assert render.related_links(published, ["mnist"], frame)["pages"] == []


def test_publish_page_renders_without_runs(tmp_path):
    sweep = spec.load_sweep(write_yaml(tmp_path / "s.yaml", TINY))
    out = tmp_path / "out"
    (out / "runs").mkdir(parents=True)
    render.write_outputs(out, sweep, spec.plan(sweep), {})
    pub = tmp_path / "pub"
    pub.mkdir()
    written = render.publish_page(out, sweep, spec.plan(sweep), pub)
    assert [p.name for p in written] == ["comparison.md", "comparison.html"]
    assert "0 of 2 runs finished" in (pub / "comparison.md").read_text()
    assert "runs/" not in (pub / "comparison.html").read_text()


def test_publishing_a_page_adds_it_to_the_see_also_line_of_the_pages_published_before(
        tmp_path, monkeypatch):
    from sae.pages import html as pages

    monkeypatch.setattr(pages, "timestamp", lambda: "2026-01-01 00:00 UTC")
    sweep = spec.load_sweep(write_yaml(tmp_path / "s.yaml", TINY))
    runs = spec.plan(sweep)
    out = tmp_path / "out"
    (out / "runs").mkdir(parents=True)
    (out / "sweep.yaml").write_text(sweep.text)
    render.write_outputs(out, sweep, runs, {})
    compare_dir = tmp_path / "figures" / "compare"
    first, second, third = (compare_dir / n for n in ("first", "second", "third"))
    compare.publish(out, first, sweep, runs)
    assert "See also" not in (first / "comparison.md").read_text()  # alone: nothing to link
    assert "See also" not in (first / "comparison.html").read_text()
    mine = compare_dir / "notes"  # not a publication: never touched
    mine.mkdir()
    (mine / "comparison.md").write_text("See also: mine\n\n")
    (mine / "comparison.html").write_text("x")
    compare.publish(out, second, sweep, runs)
    compare.publish(out, third, sweep, runs)
    for page in (first, second, third):
        md, html = ((page / n).read_text() for n in ("comparison.md", "comparison.html"))
        others = [p.name for p in (first, second, third, mine) if p != page]
        for name in others:
            assert f"[{name} comparison](../{name}/comparison.html)" in md
            assert f'<a href="../{name}/comparison.html">{name} comparison</a>' in html
        # the line is the one a page rendered now would have, and nothing else moved
        render.publish_page(out, sweep, runs, page)
        assert (page / "comparison.md").read_text() == md
        assert (page / "comparison.html").read_text() == html
    assert (mine / "comparison.md").read_text() == "See also: mine\n\n"
    # a page that goes away leaves the lines of the others
    for name in ("comparison.md", "comparison.html"):
        (third / name).unlink()
    compare.publish(out, second, sweep, runs)
    assert "third" not in (first / "comparison.md").read_text()
    assert "third" not in (first / "comparison.html").read_text()


# --------------------------------------------------------------------------- plots


def plot_frames():
    s = summary([
        ("mnist", "kl", "kl", "lambda", 0.1, 0, 0.3, 10, 0.9),
        ("mnist", "kl", "kl", "lambda", 0.1, 1, 0.32, 11, 0.91),
        ("mnist", "l1", "l1", "lambda", 0.01, 0, 0.2, 12, 0.95),
        ("mnist", "l1", "l1", "lambda", 0.1, 0, 0.4, 3, 0.85),
        ("fashion-mnist", "topk", "topk", "k", 8, 0, 0.25, 8, 0.8),
    ])
    rng = np.random.default_rng(0)
    l0 = pd.DataFrame({"dataset": "mnist", "model": np.repeat(["kl", "l1", "topk"], 50),
                       "config": "λ = 0.1", "l0": np.r_[rng.poisson(10, 100), np.full(50, 8)]})
    per_class = pd.DataFrame([{"dataset": "mnist", "model": m, "config": "λ = 0.1",
                               "class": str(c), "l0": 5.0 + c} for m in ("kl", "l1")
                              for c in range(10)])
    corr = pd.DataFrame({"dataset": "mnist", "model": ["kl", "kl", "topk"],
                         "config": ["λ = 0.1", "λ = 0.1", "k = 8"],
                         "l0_ink_corr": [0.5, 0.6, np.nan]})
    return s, l0, per_class, corr


def axes_labelled(fig, prefix: str) -> list:
    return [ax for ax in fig.axes if ax.get_label().startswith(prefix)]


def test_comparison_plots_render():
    s, l0, per_class, corr = plot_frames()
    made = [plots.fvu_l0_pareto(s), plots.probe_vs_l0(s, {"mnist": 0.926}),
            plots.l0_distributions(l0), plots.class_l0_heatmap(per_class),
            plots.l0_ink_correlation(corr)]
    assert len(made[1].axes) == 2
    assert len(made[2].axes) == 3  # one panel per dataset x model
    text = " ".join(t.get_text() for t in made[4].findobj(lambda o: hasattr(o, "get_text")))
    assert "undefined" in text  # TopK's constant L0
    for fig in made:
        assert figures.figure_to_png_bytes(fig, dpi=30).startswith(b"\x89PNG")


def test_fvu_plot_keeps_codes_without_exact_zeros_off_its_main_axes():
    s, *_ = plot_frames()
    fig = plots.fvu_l0_pareto(s)
    main = {ax.get_label(): ax for ax in axes_labelled(fig, "main:")}
    loose = {ax.get_label(): ax for ax in axes_labelled(fig, "loose:")}
    assert set(main) == {"main:mnist", "main:fashion-mnist"}
    assert set(loose) == {"loose:mnist", "loose:fashion-mnist"}
    ax = main["main:mnist"]
    legend = ax.get_legend_handles_labels()[1]  # the entries this axes gives the legend
    assert "l1" in legend and not any(label.startswith("kl") for label in legend)
    # no drawn point of the main axes is the KL-SAE's (FVU 0.31 or FVU at L0 0.81)
    ys = np.concatenate([np.asarray(line.get_ydata(), float) for line in ax.get_lines()])
    assert not np.isin(np.round(ys, 3), [0.31, 0.81]).any()
    assert ax.get_ylim()[1] < 0.5  # the KL-SAE's 0.81 does not stretch the axis
    front = next(ln for ln in ax.get_lines() if "Pareto" in ln.get_label())
    assert list(front.get_ydata()) == [0.4, 0.2]
    kl_panel = loose["loose:mnist"]
    kl_legend = kl_panel.get_legend_handles_labels()[1]
    assert kl_legend == ["kl: FVU", "kl: FVU at L0"] and "no exact zeros" in kl_panel.get_title()
    shown = [t.get_text() for t in fig.legends[0].get_texts()]  # one legend, outside the axes
    assert {"l1", "kl: FVU", "kl: FVU at L0", "Pareto frontier"} <= set(shown)
    # the KL-SAE's panel has the same L0 scale as the main one above it
    assert kl_panel.get_xscale() == ax.get_xscale() == "log"
    assert kl_panel.get_xlim() == ax.get_xlim()
    kl_ys = {round(float(y), 3) for line in kl_panel.get_lines() for y in line.get_ydata()}
    assert {0.31, 0.81} <= kl_ys
    assert "none" in " ".join(t.get_text() for t in loose["loose:fashion-mnist"].texts)
    # without any such code there is no second row
    exact_only = plots.fvu_l0_pareto(s[s["kind"] != "kl"])
    assert not axes_labelled(exact_only, "loose:")


def test_point_labels_do_not_overlap():
    rows = [("mnist", m, m, "lambda", lam, 0, 0.2 + 0.001 * i, 20 + 0.3 * i, 0.9)
            for i, (m, lam) in enumerate([(m, lam) for m in ("l1", "sparsemax", "entmax")
                                          for lam in (0.003, 0.01, 0.03)])]
    fig = plots.fvu_l0_pareto(summary(rows))
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    renderer = FigureCanvasAgg(fig).get_renderer()
    fig.draw(renderer)
    boxes = [t.get_window_extent(renderer) for t in fig.axes[0].texts]
    assert len(boxes) >= 6  # at least each line's two ends are labelled
    for i, a in enumerate(boxes):
        for b in boxes[i + 1:]:
            assert not a.overlaps(b)


def test_point_labels_of_a_crowded_panel_do_not_overlap_once_the_legend_is_drawn():
    """Seven models bunched in one corner: the seed-0 (FVU, L0) of the MNIST MLP-layer preset,
    where labels placed for the axes' size before the layout (the legend outside then takes
    width from the axes) overlapped. The labels are measured in the final layout."""
    points = [
        ("l1", 0.002, 0.0105, 48.3),
        ("l1", 0.004, 0.0141, 31.9),
        ("l1", 0.008, 0.0233, 21.0),
        ("l1", 0.016, 0.0405, 11.9),
        ("sparsemax", 0.0002, 0.0086, 37.5),
        ("sparsemax", 0.0005, 0.0107, 25.1),
        ("sparsemax", 0.001, 0.0128, 18.3),
        ("sparsemax", 0.002, 0.0155, 13.3),
        ("entmax", 0.0005, 0.0074, 45.2),
        ("entmax", 0.001, 0.0089, 31.6),
        ("entmax", 0.0025, 0.0124, 20.2),
        ("entmax", 0.005, 0.0165, 14.4),
        ("topk", 16, 0.0145, 16.0),
        ("topk", 32, 0.0087, 32.0),
        ("batchtopk", 16, 0.0137, 16.1),
        ("batchtopk", 32, 0.0083, 31.9),
        ("jumprelu", 3e-05, 0.0176, 17.6),
        ("jumprelu", 0.0003, 0.0184, 17.5),
        ("jumprelu", 0.001, 0.0182, 16.6),
        ("jumprelu", 0.004, 0.0197, 14.7),
    ]
    kinds = {"topk": "k", "batchtopk": "k"}
    rows = [("mnist", m, m, kinds.get(m, "lambda"), v, 0, fvu, l0, 0.9)
            for m, v, fvu, l0 in points]
    fig = plots.fvu_l0_pareto(summary(rows))
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    renderer = FigureCanvasAgg(fig).get_renderer()
    fig.draw(renderer)
    boxes = [t.get_window_extent(renderer) for ax in fig.axes for t in ax.texts]
    assert len(boxes) >= 12  # each line's two ends at least, but the bunched ones
    for i, a in enumerate(boxes):
        for b in boxes[i + 1:]:
            assert not a.overlaps(b), (a, b)


def test_point_labels_cross_no_line():
    """A λ / k label is not drawn across a line: no point of any line of the axes lies in it."""
    rows = [("mnist", m, m, "lambda", lam, 0, fvu, l0, 0.9)
            for m, shift in (("l1", 0.0), ("sparsemax", 0.01), ("topk", 0.02))
            for lam, fvu, l0 in ((0.03, 0.3 + shift, 10), (0.01, 0.2 + shift, 20),
                                 (0.003, 0.1 + shift, 40))]
    fig = plots.fvu_l0_pareto(summary(rows))
    ax = fig.axes[0]
    assert len(ax.texts) >= 6
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    renderer = FigureCanvasAgg(fig).get_renderer()
    fig.draw(renderer)
    lines = plots._line_points(ax, step=0.002)
    frac = ax.transAxes.inverted()
    for text in ax.texts:
        (x0, y0), (x1, y1) = frac.transform(text.get_window_extent(renderer).get_points())
        inside = ((lines[:, 0] > x0) & (lines[:, 0] < x1) & (lines[:, 1] > y0)
                  & (lines[:, 1] < y1))
        assert not inside.any(), text.get_text()


def test_a_model_looks_the_same_whatever_else_a_figure_holds():
    s, *_ = plot_frames()
    colour = {}
    for models in (["l1", "kl", "topk"], ["topk"], ["kl", "topk"]):
        fig = plots.probe_vs_l0(s[s["model"].isin(models)])
        for container in (c for ax in fig.axes for c in ax.containers):
            if container.get_label() == "topk":  # an error-bar plot: its data line first
                line = container.lines[0]
                colour.setdefault(len(models), (line.get_color(), line.get_marker()))
    assert len(set(colour.values())) == 1 and len(colour) == 3
    assert colour[1] == (figures.common.model_style("topk")["color"],
                         figures.common.model_style("topk")["marker"])


def suptitle(fig):
    """The figure's title as a text artist (found among its artists by its text)."""
    from matplotlib.text import Text

    return next(t for t in fig.findobj(Text) if t.get_text() == fig.get_suptitle())


def test_titles_fit_and_say_what_the_bars_are():
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    s, *_ = plot_frames()
    two = summary([("mnist", "l1", "l1", "lambda", lam, seed, 0.2 + 0.01 * seed, l0, 0.9)
                   for lam, l0 in ((0.01, 20), (0.03, 10)) for seed in (0, 1)])
    one = two[two["n_seeds"] > 0].assign(n_seeds=1, l0_mean_std=np.nan, fvu_std=np.nan,
                                         probe_accuracy_std=np.nan)
    for frame, wording in ((two, "mean ± std over seeds"), (one, "one seed")):
        for probe_loss in ("softmax", "sparsemax"):
            for fig in (plots.fvu_l0_pareto(frame),
                        plots.probe_vs_l0(frame, {"mnist": 0.9}, probe_loss)):
                title = fig.get_suptitle()
                assert wording in title
                assert ("mean ± std" in title) == (wording != "one seed")
                renderer = FigureCanvasAgg(fig).get_renderer()
                fig.draw(renderer)
                box = suptitle(fig).get_window_extent(renderer)
                assert box.x0 >= 0 and box.x1 <= fig.bbox.width  # the title is not cut off
                legend = fig.legends[0].get_window_extent(renderer)
                assert not box.overlaps(legend)
    single_plot = plots.l0_ink_correlation(pd.DataFrame({
        "dataset": ["mnist"] * 2, "model": ["l1", "topk"], "kind": ["l1", "topk"],
        "config": ["λ = 0.1", "k = 8"], "l0_ink_corr": [0.5, 0.2]}))
    renderer = FigureCanvasAgg(single_plot).get_renderer()
    single_plot.draw(renderer)
    tight = single_plot.get_tightbbox(renderer)
    title = suptitle(single_plot).get_window_extent(renderer)
    assert tight.x0 <= title.x0 and title.x1 <= single_plot.bbox.width


def test_comparison_plots_accept_empty_frames():
    empty = aggregate.summarize_seeds(aggregate.results_frame([]))
    for fig in (plots.fvu_l0_pareto(empty), plots.probe_vs_l0(empty),
                plots.l0_distributions(pd.DataFrame(columns=["dataset", "model", "config",
                                                                "l0"])),
                plots.class_l0_heatmap(pd.DataFrame(columns=["dataset", "model", "config",
                                                                "class", "l0"])),
                plots.l0_ink_correlation(pd.DataFrame(columns=["dataset", "model", "config",
                                                                  "l0_ink_corr"]))):
        assert figures.figure_to_png_bytes(fig, dpi=30).startswith(b"\x89PNG")


def test_pareto_front():
    l0 = np.array([5.0, 10, 20, 8, 30])
    err = np.array([0.5, 0.3, 0.1, 0.6, 0.2])
    assert list(plots._pareto_front(l0, err)) == [0, 1, 2]


# --------------------------------------------------------------------------- the runner


@pytest.fixture(scope="module")
def finished_sweep(tmp_path_factory, data_dir):
    """The quick preset (:func:`quick_preset`: every model on both datasets, one setting each,
    one seed) after one complete invocation of the command a user types."""
    root = tmp_path_factory.mktemp("sweep")
    preset = quick_preset()
    write_yaml(root / "quick.yaml", preset)
    result = run_compare(["quick.yaml", "--jobs", "2"], root, data_dir, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return root, result, preset


def n_runs(preset: dict) -> int:
    return len(preset["datasets"]) * len(preset["models"]) * len(preset["seeds"])


@pytest.mark.slow
def test_quick_preset_writes_tables_and_page(finished_sweep):
    root, result, preset = finished_sweep
    out = root / "sweeps" / "quick"
    n = n_runs(preset)
    assert result.stdout.count("trained in") == n and f"[{n}/{n}]" in result.stdout
    frame = pd.read_csv(out / "results.csv")
    assert list(frame.columns) == aggregate.RESULT_COLUMNS and len(frame) == n
    assert set(frame["model"]) == set(MODELS) and set(frame["seed"]) == {0}
    assert set(frame["dataset"]) == {"mnist", "fashion-mnist"}
    assert frame["probe_accuracy"].between(0, 1).all() and frame["wall_time_s"].gt(0).all()
    assert frame["probe_sparsemax_accuracy"].between(0, 1).all()
    assert frame["probe_sparsemax_classes"].between(1, 10).all()
    for rel in frame["run"]:
        run = out / rel
        assert (run / "metrics.json").is_file()
        analysis = json.loads((run / "analysis.json").read_text())
        assert len(analysis["class_l0_mean"]) == 10
        assert np.load(run / "test_l0.npy").shape == (200,)
    md = (out / "comparison.md").read_text()
    for dataset in ("mnist", "fashion-mnist"):
        assert f"## {dataset}" in md and f"### {dataset}: headline" in md
    assert "vs KL-SAE" in md and "raw input" in md and "k = 8" in md
    page = (out / "comparison.html").read_text()
    assert page.count("data:image/png;base64,") == len(render.FIGURE_FILES)
    assert "<script" not in page and "http" not in page.replace("http-equiv", "")
    assert all((out / name).is_file() for name in render.FIGURE_FILES)
    raw = json.loads((out / "raw_probe.json").read_text())
    assert {r["dataset"] for r in raw} == {"mnist", "fashion-mnist"}
    assert all(0 < r["sparsemax_test_accuracy"] <= 1 for r in raw)
    assert "sparsemax probe %" in md and "probe classes" in md


@pytest.mark.slow
def test_second_invocation_skips_finished_runs(finished_sweep, data_dir):
    root, _, preset = finished_sweep
    runs = sorted((root / "sweeps" / "quick" / "runs").glob("*/*/*/seed*"))
    stamps = {p: ((p / "metrics.json").stat().st_mtime_ns,
                  (p / "analysis.json").stat().st_mtime_ns) for p in runs}
    result = run_compare(["quick.yaml"], root, data_dir)
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("skipped (finished)") == n_runs(preset)
    assert "trained in" not in result.stdout
    assert stamps == {p: ((p / "metrics.json").stat().st_mtime_ns,
                          (p / "analysis.json").stat().st_mtime_ns) for p in runs}


@pytest.mark.slow
def test_interrupted_runs_are_completed(finished_sweep, data_dir, tmp_path):
    root = tmp_path / "copy"
    shutil.copytree(finished_sweep[0], root)
    runs = root / "sweeps" / "quick" / "runs" / "mnist"
    resumed, restarted = runs / "kl" / "lambda0.01" / "seed0", runs / "topk" / "k8" / "seed0"
    (resumed / "metrics.json").unlink()  # killed after its last checkpoint
    for path in restarted.iterdir():  # killed before its first checkpoint
        if path.name != "config.yaml":
            shutil.rmtree(path) if path.is_dir() else path.unlink()
    result = run_compare(["quick.yaml", "--jobs", "2"], root, data_dir)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("trained in") == 2
    for run in (resumed, restarted):
        assert (run / "metrics.json").is_file() and (run / "analysis.json").is_file()
    logs = root / "sweeps" / "quick" / "logs" / "mnist"
    commands = {name: [line for line in (logs / name).read_text().splitlines()
                       if line.startswith("$ ")] for name in ("kl/lambda0.01/seed0.log",
                                                               "topk/k8/seed0.log")}
    assert commands["kl/lambda0.01/seed0.log"][-1].endswith("--resume")
    assert commands["topk/k8/seed0.log"][-1].endswith("--overwrite")
    assert len(pd.read_csv(root / "sweeps" / "quick" / "results.csv")) == \
        n_runs(finished_sweep[2])


@pytest.mark.slow
def test_bad_input_from_the_shell(tmp_path, data_dir):
    write_yaml(tmp_path / "bad.yaml", "datasets: [mnist]\nseeds: [0]\nmodels: {l1: {x: 1}}\n")
    result = run_compare(["bad.yaml"], tmp_path, data_dir)
    one_line_error(result.returncode, result.stderr)
    assert "Traceback" not in result.stderr and not (tmp_path / "sweeps").exists()


def test_usage_error_is_the_cli_one():
    with pytest.raises(UsageError):
        spec.load_sweep("no/such/file.yaml")
