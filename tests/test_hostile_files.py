"""Hostile files and bad luck: planted links, damaged derived files, foreign folders, failed
starts and interruptions (crafted checkpoints: test_hostile_checkpoints.py). Each case ends in
one ``error:`` line and its exit code, with nothing outside the tool's folders touched and the
run folder byte-identical where the input is refused.
"""

import json
import os
import shutil
import signal
import threading
import time
from pathlib import Path

import pytest
import yaml
from cli_helpers import QUICK
from hostile_helpers import (
    VICTIM_TEXT,
    copy_run,
    edit_checkpoint,
    one_line,
    resume,
    snapshot,
    train_template,
    victim,
)

from sae.pages import gallery, report
from sae.runner import command as sae_run
from sae.settings.cli import UsageError
from sae.sweep import analysis, launch, spec
from sae.sweep import command as compare
from sae.system import io
from sae.training import runfolder


@pytest.fixture(scope="module")
def trained(tmp_path_factory, data_dir):
    """A finished tiny run: the template every case of this file copies."""
    return train_template(tmp_path_factory, data_dir)


# --------------------------------------------------------------------------- planted links


def test_a_lock_link_is_refused_by_resume_overwrite_and_a_new_run(trained, tmp_path, capsys):
    target = victim(tmp_path)
    run = copy_run(trained, tmp_path)
    (run / ".lock").unlink()
    (run / ".lock").symlink_to(target)
    before = snapshot(run)
    assert resume(run) == 2
    one_line(capsys, ".lock", "link")
    assert sae_run.main(["--model", "topk", *QUICK, "--out", str(run), "--overwrite"]) == 2
    one_line(capsys, "link")
    assert snapshot(run) == before and target.read_text() == VICTIM_TEXT
    fresh = tmp_path / "fresh"  # a folder holding only the planted lock
    fresh.mkdir()
    (fresh / ".lock").symlink_to(target)
    assert sae_run.main(["--model", "topk", *QUICK, "--out", str(fresh)]) == 2
    one_line(capsys, "link")
    assert target.read_text() == VICTIM_TEXT and os.listdir(fresh) == [".lock"]


@pytest.mark.parametrize("entry", ["checkpoints", "metrics.csv", "logs"])
def test_a_linked_folder_or_log_is_refused_before_anything_is_written(trained, tmp_path,
                                                                      capsys, entry):
    run = copy_run(trained, tmp_path)
    elsewhere = tmp_path / "elsewhere"
    shutil.move(run / entry, elsewhere)
    (run / entry).symlink_to(elsewhere)
    before, outside = snapshot(run), snapshot(tmp_path)
    if entry == "checkpoints":  # --resume CKPT: the checkpoint itself is fine, the folder not
        code = sae_run.main(["--out", str(run), "--resume", str(elsewhere / "last.ckpt")])
    else:
        code = resume(run)
    assert code == 2
    one_line(capsys, "is a link")
    assert snapshot(run) == before and snapshot(tmp_path) == outside


@pytest.mark.parametrize("kind", ["fifo", "folder", "dangling", "dev-zero"])
def test_a_lock_that_is_not_a_regular_file_is_refused_without_blocking(tmp_path, kind):
    folder = tmp_path / "run"
    folder.mkdir()
    lock = folder / ".lock"
    {"fifo": lambda: os.mkfifo(lock), "folder": lock.mkdir,
     "dangling": lambda: lock.symlink_to(tmp_path / "nowhere"),
     "dev-zero": lambda: lock.symlink_to("/dev/zero")}[kind]()
    def hung(signum, frame):
        raise TimeoutError("a blocking open")

    previous = signal.signal(signal.SIGALRM, hung)
    signal.alarm(10)  # a blocking open would hang here; fail instead
    try:
        with pytest.raises(UsageError) as e:
            runfolder.claim(folder, "new")
        assert "\n" not in str(e.value)
        with pytest.raises(UsageError):
            launch.lock(folder)  # a sweep folder's lock: the same refusal
        if kind != "folder":
            with pytest.raises(UsageError):
                runfolder.is_locked(folder)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    assert not (tmp_path / "nowhere").exists()


