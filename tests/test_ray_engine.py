"""Sweeps on Ray (``--engine ray``), on a local Ray instance: the same numbers as the local
engine, a run whose worker dies retried, a stopped sweep resumed, a missing Ray one line."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import yaml

from sae.sweep import command, raypool

# four runs: two settings, two seeds; long enough (8 steps an epoch) to be stopped part-way
SWEEP = {
    "description": "four runs on Ray",
    "datasets": ["mnist"],
    "seeds": [0, 1],
    "common": {"hidden": 32, "limit_train": 512, "val_size": 128, "limit_test": 200,
               "batch_size": 64, "epochs": 3},
    "models": {"l1": {"lambda": [0.03, 0.1]}},
}
NOT_COMPARED = {"wall_time_s", "run"}

needs_ray = pytest.mark.skipif(not __import__("importlib").util.find_spec("ray"),
                               reason='Ray is not installed (pip install -e ".[ray]")')


def env(root: Path, data_dir: Path) -> dict:
    e = dict(os.environ, SAE_DATA_DIR=str(data_dir), SAE_OFFLINE="1", OMP_NUM_THREADS="2",
             SAE_CACHE_DIR=str(root / "cache"), RAY_AUTH_MODE="disabled")
    e.pop("SAE_RUN_DIR", None)
    return e


def start(args, root: Path, data_dir: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "sae.compare", *map(str, args)], cwd=root,
                            env=env(root, data_dir), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def finish(proc: subprocess.Popen, timeout: int = 600) -> tuple[int, str, str]:
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, out, err


def sweep_file(root: Path, data=SWEEP) -> Path:
    path = root / "ray.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def table(folder: Path) -> pd.DataFrame:
    frame = pd.read_csv(folder / "results.csv")
    return frame.drop(columns=[c for c in NOT_COMPARED if c in frame]).sort_values(
        ["value", "seed"]).reset_index(drop=True)


def trainings(folder: Path) -> list[tuple[int, dict]]:
    """(pid, environment) of the sae.run processes training into ``folder``."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            if b"sae.run" in cmd and any(str(folder).encode() in part for part in cmd):
                raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
                found.append((int(pid), dict(p.decode().split("=", 1) for p in raw if b"=" in p)))
        except OSError:
            continue
    return found


def wait_for_training(folder: Path, limit: float = 180) -> list[tuple[int, dict]]:
    """The trainings into ``folder`` as soon as one has started (it has seconds of start-up
    and training left: a run of this sweep takes some 10 s on an idle machine)."""
    end = time.monotonic() + limit
    while time.monotonic() < end:
        running = trainings(folder)
        if running:
            return running
        time.sleep(0.2)
    raise AssertionError("no training started")


@pytest.mark.slow
@needs_ray
def test_ray_gives_the_local_engine_s_numbers(tmp_path, data_dir):
    sweep_file(tmp_path)
    local = start(["ray.yaml", "--jobs", "2", "--out", "local"], tmp_path, data_dir)
    code, out, err = finish(local)
    assert code == 0, out[-2000:] + err[-2000:]
    code, out, err = finish(start(["ray.yaml", "--jobs", "2", "--engine", "ray", "--out", "ray"],
                                  tmp_path, data_dir))
    assert code == 0, out[-2000:] + err[-2000:]
    assert "[4/4]" in out and "trained in" in out  # the local engine's progress lines
    pd.testing.assert_frame_equal(table(tmp_path / "local"), table(tmp_path / "ray"))
    assert (tmp_path / "ray" / "comparison.html").is_file()
    logs = sorted((tmp_path / "ray" / "logs").rglob("seed*.log"))
    assert len(logs) == 4 and all("# exit code 0" in p.read_text() for p in logs)


@pytest.mark.slow
@needs_ray
def test_a_run_whose_worker_dies_is_retried_and_a_stopped_sweep_resumes(tmp_path, data_dir):
    sweep_file(tmp_path, {**SWEEP, "common": {**SWEEP["common"], "epochs": 40}})
    folder = tmp_path / "ray"
    driver = start(["ray.yaml", "--jobs", "2", "--engine", "ray", "--out", folder], tmp_path,
                   data_dir)
    try:
        pid, environ = wait_for_training(folder)[0]
        worker = int(environ["SAE_STOP_WITH_PARENT"])  # the Ray worker running its task
        assert worker != driver.pid
        run = next(part for part in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
                   if b"/runs/" in part).decode()
        os.kill(worker, signal.SIGKILL)
        log = folder / "logs" / Path(run).relative_to(folder / "runs").with_suffix(".log")
        end = time.monotonic() + 120  # Ray runs its task again: a second command in the log
        while log.read_text().count("\n$ ") < 2 and time.monotonic() < end:
            time.sleep(0.5)
        assert log.read_text().count("\n$ ") == 2, log.read_text()[-2000:]
        driver.send_signal(signal.SIGINT)  # then the whole sweep is stopped
        code, out, err = finish(driver, timeout=180)
    finally:
        if driver.poll() is None:
            driver.kill()
    assert code == 130, out[-2000:] + err[-2000:]
    assert err.strip().splitlines()[-1].startswith("interrupted")
    assert not trainings(folder)  # nothing left training
    code, out, err = finish(start(["ray.yaml", "--jobs", "2", "--engine", "ray", "--out", folder],
                                  tmp_path, data_dir))
    assert code == 0, out[-2000:] + err[-2000:]
    results = pd.read_csv(folder / "results.csv")
    assert len(results) == 4 and (results["epochs"] == 40).all()


def test_without_ray_the_engine_is_one_line_and_exit_2(tmp_path, monkeypatch, capsys):
    sweep_file(tmp_path)
    monkeypatch.setattr(raypool.importlib.util, "find_spec", lambda name: None)
    assert command.main([str(tmp_path / "ray.yaml"), "--engine", "ray",
                         "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ['error: --engine ray needs Ray: pip install -e ".[ray]"']
    assert not (tmp_path / "out").exists()
    assert command.main([str(tmp_path / "ray.yaml"), "--address", "auto"]) == 2
    assert capsys.readouterr().err.strip() == "error: --address applies to --engine ray"
