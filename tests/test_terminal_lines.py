"""What the terminal says: one step numbering (metrics.csv's, from 0) in every line, the bar and
the figures; the start's first line; a resumed run's bar with its last validation; the ^C wiped
from the bar's line; and a sweep's first line within 5 s and a line at least every half
minute."""

import csv
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from cli_helpers import QUICK, cli_env, run_cli
from sweep_helpers import TINY, write_yaml

from sae.sweep.heartbeat import Heartbeat, sweep_status
from sae.training.progress import (
    ERASE_TO_END,
    ProgressBar,
    _Bar,
    epoch_line,
    last_step,
    last_validation,
    progress_line,
)


class _Trainer:
    global_step, current_epoch, max_epochs, max_steps = 645, 2, 10, -1
    num_training_batches, estimated_stepping_batches = 215, 2150
    callback_metrics: dict = {}
    progress_bar_metrics: dict = {}


def test_every_line_names_the_last_step_as_metrics_csv_does():
    t = _Trainer()
    assert last_step(t) == 644
    assert epoch_line(t).startswith("epoch 3/10 · step 644")
    assert progress_line(t, 0.004).startswith("epoch 3/10 · step 644 · 645 of 2150 done")
    assert ProgressBar().get_metrics(t, None)["step"] == "644"


def test_a_run_says_the_steps_of_its_metrics_csv_and_starts_with_the_import(tmp_path, data_dir):
    result = run_cli(["--model", "l1", "--epochs", "2", *QUICK, "--no-figures", "--no-report",
                      "--no-features", "--out", "run"], tmp_path, data_dir)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    # the first line says what the start waits for, before the run folder's
    assert lines[0] == "starting (0 s): importing torch and Lightning"
    assert lines.index("run folder: run") > 0
    said = [int(ln.split(" · ")[1].removeprefix("step ")) for ln in lines
            if ln.startswith("epoch ")]
    with open(tmp_path / "run" / "metrics.csv", newline="") as fh:
        logged = [int(r["step"]) for r in csv.DictReader(fh) if r.get("val/fvu")]
    assert said == logged == [7, 15]  # 8 steps an epoch, numbered from 0


def test_a_resumed_bar_shows_the_last_validation_before_the_stop(tmp_path):
    (tmp_path / "metrics.csv").write_text(
        "epoch,step,train/loss,val/fvu,val/l0,val/dead_fraction\n"
        "0,6,0.5,,,\n0,7,,0.2500,31.5,0.01\n1,8,0.4,,,\n1,15,,0.125,20.0,0.02\n")
    assert last_validation(tmp_path / "metrics.csv", 12) == {
        "val/fvu": 0.25, "val/l0": 31.5, "val/dead_fraction": 0.01}
    assert last_validation(tmp_path / "missing.csv", 12) == {}

    class Resumed(_Trainer):
        global_step, current_epoch, default_root_dir = 12, 1, str(tmp_path)

    bar = ProgressBar()
    bar._resumed = last_validation(Path(Resumed.default_root_dir) / "metrics.csv", 12)
    shown = bar.get_metrics(Resumed(), None)
    assert shown["val FVU"] == "0.2500" and shown["val L0"] == "31.5" and shown["dead"] == "1.0 %"


def test_each_bar_drawing_clears_the_rest_of_its_line():
    # the ^C a terminal echoes after the bar is wiped by its next drawing (the one at the stop)
    bar = _Bar(total=10, file=open(os.devnull, "w"), ncols=60)  # noqa: SIM115
    try:
        bar.update(3)
        text = str(bar)
        assert text.endswith(ERASE_TO_END) and "3/10" in text
    finally:
        bar.close()


