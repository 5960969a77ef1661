"""What a command may remove, and what a retry finds: --overwrite never removes a file a run did
not write, a start killed before its first checkpoint names the command that starts it again,
the gallery and sae.data.layer leave what their retry can use, and pages built from a run whose
data changed since training refuse or say so (issue 52, cases 5, 6, 7, 10 and 'also seen').
In-process: the process boundary is not the point (tests/test_hostile_signals.py)."""

import errno
import hashlib
import json
import os
import shlex
import shutil
import signal
import sys
from pathlib import Path

import numpy as np
import pytest
from cli_helpers import QUICK

from sae.data import layer, matrix
from sae.pages import gallery
from sae.runner import command as sae_run
from sae.settings.cli import run_config, write_config
from sae.system.process import RUN_DIR_ENV
from sae.training import runfolder

QUIET = ["--no-figures", "--no-features", "--no-report", "--progress", "off"]
NEW = ["--model", "topk", *QUICK, "--max-steps", "4", *QUIET]


@pytest.fixture(autouse=True)
def _process_state(monkeypatch, data_dir):
    """main() installs signal handlers and names its run folder in the environment."""
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    monkeypatch.delenv(RUN_DIR_ENV, raising=False)
    monkeypatch.delenv("SAE_SESSION", raising=False)
    monkeypatch.setenv("SAE_DATA_DIR", str(data_dir))
    monkeypatch.setenv("SAE_OFFLINE", "1")
    yield
    for s, handler in handlers.items():
        signal.signal(s, handler)
    for name in (RUN_DIR_ENV, "SAE_SESSION"):
        os.environ.pop(name, None)


def main(argv) -> int:
    argv = [str(a) for a in argv]
    try:
        return sae_run.main(argv)
    finally:  # the lock is held until the process ends otherwise
        if "--out" in argv:
            runfolder.release(Path(argv[argv.index("--out") + 1]))


def snapshot(root: Path) -> dict:
    return {str(p.relative_to(root)): (hashlib.sha256(p.read_bytes()).hexdigest()
                                       if p.is_file() else "dir") for p in sorted(root.rglob("*"))}


def error_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: "), err
    return err[0]


@pytest.fixture(scope="module")
def finished(tmp_path_factory, data_dir):
    """A finished tiny image run (figures on: every kind of file a run writes)."""
    os.environ.update(SAE_DATA_DIR=str(data_dir), SAE_OFFLINE="1")
    out = tmp_path_factory.mktemp("finished") / "run"
    assert main(["--model", "topk", *QUICK, "--max-steps", "8", "--no-features",
                 "--progress", "off", "--out", out]) == 0
    os.environ.pop(RUN_DIR_ENV, None)
    return out


# --------------------------------------------------------------------------- --overwrite


@pytest.mark.slow
@pytest.mark.parametrize("mine", ["my_analysis.txt", "mine/y.txt", "checkpoints/notes.txt",
                                  "figures/decoder_atoms/notes.txt", "logs/session_0/a.md",
                                  "tensorboard/plot.py", "mine/"])
def test_overwrite_refuses_a_run_folder_holding_a_users_file(finished, tmp_path, capsys, mine):
    run = tmp_path / "run"
    shutil.copytree(finished, run)
    path = run / mine
    if mine.endswith("/"):
        path.mkdir()
    else:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("the user's own\n")
    before = snapshot(run)
    assert main([*NEW, "--overwrite", "--out", run]) == 2
    line = error_line(capsys)
    assert line.startswith(f"error: refusing to --overwrite {run}: "), line
    named = Path(line.split(": ")[2].split(" was not written by a run")[0])
    assert named == path or named in path.parents, line  # the user's file, or its folder
    assert named != run and "nothing was removed" in line and snapshot(run) == before


