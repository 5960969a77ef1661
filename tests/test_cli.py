"""python -m sae.run as a user calls it: a subprocess on real (subset) MNIST data."""

import json
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import yaml
from cli_helpers import QUICK, assert_one_line_error, cli_env, run_cli, start_cli

from sae.models import MODELS
from sae.training.checkpoints import CheckpointError, read_checkpoint


def test_help_shows_defaults(tmp_path, data_dir):
    result = run_cli(["--help"], tmp_path, data_dir)
    assert result.returncode == 0
    assert "--lambda" in result.stdout and "(default: 0.01)" in result.stdout
    assert "--resume" in result.stdout and "--devices" in result.stdout
    assert "--model {l1,kl,sparsemax,entmax,topk,batchtopk,jumprelu,sparsemax-attention}" \
        in " ".join(result.stdout.split())
    assert "(default: None)" not in result.stdout and "(default: False)" not in result.stdout


@pytest.mark.parametrize("args", [
    ["--lambda", "-1"], ["--lambda", "nan"], ["--hidden", "0"], ["--model", "pca"],
    ["--k", "0"], ["--model", "topk", "--k", "100", "--hidden", "64"], ["--groups", "3"],
    ["--rho", "1.5"],
    ["--alpha", "1.0"], ["--epochs", "two"], ["--dataset", "cifar"], ["--lr", "0"],
    ["--data-dir", "/nonexistent/folder"], ["--config", "missing.yaml"],
    ["--dead-guard", "auxk", "--model", "l1"], ["--resume", "--overwrite"],
    ["--resume"], ["--unknown-flag"],
])
def test_bad_input_is_one_line_exit_2(tmp_path, data_dir, args, capsys, monkeypatch):
    # in-process, as the command runs it (the subprocess case below checks the imports)
    from sae.runner import command as run

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("SAE_RUN_DIR", raising=False)
    monkeypatch.setenv("SAE_DATA_DIR", str(data_dir))
    monkeypatch.setattr(signal, "signal", lambda *a: None)  # keep pytest's own handlers
    assert run.main(args) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), lines
    assert list(tmp_path.iterdir()) == []  # nothing was started


def test_bad_input_is_refused_before_torch_is_imported(tmp_path, data_dir):
    code = ("import sys; from sae import run; rc = run.main(sys.argv[1:]); "
            "assert 'torch' not in sys.modules, 'torch imported'; sys.exit(rc)")
    result = subprocess.run([sys.executable, "-c", code, "--model", "topk", "--k", "100",
                             "--hidden", "64"], cwd=tmp_path, env=cli_env(tmp_path, data_dir),
                            capture_output=True, text=True, timeout=120)
    assert_one_line_error(result)
    assert "--k must be <= --hidden" in result.stderr


def test_bad_config_file(tmp_path, data_dir):
    (tmp_path / "bad.yaml").write_text("model: sparsemax\nbogus: 3\n")
    assert_one_line_error(run_cli(["--config", "bad.yaml"], tmp_path, data_dir))
    (tmp_path / "bad2.yaml").write_text("hidden: -4\n")
    result = run_cli(["--config", "bad2.yaml"], tmp_path, data_dir)
    assert_one_line_error(result)
    assert "bad2.yaml" in result.stderr


def test_missing_data_is_one_clear_error(tmp_path, data_dir):
    empty = tmp_path / "empty"
    empty.mkdir()
    result = run_cli(["--data-dir", empty, "--out", tmp_path / "run"], tmp_path, data_dir)
    assert_one_line_error(result)
    assert "--data-dir" in result.stderr and "SAE_DATA_DIR" in result.stderr


def test_existing_run_folder_is_never_touched(tmp_path, data_dir):
    out = tmp_path / "run"
    out.mkdir()
    (out / "config.yaml").write_text("model: l1\n")
    (out / "metrics.json").write_text('{"fvu": 0.1}')
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    assert_one_line_error(run_cli(["--out", out, *QUICK], tmp_path, data_dir))
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    # --overwrite refuses a folder that is not a run folder
    other = tmp_path / "notes"
    other.mkdir()
    (other / "thesis.tex").write_text("precious")
    assert_one_line_error(run_cli(["--out", other, "--overwrite", *QUICK], tmp_path, data_dir))
    assert (other / "thesis.tex").read_text() == "precious"


