"""Untrusted files and bad luck: python -m sae.run never runs code from a file, never loses a
user's work, and reports every failure as one line (subprocess calls, as a user makes them)."""

import json
import shlex
import shutil
import signal
import subprocess
import sys
import textwrap
import time

import pytest
import torch
from cli_helpers import QUICK, assert_one_line_error, cli_env, run_cli, start_cli
from test_checkpoints import poisoned_checkpoint

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def trained(tmp_path_factory, data_dir):
    """A finished 8-step run (linear l1 SAE, 64 units) to copy and damage."""
    where = tmp_path_factory.mktemp("trained")
    result = run_cli(["--model", "l1", "--max-steps", 8, "--out", where / "run", *QUICK,
                      "--no-figures"], where, data_dir)
    assert result.returncode == 0, result.stderr[-2000:]
    return where / "run"


def copy_run(trained, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(trained, run, ignore=shutil.ignore_patterns(".lock"))
    return run


def snapshot(run):
    return {p.name: p.read_bytes() for p in (run / "metrics.csv", run / "metrics.json",
                                             run / "report.html") if p.is_file()}


def test_a_poisoned_checkpoint_runs_nothing_on_resume(trained, tmp_path, data_dir):
    run = copy_run(trained, tmp_path)
    before = snapshot(run)
    marker = tmp_path / "owned"
    poisoned_checkpoint(run / "checkpoints" / "last.ckpt", marker)
    result = run_cli(["--out", run, "--resume", "--epochs", 2], tmp_path, data_dir)
    assert_one_line_error(result)
    assert "refusing checkpoint" in result.stderr
    assert not marker.exists() and snapshot(run) == before
    # an explicit path, too
    evil = poisoned_checkpoint(tmp_path / "evil.ckpt", marker)
    assert_one_line_error(run_cli(["--out", run, "--resume", evil], tmp_path, data_dir))
    assert not marker.exists()


def test_a_damaged_checkpoint_is_refused_and_nothing_changes(trained, tmp_path, data_dir):
    run = copy_run(trained, tmp_path)
    before = snapshot(run)
    last = run / "checkpoints" / "last.ckpt"
    data = bytearray(last.read_bytes())
    data[len(data) // 2:len(data) // 2 + 4096] = bytes(4096)  # 4 KiB overwritten
    last.write_bytes(bytes(data))
    result = run_cli(["--out", run, "--resume", "--epochs", 3], tmp_path, data_dir)
    assert_one_line_error(result)
    assert snapshot(run) == before


def test_a_checkpoint_of_another_model_keeps_the_history(trained, tmp_path, data_dir):
    run = copy_run(trained, tmp_path)
    other = tmp_path / "other"
    ok = run_cli(["--model", "l1", "--max-steps", 2, "--out", other, *QUICK[:6], "--hidden", 32,
                  "--no-figures", "--no-report"], tmp_path, data_dir)
    assert ok.returncode == 0, ok.stderr[-2000:]
    before = snapshot(run)
    result = run_cli(["--out", run, "--resume", other / "checkpoints" / "last.ckpt"], tmp_path,
                     data_dir)
    assert_one_line_error(result)
    assert "another model" in result.stderr and snapshot(run) == before


def test_overwrite_never_deletes_a_folder_the_tool_did_not_make(trained, tmp_path, data_dir):
    project = tmp_path / "project"
    project.mkdir()
    (project / "config.yaml").write_text("model: l1\n")
    (project / "train.py").write_text("print('my work')\n")
    result = run_cli(["--out", project, "--overwrite"], tmp_path, data_dir)
    assert_one_line_error(result)
    assert (project / "train.py").read_text() == "print('my work')\n"
    run = copy_run(trained, tmp_path)
    assert_one_line_error(run_cli(["--out", ".", "--overwrite"], run, data_dir))
    assert (run / "metrics.json").is_file()


def test_two_runs_on_one_folder_cannot_both_write(tmp_path, data_dir):
    out = tmp_path / "shared"
    args = ["--model", "l1", "--max-steps", 40, "--out", out, *QUICK, "--no-figures",
            "--no-report"]
    first, second = (start_cli(args, tmp_path, data_dir, stderr=-1) for _ in range(2))
    codes = sorted(p.wait(timeout=300) for p in (first, second))
    assert codes == [0, 2]
    # and a resume while a run trains in the folder is refused
    long = start_cli(["--model", "l1", "--epochs", 500, "--out", tmp_path / "busy", *QUICK,
                      "--no-figures", "--no-report"], tmp_path, data_dir)
    try:
        deadline = time.time() + 120
        while time.time() < deadline and not (tmp_path / "busy" / "checkpoints" /
                                              "last.ckpt").is_file():
            time.sleep(0.3)
        result = run_cli(["--out", tmp_path / "busy", "--resume"], tmp_path, data_dir)
        assert_one_line_error(result)
        assert "in use" in result.stderr
    finally:
        long.kill()
        long.wait()


@pytest.mark.parametrize("args, message", [
    (["--limit-train", "1"], "--limit-train: must be >= 2"),  # refused before the start
    (["--data-dir", "EMPTY"], "IDX"),
])
def test_a_failed_start_leaves_no_folder(tmp_path, data_dir, args, message):
    (tmp_path / "EMPTY").mkdir()
    out = tmp_path / "run"
    result = run_cli([*args, "--out", out, "--max-steps", 2], tmp_path, data_dir)
    assert_one_line_error(result)
    assert message in result.stderr
    assert not out.exists()
    # so the retry simply works
    ok = run_cli(["--out", out, "--max-steps", 2, *QUICK, "--no-figures", "--no-report"],
                 tmp_path, data_dir)
    assert ok.returncode == 0, ok.stderr[-2000:]


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without a GPU")
def test_gpu_without_a_gpu_is_one_line(tmp_path, data_dir):
    result = run_cli(["--accelerator", "gpu", "--out", tmp_path / "run", *QUICK], tmp_path,
                     data_dir)
    assert_one_line_error(result)
    assert not (tmp_path / "run").exists()


def test_sigterm_exits_143_with_a_resume_hint(tmp_path, data_dir):
    out = tmp_path / "run"
    proc = start_cli(["--model", "l1", "--epochs", 500, "--out", out, *QUICK, "--no-figures",
                      "--no-report"], tmp_path, data_dir, stderr=-1)
    deadline = time.time() + 120
    while time.time() < deadline and not (out / "checkpoints" / "last.ckpt").is_file():
        time.sleep(0.3)
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 143, stderr[-2000:]
    resume = shlex.join([sys.executable, "-m", "sae.run", "--out", str(out), "--resume"])
    assert f"terminated; continue with: {resume}\n" in stderr  # the interpreter in use
    assert "Traceback" not in stderr


def test_metrics_json_is_strict_json(trained):
    def refuse(name):
        raise ValueError(f"bare {name} in metrics.json")

    metrics = json.loads((trained / "metrics.json").read_text(), parse_constant=refuse)
    assert metrics["steps"] == 8


def test_a_finite_blow_up_stops_like_a_nan(tmp_path, data_dir):
    out = tmp_path / "run"
    result = run_cli(["--model", "l1", "--lr", "1e6", "--grad-clip", "0", "--max-steps", 40,
                      "--out", out, *QUICK, "--no-figures", "--no-report"], tmp_path, data_dir)
    assert result.returncode == 1, result.stderr[-2000:]
    assert "diverging loss" in result.stderr and "Traceback" not in result.stderr
    assert not (out / "metrics.json").exists()


def test_a_training_stops_when_the_sweep_that_started_it_dies(tmp_path, data_dir):
    from sae.training import runfolder

    out = tmp_path / "run"
    parent = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import os, subprocess, sys
        env = dict(os.environ, SAE_STOP_WITH_PARENT=str(os.getpid()))
        child = subprocess.Popen([sys.executable, "-m", "sae.run", "--model", "l1", "--epochs",
                                  "500", "--out", {str(out)!r}, *{QUICK!r}, "--no-figures",
                                  "--no-report", "--no-features"], env=env)
        child.wait()
    """)], cwd=tmp_path, env=cli_env(tmp_path, data_dir))
    deadline = time.time() + 120
    while time.time() < deadline and not (out / "checkpoints" / "last.ckpt").is_file():
        time.sleep(0.3)
    assert runfolder.is_locked(out)
    parent.kill()  # kill -9: the sweep gets no chance to stop its children
    parent.wait()
    deadline = time.time() + 60
    while time.time() < deadline and runfolder.is_locked(out):
        time.sleep(0.3)
    assert not runfolder.is_locked(out), "the orphaned training kept running"
    from sae.training.checkpoints import read_checkpoint

    epoch = int(read_checkpoint(out / "checkpoints" / "last.ckpt")["epoch"])
    if epoch > 1:  # fewer epochs than the checkpoint has done: one line
        assert_one_line_error(run_cli(["--out", out, "--resume", "--epochs", 1], tmp_path,
                                      data_dir))
    # and the run resumes cleanly
    result = run_cli(["--out", out, "--resume", "--epochs", epoch + 1, "--no-features"],
                     tmp_path, data_dir)
    assert result.returncode == 0, result.stderr[-2000:]


def test_a_poisoned_checkpoint_runs_nothing_in_the_api_and_the_sweep_analysis(tmp_path, trained):
    from sae.sweep.analysis import DataCache, analyse_run
    from sae.training.checkpoints import CheckpointError, load_checkpoint

    run = copy_run(trained, tmp_path)
    marker = tmp_path / "owned"
    poisoned_checkpoint(run / "checkpoints" / "last.ckpt", marker)
    with pytest.raises(CheckpointError):
        load_checkpoint(run / "checkpoints" / "last.ckpt")
    with pytest.raises(CheckpointError):
        analyse_run(run, DataCache())
    assert not marker.exists()


def test_report_of_a_folder_with_a_poisoned_checkpoint_runs_nothing(tmp_path, trained, data_dir):
    run = copy_run(trained, tmp_path)
    marker = tmp_path / "owned"
    poisoned_checkpoint(run / "checkpoints" / "last.ckpt", marker)
    result = run_cli([run], tmp_path, data_dir, module="sae.report")
    assert result.returncode == 0, result.stderr
    assert not marker.exists()


def test_last_checkpoint_is_the_last_step_not_the_best(trained):
    from sae.training.checkpoints import read_checkpoint

    assert read_checkpoint(trained / "checkpoints" / "last.ckpt")["global_step"] == 8
    assert (trained / "checkpoints" / "best.ckpt").is_file()


@pytest.mark.parametrize("args, message", [
    (["--strategy", "nonsense"], "cannot set up training"),
    (["--resume", "FOLDER"], "is a folder"),
    (["--config", "FOLDER"], "is a folder"),
])
def test_more_bad_input_is_one_line(tmp_path, data_dir, args, message):
    (tmp_path / "FOLDER").mkdir()
    out = tmp_path / "run"
    result = run_cli([*args, "--out", out, *QUICK, "--max-steps", 2], tmp_path, data_dir)
    assert_one_line_error(result)
    assert message in result.stderr
    assert not out.exists()
