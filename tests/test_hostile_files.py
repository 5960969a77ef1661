"""Hostile files and bad luck: planted links, crafted checkpoints, damaged derived files, failed
starts and interruptions. Each case ends in one ``error:`` line and its exit code, with nothing
outside the tool's folders touched and the run folder byte-identical where the input is refused.
"""

import hashlib
import json
import math
import os
import shutil
import signal
import threading
import time
import zipfile
from pathlib import Path

import pytest
import torch
import yaml
from cli_helpers import QUICK

from sae.pages import gallery, report
from sae.runs import command as sae_run
from sae.settings.cli import UsageError
from sae.sweep import analysis, launch, spec
from sae.sweep import command as compare
from sae.system import io
from sae.training import runfolder
from sae.training.checkpoints import CheckpointError, checksum, read_checkpoint

VICTIM_TEXT = "the user's own file\n"


# --------------------------------------------------------------------------- helpers


@pytest.fixture(scope="module")
def trained(tmp_path_factory, data_dir):
    """A finished tiny run (in-process): the template every case copies."""
    os.environ.update(SAE_DATA_DIR=str(data_dir), SAE_OFFLINE="1")
    out = tmp_path_factory.mktemp("template") / "run"
    rc = sae_run.main(["--model", "topk", *QUICK, "--max-steps", "8", "--no-figures",
                       "--no-features", "--no-report", "--progress", "off", "--out", str(out)])
    assert rc == 0
    runfolder.release(out)
    return out


def copy_run(trained, tmp_path) -> Path:
    run = tmp_path / "run"
    shutil.copytree(trained, run)
    return run


def snapshot(root: Path) -> dict:
    """Every path under root (folders too) with the SHA-256 of each file's bytes."""
    return {str(p.relative_to(root)): (hashlib.sha256(p.read_bytes()).hexdigest()
                                       if p.is_file() and not p.is_symlink() else "dir")
            for p in sorted(root.rglob("*"))}


def one_line(capsys, *words) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: "), err
    assert "Traceback" not in err[0]
    for word in words:
        assert word in err[0], err[0]
    return err[0]


def victim(tmp_path) -> Path:
    path = tmp_path / "victim.txt"
    path.write_text(VICTIM_TEXT)
    return path


def resume(run: Path) -> int:
    code = sae_run.main(["--out", str(run), "--resume", "--progress", "off"])
    runfolder.release(run)
    return code


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


# --------------------------------------------------------------------------- crafted checkpoints


def edit_checkpoint(run: Path, change, keep_checksum=False) -> None:
    path = run / "checkpoints" / "last.ckpt"
    state = torch.load(path, weights_only=True)
    change(state)
    if not keep_checksum and "sae_checksum" in state:
        state["sae_checksum"] = checksum(state)
    torch.save(state, path)


def nested(depth):
    value = 1
    for _ in range(depth):
        value = [value]
    return value


CRAFTED = {
    "wrong W_dec shape": (lambda s: s["state_dict"].__setitem__("W_dec", torch.zeros(784, 65)),
                          "W_dec"),
    "missing key": (lambda s: s["state_dict"].pop("b_enc"), "lacks b_enc"),
    "extra key": (lambda s: s["state_dict"].__setitem__("evil", torch.zeros(1)), "unknown evil"),
    "wrong dtype": (lambda s: s["state_dict"].__setitem__(
        "samples_since_fired", s["state_dict"]["samples_since_fired"].float()),
        "samples_since_fired"),
    "weights not floating": (lambda s: s["state_dict"].__setitem__(
        "b_enc", s["state_dict"]["b_enc"].int()), "b_enc"),
    "state_dict not a dict": (lambda s: s.__setitem__("state_dict", [1, 2]), "state_dict"),
    "epoch not an integer": (lambda s: s.__setitem__("epoch", "2"), "epoch"),
    "global_step a float": (lambda s: s.__setitem__("global_step", 8.5), "global_step"),
    "deep nesting": (lambda s: s.__setitem__("hparams_name", nested(200)), "nested"),
    "huge hidden": (lambda s: s["hyper_parameters"]["config"].__setitem__("hidden", 10**7),
                    "hidden"),
    "model foo": (lambda s: s["hyper_parameters"]["config"].__setitem__("model", "foo"),
                  "model settings"),
    "data_var text": (lambda s: s["hyper_parameters"].__setitem__("data_var", "abc"),
                      "data variance"),
    "optimizer state of another shape": (
        lambda s: s["optimizer_states"][0]["state"][1].__setitem__("exp_avg", torch.zeros(3)),
        "optimizer"),
    "loop counter a string": (
        lambda s: s["loops"]["fit_loop"]["epoch_progress"]["total"].__setitem__("ready", "x"),
        "training state"),
    "timer not a number": (
        lambda s: s["callbacks"]["Timer"]["time_elapsed"].__setitem__("train", "x"),
        "callback"),
}


@pytest.mark.parametrize("case", sorted(CRAFTED))
def test_a_crafted_checkpoint_is_refused_before_the_folder_changes(trained, tmp_path, capsys,
                                                                   case):
    run = copy_run(trained, tmp_path)
    change, words = CRAFTED[case]
    edit_checkpoint(run, change)
    before = snapshot(run)
    assert resume(run) == 2
    one_line(capsys, words)
    assert snapshot(run) == before  # no session folder, no TensorBoard file, nothing


