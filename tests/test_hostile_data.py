"""Hostile activation data (``--data``): every value read from a file is bounded before it sizes
anything, only regular files are read, every reader's failure is one ``error:`` line and exit 2
with no numpy warning before it, and nothing is written. In-process: the process boundary is not
the point here (tests/test_hostile_signals.py has the cases where it is)."""

import json
import os
import signal
import time
import tracemalloc
import warnings
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest

from sae.data import matrix
from sae.data.matrix import MatrixError, load_data
from sae.settings.cli import UsageError, load_yaml, run_config
from sae.settings.sizes import MAX_CHECKPOINT_ELEMENTS
from sae.system.process import RUN_DIR_ENV

TINY = ["--hidden", "16", "--max-steps", "4", "--batch-size", "32", "--val-size", "50",
        "--no-figures", "--no-report", "--no-features", "--progress", "off"]


@pytest.fixture(autouse=True)
def _process_state(monkeypatch):
    """main() installs signal handlers and names its run folder in the environment."""
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    monkeypatch.delenv(RUN_DIR_ENV, raising=False)
    yield
    for s, handler in handlers.items():
        signal.signal(s, handler)
    os.environ.pop(RUN_DIR_ENV, None)


@pytest.fixture(scope="module", autouse=True)
def _imported():
    """torch and Lightning imported before any case is measured (their import is not it)."""
    import sae.data.matrixdata
    import sae.runner.command
    import sae.sweep.command

    sae.runner.command._import_training()


@pytest.fixture
def good(tmp_path) -> Path:
    """400 x 8 float32 rows with labels of 3 classes: the folder every case spoils a file in."""
    r = np.random.default_rng(0)
    np.save(tmp_path / "good.npy", r.normal(size=(400, 8)).astype(np.float32))
    np.save(tmp_path / "labels.npy", r.integers(0, 3, 400))
    return tmp_path


def manifest(folder: Path, name: str = "m.json", **train) -> Path:
    path = folder / name
    path.write_text(json.dumps({"format": matrix.FORMAT, "name": "case",
                                "train": {"x": "good.npy", **train}}))
    return path


@contextmanager
def no_warnings_and_no_hang(seconds: int = 60, strict: bool = True):
    """No numpy warning may print before the error line: with ``strict`` (the checks before
    any work) any warning is an error, else none may be a RuntimeWarning (numpy's overflow);
    and a read that blocks (a FIFO, a device) fails the test instead of hanging it."""
    def hung(signum, frame):
        raise TimeoutError("a read blocked")

    previous = signal.signal(signal.SIGALRM, hung)
    signal.alarm(seconds)
    try:
        with warnings.catch_warnings(record=not strict) as seen:
            if strict:
                warnings.simplefilter("error")
                with np.errstate(divide="raise", over="raise", invalid="raise"):
                    yield
            else:
                warnings.simplefilter("always")
                yield
                assert not [w for w in seen if issubclass(w.category, RuntimeWarning)], \
                    [str(w.message) for w in seen]
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def refused(argv, capsys, *words, module: str = "run", strict: bool = True) -> str:
    """``python -m sae.<module> argv`` in this process: exit 2, one ``error:`` line holding
    ``words``, in bounded time and Python memory, with no warning printed."""
    from sae.runner.command import main as run
    from sae.sweep.command import main as compare

    tracemalloc.start()
    start = time.perf_counter()
    try:
        with no_warnings_and_no_hang(strict=strict):
            code = (run if module == "run" else compare)([str(a) for a in argv])
    finally:
        seconds = time.perf_counter() - start
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: "), err[-2000:]
    assert "Traceback" not in err and "Warning" not in err
    for word in words:
        assert word in lines[0], lines[0]
    assert seconds < 20 and peak < 100e6, (seconds, peak)
    return lines[0]


def refused_by_run(folder, data, capsys, *words, strict: bool = True) -> str:
    out = folder / "made" / "run"
    line = refused(["--data", data, *TINY, "--out", out], capsys, *words, strict=strict)
    assert not (folder / "made").exists()  # nothing written, nor the parent --out named
    return line


# --------------------------------------------------------------------------- bounded values


def test_a_label_of_2_to_the_40_is_refused_before_it_sizes_anything(good, capsys):
    labels = np.load(good / "labels.npy")
    labels[0] = 2**40
    np.save(good / "big.npy", labels)
    refused_by_run(good, manifest(good, labels="big.npy"), capsys, "labels holds 1099511627776",
                   f"[0, {matrix.MAX_CLASSES})")