def read_history(out: Path) -> pd.DataFrame:
    return pd.read_csv(out / "metrics.csv")


@pytest.mark.slow
@pytest.mark.parametrize("model", MODELS)
def test_every_model_trains_end_to_end(tmp_path, data_dir, model):
    out = tmp_path / "run"
    result = run_cli(["--model", model, "--max-steps", 24, "--lambda-warmup", 12,
                      "--log-every", 4, "--out", out, *QUICK],
                     tmp_path, data_dir)
    assert result.returncode == 0, result.stderr[-3000:]
    config = yaml.safe_load((out / "config.yaml").read_text())
    assert config["model"] == model and config["lambda"] == 0.01
    metrics = json.loads((out / "metrics.json").read_text())
    for key in ("mse", "fvu", "fvu_at_l0", "l0_mean", "l0_std", "dead_fraction",
                "dense_fraction", "wall_time_s"):
        assert isinstance(metrics[key], float)
    # the published Sparsemax-SAE has no decoder bias at the mean and a random dictionary: in
    # 24 steps it is still far from the mean image's FVU of 1 (the others start at it)
    assert 0 < metrics["fvu"] < (10 if model == "sparsemax-attention" else 1.5)
    assert metrics["steps"] == 24
    if model != "kl":  # codes at or below the firing threshold are exact zeros
        assert metrics["fvu_at_l0"] == metrics["fvu"]
    assert (out / "checkpoints" / "last.ckpt").is_file()
    assert (out / "checkpoints" / "best.ckpt").is_file()
    assert list((out / "tensorboard").glob("events.out.tfevents.*"))
    history = read_history(out)
    assert {"train/loss", "train/lambda", "val/loss", "val/l0"} <= set(history.columns)
    lam = history["train/lambda"].dropna()
    assert lam.iloc[0] < lam.iloc[-1] == pytest.approx(0.01)  # λ warms up
    for kind in ("decoder_atoms", "reconstructions", "sparsity_histogram",
                 "activation_frequency", "class_unit_heatmap", "feature_density"):
        pngs = list((out / "figures" / kind).glob("epoch_*.png"))
        assert pngs and pngs[0].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    html = (out / "report.html").read_text()
    assert "data:image/png;base64," in html and f"{metrics['fvu']:.4g}"[:4] in html


def start_long_run(tmp_path, data_dir, stderr=subprocess.DEVNULL):
    """A 500-epoch run of 2 steps per epoch in tmp_path/run, started in the background."""
    out = tmp_path / "run"
    args = ["--model", "l1", "--out", out, "--limit-train", "512", "--val-size", "256",
            "--limit-test", "256", "--hidden", "32", "--batch-size", "256", "--epochs", "500",
            "--no-figures", "--no-report"]
    return start_cli(args, tmp_path, data_dir, stderr=stderr), out


def saved_epoch(last) -> int:
    """The epoch of the checkpoint at ``last``, or -1 while there is none (or it is mid-write)."""
    try:
        return int(read_checkpoint(last)["epoch"])
    except CheckpointError:
        return -1


def train_seconds(last) -> float:
    return float(read_checkpoint(last)["callbacks"]["Timer"]["time_elapsed"]["train"])


@pytest.mark.slow
def test_resume_after_interrupted_run(tmp_path, data_dir):
    proc, out = start_long_run(tmp_path, data_dir)
    last = out / "checkpoints" / "last.ckpt"
    deadline = time.time() + 240
    while time.time() < deadline and saved_epoch(last) < 2:
        time.sleep(0.1)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert last.is_file(), "no checkpoint was written before the interruption"
    assert not (out / "metrics.json").exists()
    epoch, seconds_before = saved_epoch(last), train_seconds(last)
    assert seconds_before > 0
    config_before = (out / "config.yaml").read_text()
    first_session = (out / "logs" / "session_0" / "metrics.csv").read_text()
    target = epoch + 3
    result = run_cli(["--out", out, "--resume", "--epochs", target], tmp_path, data_dir)
    assert result.returncode == 0, result.stderr[-3000:]
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["steps"] == 2 * target  # 2 steps per epoch, counted from the first run
    assert metrics["wall_time_s"] > seconds_before  # the first session's training time counts
    history = read_history(out)
    assert history["epoch"].min() == 0 and history["epoch"].max() == target - 1
    assert history.dropna(subset=["val/loss"])["epoch"].is_unique  # no epoch logged twice
    assert (out / "config.yaml").read_text() == config_before
    # the first session's own history was not rewritten
    assert (out / "logs" / "session_0" / "metrics.csv").read_text() == first_session
    # a finished run is refused without --resume / --overwrite
    assert_one_line_error(run_cli(["--out", out, "--no-figures"], tmp_path, data_dir))