def test_a_sweep_lock_link_never_truncates_its_target(tmp_path):
    target = victim(tmp_path)
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    (sweep / ".lock").symlink_to(target)
    with pytest.raises(UsageError, match="link"):
        launch.lock(sweep)
    assert target.read_text() == VICTIM_TEXT
    (sweep / ".lock").unlink()
    with launch.lock(sweep):  # a plain lock still works, and excludes a second runner
        with pytest.raises(UsageError, match="another sweep"):
            launch.lock(sweep)


def test_a_sweep_folder_with_a_link_is_refused_before_any_work(tmp_path, capsys):
    sweep_file = tmp_path / "s.yaml"
    sweep_file.write_text(yaml.safe_dump({"datasets": ["mnist"], "seeds": [0],
                                          "models": {"topk": {"k": [4]}},
                                          "common": {"hidden": 16}}))
    out = tmp_path / "out"
    (out / "logs").mkdir(parents=True)
    (out / "logs" / "mnist").symlink_to(tmp_path)
    assert compare.main([str(sweep_file), "--out", str(out)]) == 2
    one_line(capsys, "is a link")
    assert not (out / ".lock").exists() and not (out / "sweep.yaml").exists()


# --------------------------------------------------------------------------- foreign folders


def test_resume_into_a_folder_this_tool_did_not_make_is_refused(trained, tmp_path, capsys):
    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "config.yaml").write_text("")
    (proj / "metrics.json").write_text('{"mine": 1}')
    before = snapshot(proj)
    code = sae_run.main(["--out", str(proj), "--resume",
                         str(trained / "checkpoints" / "last.ckpt")])
    assert code == 2
    one_line(capsys, "refusing to resume", "no marker")
    code = sae_run.main(["--model", "topk", *QUICK, "--out", str(proj), "--overwrite"])
    assert code == 2
    one_line(capsys, "refusing to --overwrite", "no marker")
    assert snapshot(proj) == before


def test_publish_refuses_a_folder_it_did_not_make(tmp_path):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "results.csv").write_text("my own results\n")  # a sweep output's name, but mine
    with pytest.raises(UsageError, match="not made by --publish"):
        compare.check_publish_dir(mine)
    sweep_dir = tmp_path / "sweep"
    sweep_dir.mkdir()
    (sweep_dir / "results.csv").write_text("a,b\n1,2\n")
    pub = tmp_path / "pub"
    compare.publish(sweep_dir, pub)
    assert (pub / compare.PUBLISH_MARKER).is_file()
    compare.check_publish_dir(pub)  # an earlier publication may be refreshed
    (pub / "results.csv").unlink()
    (pub / "results.csv").symlink_to(mine / "results.csv")
    with pytest.raises(UsageError, match="link"):
        compare.check_publish_dir(pub)
    assert (mine / "results.csv").read_text() == "my own results\n"


def test_the_committed_publications_carry_the_marker():
    published = Path(__file__).resolve().parents[1] / "figures" / "compare"
    for folder in published.iterdir():
        compare.check_publish_dir(folder)


# --------------------------------------------------------------------------- failed starts


def test_a_folder_left_holding_only_a_lock_is_taken_by_a_retry_and_overwrite(tmp_path):
    for mode in ("new", "overwrite"):
        folder = tmp_path / mode
        folder.mkdir()
        (folder / ".lock").write_text("12345\n")
        (folder / runfolder.MARKER).write_text("made by python -m sae.run\n")
        assert runfolder.is_leftover(folder)
        assert runfolder.overwritable(folder) is None
        runfolder.claim(folder, mode)
        runfolder.release(folder)
        assert sorted(os.listdir(folder)) == [".lock", runfolder.MARKER]


def test_a_full_disk_at_the_start_leaves_no_folder(tmp_path, monkeypatch):
    def full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(io, "write_text", full)
    with pytest.raises(UsageError, match="No space left"):
        runfolder.claim(tmp_path / "a" / "run", "new")
    assert not (tmp_path / "a" / "run").exists()
    existing = tmp_path / "empty"
    existing.mkdir()
    with pytest.raises(UsageError):
        runfolder.claim(existing, "new")
    assert existing.is_dir() and os.listdir(existing) == []


# --------------------------------------------------------------------------- bad luck


def test_temporaries_of_a_killed_write_are_removed_when_the_folder_is_claimed(trained, tmp_path):
    run = copy_run(trained, tmp_path)
    stale = [run / "checkpoints" / ".last.ckpt-k1l2e3d4.tmp", run / ".metrics.json-x9y8.tmp"]
    for path in stale:
        path.write_bytes(b"half a file")
    keep = run / "checkpoints" / "notes.tmp"  # not a name the tool's writer uses
    keep.write_text("mine")
    runfolder.claim(run, "resume")
    runfolder.release(run)
    assert not any(p.exists() for p in stale) and keep.exists()