def test_more_classes_than_rows_are_refused(good, capsys):
    labels = np.load(good / "labels.npy")
    labels[0] = 450  # under the bound, but 451 classes for 400 rows
    np.save(good / "many.npy", labels)
    refused_by_run(good, manifest(good, labels="many.npy"), capsys, "451 classes",
                   "400 training rows")
    path = good / "names.json"
    path.write_text(json.dumps({"format": matrix.FORMAT, "class_names": ["a"] * 2000,
                                "train": {"x": "good.npy", "labels": "labels.npy"}}))
    refused_by_run(good, path, capsys, "2,000 names", "at most 1,000")


def test_texts_are_bounded_by_the_bytes_read_per_row(good, monkeypatch):
    monkeypatch.setattr(matrix, "TEXT_ROW_LIMIT", 10)
    (good / "long.txt").write_text("".join("a fairly long line of text\n" for _ in range(400)))
    with pytest.raises(MatrixError, match="more than 4,000 bytes of text"):
        load_data(manifest(good, texts="long.txt"))


def test_a_huge_hidden_is_refused_from_its_size_before_any_allocation(good, capsys):
    for argv in (["--hidden", str(10**11)], ["--data", good / "good.npy", "--hidden",
                                             str(10**11)]):
        line = refused([*argv, "--out", good / "made" / "run"], capsys, "--hidden 100000000000",
                       "at most --hidden")
        assert "checkpoint" in line and not (good / "made").exists()
    assert run_config(["--hidden", "100000", "--out", "x"]).sae.hidden == 100000
    with pytest.raises(UsageError, match="--mlp-width"):
        run_config(["--arch", "mlp", "--mlp-width", str(10**7), "--out", "x"])


def test_the_size_bound_is_the_checkpoints_own():
    from sae.training.checkpoints import MAX_ELEMENTS

    assert MAX_CHECKPOINT_ELEMENTS == MAX_ELEMENTS


# --------------------------------------------------------------------------- regular files only


@pytest.mark.parametrize("where", ["texts", "x", "labels", "data"])
@pytest.mark.parametrize("kind", ["dev-zero", "fifo", "folder"])
def test_only_regular_files_are_read(good, capsys, where, kind):
    target = {"dev-zero": Path("/dev/zero"), "folder": good / "sub",
              "fifo": good / "pipe"}[kind]
    if kind == "fifo":
        os.mkfifo(target)
    elif kind == "folder":
        target.mkdir()
    if where == "data":
        data = target
    else:  # an absolute path in the manifest, or a link to it in the manifest's folder
        (good / "link").symlink_to(target)
        name = str(target) if kind == "dev-zero" else "link"
        data = manifest(good, **({"x": name} if where == "x" else {where: name}))
    word = {"dev-zero": "device", "fifo": "FIFO", "folder": "folder"}[kind]
    refused_by_run(good, data, capsys, word)


def test_a_fifo_data_file_is_refused_by_a_sweep_dry_run(good, capsys):
    os.mkfifo(good / "pipe.txt")
    sweep = good / "s.yaml"
    sweep.write_text(f"seeds: [0]\ncommon: {{data: {manifest(good, texts='pipe.txt')}, "
                     "hidden: 16}\nmodels:\n  topk: {k: [4]}\n")
    refused([sweep, "--dry-run", "--out", good / "sw"], capsys, "FIFO", module="compare")
    assert not (good / "sw").exists()


@pytest.mark.parametrize("kind", ["fifo", "dev-zero"])
def test_a_config_file_that_is_not_a_regular_file_is_refused_without_blocking(tmp_path, kind):
    path = tmp_path / "c.yaml"
    os.mkfifo(path) if kind == "fifo" else path.symlink_to("/dev/zero")
    with no_warnings_and_no_hang(), pytest.raises(UsageError, match="not a regular file"):
        load_yaml(path, "config file")


# --------------------------------------------------------------------------- readers


def _deep_manifest(folder: Path) -> Path:
    path = folder / "deep.json"
    path.write_text("[" * 100_000)
    return path


def _short_labels(folder: Path) -> Path:
    data = (folder / "labels.npy").read_bytes()
    (folder / "short.npy").write_bytes(data[:-100])
    return manifest(folder, labels="short.npy")


def _texts_a_folder(folder: Path) -> Path:
    return manifest(folder, texts=".")


