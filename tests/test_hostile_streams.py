"""Streamed runs (--source / --hook, sae.train(source=...)) on hostile sources: every thread a
run starts ends with it (after a finish, Ctrl-C, SIGTERM or a non-finite loss, whatever the size
of the source), the network never sees more than --buffer-rows inputs at once, labels are
classes or refused, NaN / Inf / complex layers are named as such, and a stopped run names the
command (or call) that resumes it."""

import shlex
import signal
import subprocess
import sys
import threading
import time
import warnings

import lightning.pytorch as L
import numpy as np
import pytest
import torch
from cli_helpers import cli_env
from test_streamed import SETTINGS, SOURCE_MODULE, Net, StopAt, images
from torch import nn
from torch.utils.data import TensorDataset

import sae
from sae.data.streamed import (
    SourceError,
    StreamedDataModule,
    register_python_source,
    release_python_source,
)
from sae.training import guards
from sae.training.guards import NonFiniteLossError

# SOURCE_MODULE's factory has 600 inputs: 400 train with --val-size 100, several chunks of 64
FLAGS = ["--source", "mysource:factory", "--hook", "2", "--hidden", "16", "--val-size", "100",
         "--buffer-rows", "64", "--no-figures", "--no-features", "--no-report", "--progress",
         "off"]
EXTRA_FACTORIES = '''
import sys

def exits():
    sys.exit(3)
'''
QUICK = {**SETTINGS, "epochs": 1, "max_steps": 12, "no_features": True, "no_report": True}


def source_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("sae-source")]


def source_env(tmp_path, data_dir) -> dict:
    (tmp_path / "mysource.py").write_text(SOURCE_MODULE)
    return {**cli_env(tmp_path, data_dir), "PYTHONPATH": str(tmp_path)}


def start_run(tmp_path, data_dir, *extra) -> subprocess.Popen:
    """python -m sae.run on mysource:factory; stdout a pipe read line by line, stderr a file."""
    err = open(tmp_path / "stderr.txt", "w")  # noqa: SIM115 - the child writes it
    proc = subprocess.Popen([sys.executable, "-m", "sae.run", *FLAGS, *extra, "--out",
                             str(tmp_path / "run")], stdout=subprocess.PIPE, stderr=err,
                            text=True, env=source_env(tmp_path, data_dir), cwd=tmp_path)
    err.close()
    return proc


def ended(proc: subprocess.Popen, timeout: float = 120) -> int:
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise AssertionError("the run never ended") from None


# --------------------------------------------------------------------------- H1: no hang


@pytest.mark.slow
def test_a_finished_command_ends_within_seconds_of_its_last_line(tmp_path, data_dir):
    proc = start_run(tmp_path, data_dir, "--max-steps", "20", "--batch-size", "16")
    last = time.perf_counter()
    for _ in proc.stdout:
        last = time.perf_counter()
    code = ended(proc)
    err = (tmp_path / "stderr.txt").read_text()
    assert code == 0, err[-3000:]
    assert time.perf_counter() - last < 10, "the process outlived its last line"
    assert "waiting for" not in err


@pytest.mark.slow
@pytest.mark.parametrize("sig, code, word", [(signal.SIGINT, 130, "interrupted"),
                                             (signal.SIGTERM, 143, "terminated")],
                         ids=["SIGINT", "SIGTERM"])
def test_a_stopped_command_ends_and_names_its_source_to_resume(tmp_path, data_dir, sig, code,
                                                               word):
    proc = start_run(tmp_path, data_dir, "--epochs", "40", "--batch-size", "8")
    for line in proc.stdout:
        if line.startswith("epoch 1/40"):  # training, a chunk computed ahead
            proc.send_signal(sig)
            break
    proc.stdout.close()
    assert ended(proc) == code, (tmp_path / "stderr.txt").read_text()[-3000:]
    err = (tmp_path / "stderr.txt").read_text()
    assert "waiting for" not in err and "Traceback" not in err
    out = tmp_path / "run"
    command = shlex.join([sys.executable, "-m", "sae.run", "--out", str(out), "--resume",
                          "--source", "mysource:factory", "--hook", "2"])
    assert err.strip().splitlines()[-1] == f"{word}; continue with: {command}"
    if sig == signal.SIGINT:  # the command printed resumes the run, and ends
        again = subprocess.run([*shlex.split(command), "--epochs", "2"], capture_output=True,
                               text=True, env=source_env(tmp_path, data_dir), cwd=tmp_path,
                               timeout=300)
        assert again.returncode == 0, again.stderr[-3000:]
        assert (out / "metrics.json").is_file()


