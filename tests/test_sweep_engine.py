"""The sweep engine: runs trained in long-lived workers are the runs ``sae.run`` trains alone, a
killed sweep continues to the same results, and one failing run does not stop the others."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from concurrent.futures import Future
from pathlib import Path

import pandas as pd
import pytest
import yaml

from sae.sweep import launch, spec
from sae.training import runfolder
from sae.training.convergence import last_epoch_change, read_validation

# three models trained one after the other by one worker (--jobs 1), so anything a run leaves
# behind in the process would reach the next: BatchTopK and the Sparsemax-SAE's batch support
# each carry a running threshold; 8 steps per epoch, enough epochs to be killed in
SWEEP = {
    "description": "three models, one worker",
    "datasets": ["mnist"],
    "seeds": [3],
    "common": {"hidden": 32, "limit_train": 512, "val_size": 128, "limit_test": 200,
               "batch_size": 64, "epochs": 24},
    "models": {"l1": {"lambda": [0.03]}, "batchtopk": {"k": [4]},
               "sparsemax": {"support": "batch", "lambda": [0.01]}},
}
NOT_COMPARED = {"wall_time_s"}  # the only number of metrics.json that may differ


def env(tmp_path: Path, data_dir: Path) -> dict:
    e = dict(os.environ, SAE_DATA_DIR=str(data_dir), SAE_OFFLINE="1", OMP_NUM_THREADS="1",
             SAE_CACHE_DIR=str(tmp_path / "cache"))
    e.pop("SAE_RUN_DIR", None)
    return e


def compare(args, cwd: Path, data_dir: Path, timeout: int = 300):
    return subprocess.run([sys.executable, "-m", "sae.compare", *map(str, args)], cwd=cwd,
                          env=env(cwd, data_dir), capture_output=True, text=True,
                          timeout=timeout)


def write_sweep(folder: Path, data=SWEEP) -> Path:
    path = folder / "engine.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def numbers(metrics: dict) -> dict:
    return {k: v for k, v in metrics.items() if isinstance(v, int | float)
            and not isinstance(v, bool) and k not in NOT_COMPARED}


@pytest.fixture(scope="module")
def finished(tmp_path_factory, data_dir):
    """The sweep after one uninterrupted invocation."""
    root = tmp_path_factory.mktemp("engine")
    write_sweep(root)
    result = compare(["engine.yaml", "--jobs", "1", "--out", "sweep"], root, data_dir)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    (root / "sweep.log").write_text(result.stdout)
    return root


@pytest.mark.slow
def test_a_sweep_run_equals_the_same_run_trained_alone(finished, data_dir, tmp_path):
    sweep = finished / "sweep"
    assert (sweep / "logs" / "worker0.log").is_file()  # one worker trained every run
    assert not (sweep / "logs" / "worker1.log").exists()
    runs = spec.plan(spec.load_sweep(finished / "engine.yaml"))
    assert [r.model for r in runs] == ["l1", "batchtopk", "sparsemax"]
    for later in runs[1:]:  # trained after another run in the same process
        alone = tmp_path / later.model
        result = subprocess.run([sys.executable, "-m", "sae.run", *later.argv, "--out", alone],
                                cwd=tmp_path, env=env(tmp_path, data_dir), capture_output=True,
                                text=True, timeout=300)
        assert result.returncode == 0, result.stderr[-2000:]
        in_sweep = numbers(json.loads((sweep / later.rel / "metrics.json").read_text()))
        trained_alone = numbers(json.loads((alone / "metrics.json").read_text()))
        assert in_sweep.keys() == trained_alone.keys()
        for key, value in in_sweep.items():
            assert value == pytest.approx(trained_alone[key], abs=1e-5), (later.model, key)
        # a sweep run writes no pages while the sweep trains (sae.pages.report / sae.pages.features
        # build them)
        folder = sweep / later.rel
        assert not (folder / "report.html").exists() and not (folder / "features.html").exists()
        assert not (folder / "figures").exists()
        assert (folder / "analysis.json").is_file()  # analysed by the worker that trained it


@pytest.mark.slow
def test_a_killed_sweep_continues_to_the_same_results(finished, data_dir, tmp_path):
    write_sweep(tmp_path)
    first = tmp_path / "sweep" / spec.plan(spec.load_sweep(tmp_path / "engine.yaml"))[0].rel
    proc = subprocess.Popen([sys.executable, "-m", "sae.compare", "engine.yaml", "--jobs", "1",
                             "--out", "sweep"], cwd=tmp_path, env=env(tmp_path, data_dir),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 180
    while time.time() < deadline and not (first / "checkpoints" / "last.ckpt").is_file():
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)  # no chance to stop its worker: the worker stops itself
    proc.wait()
    deadline = time.time() + 60
    while time.time() < deadline and runfolder.is_locked(first):
        time.sleep(0.1)
    assert not runfolder.is_locked(first), "the worker went on training after the sweep died"
    assert not (first / "metrics.json").exists(), "the run finished before the kill"
    result = compare(["engine.yaml", "--jobs", "1", "--out", "sweep"], tmp_path, data_dir)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert result.stdout.count("trained in") == 3
    resumed = pd.read_csv(tmp_path / "sweep" / "results.csv").set_index("model")
    baseline = pd.read_csv(finished / "sweep" / "results.csv").set_index("model")
    columns = ["fvu", "mse", "l0_mean", "l0_std", "dead_fraction", "probe_accuracy",
               "probe_sparsemax_accuracy", "support_fvu", "adaptivity", "steps"]
    pd.testing.assert_frame_equal(resumed[columns], baseline[columns], atol=1e-5, rtol=0)
    commands = [line for line in (tmp_path / "sweep" / "logs" / "mnist" / "l1" /
                                  "lambda0.03" / "seed3.log").read_text().splitlines()
                if line.startswith("$ ")]
    assert commands[-1].endswith("--resume")


@pytest.mark.slow
def test_progress_estimates_the_time_left_from_the_runs_trained(finished):
    p = launch.Progress(total=10, jobs=2, to_train=7)
    assert p.left() is None  # nothing trained yet: no estimate
    p.trained, p.trained_seconds, p.failed = 2, 100.0, 1
    assert p.left() == pytest.approx(50.0 * 2)  # 4 runs left, two slots: two rounds of 50 s
    p.trained = 6
    assert p.left() is None  # every run is trained or failed
    run = spec.plan(spec.load_sweep(finished / "engine.yaml"))[0]
    p = launch.Progress(total=3, jobs=1, to_train=2)
    p.trained, p.trained_seconds = 1, 125.0
    assert p.line(run, "trained in 125.0 s").endswith(", about 2:05 left)")
    # the sweep says it too, for every trained run but the last
    lines = [ln for ln in (finished / "sweep.log").read_text().splitlines() if "trained in" in ln]
    assert ["left)" in ln for ln in lines] == [True, True, False]


@pytest.mark.slow
def test_a_failing_run_does_not_stop_the_others(tmp_path, data_dir):
    sweep = {**SWEEP, "common": {**SWEEP["common"], "epochs": 2},
             "models": {"l1": {"lambda": [0.03]},
                        # diverges at once: exit 1 from inside the worker
                        "l1-blowup": {"model": "l1", "lambda": [0.01], "lr": 1e6,
                                      "grad_clip": 0},
                        "batchtopk": {"k": [4]}}}
    write_sweep(tmp_path, sweep)
    result = compare(["engine.yaml", "--jobs", "1", "--out", "sweep"], tmp_path, data_dir)
    assert result.returncode == 1, result.stdout + result.stderr
    assert result.stdout.count("trained in") == 2 and "FAILED (exit 1)" in result.stdout
    frame = pd.read_csv(tmp_path / "sweep" / "results.csv")
    assert sorted(frame["model"]) == ["batchtopk", "l1"]


def test_a_dead_worker_fails_its_run_and_the_next_gets_a_new_one(tmp_path, monkeypatch):
    """A worker that dies mid-run (a crash, a kill) fails that run only."""
    runs = spec.plan(spec.load_sweep(write_sweep(tmp_path)))
    pool = launch.RunPool(jobs=1, threads=1, gpus=[], logs=tmp_path / "logs")
    crash = [sys.executable, "-m", "sae.run", "--model", "l1"]

    class Dying(launch.Worker):
        def __init__(self, env, stderr):
            self.proc = subprocess.Popen(
                [sys.executable, "-c", "import sys; sys.stdin.readline(); sys.exit(9)"],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    monkeypatch.setattr(launch, "Worker", Dying)
    first = pool.submit(runs[0], crash, tmp_path / "a.log").result()
    second = pool.submit(runs[1], crash, tmp_path / "b.log").result()
    pool.close()
    assert first[0] == 9 and second[0] == 9  # each run reported with the worker's exit code
    assert "ended unexpectedly" in (tmp_path / "a.log").read_text()


class _InstantPool:
    """A RunPool stand-in whose runs finish at once, in the order submitted."""

    def __init__(self, jobs, threads, gpus, logs=None, workers=True):
        self.sweep_dir = logs.parent

    def submit(self, run, command, log, analyse=False):
        folder = self.sweep_dir / run.rel
        folder.mkdir(parents=True)
        (folder / "metrics.json").write_text("{}")
        future = Future()
        future.set_result((0, 1.0))
        return future

    def close(self):
        pass


@pytest.mark.parametrize("jobs, calls", [(1, []), (2, [2]), (4, [1])])
def test_the_tables_prepare_once_when_a_slot_has_no_run_left(tmp_path, monkeypatch, jobs,
                                                              calls):
    """The hook runs once, as soon as a run finishes with fewer runs left than slots (three
    runs: after the second with two slots, after the first with four); with one slot, never."""
    data = {**SWEEP, "models": {"l1": {"lambda": [0.01, 0.02, 0.03]}}}
    runs = spec.plan(spec.load_sweep(write_sweep(tmp_path, data)))
    monkeypatch.setattr(launch, "RunPool", _InstantPool)
    monkeypatch.setattr(launch, "analysis_is_current", lambda folder: True)
    monkeypatch.setattr(launch, "analyse_run", lambda folder, data: {})
    seen = []

    def on_idle(finished):
        seen.append(len(finished))
        assert all((tmp_path / "sweep" / r.rel / "metrics.json").is_file() for r in finished)
        raise RuntimeError("a failing head start does not stop the sweep")

    analyses, failed = launch.run_sweep(tmp_path / "sweep", runs, jobs, [], lambda line: None,
                                        on_idle=on_idle)
    assert (seen, failed, len(analyses)) == (calls, 0, 3)


def test_no_gpu_device_node_means_no_gpu_and_no_torch_import(monkeypatch):
    monkeypatch.setattr(sys, "platform", "linux")
    monkeypatch.setattr(os, "listdir", lambda path: ["null", "zero", "tty0"])
    assert not launch.gpu_device_nodes()
    for nodes in (["nvidia0", "nvidiactl"], ["kfd", "dri"], ["dxg"]):
        monkeypatch.setattr(os, "listdir", lambda path, nodes=nodes: nodes)
        assert launch.gpu_device_nodes()
    monkeypatch.setattr(sys, "platform", "darwin")  # no /dev to tell by: ask torch
    assert launch.gpu_device_nodes()
    # on this machine, as a sweep starts: without device nodes, torch is not imported to count
    code = ("import sys; from sae.sweep.launch import gpu_device_nodes, visible_gpus; "
            "g = visible_gpus(); print(gpu_device_nodes(), g, 'torch' in sys.modules)")
    env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         check=True).stdout.split()
    if out[0] == "False":
        assert out[1:] == ["[]", "False"]


def test_multi_process_runs_train_as_subprocesses(tmp_path):
    data = {**SWEEP, "models": {"l1": {"lambda": [0.03], "strategy": "ddp", "devices": 2}}}
    ddp, = spec.plan(spec.load_sweep(write_sweep(tmp_path, data)))
    plain = spec.plan(spec.load_sweep(write_sweep(tmp_path)))[0]
    assert launch.in_process(plain, gpus_per_slot=0)
    assert not launch.in_process(ddp, gpus_per_slot=0)


@pytest.mark.parametrize("values, change, converged", [
    ([(0.30, 20.0)], None, None),  # one epoch: nothing to measure
    ([(0.30, 20.0), (0.20, 25.0), (0.199, 25.2)], 0.005, True),
    ([(0.30, 20.0), (0.20, 25.0), (0.198, 25.0)], 0.01, False),  # FVU moved 1 %
    ([(0.20, 25.0), (0.2, 25.6)], 0.0, False),  # L0 moved 2.4 %
])
def test_convergence_is_the_last_epochs_relative_change(tmp_path, values, change, converged):
    lines = ["epoch,step,train/loss,val/fvu,val/l0"]
    for epoch, (fvu, l0) in enumerate(values):
        lines += [f"{epoch},{8 * epoch + 3},0.5,,", f"{epoch},{8 * epoch + 7},,{fvu},{l0}"]
    (tmp_path / "metrics.csv").write_text("\n".join(lines) + "\n")
    got = last_epoch_change(read_validation(tmp_path / "metrics.csv"))
    assert got["converged"] is converged
    if change is None:
        assert got["val_fvu_change"] is None
    else:
        assert got["val_fvu_change"] == pytest.approx(change)
    assert last_epoch_change(read_validation(tmp_path / "missing.csv"))["converged"] is None


@pytest.mark.slow
def test_report_draws_a_sweep_runs_figures_as_training_would(tmp_path, data_dir):
    """``sae.pages.report RUN`` on a run without figures draws them from its checkpoint: the same
    pictures the figure callback draws at the end of training."""
    import numpy as np
    from cli_helpers import QUICK, run_cli
    from PIL import Image

    trained = tmp_path / "trained"
    result = run_cli(["--model", "l1", "--epochs", "2", "--figure-every", "0", "--no-features",
                      "--no-report", "--out", trained, *QUICK], tmp_path, data_dir)
    assert result.returncode == 0, result.stderr[-2000:]
    bare = tmp_path / "bare"
    shutil.copytree(trained, bare, ignore=shutil.ignore_patterns("figures"))
    result = run_cli([bare], tmp_path, data_dir, module="sae.report")
    assert result.returncode == 0, result.stderr[-2000:]
    drawn = sorted(p.relative_to(bare) for p in (bare / "figures").rglob("*.png"))
    assert drawn == sorted(p.relative_to(trained) for p in (trained / "figures").rglob("*.png"))
    assert len(drawn) == 6
    for rel in drawn:
        assert np.array_equal(np.asarray(Image.open(bare / rel)),
                              np.asarray(Image.open(trained / rel))), rel
    assert (bare / "report.html").read_text().count("data:image/png") >= 6


def test_raw_pixel_probes_are_shared_by_the_sweeps_of_a_machine(tmp_path, data_dir,
                                                                monkeypatch):
    from sae import metrics
    from sae.sweep import analysis

    monkeypatch.setenv("SAE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("SAE_DATA_DIR", str(data_dir))
    runs = spec.plan(spec.load_sweep(write_sweep(tmp_path)))
    first = analysis.raw_probes(tmp_path / "a", runs, analysis.DataCache())
    (tmp_path / "b").mkdir()

    def refit(*args, **kwargs):
        raise AssertionError("the raw-pixel probes were fitted again")

    monkeypatch.setattr(metrics, "linear_probes", refit)
    assert analysis.raw_probes(tmp_path / "b", runs, analysis.DataCache()) == first
    assert (tmp_path / "b" / "raw_probe.json").is_file()