@pytest.mark.slow
def test_ctrl_c_stops_with_a_resume_hint_and_keeps_the_checkpoint(tmp_path, data_dir):
    proc, out = start_long_run(tmp_path, data_dir, stderr=subprocess.PIPE)
    last = out / "checkpoints" / "last.ckpt"
    deadline = time.time() + 240
    while time.time() < deadline and saved_epoch(last) < 0:  # a whole checkpoint is on disk
        time.sleep(0.1)
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130, stderr[-2000:]
    resume = shlex.join([sys.executable, "-m", "sae.run", "--out", str(out), "--resume"])
    assert f"interrupted; continue with: {resume}\n" in stderr  # the interpreter in use
    assert last.is_file() and not (out / "metrics.json").exists()


@pytest.mark.slow
def test_ddp_on_cpu_matches_single_process_statistics(tmp_path, data_dir):
    from sae.data.images import ImageDataModule
    from sae.metrics import firing_frequency, l0
    from sae.models import encode_dataset
    from sae.training.checkpoints import load_checkpoint

    out = tmp_path / "ddp"
    result = run_cli(["--model", "sparsemax", "--max-steps", 6, "--out", out, "--devices", 2,
                      "--strategy", "ddp", "--accelerator", "cpu", *QUICK], tmp_path, data_dir,
                     timeout=400)
    assert result.returncode == 0, result.stderr[-3000:]
    # figures are written once, by rank 0
    assert len(list((out / "figures" / "decoder_atoms").glob("*.png"))) == 1
    val = read_history(out).dropna(subset=["val/dead_fraction"]).iloc[-1]
    # the same model on the same validation images in one process
    model = load_checkpoint(out / "checkpoints" / "last.ckpt")
    dm = ImageDataModule("mnist", str(data_dir), val_size=256, limit_train=1024)
    dm.setup()
    _, codes = encode_dataset(model, dm.val_x)
    freq = firing_frequency(codes)
    assert float((freq == 0).float().mean()) == pytest.approx(val["val/dead_fraction"], abs=1e-6)
    assert float(l0(codes).mean()) == pytest.approx(val["val/l0"], rel=1e-4)