@pytest.mark.parametrize("damage", ["", "{not json", "[1, 2]", '{"start_step": "x"}'])
def test_a_damaged_session_record_never_stops_the_history_merge(tmp_path, damage):
    run = tmp_path / "run"
    for n, (start, steps) in enumerate([(0, [0, 50, 100, 150]), (100, [100, 150, 200])]):
        d = run / "logs" / f"session_{n}"
        d.mkdir(parents=True)
        (d / "session.json").write_text(json.dumps({"start_step": start}))
        (d / "metrics.csv").write_text("step,loss\n" + "".join(f"{s},{n}\n" for s in steps))
    (run / "logs" / "session_1" / "session.json").write_text(damage)
    merged = runfolder.merge_history(run).read_text().splitlines()
    # the damaged session's start is recomputed from its first logged step (100)
    assert merged == ["step,loss", "0,0", "50,0", "100,1", "150,1", "200,1"]


def test_a_hanging_tensorboard_close_does_not_hold_the_run(tmp_path, monkeypatch):
    from lightning.pytorch.loggers import TensorBoardLogger

    from sae.training import engine as training

    release = threading.Event()
    monkeypatch.setattr(TensorBoardLogger, "finalize", lambda self, status: release.wait(60))
    monkeypatch.setattr(training, "LOGGER_CLOSE_S", 0.3)
    logger = training.bounded_tensorboard_logger(tmp_path)
    start = time.perf_counter()
    logger.finalize("failed")
    assert time.perf_counter() - start < 5
    release.set()


# --------------------------------------------------------------------------- readers


@pytest.mark.parametrize("config, words", [
    ("- a\n- b\n", "mapping"), ("just text\n", "mapping"), ("model: foo\n", "model"),
    ("hidden: many\n", "hidden"), ("data_var: abc\n", "data_var")])
def test_the_feature_browser_refuses_bad_settings_in_one_line(tmp_path, capsys, config, words):
    from sae.pages.features.command import main

    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "checkpoints" / "last.ckpt").write_bytes(b"")
    (run / "config.yaml").write_text(config)
    assert main([str(run)]) == 2
    one_line(capsys, words)
    assert not (run / "features.html").exists()


def test_the_feature_browser_refuses_a_crafted_checkpoint_and_bad_labels(trained, tmp_path,
                                                                        capsys, monkeypatch):
    from sae.data import images as data
    from sae.pages.features.command import main

    run = copy_run(trained, tmp_path)
    edit_checkpoint(run, lambda s: s["hyper_parameters"].__setitem__("data_var", "abc"))
    assert main([str(run)]) == 2
    one_line(capsys, "data variance")
    run = tmp_path / "labels"
    shutil.copytree(trained, run)
    real = data.load_arrays

    def eleven(*args, **kwargs):
        arrays = real(*args, **kwargs)
        arrays.test_labels[:3] = 11
        return arrays

    monkeypatch.setattr(data, "load_arrays", eleven)
    assert main([str(run)]) == 2
    one_line(capsys, "outside 0-9")
    assert not (run / "features.html").exists()


@pytest.mark.slow
def test_report_and_features_stop_in_one_line_on_ctrl_c(trained, tmp_path, capsys, monkeypatch):
    from sae.pages.features import build
    from sae.pages.features.command import main as features_main

    def ctrl_c(*args, **kwargs):
        raise KeyboardInterrupt

    run = copy_run(trained, tmp_path)
    monkeypatch.setattr(report, "render_report", ctrl_c)
    assert report.main([str(run)]) == 130
    assert capsys.readouterr().err.strip() == "interrupted; nothing was written"
    monkeypatch.setattr(build, "feature_stats", ctrl_c)
    assert features_main([str(run)]) == 130
    assert capsys.readouterr().err.strip() == "interrupted; nothing was written"
    assert not (run / "report.html").exists() and not (run / "features.html").exists()


