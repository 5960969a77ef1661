"""SAEs on any PyTorch model's layer while it runs (--source / --hook, sae.train(source=...)):
the rows are the layer's outputs, training resumes exactly, bad sources are one line."""

import json
import re
import signal
import subprocess
import sys

import lightning.pytorch as L
import numpy as np
import pytest
import torch
from cli_helpers import cli_env
from torch import nn
from torch.utils.data import TensorDataset

import sae
from sae.data.streamed import StreamedDataModule, register_python_source, release_python_source
from sae.training import guards


class Net(nn.Module):
    """A small classifier on 8x8 images: the layer an SAE reads is ``body.1`` (after a ReLU)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.body = nn.Sequential(nn.Linear(64, 24), nn.ReLU(), nn.Linear(24, 12))
        self.head = nn.Linear(12, 3)

    def forward(self, x):
        return self.head(torch.relu(self.body(x.flatten(1))))


def images(n=1500):
    g = torch.Generator().manual_seed(1)
    return TensorDataset(torch.randn(n, 8, 8, generator=g), torch.randint(0, 3, (n,),
                                                                          generator=g))


SETTINGS = {"hidden": 32, "val_size": 200, "limit_test": 200, "batch_size": 64,
            "buffer_rows": 160, "epochs": 2, "no_figures": True, "progress": "off",
            "model": "topk", "k": 4}


def test_rows_are_the_hooked_layers_outputs_chunk_by_chunk():
    net, data = Net(), images()
    register_python_source((net, data))
    try:
        dm = StreamedDataModule("python", "body.1", val_size=200, buffer_rows=160,
                                batch_size=64)
        dm.setup()
        direct = lambda idx: torch.relu(net.body[0](data.tensors[0][idx].flatten(1)))  # noqa: E731
        with torch.no_grad():
            torch.testing.assert_close(dm.val_x[:5], direct(np.sort(
                torch.randperm(1500, generator=torch.Generator().manual_seed(0))[:200].numpy())
                [:5]))
            # a training batch in the epoch's order: served from its chunk, the same rows
            order = dm.sampler(len(dm.train_x)).epoch_order(0)
            batch = order[170:234]  # across a chunk boundary (160, 320)
            torch.testing.assert_close(dm.train_x[batch], direct(dm.train_index[batch]))
        assert dm.has_labels and dm.class_names == ["0", "1", "2"]
        assert dm.test_images.shape == (200, 8, 8)  # the inputs are shown as images
        assert len(dm.train_x) == 1500 - 400 and dm.train_x.shape[1] == 24
    finally:
        release_python_source()


def test_a_module_defined_here_trains_through_a_hook(tmp_path):
    out = sae.train(source=(Net(), images()), hook="body.1", out=str(tmp_path / "run"),
                    **SETTINGS)
    record = json.loads((out / "data.json").read_text())
    assert record == {"streamed": True, "source": "python", "hook": "body.1", "inputs": 1500,
                      "test_inputs": None, "width": 24}
    result = json.loads((out / "metrics.json").read_text())
    assert 0 < result["fvu"] < 1 and result["l0_mean"] == pytest.approx(4, abs=0.5)
    model = sae.load(out)
    assert model.config.input_dim == 24
    assert (out / "features.html").is_file() and (out / "report.html").is_file()


class StopAt(L.Callback):
    def __init__(self, step):
        self.step = step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.global_step == self.step:
            signal.raise_signal(signal.SIGINT)


@pytest.mark.slow
def test_a_streamed_run_stopped_mid_epoch_resumes_exactly(tmp_path, monkeypatch):
    settings = {**SETTINGS, "no_features": True, "no_report": True}
    whole = sae.train(source=(Net(), images()), hook="body.1", out=str(tmp_path / "whole"),
                      **settings)
    plain = guards.training_callbacks
    with monkeypatch.context() as patch:
        patch.setattr(guards, "training_callbacks",
                      lambda config: [*plain(config), StopAt(23)])  # mid-epoch, mid-chunk
        with pytest.raises(sae.TrainingFailed) as stopped:
            sae.train(source=(Net(), images()), hook="body.1", out=str(tmp_path / "split"),
                      **settings)
    assert stopped.value.exit_code == 130
    assert not (tmp_path / "split" / "metrics.json").exists()
    split = sae.train(source=(Net(), images()), hook="body.1", out=str(tmp_path / "split"),
                      resume="last", **settings)
    a = json.loads((whole / "metrics.json").read_text())
    b = json.loads((split / "metrics.json").read_text())
    for key in ("fvu", "l0_mean", "mse", "dead_fraction", "steps"):
        assert b[key] == pytest.approx(a[key], rel=1e-6, abs=1e-7), key
    for name, t in sae.load(whole).state_dict().items():
        torch.testing.assert_close(sae.load(split).state_dict()[name], t, rtol=0, atol=1e-6)


SOURCE_MODULE = '''
import torch
from torch import nn
from torch.utils.data import TensorDataset

def factory():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(16, 8), nn.ReLU(), nn.Linear(8, 2))
    return model, TensorDataset(torch.randn(600, 4, 4))

def broken():
    raise RuntimeError("no weights here")
'''


@pytest.mark.slow
@pytest.mark.parametrize("args, message", [
    (["--source", "nowhere:factory", "--hook", "1"],
     r"--source nowhere:factory: cannot import nowhere \(ModuleNotFoundError: .*\)"),
    (["--source", "mysource:broken", "--hook", "1"],
     r"--source mysource:broken: broken\(\) failed \(RuntimeError: no weights here\)"),
    (["--source", "mysource:factory", "--hook", "fc1"],
     r"--hook fc1: mysource:factory's model has no layer 'fc1' \(it has 0, 1, 2, 3\)"),
    (["--source", "mysource:factory"], r"--source and --hook go together: .*"),
])
def test_a_bad_source_or_hook_is_one_line_before_any_folder(tmp_path, data_dir, args, message):
    (tmp_path / "mysource.py").write_text(SOURCE_MODULE)
    env = {**cli_env(tmp_path, data_dir), "PYTHONPATH": str(tmp_path)}
    result = subprocess.run([sys.executable, "-m", "sae.run", *args, "--out",
                             str(tmp_path / "run")], capture_output=True, text=True, env=env,
                            cwd=tmp_path, timeout=300)
    # stdout: at most the start-up's status lines (the source is imported: seconds)
    assert result.returncode == 2 and all(line.startswith("starting (")
                                          for line in result.stdout.splitlines())
    assert re.fullmatch(f"error: {message}\n", result.stderr), result.stderr
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_the_command_streams_and_resumes_only_with_its_source_named(tmp_path, data_dir):
    (tmp_path / "mysource.py").write_text(SOURCE_MODULE)
    env = {**cli_env(tmp_path, data_dir), "PYTHONPATH": str(tmp_path)}
    flags = ["--source", "mysource:factory", "--hook", "2", "--hidden", "16", "--val-size",
             "100", "--max-steps", "12", "--no-figures", "--no-features", "--no-report",
             "--progress", "off", "--out", str(tmp_path / "run")]
    first = subprocess.run([sys.executable, "-m", "sae.run", *flags], capture_output=True,
                           text=True, env=env, cwd=tmp_path, timeout=300)
    assert first.returncode == 0, first.stderr[-2000:]
    again = subprocess.run([sys.executable, "-m", "sae.run", "--out", str(tmp_path / "run"),
                            "--resume", "--max-steps", "20"], capture_output=True, text=True,
                           env=env, cwd=tmp_path, timeout=300)
    assert again.returncode == 2
    assert again.stderr == (f"error: cannot resume {tmp_path / 'run'} without naming its source "
                            "again: give --source mysource:factory --hook 2 (a run folder's "
                            "files never name code to import)\n")
    rebuild = subprocess.run([sys.executable, "-m", "sae.features", str(tmp_path / "run")],
                             capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    assert rebuild.returncode != 0 and rebuild.stderr.startswith("error: ")
    assert len(rebuild.stderr.splitlines()) == 1


@pytest.mark.slow
def test_ddp_on_cpu_streams_each_share_and_matches_one_process(tmp_path, data_dir, monkeypatch):
    (tmp_path / "mysource.py").write_text(SOURCE_MODULE)
    env = {**cli_env(tmp_path, data_dir), "PYTHONPATH": str(tmp_path)}
    out = tmp_path / "ddp"
    result = subprocess.run([sys.executable, "-m", "sae.run", "--source", "mysource:factory",
                             "--hook", "2", "--hidden", "16", "--val-size", "100",
                             "--max-steps", "6", "--devices", "2", "--strategy", "ddp",
                             "--accelerator", "cpu", "--no-figures", "--no-features",
                             "--no-report", "--progress", "off", "--out", str(out)],
                            capture_output=True, text=True, env=env, cwd=tmp_path, timeout=400)
    assert result.returncode == 0, result.stderr[-3000:]
    # the last validation, over both ranks' shares, is the model's on every validation row
    import pandas as pd

    history = pd.read_csv(out / "metrics.csv").dropna(subset=["val/l0"]).iloc[-1]
    monkeypatch.syspath_prepend(str(tmp_path))
    dm = StreamedDataModule("mysource:factory", "2", val_size=100)
    dm.setup()
    model = sae.load(out)
    with torch.no_grad():
        codes = model.encode(dm.val_x)
    assert float((codes > 0).sum(-1).float().mean()) == pytest.approx(history["val/l0"],
                                                                      rel=1e-4)
