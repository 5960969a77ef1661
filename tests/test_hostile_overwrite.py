"""What --overwrite and a resume may remove, and what a closed stdout costs a run.

--overwrite removes exactly the files a run writes, by their names: a user's file that only
looks like one (``checkpoints/keep-epoch5.ckpt``, ``logs/my_analysis/metrics.csv``, a figure in
a folder of the user's, an event file of the user's own experiment, a hidden ``.tmp`` draft) is
named and nothing is removed, while a folder holding a real run's files (figures, pages, two
sessions, the temporary files of a killed write) is replaced. A resume removes only the tool's
own temporary files. A reader that closes the run's stdout (``python -m sae.run ... | head``)
does not stop the run: its lines are dropped and it trains to the end.
"""

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from cli_helpers import QUICK, cli_env
from hostile_helpers import copy_run, one_line, resume, snapshot

from sae.runner import command as sae_run
from sae.system.process import RUN_DIR_ENV
from sae.training import runfolder

QUIET = ["--no-figures", "--no-features", "--no-report", "--progress", "off"]


@pytest.fixture(autouse=True)
def _process_state(monkeypatch, data_dir):
    """main() installs signal handlers and names its run folder in the environment."""
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
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
        runfolder.release(argv[argv.index("--out") + 1])
        for name in (RUN_DIR_ENV, "SAE_SESSION"):
            os.environ.pop(name, None)


@pytest.fixture(scope="module")
def full_run(tmp_path_factory, data_dir):
    """A finished tiny run with everything a run writes: figures (of two validations), the
    feature browser and its code embedding, the report, and two sessions (a resume)."""
    os.environ.update(SAE_DATA_DIR=str(data_dir), SAE_OFFLINE="1")
    out = tmp_path_factory.mktemp("full") / "run"
    assert main(["--model", "topk", *QUICK, "--max-steps", "8", "--progress", "off",
                 "--out", out]) == 0
    assert main(["--out", out, "--resume", "--max-steps", "16", "--progress", "off"]) == 0
    for name in (RUN_DIR_ENV, "SAE_SESSION"):
        os.environ.pop(name, None)
    assert (out / "logs" / "session_1").is_dir() and (out / "features.html").is_file()
    return out


# the tool's own names of a killed write's temporary files (sae.system.io.atomic_file)
KILLED_WRITES = [".metrics.json-k2j4x_9a.tmp", ".config.yaml-0abc1def.tmp",
                 "checkpoints/.best.ckpt-ab12cd34.tmp",
                 "figures/decoder_atoms/.epoch_2.png-zz9y8x7w.tmp",
                 "logs/session_1/.session.json-q1w2e3r4.tmp"]


def plant(run, relative, text="the user's own\n"):
    path = run / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


# --------------------------------------------------------------------------- --overwrite


@pytest.mark.slow
@pytest.mark.parametrize("mine", [
    "checkpoints/keep-epoch5.ckpt", "logs/my_analysis/metrics.csv", "figures/mine/atoms.png",
    "tensorboard/events.out.tfevents.my-own-experiment", ".my-draft.tmp",
    "checkpoints/.my-draft.tmp", "figures/decoder_atoms/best_one.png",
    "figures/reconstructions/.notes.txt-abc12345.tmp", "logs/session_x/metrics.csv",
    ".lock-ab12cd34.tmp", "tensorboard/version_0/hparams.yaml"])
def test_overwrite_refuses_a_users_file_named_like_the_runs(full_run, tmp_path, capsys, mine):
    run = copy_run(full_run, tmp_path)
    path = plant(run, mine)
    before = snapshot(run)
    assert main(["--model", "topk", *QUICK, "--max-steps", "4", *QUIET, "--overwrite",
                 "--out", run]) == 2
    line = one_line(capsys, f"refusing to --overwrite {run}: ", "nothing was removed")
    named = Path(line.split(f"{run}: ", 1)[1].split(" was not written by a run")[0])
    assert named == path or named in path.parents, line  # the user's file, or its folder
    assert named != run and snapshot(run) == before


@pytest.mark.slow
def test_overwrite_replaces_exactly_what_a_run_wrote(full_run, tmp_path, capsys):
    run = copy_run(full_run, tmp_path)
    for name in KILLED_WRITES:
        plant(run, name, "half a write")
    assert runfolder.foreign_file(run) is None and runfolder.overwritable(run) is None
    mine = plant(run, "logs/.my-draft.tmp")  # beside them, the user's: the whole folder stays
    before = snapshot(run)
    assert main(["--model", "topk", *QUICK, "--max-steps", "4", *QUIET, "--overwrite",
                 "--out", run]) == 2
    one_line(capsys, str(mine), "nothing was removed")
    assert snapshot(run) == before
    mine.unlink()
    assert main(["--model", "topk", *QUICK, "--max-steps", "4", *QUIET, "--overwrite",
                 "--out", run]) == 0
    assert not (run / "figures").exists() and not (run / "logs" / "session_1").exists()
    assert not any(run.rglob("*.tmp")) and (run / "metrics.json").is_file()


def test_the_figure_kinds_a_run_draws_are_the_ones_overwrite_knows():
    from sae.pages.report import FIGURE_KINDS

    assert set(FIGURE_KINDS) <= runfolder.FIGURE_KINDS


# --------------------------------------------------------------------------- a resume


@pytest.mark.slow
def test_a_resume_removes_only_the_tools_own_temporary_files(full_run, tmp_path):
    run = copy_run(full_run, tmp_path)
    mine = [plant(run, name) for name in (".my-draft.tmp", "checkpoints/.keep-1.tmp",
                                          "logs/.a-b.tmp")]
    killed = [plant(run, name, "half a write") for name in KILLED_WRITES]
    runfolder.claim(run, "resume")
    runfolder.release(run)
    assert all(p.read_text() == "the user's own\n" for p in mine)
    assert not any(p.exists() for p in killed)
    assert resume(run) == 0 and all(p.is_file() for p in mine)


# --------------------------------------------------------------------------- a closed stdout


def start_piped(args, cwd, data_dir, stderr):
    return subprocess.Popen([sys.executable, "-m", "sae.run", *map(str, args)], cwd=cwd,
                            env=cli_env(cwd, data_dir), stdout=subprocess.PIPE, stderr=stderr,
                            text=True)


@pytest.mark.slow
@pytest.mark.parametrize("both", [False, True], ids=["stdout", "stdout-and-stderr"])
def test_a_run_whose_reader_closes_its_output_trains_to_the_end(tmp_path, data_dir, both):
    """``python -m sae.run ... | head -n 1`` (with ``2>&1`` too): the run's lines after the
    first go nowhere, and the run ends as it would have, its folder finished."""
    out = tmp_path / "run"
    errors = tmp_path / "stderr.txt"
    with open(errors, "w") as err:
        proc = start_piped(["--model", "topk", *QUICK, "--max-steps", "16", "--out", out],
                           tmp_path, data_dir, subprocess.STDOUT if both else err)
        first = proc.stdout.readline()  # what the start waits for: torch's import
        proc.stdout.close()  # the reader goes away, as head does after its line
        code = proc.wait(timeout=300)
    assert first.startswith("starting (0 s): importing torch"), first
    text = errors.read_text()
    assert code == 0, text
    assert "Broken pipe" not in text and "Traceback" not in text and "Exception" not in text
    assert (out / "metrics.json").is_file() and (out / "report.html").is_file()
    assert runfolder.foreign_file(out) is None