# --------------------------------------------------------------------------- the library


class Counted(Net):
    """Net that records the largest batch its forward ever sees."""

    largest = 0

    def forward(self, x):
        Counted.largest = max(Counted.largest, len(x))
        return super().forward(x)


@pytest.mark.slow
def test_the_library_leaves_no_thread_and_runs_the_network_in_chunks(tmp_path):
    """H1 and H5: after sae.train returns no sae-source thread remains; validation, test, the
    moments, the PCA sample and the feature page's inputs all reach the network in chunks of at
    most --buffer-rows."""
    Counted.largest = 0
    sae.train(source=(Counted(), images(3000)), hook="body.1", out=str(tmp_path / "run"),
              **{**SETTINGS, "epochs": 1, "max_steps": 30, "val_size": 600, "limit_test": None,
                 "buffer_rows": 48, "no_features": False})
    assert source_threads() == []
    assert 0 < Counted.largest <= 48


class NonFiniteAt(L.Callback):
    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.global_step == 5:
            raise NonFiniteLossError(5)


@pytest.mark.slow
@pytest.mark.parametrize("stop", ["SIGINT", "non-finite loss"])
def test_a_stopped_library_run_leaves_no_thread_and_says_how_to_resume(tmp_path, monkeypatch,
                                                                      capsys, stop):
    """H1 and M7: a stop leaves no sae-source thread; the resume hint for a (model, dataset)
    is the sae.train call, not a command that cannot name it."""
    plain = guards.training_callbacks
    extra = StopAt(5) if stop == "SIGINT" else NonFiniteAt()
    monkeypatch.setattr(guards, "training_callbacks", lambda config: [*plain(config), extra])
    with pytest.raises(sae.TrainingFailed) as failed:
        sae.train(source=(Net(), images()), hook="body.1", out=str(tmp_path / "run"), **QUICK)
    assert source_threads() == []
    err = capsys.readouterr().err
    if stop == "SIGINT":
        assert failed.value.exit_code == 130
        assert err.strip().splitlines()[-1] == (
            f"interrupted; continue with: sae.train(source=(model, dataset), hook='body.1', "
            f"out={str(tmp_path / 'run')!r}, resume='last')")
    else:
        assert failed.value.exit_code == 1


def test_every_pass_through_the_network_is_at_most_buffer_rows():
    """H5 on the data module itself: validation, test, moments, the PCA sample and a direct
    read of many training rows."""
    Counted.largest = 0
    register_python_source((Counted(), images(3000)))
    try:
        dm = StreamedDataModule("python", "body.1", val_size=700, buffer_rows=32, batch_size=64)
        dm.setup()
        dm.train_pca()
        dm.train_x[np.arange(500)]
        dm.teardown("fit")
    finally:
        release_python_source()
    assert Counted.largest == 32


# --------------------------------------------------------------------------- H4: labels


def labelled(labels) -> TensorDataset:
    g = torch.Generator().manual_seed(1)
    return TensorDataset(torch.randn(len(labels), 8, 8, generator=g),
                         torch.as_tensor(labels, dtype=torch.long))