def test_flags_are_checked_before_lightning_is_imported():
    # a typo must cost a fraction of a second, not Lightning's import time
    code = ("import sys, sae.run; from sae.settings.config import SAEConfig; "
            "SAEConfig().validate(); "
            "print(sorted(m for m in ('lightning', 'torch') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.slow
def test_piped_output_names_the_folder_first_then_one_line_per_epoch(tmp_path, data_dir):
    """Piped (not a terminal): what the start waits for first (torch's import), then the run
    folder, a line per validation, a line as each finishing step starts and one with its time
    as it ends, the pages last."""
    out = tmp_path / "run"
    result = run_cli(["--model", "l1", "--epochs", "3", "--out", out, *QUICK], tmp_path,
                     data_dir)
    assert result.returncode == 0, result.stderr[-2000:]
    lines = result.stdout.splitlines()
    assert lines[0] == "starting (0 s): importing torch and Lightning"
    lines = [ln for ln in lines if not ln.startswith("starting (")]
    assert lines[0] == f"run folder: {out}"
    # QUICK's --k is no setting of the L1 SAE: said once
    assert lines[1] == "note: --k is ignored by --model l1: its sparsity is --lambda 0.01"
    epochs = [ln for ln in lines if ln.startswith("epoch ")]
    assert [ln.split(" · ")[0] for ln in epochs] == ["epoch 1/3", "epoch 2/3", "epoch 3/3"]
    assert all("val FVU" in ln and "L0" in ln and "dead" in ln for ln in epochs)
    assert "v_num" not in result.stdout + result.stderr
    after = lines[lines.index(epochs[-1]) + 1:]
    names = ["figures", "test metrics", "feature browser", "report"]
    assert after[0:8:2] == [f"{name} …" for name in names]
    ends = [re.fullmatch(r"(.+) … (\d+\.\d) s", ln) for ln in after[1:8:2]]
    assert [m.group(1) for m in ends if m] == names
    assert after[8].startswith("mse=")
    assert lines[-2:] == [f"report: {out / 'report.html'}", f"features: {out / 'features.html'}"]
    assert (out / "report.html").is_file() and (out / "features.html").is_file()


@pytest.mark.parametrize("args, named", [
    (["--lamda", "0.1"], "did you mean --lambda?"),
    (["--model", "sparsmax"], "did you mean sparsemax?"),
    (["--hiden", "3", "--epocs", "2"], "did you mean --hidden (for --hiden), --epochs (for "
                                       "--epocs)?"),
])
def test_a_misspelt_flag_or_model_names_the_closest(tmp_path, data_dir, args, named):
    result = run_cli(args, tmp_path, data_dir)
    assert_one_line_error(result)
    assert result.stderr.rstrip().endswith(named), result.stderr
    assert list(tmp_path.iterdir()) == []  # nothing was started (no cache, no run folder)


def test_a_flag_close_to_none_is_named_without_a_guess(tmp_path, data_dir):
    result = run_cli(["--foo"], tmp_path, data_dir)
    assert_one_line_error(result)
    assert result.stderr == "error: unrecognized arguments: --foo\n"


@pytest.mark.parametrize("module, args, named", [
    ("sae.report", ["run", "--no-figuers"], "did you mean --no-figures?"),
    ("sae.compare", ["sweep.yaml", "--engine", "worker"], "did you mean workers?"),
    ("sae.features", ["run", "--max-imputs", "3"], "did you mean --max-inputs?"),
])
def test_every_command_names_the_closest_flag(tmp_path, data_dir, module, args, named):
    result = run_cli(args, tmp_path, data_dir, module=module)
    assert_one_line_error(result)
    assert result.stderr.rstrip().endswith(named), result.stderr


def test_a_settings_file_names_the_closest_setting(tmp_path, data_dir):
    (tmp_path / "typo.yaml").write_text("lamda: 0.1\n")
    result = run_cli(["--config", "typo.yaml"], tmp_path, data_dir)
    assert_one_line_error(result)
    assert "unknown setting 'lamda'; did you mean lambda?" in result.stderr


@pytest.mark.parametrize("args, says", [
    (["--val-size", 60000], "--val-size 60,000: mnist has 60,000 training images, too few for "
                            "60,000 validation images and at least 2 to train on; give "
                            "--val-size 59,998 or less"),
    (["--dataset", "fashion-mnist", "--val-size", 59999], "give --val-size 59,998 or less"),
    (["--limit-train", 1], "--limit-train: must be >= 2, got 1"),
])
def test_a_split_the_images_cannot_hold_is_refused_before_the_run_folder(tmp_path, data_dir,
                                                                        args, says):
    out = tmp_path / "run"
    started = time.monotonic()
    result = run_cli([*args, "--out", out], tmp_path, data_dir)
    assert_one_line_error(result)
    assert says in result.stderr and not out.exists()
    assert time.monotonic() - started < 60  # before torch: well under a second on a quiet machine


def test_own_data_too_small_for_its_val_size_is_refused_before_the_run_folder(
        tmp_path, data_dir):
    import numpy as np

    np.save(tmp_path / "acts.npy", np.random.default_rng(0).standard_normal((3000, 8),
                                                                            dtype=np.float32))
    out = tmp_path / "runs" / "own"
    result = run_cli(["--data", "acts.npy", "--val-size", "1500", "--out", out], tmp_path,
                     data_dir)
    assert_one_line_error(result)
    assert ("--val-size 1,500: --data acts.npy has 3,000 training rows, too few "
            "for 1,500 validation rows and as many test rows (it has no test split) and at "
            "least 2 to train on; give --val-size 1,499 or less") in result.stderr
    assert "run folder" not in result.stdout and not (tmp_path / "runs").exists()


def test_image_files_missing_offline_are_refused_before_the_run_folder(tmp_path, data_dir):
    empty = tmp_path / "empty"
    empty.mkdir()
    result = run_cli(["--data-dir", empty, "--out", tmp_path / "run"], tmp_path, data_dir)
    assert_one_line_error(result)
    assert "SAE_OFFLINE is set" in result.stderr and not (tmp_path / "run").exists()
