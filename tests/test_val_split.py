"""The validation split: --val-size as a count, a fraction or the default rule (the smaller of
5 000 and 10 % of the training rows), a manifest's own val rows, and the note on a split that
takes over a quarter of the rows."""

import json

import numpy as np
import pytest
import yaml
from cli_helpers import assert_one_line_error, run_cli
from hypothesis import given
from hypothesis import strategies as st

from sae.data.splits import large_val_note, val_rows
from sae.settings.cli import run_config
from sae.settings.setting import UsageError

QUIET = ["--hidden", "8", "--max-steps", "2", "--no-figures", "--no-report", "--no-features"]


def test_mnist_keeps_its_5000_validation_images():
    # published numbers recompute: 60 000 training images give the split they always had
    assert val_rows(None, 60_000) == 5000
    assert val_rows(5000, 60_000) == 5000


@given(st.integers(1, 10**7))
def test_the_default_is_the_smaller_of_5000_and_a_tenth(n):
    v = val_rows(None, n)
    assert v == max(1, min(5000, n // 10))
    assert v <= max(1, n / 10)


@given(st.integers(2, 10**7), st.floats(0.001, 0.999))
def test_a_fraction_is_that_share_of_the_rows(n, f):
    v = val_rows(f, n)
    assert v == max(1, int(f * n)) and 1 <= v <= n


def test_the_note_names_a_split_over_a_quarter():
    assert large_val_note(5000, 12_000) is not None and "42 %" in large_val_note(5000, 12_000)
    assert large_val_note(3000, 12_000) is None  # a quarter exactly: no note


@pytest.mark.parametrize("text, value", [("5000", 5000), ("0.1", 0.1), ("1e3", 1000),
                                         ("none", None)])
def test_val_size_takes_a_count_or_a_fraction(text, value):
    assert run_config(["--val-size", text]).data.val_size == value


@pytest.mark.parametrize("text", ["0", "1.5", "-0.2", "abc", "1.0e-9x"])
def test_a_val_size_neither_count_nor_fraction_is_refused(text):
    with pytest.raises(UsageError, match="expected a count >= 1 or a fraction between 0 and 1"):
        run_config(["--val-size", text])


def _matrix(path, rows, seed=0):
    np.save(path, np.random.default_rng(seed).standard_normal((rows, 8), dtype=np.float32))
    return path.name


def test_own_data_gets_a_tenth_by_default_recorded_in_config(tmp_path, data_dir):
    _matrix(tmp_path / "acts.npy", 12_000)
    result = run_cli(["--data", "acts.npy", *QUIET, "--out", "run"], tmp_path, data_dir)
    assert result.returncode == 0, result.stderr
    assert yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())["val_size"] == 1200
    assert "note: the validation split" not in result.stdout


def test_a_fraction_is_recorded_as_its_count_and_a_large_split_is_noted(tmp_path, data_dir):
    _matrix(tmp_path / "acts.npy", 400)
    result = run_cli(["--data", "acts.npy", "--val-size", "0.3", *QUIET, "--out", "run"],
                     tmp_path, data_dir)
    assert result.returncode == 0, result.stderr
    assert yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())["val_size"] == 120
    notes = [line for line in result.stdout.splitlines() if "validation split takes" in line]
    assert notes == ["note: the validation split takes 120 of the 400 training rows (30 %), "
                     "which are not trained on; --val-size sets it (a count, or a fraction "
                     "such as 0.1)"]


def _manifest(folder, **splits):
    spec = {"format": "sae-activations/1", "name": "own"}
    for name, rows in splits.items():
        spec[name] = {"x": _matrix(folder / f"{name}.npy", rows, seed=len(spec))}
    (folder / "data.json").write_text(json.dumps(spec))
    return "data.json"


def test_a_manifest_names_its_own_validation_rows(tmp_path):
    from sae.data.matrixdata import MatrixDataModule

    data = _manifest(tmp_path, train=300, val=40, test=50)
    dm = MatrixDataModule(tmp_path / data)
    dm.load()
    assert len(dm.val_x) == 40 and len(dm.test_x) == 50 and len(dm.train_x) == 300  # nothing carved
    own = np.load(tmp_path / "val.npy")
    assert np.array_equal(dm.val_x.numpy(), own)
    assert dm.held_out == []  # every training row is trained on


def test_a_manifest_with_val_but_no_test_carves_only_test(tmp_path):
    from sae.data.matrixdata import MatrixDataModule

    dm = MatrixDataModule(tmp_path / _manifest(tmp_path, train=300, val=40), val_size=30)
    dm.load()
    assert (len(dm.val_x), len(dm.test_x), len(dm.train_x)) == (40, 30, 270)
    assert set(dm.test_row_numbers).isdisjoint(dm.train_index)


def test_without_val_the_split_is_the_one_carved_before(tmp_path):
    # the carving of runs before val existed: validation first, then test, then training
    import torch

    from sae.data.matrixdata import MatrixDataModule

    dm = MatrixDataModule(tmp_path / _manifest(tmp_path, train=500), val_size=50)
    dm.load()
    perm = torch.randperm(500, generator=torch.Generator().manual_seed(0)).numpy()
    assert np.array_equal(dm.test_row_numbers, np.sort(perm[50:100]))
    assert np.array_equal(dm.train_index, np.sort(perm[100:]))


def test_a_run_trains_on_a_manifest_with_val_and_records_it(tmp_path, data_dir):
    data = _manifest(tmp_path, train=300, val=40, test=50)
    result = run_cli(["--data", data, *QUIET, "--out", "run"], tmp_path, data_dir)
    assert result.returncode == 0, result.stderr
    record = json.loads((tmp_path / "run" / "data.json").read_text())
    assert record["val"]["shape"] == [40, 8]
    (tmp_path / "val.npy").write_bytes(b"")  # a changed val file: a resume refuses it
    _matrix(tmp_path / "val.npy", 40, seed=99)
    again = run_cli(["--out", "run", "--resume", "--max-steps", "4"], tmp_path, data_dir)
    assert_one_line_error(again)
    assert "val matrix" in again.stderr


def test_a_val_split_of_another_width_is_refused(tmp_path, data_dir):
    data = _manifest(tmp_path, train=300, val=40)
    np.save(tmp_path / "val.npy", np.zeros((40, 5), np.float32))
    result = run_cli(["--data", data, *QUIET, "--out", "run"], tmp_path, data_dir)
    assert_one_line_error(result)
    assert "val rows have 5 numbers, train rows 8" in result.stderr