def test_a_huge_stride_zero_tensor_is_refused_unexpanded(trained, tmp_path, capsys):
    run = copy_run(trained, tmp_path)
    # 10^12 elements that cost one float on disk (and a checksum that is never reached)
    edit_checkpoint(run, lambda s: s.__setitem__("extra", torch.zeros(1).expand(10**12)),
                    keep_checksum=True)
    before = snapshot(run)
    assert resume(run) == 2
    one_line(capsys, "elements")
    assert snapshot(run) == before


def test_a_deflated_zip_bomb_is_refused_before_loading(trained, tmp_path, capsys):
    run = copy_run(trained, tmp_path)
    path = run / "checkpoints" / "last.ckpt"
    shutil.copy(path, tmp_path / "plain.zip")
    with zipfile.ZipFile(tmp_path / "plain.zip") as src, \
            zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as dst:
        for info in src.infolist():
            dst.writestr(info.filename, src.read(info.filename))
        dst.writestr("archive/data/bomb", bytes(20 * 2**20))  # 20 MiB of zeros, ~20 kB on disk
    with zipfile.ZipFile(path) as z:
        assert sum(i.file_size for i in z.infolist()) > path.stat().st_size + 19 * 2**20
    before = snapshot(run)
    assert resume(run) == 2
    one_line(capsys, "compressed")
    assert snapshot(run) == before


def test_the_uncompressed_size_is_bounded_from_the_zip_directory(trained, monkeypatch):
    from sae.training import checkpoints

    monkeypatch.setattr(checkpoints, "MAX_BYTES", 1000)
    loads = []
    monkeypatch.setattr(torch, "load", lambda *a, **k: loads.append(a))
    with pytest.raises(CheckpointError, match="uncompressed"):
        read_checkpoint(trained / "checkpoints" / "last.ckpt")
    assert loads == []


def test_the_checksum_is_required(trained, tmp_path, capsys):
    run = copy_run(trained, tmp_path)
    edit_checkpoint(run, lambda s: s.pop("sae_checksum"))
    before = snapshot(run)
    assert resume(run) == 2
    one_line(capsys, "no checksum")
    assert snapshot(run) == before


CHANGES = {
    "config": lambda s: s["hyper_parameters"]["config"].__setitem__("lam", 0.5),
    "data_var": lambda s: s["hyper_parameters"].__setitem__("data_var", 1.0),
    "learning rate": lambda s: s["optimizer_states"][0]["param_groups"][0].__setitem__("lr",
                                                                                       0.5),
    "epoch": lambda s: s.__setitem__("epoch", s["epoch"] + 1),
    "global_step": lambda s: s.__setitem__("global_step", s["global_step"] - 1),
    "callback": lambda s: s["callbacks"]["Timer"]["time_elapsed"].__setitem__("train", 99.0),
}


@pytest.mark.parametrize("what", sorted(CHANGES))
def test_a_changed_value_that_is_not_a_tensor_is_refused(trained, tmp_path, capsys, what):
    run = copy_run(trained, tmp_path)
    edit_checkpoint(run, CHANGES[what], keep_checksum=True)
    before = snapshot(run)
    assert resume(run) == 2
    one_line(capsys, "checksum")
    assert snapshot(run) == before


def leaves(obj, path=()):
    """(path, value) of every value in a checkpoint that is not a container or a tensor."""
    if isinstance(obj, dict):
        for k, v in obj.items():
            if k != "sae_checksum":
                yield from leaves(v, (*path, k))
    elif isinstance(obj, list | tuple):
        for i, v in enumerate(obj):
            yield from leaves(v, (*path, i))
    elif not isinstance(obj, torch.Tensor):
        yield path, obj


def set_at(root, path, value):
    """``root`` with ``value`` at ``path`` (tuples on the way are rebuilt)."""
    new = value if len(path) == 1 else set_at(root[path[0]], path[1:], value)
    if isinstance(root, tuple):
        return (*root[:path[0]], new, *root[path[0] + 1:])
    root[path[0]] = new
    return root


def different(value):
    if isinstance(value, bool):
        return not value
    if value is None:
        return "x"
    if isinstance(value, str):
        return value + "x"
    return value + 1 if math.isfinite(value) else 0


def test_the_checksum_covers_every_value_that_is_not_a_tensor(trained):
    state = torch.load(trained / "checkpoints" / "last.ckpt", weights_only=True)
    reference = checksum(state)
    assert reference == state["sae_checksum"]
    found = list(leaves(state))
    assert len(found) > 100
    for path, value in found:
        state = set_at(state, path, different(value))
        assert checksum(state) != reference, path
        state = set_at(state, path, value)
    state["epoch"] = float(state["epoch"])  # the same number, another type
    assert checksum(state) != reference
    state["epoch"] = int(state["epoch"])
    assert checksum(state) == reference


def test_a_checkpoint_of_an_earlier_version_needs_the_explicit_switch(trained, tmp_path,
                                                                     monkeypatch):
    from sae.training.checkpoints import tensors_checksum

    path = tmp_path / "old.ckpt"
    state = torch.load(trained / "checkpoints" / "last.ckpt", weights_only=True)
    state["sae_checksum"] = tensors_checksum(state)  # what earlier versions wrote
    torch.save(state, path)
    with pytest.raises(CheckpointError, match="SAE_LEGACY_CHECKPOINTS=1"):
        read_checkpoint(path)
    monkeypatch.setenv("SAE_LEGACY_CHECKPOINTS", "1")
    assert read_checkpoint(path)["global_step"] == state["global_step"]
    state["state_dict"]["b_enc"] += 1  # its tensors are still verified
    torch.save(state, path)
    with pytest.raises(CheckpointError, match="damaged"):
        read_checkpoint(path)


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
