"""Ctrl-C or SIGTERM at any moment of training loses nothing: the run stops after the step in
progress with that step's checkpoint, and ``--resume`` ends with the metrics of a run never
stopped (same seed, CPU)."""

import html
import json
import math
import os
import shlex
import signal
import subprocess
import sys
from pathlib import Path

import lightning.pytorch as L
import pytest
from cli_helpers import cli_env

from sae.runner import command as sae_run
from sae.training import runfolder
from sae.training.checkpoints import read_checkpoint

# 64 steps per epoch of a small model; dead units resampled every 20 steps (the generator's
# state matters mid-epoch)
STEPS = 64
TINY = ["--model", "l1", "--hidden", "32", "--limit-train", "1024", "--batch-size", "16",
        "--val-size", "512", "--limit-test", "256", "--epochs", "3", "--resample-every", "20",
        "--no-figures", "--no-features", "--progress", "off"]


@pytest.fixture
def in_process(monkeypatch):
    """sae.runner.command.main in this process; its environment and signal handlers restored."""
    for name in ("SAE_RUN_DIR", "SAE_SESSION"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("SAE_DATA_DIR", os.environ.get("SAE_DATA_DIR", ""))
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}

    def main(argv):
        try:
            return sae_run.main([str(a) for a in argv])
        finally:  # the run folder's lock is held until the process ends otherwise
            runfolder.release(Path(argv[argv.index("--out") + 1]))

    yield main
    for s, handler in handlers.items():
        signal.signal(s, handler)
    for name in ("SAE_RUN_DIR", "SAE_SESSION"):
        os.environ.pop(name, None)


# the Sparsemax-SAE with a threshold at inference: θ is a running mean that must resume exactly
SPARSEMAX = ["--model", "sparsemax", "--inference", "threshold", *TINY[2:]]


def uninterrupted_metrics(tmp_path_factory, data_dir, args):
    """The metrics of the run never stopped (a subprocess: the same conditions as a user's)."""
    out = tmp_path_factory.mktemp("reference") / "run"
    result = subprocess.run([sys.executable, "-m", "sae.run", *args, "--out", str(out)],
                            env=cli_env(out.parent, data_dir), capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads((out / "metrics.json").read_text())


@pytest.fixture(scope="module")
def reference(tmp_path_factory, data_dir):
    return uninterrupted_metrics(tmp_path_factory, data_dir, TINY)


def assert_same_metrics(run, reference):
    metrics = json.loads((run / "metrics.json").read_text())
    assert metrics.keys() == reference.keys()
    for key, value in reference.items():
        if key == "wall_time_s":
            continue
        if isinstance(value, float) and not isinstance(metrics[key], bool):
            assert math.isclose(metrics[key], value, rel_tol=1e-5, abs_tol=1e-5), key
        else:
            assert metrics[key] == value, key


def saved_step(run) -> int:
    return int(read_checkpoint(run / "checkpoints" / "last.ckpt")["global_step"])


@pytest.mark.slow
def test_ctrl_c_from_the_terminal_leaves_a_report_and_a_resumable_run(tmp_path, data_dir,
                                                                     reference):
    out = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "sae.run", *TINY, "--out", str(out)],
                            env=cli_env(tmp_path, data_dir), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    for line in proc.stdout:  # the first validation's line: its end or epoch 2 follows
        if line.startswith("epoch 1/3"):
            proc.send_signal(signal.SIGINT)
            break
    stdout, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 130, stderr[-3000:]
    command = shlex.join([sys.executable, "-m", "sae.run", "--out", str(out), "--resume"])
    assert stderr == f"interrupted; continue with: {command}\n"
    assert stdout.splitlines()[-1] == f"report: {out / 'report.html'}"
    assert STEPS <= saved_step(out) < 2 * STEPS
    report = (out / "report.html").read_text()
    assert "interrupted" in report and html.escape(command) in report

    result = subprocess.run([sys.executable, "-m", "sae.run", "--out", str(out), "--resume"],
                            env=cli_env(tmp_path, data_dir), capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert_same_metrics(out, reference)


class SignalAt(L.Callback):
    """Sends this process ``signum`` after batch ``batch`` of epoch ``epoch``: a training batch,
    or with ``validation`` a batch of that epoch's validation."""

    def __init__(self, signum, epoch, batch, validation=False):
        self.signum, self.epoch, self.batch, self.validation = signum, epoch, batch, validation

    def _maybe_signal(self, trainer, batch_idx, validation):
        if (validation == self.validation and trainer.current_epoch == self.epoch
                and batch_idx == self.batch):
            os.kill(os.getpid(), self.signum)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self._maybe_signal(trainer, batch_idx, validation=False)

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx,
                                dataloader_idx=0):
        self._maybe_signal(trainer, batch_idx, validation=True)


def stopped_run(in_process, monkeypatch, out, signal_at, args=TINY) -> int:
    """The exit code of the tiny run (``args``) into ``out`` with ``signal_at`` among its
    training callbacks (they are as before afterwards)."""
    import sae.training.guards

    plain = sae.training.guards.training_callbacks
    with monkeypatch.context() as patch:
        patch.setattr(sae.training.guards, "training_callbacks",
                      lambda config: [*plain(config), signal_at])
        return in_process([*args, "--out", out])


def assert_resumes_to_the_same_metrics(in_process, out, reference):
    assert not (out / "metrics.json").exists()
    assert in_process(["--out", out, "--resume", "--progress", "off"]) == 0
    assert_same_metrics(out, reference)


@pytest.mark.slow
def test_ctrl_c_mid_epoch_resumes_to_the_same_metrics(tmp_path, data_dir, reference,
                                                      in_process, monkeypatch):
    out = tmp_path / "run"
    assert stopped_run(in_process, monkeypatch, out, SignalAt(signal.SIGINT, 1, 10)) == 130
    assert saved_step(out) == STEPS + 11  # the step in progress when the signal came
    assert_resumes_to_the_same_metrics(in_process, out, reference)


@pytest.mark.slow
def test_sigterm_mid_validation_resumes_to_the_same_metrics(tmp_path, data_dir, reference,
                                                            in_process, monkeypatch):
    out = tmp_path / "run"
    signal_at = SignalAt(signal.SIGTERM, 1, 2, validation=True)  # the second validation
    assert stopped_run(in_process, monkeypatch, out, signal_at) == 143
    # the validation under way finished and was saved: the checkpoint is of the epoch's end
    assert saved_step(out) == 2 * STEPS
    assert_resumes_to_the_same_metrics(in_process, out, reference)


@pytest.mark.slow
def test_a_sparsemax_run_resumes_its_inference_threshold_to_the_same_metrics(
        tmp_path, tmp_path_factory, data_dir, in_process, monkeypatch):
    reference = uninterrupted_metrics(tmp_path_factory, data_dir, SPARSEMAX)
    out = tmp_path / "run"
    assert stopped_run(in_process, monkeypatch, out, SignalAt(signal.SIGINT, 1, 10),
                       SPARSEMAX) == 130
    saved = read_checkpoint(out / "checkpoints" / "last.ckpt")["state_dict"]
    assert int(saved["threshold_batches"]) == STEPS + 11 and float(saved["inference_threshold"]) > 0
    assert_resumes_to_the_same_metrics(in_process, out, reference)