@pytest.mark.slow
def test_a_run_folder_of_the_tools_own_files_is_overwritten(finished, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(finished, run)
    (run / "data.json").write_text("{}")  # a --data run's record
    (run / "analysis.json").write_text("{}")  # a sweep's analysis
    (run / "figures" / "decoder_atoms" / ".epoch_9.png-x1y2.tmp").write_bytes(b"half")  # killed
    assert runfolder.foreign_file(run) is None and runfolder.overwritable(run) is None
    runfolder.claim(run, "overwrite")
    runfolder.release(run)
    assert sorted(os.listdir(run)) == [".lock", runfolder.MARKER]


# --------------------------------------------------------------------------- a killed start


def killed_start(out: Path, argv: list[str]) -> None:
    """What kill -9 before the first checkpoint leaves: the claimed folder, its settings, and
    a .lock no process holds."""
    runfolder.claim(out, "new")
    write_config(run_config([*argv, "--out", str(out)]), out / "config.yaml")
    runfolder.release(out)


def command_in(line: str) -> list[str]:
    """The sae.run flags of the command a message names after 'start it again with: '."""
    command = shlex.split(line.split("start it again with: ", 1)[1])
    assert command[:3] == [sys.executable, "-m", "sae.run"], command
    return command[3:]


@pytest.mark.slow
def test_the_same_command_after_a_kill_names_the_command_that_works(tmp_path, capsys):
    out = tmp_path / "run"
    killed_start(out, NEW)
    assert main([*NEW, "--out", out]) == 2
    line = error_line(capsys)
    assert "stopped before its first checkpoint" in line
    again = command_in(line)
    assert again == [*NEW, "--out", str(out), "--overwrite"]
    assert main(again) == 0 and (out / "metrics.json").is_file()


def test_resume_after_a_kill_names_the_command_that_works(tmp_path, capsys):
    out = tmp_path / "run"
    killed_start(out, NEW)
    assert main(["--out", out, "--resume"]) == 2
    line = error_line(capsys)
    assert line.startswith(f"error: cannot resume: no checkpoint at {out}")
    again = command_in(line)
    assert again == ["--config", str(out / "config.yaml"), "--out", str(out), "--overwrite"]
    assert main(again) == 0 and (out / "metrics.json").is_file()


# --------------------------------------------------------------------------- the gallery


def test_the_gallery_resumes_only_a_run_with_a_checkpoint(tmp_path, monkeypatch):
    commands = []

    def train(cmd):
        commands.append(cmd)
        run = Path(cmd[cmd.index("--out") + 1])
        run.mkdir(parents=True, exist_ok=True)
        (run / "metrics.json").write_text(json.dumps(dict.fromkeys(gallery.METRICS, 0.5)))
        return 0

    monkeypatch.setattr(gallery, "train", train)
    stopped, resumable, leftover = (tmp_path / name for name in ("stopped", "ckpt", "left"))
    killed_start(stopped, NEW)
    (resumable / "checkpoints").mkdir(parents=True)
    (resumable / "checkpoints" / "last.ckpt").write_bytes(b"")
    leftover.mkdir()
    (leftover / runfolder.MARKER).write_text("")
    for run, flag in ((stopped, "--overwrite"), (resumable, "--resume"), (leftover, None),
                      (tmp_path / "new", None)):
        gallery.ensure_run(run, "mnist", "topk", 0.01, 1, [])
        assert (commands[-1][-1] == flag) if flag else commands[-1][-1] == str(run)


# --------------------------------------------------------------------------- sae.data.layer


@pytest.mark.slow
def test_a_layer_dump_that_fails_to_write_leaves_nothing_and_a_retry_works(tmp_path, monkeypatch,
                                                                          capsys):
    out = tmp_path / "made" / "layer"
    argv = ["--epochs", "1", "--limit-train", "600", "--out", str(out)]
    real = layer.write_dataset

    def full(folder, parts, manifest):
        (folder / "train.npy").write_bytes(b"half a dump")
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(layer, "write_dataset", full)
    assert layer.main(argv) == 1
    assert "No space left" in error_line(capsys) and not (tmp_path / "made").exists()
    monkeypatch.setattr(layer, "write_dataset", real)
    assert layer.main(argv) == 0 and (out / "dataset.json").is_file()


def test_a_dump_killed_mid_write_is_taken_by_a_retry_unless_it_holds_a_users_file(tmp_path):
    folder = tmp_path / "layer"
    folder.mkdir()
    (folder / layer.MARKER).write_text("")
    (folder / "train.npy").write_bytes(b"half")
    (folder / ".test.npy-a1b2.tmp").write_bytes(b"half")
    assert layer.unfinished(folder)
    (folder / "notes.txt").write_text("mine")
    assert not layer.unfinished(folder)
    layer._undo(folder, None)  # a stop removes only what the tool writes
    assert sorted(os.listdir(folder)) == ["notes.txt"]


# --------------------------------------------------------------------------- changed data


@pytest.fixture(scope="module")
def data_run(tmp_path_factory):
    """A finished tiny --data run (labelled rows), its data beside it."""
    folder = tmp_path_factory.mktemp("datarun")
    r = np.random.default_rng(0)
    np.save(folder / "x.npy", np.maximum(r.normal(size=(400, 8)), 0).astype(np.float32))
    np.save(folder / "y.npy", r.integers(0, 3, 400))
    (folder / "m.json").write_text(json.dumps({"format": matrix.FORMAT, "name": "rows",
                                               "train": {"x": "x.npy", "labels": "y.npy"}}))
    out = folder / "run"
    assert main(["--data", folder / "m.json", "--hidden", "16", "--max-steps", "4",
                 "--batch-size", "32", "--val-size", "50", *QUIET, "--out", out]) == 0
    os.environ.pop(RUN_DIR_ENV, None)
    return out


@pytest.mark.slow
def test_pages_of_a_run_whose_data_changed_refuse_or_say_so(data_run, capsys):
    from sae.pages.features.command import main as features
    from sae.pages.report import main as report

    source = data_run.parent / "x.npy"
    original = source.read_bytes()
    try:
        x = np.load(source)
        x[0, 0] += 1
        np.save(source, x)
        assert features([str(data_run)]) == 2
        line = error_line(capsys)
        assert "the data changed since" in line and "differs from the one" in line
        assert not (data_run / "features.html").exists()
        assert report([str(data_run)]) == 0
        err = capsys.readouterr().err
        assert "no figures drawn: its train matrix" in err and "has changed since" in err
        page = (data_run / "report.html").read_text()
        assert "Not the data it was trained on" in page and "has changed since" in page
    finally:
        source.write_bytes(original)
    assert report([str(data_run), "--no-figures"]) == 0
    assert "Not the data it was trained on" not in (data_run / "report.html").read_text()


@pytest.mark.slow
def test_a_recorded_data_path_that_is_now_a_fifo_is_said_not_read(data_run, tmp_path, capsys):
    from sae.pages.report import main as report

    run = tmp_path / "run"
    shutil.copytree(data_run, run)
    record = json.loads((run / "data.json").read_text())
    os.mkfifo(tmp_path / "pipe")
    record["train"]["path"] = str(tmp_path / "pipe")
    (run / "data.json").write_text(json.dumps(record))
    assert report([str(run), "--no-figures"]) == 0
    assert "cannot be read now" in (run / "report.html").read_text()
