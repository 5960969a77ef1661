"""--logger: where a run's curves go besides metrics.csv, which every run writes (the session's
CSV log merged; the pages, a resume and sweeps read it). TensorBoard by default, csv for none
more, wandb (an optional extra) for Weights & Biases, run here offline."""

import importlib.util
import json
import subprocess
import sys

import pytest
from cli_helpers import QUICK, assert_one_line_error, run_cli

RUN = [*QUICK, "--model", "l1", "--epochs", "1", "--no-features"]
HAS_WANDB = importlib.util.find_spec("wandb") is not None


def _pages_and_metrics(out):
    assert (out / "metrics.csv").is_file() and (out / "metrics.json").is_file()
    rows = (out / "metrics.csv").read_text().splitlines()
    assert rows[0].startswith("epoch,step") and len(rows) > 2
    assert "val/fvu" in rows[0]
    assert (out / "report.html").is_file()
    assert "fvu" in json.loads((out / "metrics.json").read_text())


def test_tensorboard_is_the_default(tmp_path, data_dir):
    result = run_cli([*RUN, "--no-report", "--out", "run"], tmp_path, data_dir)
    assert result.returncode == 0, result.stderr
    assert any((tmp_path / "run" / "tensorboard").glob("events.out.tfevents.*"))


def test_csv_writes_metrics_csv_and_the_pages_without_tensorboard(tmp_path, data_dir):
    result = run_cli([*RUN, "--logger", "csv", "--out", "run"], tmp_path, data_dir)
    assert result.returncode == 0, result.stderr
    out = tmp_path / "run"
    assert not (out / "tensorboard").exists()
    _pages_and_metrics(out)
    # a resumed csv run goes on with its logger, from config.yaml
    again = run_cli(["--out", "run", "--resume", "--epochs", "2", "--no-report"], tmp_path,
                    data_dir)
    assert again.returncode == 0, again.stderr
    assert not (out / "tensorboard").exists()


@pytest.mark.skipif(HAS_WANDB, reason="wandb is installed: its absence cannot be tested here")
def test_a_missing_wandb_is_one_line_naming_the_extra(tmp_path, data_dir):
    result = run_cli([*RUN, "--logger", "wandb", "--out", "run"], tmp_path, data_dir)
    assert_one_line_error(result)
    assert "--logger wandb needs the wandb package" in result.stderr
    assert '".[wandb]"' in result.stderr and not (tmp_path / "run").exists()


@pytest.mark.skipif(not HAS_WANDB, reason="wandb is not installed (pip install -e '.[wandb]'); "
                                          "the run with --logger wandb is not tested")
def test_wandb_offline_logs_the_run_and_keeps_the_run_folder_layout(tmp_path, data_dir):
    result = run_cli([*RUN, "--logger", "wandb", "--out", "run"], tmp_path, data_dir,
                     WANDB_MODE="offline", WANDB_DIR=str(tmp_path / "wandb-files"),
                     WANDB_SILENT="true")
    assert result.returncode == 0, result.stderr
    out = tmp_path / "run"
    _pages_and_metrics(out)
    assert not (out / "tensorboard").exists() and not (out / "wandb").exists()
    offline = list((tmp_path / "wandb-files").glob("wandb/offline-run-*/run-*.wandb"))
    assert offline, sorted(p.name for p in (tmp_path / "wandb-files").rglob("*"))[:20]
    # the folder is a run folder still: --overwrite replaces it
    again = run_cli([*RUN, "--logger", "csv", "--no-report", "--out", "run", "--overwrite"],
                    tmp_path, data_dir)
    assert again.returncode == 0, again.stderr


def test_the_logger_is_a_setting_of_sae_train_and_sweeps():
    from sae.settings.cli import SETTINGS

    s = SETTINGS["logger"]
    assert s.default == "tensorboard" and s.choices == ("tensorboard", "csv", "wandb")
    assert s.file  # config.yaml records it: a resume logs where the run logged
    # choosing a logger imports none (a fresh process: another test may have imported wandb)
    probe = ("import sys; from sae.settings.cli import run_config; "
             "run_config(['--logger', 'wandb', '--out', 'x']); print('wandb' in sys.modules)")
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                            timeout=120)
    assert result.stdout.strip() == "False", result.stderr[-1000:]
