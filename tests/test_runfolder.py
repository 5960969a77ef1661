"""Run-folder ownership, --overwrite rules and the per-session training history."""

import csv
import os
import subprocess
import sys
import textwrap

import pytest

from sae.settings.cli import UsageError
from sae.training import runfolder


def test_new_folder_is_marked_and_locked(tmp_path):
    out = tmp_path / "run"
    assert runfolder.claim(out, "new") is True
    assert (out / runfolder.MARKER).is_file()
    assert runfolder.overwritable(out) is None
    # another process cannot take it while this one holds it
    code = textwrap.dedent(f"""
        import sys
        from sae.training import runfolder
        from sae.settings.cli import UsageError
        try:
            runfolder.claim(__import__('pathlib').Path({str(out)!r}), 'resume')
        except UsageError as e:
            print(e); sys.exit(3)
    """)
    other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert other.returncode == 3 and "in use" in other.stdout
    assert runfolder.is_locked(out)
    runfolder.release(out)
    assert not runfolder.is_locked(out)
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


def test_overwrite_refuses_what_the_tool_did_not_make(tmp_path, monkeypatch):
    project = tmp_path / "project"
    project.mkdir()
    (project / "config.yaml").write_text("model: l1\n")
    (project / "main.py").write_text("print('mine')\n")
    reason = runfolder.overwritable(project)
    assert reason and "main.py" in reason
    with pytest.raises(UsageError, match="refusing to --overwrite"):
        runfolder.claim(project, "overwrite")
    assert (project / "main.py").is_file()
    # never the working directory or a parent of it, even a real run folder
    run = tmp_path / "run"
    runfolder.claim(run, "new")
    runfolder.release(run)
    monkeypatch.chdir(run)
    assert "working directory" in runfolder.overwritable(run)
    (run / "sub").mkdir()
    monkeypatch.chdir(run / "sub")
    assert "working directory" in runfolder.overwritable(run)


def test_folder_of_an_earlier_version_may_be_overwritten(tmp_path):
    old = tmp_path / "old"
    (old / "checkpoints").mkdir(parents=True)
    (old / "config.yaml").write_text("model: l1\nhidden: 32\n")
    (old / "metrics.csv").write_text("epoch,step\n0,1\n")
    assert runfolder.overwritable(old) is None
    runfolder.claim(old, "overwrite")
    assert sorted(p.name for p in old.iterdir()) == [runfolder.LOCK, runfolder.MARKER]
    runfolder.release(old)


def rows(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def write_rows(path, steps):
    path.write_text("epoch,step,train/loss\n" + "".join(f"0,{s},{s / 10}\n" for s in steps))


def test_history_sessions_are_never_rewritten_and_merge_in_order(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    first = runfolder.new_session(out, 0)
    write_rows(out / "logs" / first / "metrics.csv", [1, 3, 5, 7])
    second = runfolder.new_session(out, 4)  # resumed from a checkpoint at step 4
    write_rows(out / "logs" / second / "metrics.csv", [5, 7, 9])
    before = (out / "logs" / first / "metrics.csv").read_text()
    runfolder.merge_history(out)
    assert [int(r["step"]) for r in rows(out / "metrics.csv")] == [1, 3, 5, 7, 9]
    assert (out / "logs" / first / "metrics.csv").read_text() == before


def test_history_of_an_earlier_version_becomes_session_0(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    write_rows(out / "metrics.csv", [1, 3, 5])
    name = runfolder.new_session(out, 2)
    assert name == "session_1"
    write_rows(out / "logs" / name / "metrics.csv", [3, 5])
    runfolder.merge_history(out)
    assert [int(r["step"]) for r in rows(out / "metrics.csv")] == [1, 3, 5]
    assert os.path.isfile(out / "logs" / "session_0" / "metrics.csv")


# ---------------------------------------------------------------- reading a run folder


def test_a_run_folder_is_opened_only_where_there_is_one(tmp_path):
    with pytest.raises(runfolder.RunFolderError, match="run folder not found"):
        runfolder.RunFolder.open(tmp_path / "missing")
    (tmp_path / "file").write_text("x")
    with pytest.raises(runfolder.RunFolderError, match="not a folder"):
        runfolder.RunFolder.open(tmp_path / "file")
    with pytest.raises(runfolder.RunFolderError, match=r"no config\.yaml"):
        runfolder.RunFolder.open(tmp_path)
    (tmp_path / "config.yaml").write_text("model: topk\n")
    run = runfolder.RunFolder.open(tmp_path)
    assert run.path == tmp_path and run.checkpoint == tmp_path / "checkpoints" / "last.ckpt"


def test_a_run_folders_settings_are_its_config_over_one_set_of_defaults(tmp_path):
    from sae.settings.cli import defaults

    (tmp_path / "config.yaml").write_text("model: topk\nk: 8\n")  # an earlier version's file
    settings = runfolder.RunFolder(tmp_path).settings()
    assert settings == {**defaults(), "model": "topk", "k": 8}
    assert settings["dataset"] == "mnist"  # named by no file: the default
    (tmp_path / "config.yaml").write_text("k: -3\n")
    with pytest.raises(runfolder.RunFolderError, match="k must be >= 1, got -3"):
        runfolder.RunFolder(tmp_path).settings()
    (tmp_path / "config.yaml").write_text("no_such_setting: 1\n")
    with pytest.raises(runfolder.RunFolderError, match="unknown setting .no_such_setting."):
        runfolder.RunFolder(tmp_path).settings()


def test_a_run_folders_metrics_are_none_until_written_and_when_damaged(tmp_path):
    run = runfolder.RunFolder(tmp_path)
    assert run.metrics() is None
    (tmp_path / "metrics.json").write_text('{"test/fvu": 0.1}')
    assert run.metrics() == {"test/fvu": 0.1}
    for damaged in ("[1, 2]", "{not json", "[" * 100_000):
        (tmp_path / "metrics.json").write_text(damaged)
        assert run.metrics() is None
