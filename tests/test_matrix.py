"""Activation matrices as data (sae.data.matrix): what is accepted, what is refused in one line, and
what a run folder records."""

import hashlib
import json
import pickle

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sae.data import matrix, scan
from sae.data.matrix import MatrixError, load_data, open_matrix
from sae.data.npyfile import FileRows


def save(path, array):
    np.save(path, array)
    return path


def manifest(folder, **spec):
    spec.setdefault("format", matrix.FORMAT)
    path = folder / "data.json"
    path.write_text(json.dumps(spec))
    return path


def test_a_matrix_is_read_from_its_file_never_written(tmp_path):
    x = np.random.default_rng(0).normal(size=(50, 7)).astype(np.float16)
    path = save(tmp_path / "x.npy", x)
    m = open_matrix(path)
    assert isinstance(m, FileRows) and m.shape == (50, 7) and m.dtype == np.float16
    np.testing.assert_array_equal(np.asarray(m), x)
    with pytest.raises(TypeError):
        m[0, 0] = 1  # no item assignment: the tool never writes into the user's file
    before = path.read_bytes()
    m[3][0] = 5  # a row read is the caller's copy
    assert path.read_bytes() == before and m[3][0] == x[3, 0]


def test_a_fortran_ordered_matrix_is_mapped_and_reads_the_same(tmp_path):
    x = np.asfortranarray(np.random.default_rng(1).normal(size=(40, 6)).astype(np.float32))
    m = open_matrix(save(tmp_path / "x.npy", x))
    assert isinstance(m, np.memmap)
    np.testing.assert_array_equal(m[[5, 1, 5]], x[[5, 1, 5]])


@pytest.mark.parametrize("array, message", [
    (np.zeros((4, 3, 2), np.float32), r"shape \(4, 3, 2\); an \(N, D\) matrix"),
    (np.zeros(5, np.float32), r"shape \(5,\); an \(N, D\) matrix"),
    (np.zeros((1, 3), np.float32), "at least 2 rows"),
    (np.zeros((4, 3), np.int32), "int32 values; float16, float32 or float64"),
    (np.array([["a", "b"], ["c", "d"]]), "float16, float32 or float64"),
    (np.zeros((4, 3), np.complex64), "complex64 values"),
])
def test_bad_matrices_are_one_line_errors(tmp_path, array, message):
    path = save(tmp_path / "x.npy", array)
    with pytest.raises(MatrixError, match=message) as e:
        load_data(path)
    assert "\n" not in str(e.value) and str(path) in str(e.value)