def test_the_heartbeat_speaks_after_every_silence_and_not_after_its_block():
    said: list[tuple[float, str]] = []
    start = time.monotonic()
    beat = Heartbeat(lambda line: said.append((time.monotonic() - start, line)),
                     lambda: "still going", every=0.5)
    with beat:
        time.sleep(1.25)  # two silences: two lines
        beat.say("a run ended")  # a line of the sweep resets the clock
        time.sleep(0.85)
    ended = len(said)
    time.sleep(0.7)
    lines = [line for _, line in said]
    assert lines[:3] == ["still going", "still going", "a run ended"], lines
    assert lines[3:] == ["still going"]  # once the silence after it lasted
    times = [t for t, _ in said]
    gaps = [b - a for a, b in zip([0.0, *times], times, strict=False)]
    assert all(gap < 0.5 + 0.4 for gap in gaps), gaps  # never silent much past its interval
    assert len(said) == ended  # nothing after the block


def test_the_sweep_status_names_each_running_run_and_its_last_line(tmp_path):
    from sae.sweep.spec import load_sweep, plan

    runs = plan(load_sweep(write_yaml(tmp_path / "s.yaml", TINY)))
    start = time.time() - 61
    log = tmp_path / "logs" / runs[0].rel.relative_to("runs").with_suffix(".log")
    log.parent.mkdir(parents=True)
    log.write_text("$ python -m sae.run ...\nrun folder: x\nepoch 1/2 · step 124 · 125 of 250 "
                   "done\n")
    line = sweep_status(tmp_path, runs, start)
    assert line.startswith("… 1:01 elapsed · 0 of 2 runs done · ")
    assert f"{runs[0].rel.relative_to('runs')}: epoch 1/2 · step 124" in line
    log.write_text(log.read_text() + "# exit code 0 after 3.0 s\n")  # ended: no more named
    assert sweep_status(tmp_path, runs, start, "writing the tables").endswith(
        "0 of 2 runs done · writing the tables")


SLOW_CHECKS = """
# python -m sae.compare whose checks of its data take 7 s
import runpy, sys, time
import sae.sweep.command
sae.sweep.command.check_sweep_data = lambda *args: time.sleep(7)
sys.argv[0] = "sae.compare"
runpy.run_module("sae.compare", run_name="__main__", alter_sys=True)
"""


def _first_line(tmp_path, data_dir, command) -> tuple[str | None, float]:
    """The first line a sweep command writes and how long after its start, the sweep then
    stopped as Ctrl-C stops it."""
    env = {**cli_env(tmp_path, data_dir), "PYTHONUNBUFFERED": "1"}
    started = time.monotonic()
    proc = subprocess.Popen(command, cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True, start_new_session=True)
    first: list[str] = []
    reader = threading.Thread(target=lambda: first.append(proc.stdout.readline()), daemon=True)
    reader.start()
    reader.join(30)
    took = time.monotonic() - started
    try:
        os.killpg(proc.pid, signal.SIGINT)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    return (first[0] if first else None), took


def test_a_sweep_with_slow_checks_says_what_it_does_within_5_seconds(tmp_path, data_dir):
    sweep = write_yaml(tmp_path / "s.yaml", TINY)
    line, took = _first_line(tmp_path, data_dir, [sys.executable, "-c", SLOW_CHECKS, str(sweep),
                                                  "--out", "sw", "--jobs", "1"])
    assert line is not None and line.startswith("starting (4 s): checking the sweep"), line
    assert took < 5.0 + 1.0  # 4 s of checks, then the line (a loaded machine: a second more)


def test_a_sweep_says_its_first_line_within_5_seconds(tmp_path, data_dir):
    """As a user starts it from a shell: the first line within 5 s of the command."""
    sweep = write_yaml(tmp_path / "s.yaml", TINY)
    line, took = _first_line(tmp_path, data_dir, [sys.executable, "-m", "sae.compare",
                                                  str(sweep), "--out", "sw", "--jobs", "1"])
    print(f"the sweep's first line came {took:.2f} s after the command")
    assert line is not None and line.startswith("sweep s.yaml: 2 runs → sw"), line
    assert took < 5.0