@pytest.mark.parametrize("label, message", [
    (10**9, "a label of 1,000,000,000; labels are classes, 0 to 999"),
    (-1, "a label of -1; labels are classes"),
    (999, "1,000 classes (labels up to 999) for 700 training inputs"),
])
def test_labels_that_are_ids_not_classes_are_refused(label, message):
    labels = np.arange(1500) % 3
    labels[::7] = label  # in the validation and the test split, whatever the seed
    register_python_source((Net(), labelled(labels[:1500 if label != 999 else 1100])))
    try:
        dm = StreamedDataModule("python", "body.1", val_size=200, buffer_rows=160)
        with pytest.raises(SourceError) as refused:
            dm.load()
    finally:
        release_python_source()
    assert message in str(refused.value) and "\n" not in str(refused.value)


def test_a_run_on_id_labels_is_one_line_and_exit_2(tmp_path, capsys):
    labels = np.arange(1500) % 3
    labels[::7] = 10**9
    with pytest.raises(sae.TrainingFailed) as failed:
        sae.train(source=(Net(), labelled(labels)), hook="body.1", out=str(tmp_path / "run"),
                  **QUICK)
    assert failed.value.exit_code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and "1,000" in err[0], err
    assert not (tmp_path / "run").exists()


# --------------------------------------------------------------------------- M8 and the rest


class Broken(Net):
    """Net whose hooked layer (``body.1``) outputs NaN, Inf or complex values."""

    def __init__(self, what):
        super().__init__()
        self.what = what
        self.body[1] = Odd(what)


class Odd(nn.Module):
    def __init__(self, what):
        super().__init__()
        self.what = what

    def forward(self, x):
        if self.what == "complex":
            return torch.complex(x, x)
        x = torch.relu(x).clone()
        x[::5, 0] = float(self.what)
        return x


def train_refused(tmp_path, capsys, net, hook="body.1") -> str:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(sae.TrainingFailed) as failed:
            sae.train(source=(net, images()), hook=hook, out=str(tmp_path / "run"), **QUICK)
    assert failed.value.exit_code == 2
    assert not [w for w in caught if issubclass(w.category, RuntimeWarning)], \
        [str(w.message) for w in caught]
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and "Traceback" not in err[0], err
    assert not (tmp_path / "run").exists()
    return err[0]


@pytest.mark.parametrize("what", ["nan", "inf"])
def test_non_finite_layer_outputs_are_named_as_such(tmp_path, capsys, what):
    line = train_refused(tmp_path, capsys, Broken(what))
    assert "the layer's outputs hold NaN or Inf" in line and "variance" not in line, line
    assert "--hook body.1" in line


def test_complex_layer_outputs_are_refused(tmp_path, capsys):
    line = train_refused(tmp_path, capsys, Broken("complex"))
    assert "complex" in line and "body.1" in line


def test_a_misspelt_hook_names_the_closest_layer(tmp_path, capsys):
    line = train_refused(tmp_path, capsys, Net(), hook="body1")
    assert line.endswith("did you mean 'body.1'?"), line


def test_a_factory_that_exits_is_one_line(tmp_path, monkeypatch, capsys):
    (tmp_path / "exiting_source.py").write_text(EXTRA_FACTORIES)  # a module of this test only
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(sae.TrainingFailed) as failed:
        sae.train(source="exiting_source:exits", hook="1", out=str(tmp_path / "run"), **QUICK)
    assert failed.value.exit_code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["error: --source exiting_source:exits: exits() exited with code 3"], err


@pytest.mark.slow
def test_a_killed_library_start_names_the_call_that_starts_it_again(tmp_path):
    """A (model, dataset) run killed before its first checkpoint: the next sae.train into its
    folder is refused with the call that starts it again, not a command no shell can run."""
    out = tmp_path / "run"
    sae.train(source=(Net(), images()), hook="body.1", out=str(out),
              **{**SETTINGS, "no_features": True, "no_report": True})
    for ckpt in (out / "checkpoints").glob("*.ckpt"):  # as if killed before its first one
        ckpt.unlink()
    (out / "metrics.json").unlink()
    with pytest.raises(sae.TrainingFailed) as failed:
        sae.train(source=(Net(), images()), hook="body.1", out=str(out), **SETTINGS)
    assert "sae.train(source=(model, dataset), hook='body.1'" in failed.value.reason
    assert "overwrite=True" in failed.value.reason and "--source" not in failed.value.reason