@pytest.mark.parametrize("spoil, words", [
    (_deep_manifest, ["nests too deeply"]),
    (_short_labels, ["cut short", "promises 3,200 bytes"]),
    (_texts_a_folder, ["is a folder"]),
])
def test_a_damaged_reader_input_is_one_line(good, capsys, spoil, words):
    data = spoil(good)
    refused_by_run(good, data, capsys, *words)
    if spoil is not _texts_a_folder:  # and the same from a sweep's dry run
        sweep = good / "s.yaml"
        sweep.write_text(f"seeds: [0]\ncommon: {{data: {data}, hidden: 16}}\n"
                         "models:\n  topk: {k: [4]}\n")
        refused([sweep, "--dry-run", "--out", good / "sw"], capsys, *words, module="compare")
        assert not (good / "sw").exists()


def test_a_header_claiming_2_to_the_62_squared_is_one_line_without_numpy_warnings(good, capsys):
    from numpy.lib import format as npy

    with open(good / "claim.npy", "wb") as f:
        npy.write_array_header_1_0(f, {"descr": "<f4", "fortran_order": False,
                                       "shape": (2**62, 2**62)})
        f.write(bytes(64))
    refused_by_run(good, good / "claim.npy", capsys, "cannot be read", "promises 8.51e+37",
                   "holds 64")


def test_a_shape_that_is_not_a_shape_is_one_line(good):
    from numpy.lib import format as npy

    with open(good / "neg.npy", "wb") as f:
        npy.write_array_header_1_0(f, {"descr": "<f4", "fortran_order": False,
                                       "shape": (-4, 2)})
    with pytest.raises(MatrixError, match="claims shape"):
        load_data(good / "neg.npy")


# --------------------------------------------------------------------------- overflow


def test_finite_values_near_1e300_are_diagnosed_as_overflow(good, capsys):
    x = np.random.default_rng(1).uniform(0.5, 1, size=(400, 8)) * 1e300
    np.save(good / "huge.npy", x)
    line = refused_by_run(good, good / "huge.npy", capsys, "row 0", "numeric overflow")
    assert "variance is 0" not in line
    x[:] = np.random.default_rng(1).normal(size=(400, 8))
    x[123, 4] = -2e39  # beyond float32 by a little: the row that training would turn into inf
    np.save(good / "huge.npy", x)
    refused_by_run(good, good / "huge.npy", capsys, "row 123 holds -2e+39", "numeric overflow")


def test_a_variance_beyond_float32_is_diagnosed_as_overflow(good, capsys):
    x = np.random.default_rng(2).normal(size=(400, 8)).astype(np.float32) * np.float32(1e30)
    np.save(good / "wide.npy", x)  # every value fits float32; their squares do not
    # found once the folder is claimed (the variance is computed there): the start is undone
    refused_by_run(good, good / "wide.npy", capsys, "variance", "numeric overflow",
                   strict=False)


def test_a_crafted_test_l0_cache_is_recomputed_not_allocated(tmp_path):
    from numpy.lib import format as npy

    from sae.sweep import analysis

    with open(tmp_path / "test_l0.npy", "wb") as f:
        npy.write_array_header_1_0(f, {"descr": "<f8", "fortran_order": False,
                                       "shape": (2**40,)})
    # a ValueError, which analysis_is_current takes as "recompute"
    with no_warnings_and_no_hang(), pytest.raises(ValueError, match="at most 67,108,864"):
        analysis._load_l0(tmp_path)


def test_an_idx_file_that_is_a_fifo_is_refused_without_blocking(tmp_path):
    from sae.data.images import DataSourceError, read_idx

    os.mkfifo(tmp_path / "train-images-idx3-ubyte")
    with no_warnings_and_no_hang(), pytest.raises(DataSourceError, match="not a regular file"):
        read_idx(tmp_path / "train-images-idx3-ubyte")


@pytest.mark.parametrize("where", ["name", "class_names"])
def test_a_name_of_a_million_characters_is_refused(good, capsys, where):
    spec = {"format": matrix.FORMAT, "train": {"x": "good.npy", "labels": "labels.npy"},
            "name": "toy", "class_names": ["a", "b", "c"]}
    if where == "name":
        spec["name"] = "n" * 1_000_000
    else:
        spec["class_names"][1] = "c" * 1_000_000
    (good / "m.json").write_text(json.dumps(spec))
    line = refused_by_run(good, good / "m.json", capsys, "1,000,000 characters", "at most 200")
    assert len(line) < 400


def test_a_manifest_the_user_linked_is_followed(good):
    real = manifest(good, "real.json", labels="labels.npy")
    (good / "link.json").symlink_to(real)
    assert load_data(good / "link.json").n_classes == 3
