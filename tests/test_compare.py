"""sae.compare and sae.sweep: sweep files, run folders, and the runner as a user calls it."""

import json
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
from sweep_helpers import TINY, write_yaml

from sae.data.matrixdata import data_name
from sae.models import MODELS
from sae.settings.cli import UsageError, build_parser
from sae.settings.config import FIXED_BUDGET, NO_BUDGET
from sae.sweep import aggregate, analysis, launch, render, spec
from sae.sweep import command as compare

REPO = Path(__file__).resolve().parents[1]
PRESETS = sorted((REPO / "experiments").glob("*.yaml"))


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
    per_dataset = sum(len(e.values) for e in sweep.models)  # grid values or targets
    assert len(runs) == len(sweep.datasets) * per_dataset * len(sweep.seeds)
    # every model, except the KL-SAE (no exact zeros) in the wide presets; the Sparsemax-SAE's
    # candidate, energy and inference sweeps compare its variants with BatchTopK only, and its
    # energy-power and batch-support sweeps its variants alone (the dataset's preset or the
    # threshold sweep holds BatchTopK at those settings); the 40-epoch MLP-layer check its two
    # supports and BatchTopK, the 40-epoch MNIST, Fashion-MNIST and wide checks (and the wide
    # checks' seeds) its default and BatchTopK, the attribution pages the batch support and the
    # shared thresholds without the sparsemax training rule
    expected = set(MODELS) - ({"kl"} if preset.stem.startswith("wide") else set())
    if preset.stem not in ("quick", "ground-truth", "mnist", "fashion-mnist", "mlp-layer",
                           "suite"):
        expected -= {"sparsemax-attention"}  # pages published before it joined
    if preset.stem.startswith(("sparsemax-energy-power-", "sparsemax-batch-")):
        expected = {"sparsemax"}
    elif preset.stem.startswith(("sparsemax-candidates-", "sparsemax-energy-",
                                 "sparsemax-threshold-", "mlp-layer-40", "mnist-40",
                                 "fashion-mnist-40", "wide-40", "wide-seeds")):
        expected = {"sparsemax", "batchtopk"}
    elif preset.stem.startswith("attribution-"):  # the batch support against shared thresholds
        expected = {"sparsemax", "batchtopk", "jumprelu"}
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
    if preset.stem.startswith("wide"):  # one seed each; the seed checks add seeds 1 and 2
        # to their page's seed 0
        assert all(r.settings["hidden"] == 4096 for r in runs)
        assert list(sweep.seeds) == ([1, 2] if preset.stem.endswith("-seeds") else [0])
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
    drawn = set(render.FIGURE_FILES) - {"truth_vs_l0.png"}  # images with labels, no truth
    assert page.count("data:image/png;base64,") == len(drawn)
    assert "<script" not in page and "http" not in page.replace("http-equiv", "")
    assert {name for name in render.FIGURE_FILES if (out / name).is_file()} == drawn
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