def test_missing_truncated_and_foreign_files(tmp_path):
    with pytest.raises(MatrixError, match="does not exist"):
        load_data(tmp_path / "none.npy")
    (tmp_path / "text.npy").write_text("not numpy")
    with pytest.raises(MatrixError, match="not a readable .npy file"):
        load_data(tmp_path / "text.npy")
    data = save(tmp_path / "x.npy", np.zeros((100, 10), np.float32)).read_bytes()
    (tmp_path / "short.npy").write_bytes(data[: len(data) // 2])
    with pytest.raises(MatrixError, match="cannot be read"):
        load_data(tmp_path / "short.npy")


class Planted:
    def __reduce__(self):  # unpickling this would create a file
        import pathlib
        return (pathlib.Path.touch, (pathlib.Path(self.target),))


def test_an_object_array_is_refused_from_its_header_without_unpickling(tmp_path):
    planted = Planted()
    planted.target = str(tmp_path / "ran")
    array = np.empty((2, 2), dtype=object)
    array[0, 0] = planted
    with open(tmp_path / "x.npy", "wb") as f:
        np.lib.format.write_array(f, array, allow_pickle=True)
    pickle.dumps(planted)  # the payload is real
    with pytest.raises(MatrixError, match="object values"):
        load_data(tmp_path / "x.npy")
    assert not (tmp_path / "ran").exists()


@settings(max_examples=25, deadline=None)
@given(n=st.integers(2, 300), d=st.integers(1, 9), bad=st.data(),
       value=st.sampled_from([np.nan, np.inf, -np.inf]))
def test_the_first_nonfinite_row_is_found_across_scan_blocks(tmp_path_factory, n, d, bad, value):
    row = bad.draw(st.integers(0, n - 1))
    x = np.ones((n, d), np.float32)
    x[row, bad.draw(st.integers(0, d - 1))] = value
    path = save(tmp_path_factory.mktemp("nan") / "x.npy", x)
    old = scan.BLOCK_BYTES
    scan.BLOCK_BYTES = 3 * d * 4  # three rows a block: the bad row lands in any block
    try:
        assert scan.first_nonfinite_row(open_matrix(path)) == row
        with pytest.raises(MatrixError, match=f"row {row} holds NaN or inf"):
            load_data(path)
    finally:
        scan.BLOCK_BYTES = old


def test_a_manifest_names_splits_labels_and_texts(tmp_path):
    rng = np.random.default_rng(1)
    save(tmp_path / "tr.npy", rng.normal(size=(30, 4)).astype(np.float32))
    save(tmp_path / "te.npy", rng.normal(size=(10, 4)).astype(np.float32))
    save(tmp_path / "trl.npy", np.arange(30) % 3)
    save(tmp_path / "tel.npy", np.arange(10) % 3)
    (tmp_path / "te.txt").write_text("".join(f"token {i}\n" for i in range(10)))
    path = manifest(tmp_path, name="toy", class_names=["a", "b", "c"],
                    train={"x": "tr.npy", "labels": "trl.npy"},
                    test={"x": "te.npy", "labels": "tel.npy", "texts": "te.txt"})
    data = load_data(path)
    assert data.name == "toy" and data.dim == 4 and data.n_classes == 3
    assert data.test.texts[9] == "token 9" and data.train.texts is None
    np.testing.assert_array_equal(data.train.labels, np.arange(30) % 3)
    record = matrix.describe(data)
    assert record["train"]["shape"] == [30, 4] and record["train"]["dtype"] == "float32"
    assert record["test"]["sha256"] == hashlib.sha256((tmp_path / "te.npy").read_bytes()) \
        .hexdigest()


@pytest.mark.parametrize("change, message", [
    ({"train": {"x": "tr.npy", "labels": "short.npy"}}, r"labels of shape \(5,\); \(30,\)"),
    ({"train": {"x": "tr.npy", "labels": "float.npy"}}, "labels are float64; integers"),
    ({"train": {"x": "tr.npy", "labels": "neg.npy"}}, "labels holds -1"),
    ({"test": {"x": "wide.npy"}}, "test rows have 5 numbers, train rows 4"),
    ({"train": {"x": "tr.npy", "extra": "a"}}, r"unknown keys \['extra'\]"),
    ({"train": "tr.npy"}, "must be an object"),
    ({"format": "other"}, "sae-activations/1"),
    ({"train": {"x": "tr.npy", "texts": "few.txt"}}, "holds 2 lines; 30 needed"),
    ({"train": {"x": "tr.npy", "rows": "neg.npy"}}, "needs \"images\""),
    ({"train": {"x": "tr.npy", "labels": "lab.npy"}, "class_names": ["a"]},
     "label 2 has no name"),
])
def test_bad_manifests_are_one_line_errors(tmp_path, change, message):
    save(tmp_path / "tr.npy", np.zeros((30, 4), np.float32))
    save(tmp_path / "wide.npy", np.zeros((10, 5), np.float32))
    save(tmp_path / "short.npy", np.zeros(5, np.int64))
    save(tmp_path / "float.npy", np.zeros(30))
    save(tmp_path / "neg.npy", -np.ones(30, np.int64))
    save(tmp_path / "lab.npy", np.arange(30) % 3)
    (tmp_path / "few.txt").write_text("a\nb\n")
    spec = {"train": {"x": "tr.npy"}, **change}
    with pytest.raises(MatrixError, match=message) as e:
        load_data(manifest(tmp_path, **spec))
    assert "\n" not in str(e.value)


def test_image_rows_are_checked_against_the_dataset(tmp_path, data_dir, monkeypatch):
    monkeypatch.setenv("SAE_DATA_DIR", str(data_dir))
    save(tmp_path / "tr.npy", np.zeros((3, 4), np.float32))
    save(tmp_path / "ok.npy", np.array([0, 59_999, 7]))
    save(tmp_path / "far.npy", np.array([0, 60_000, 7]))
    good = load_data(manifest(tmp_path, images={"dataset": "mnist"},
                              train={"x": "tr.npy", "rows": "ok.npy"}))
    assert good.images == "mnist" and list(good.train.rows) == [0, 59_999, 7]
    with pytest.raises(MatrixError, match=r"image rows holds 60000; values \[0, 60000\)"):
        load_data(manifest(tmp_path, images={"dataset": "mnist"},
                           train={"x": "tr.npy", "rows": "far.npy"}))