@pytest.mark.slow
def test_report_states_damaged_parts_on_the_page(trained, tmp_path):
    run = copy_run(trained, tmp_path)
    (run / "metrics.json").write_text("{damaged")
    (run / "figures" / "decoder_atoms").mkdir(parents=True)
    (run / "figures" / "decoder_atoms" / "epoch_3.png").write_bytes(b"not a png")
    (run / "figures" / "decoder_atoms" / "epoch_.png").write_bytes(b"x")
    assert report.main([str(run)]) == 0
    page = (run / "report.html").read_text()
    assert "metrics.json could not be read" in page and "is not a PNG file" in page


def finished_gallery_run(folder, metrics="ok", png=b"\x89PNG\r\n\x1a\n0"):
    folder.mkdir(parents=True)
    (folder / "metrics.json").write_text(metrics if metrics != "ok" else json.dumps(
        dict.fromkeys(gallery.METRICS, 0.5)))
    for kind in gallery.KINDS:
        (folder / "figures" / kind).mkdir(parents=True)
        (folder / "figures" / kind / "epoch_2.png").write_bytes(png)
        (folder / "figures" / kind / "epoch_.png").write_bytes(b"ignored")


@pytest.mark.parametrize("argv, words", [
    (["--epochs", "many"], "--epochs"), (["--lambda", "nan"], "--lambda"),
    (["--epochs", "0"], "--epochs"), (["--hidden", "-3"], "hidden")])
def test_gallery_bad_values_exit_2_before_out_exists(tmp_path, capsys, argv, words):
    out = tmp_path / "gallery"
    assert gallery.main(["--out", str(out), "--runs", str(tmp_path / "runs"), *argv]) == 2
    one_line(capsys, words)
    assert not out.exists()


@pytest.mark.parametrize("damage", ["metrics", "png"])
def test_gallery_refuses_a_damaged_finished_run_in_one_line(tmp_path, capsys, damage):
    runs, out = tmp_path / "runs", tmp_path / "gallery"
    for dataset in gallery.DATASETS:
        for model in gallery.MODELS:
            bad = (dataset, model) == ("mnist", "kl")
            finished_gallery_run(runs / f"{dataset}-{model}",
                                 metrics="{damaged" if bad and damage == "metrics" else "ok",
                                 png=b"garbage" if bad and damage == "png" else
                                 b"\x89PNG\r\n\x1a\n0")
    assert gallery.main(["--out", str(out), "--runs", str(runs)]) == 2
    one_line(capsys, "mnist-kl", "damaged")
    assert not out.exists()


# --------------------------------------------------------------------------- sweeps


@pytest.mark.slow
def test_damaged_derived_sweep_files_are_recomputed_and_ctrl_c_while_writing(
        tmp_path, data_dir, capsys, monkeypatch):
    monkeypatch.setenv("SAE_DATA_DIR", str(data_dir))
    monkeypatch.setenv("SAE_OFFLINE", "1")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    sweep_file = tmp_path / "tiny.yaml"
    sweep_file.write_text(yaml.safe_dump({
        "datasets": ["mnist"], "seeds": [0], "models": {"topk": {"k": [4, 8]}},
        "common": {"hidden": 16, "limit_train": 200, "val_size": 100, "limit_test": 200,
                   "batch_size": 64, "epochs": 1, "no_figures": True, "no_report": True,
                   "no_features": True}}))
    out = tmp_path / "sweep"
    assert compare.main([str(sweep_file), "--out", str(out)]) == 0
    runs = spec.plan(spec.load_sweep(sweep_file))
    first, second = (out / r.rel for r in runs)
    (first / "analysis.json").write_text("{damaged")
    (out / "raw_probe.json").write_text("[{")
    (second / "metrics.json").write_text("[1, 2")
    capsys.readouterr()
    assert compare.main([str(sweep_file), "--out", str(out)]) == 1  # the damaged run: failed
    captured = capsys.readouterr()
    assert "metrics.json is damaged" in captured.out and "Traceback" not in captured.err
    assert json.loads((first / "analysis.json").read_text())["version"] == \
        analysis.ANALYSIS_VERSION
    assert isinstance(json.loads((out / "raw_probe.json").read_text()), list)
    assert (out / "results.csv").read_text().count("\n") == 2  # header + the intact run

    before = snapshot(out)

    def ctrl_c(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(compare, "write_outputs", ctrl_c)
    assert compare.main([str(sweep_file), "--out", str(out)]) == 130
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("interrupted while writing")
    assert {k for k, v in snapshot(out).items()} == set(before)  # nothing half-made
