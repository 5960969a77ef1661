import gzip
import os
import struct

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from sae.data.images import IDX_FILES, DataSourceError, ImageDataModule, load_arrays, read_idx


def write_idx(path, array: np.ndarray, compress: bool = False) -> None:
    header = struct.pack(">BBBB", 0, 0, 0x08, array.ndim)
    header += struct.pack(f">{array.ndim}I", *array.shape)
    raw = header + array.astype(np.uint8).tobytes()
    if compress:
        path = path.with_name(path.name + ".gz")
        raw = gzip.compress(raw)
    path.write_bytes(raw)


def write_dataset(folder, n_train=30, n_test=10, compress=False, seed=0):
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    arrays = {
        "train_images": rng.integers(0, 256, (n_train, 28, 28)),
        "train_labels": rng.integers(0, 10, n_train),
        "test_images": rng.integers(0, 256, (n_test, 28, 28)),
        "test_labels": rng.integers(0, 10, n_test),
    }
    for key, stem in IDX_FILES.items():
        write_idx(folder / stem, arrays[key], compress)
    return arrays


@pytest.mark.parametrize("compress", [False, True])
def test_read_idx_round_trip(tmp_path, compress):
    array = np.arange(2 * 3 * 4, dtype=np.uint8).reshape(2, 3, 4)
    write_idx(tmp_path / "x-idx3-ubyte", array, compress)
    name = "x-idx3-ubyte.gz" if compress else "x-idx3-ubyte"
    np.testing.assert_array_equal(read_idx(tmp_path / name), array)


def test_truncated_file_is_named(tmp_path):
    array = np.zeros((5, 28, 28), dtype=np.uint8)
    write_idx(tmp_path / "t-idx3-ubyte", array)
    path = tmp_path / "t-idx3-ubyte"
    path.write_bytes(path.read_bytes()[:-100])
    with pytest.raises(DataSourceError, match="t-idx3-ubyte.*truncated"):
        read_idx(path)


def test_corrupt_magic_and_bad_gzip_are_named(tmp_path):
    bad = tmp_path / "bad-idx1-ubyte"
    bad.write_bytes(b"\x12\x34\x08\x01" + b"\x00" * 8)
    with pytest.raises(DataSourceError, match="bad-idx1-ubyte.*not an IDX"):
        read_idx(bad)
    gz = tmp_path / "bad-idx1-ubyte.gz"
    gz.write_bytes(b"this is not gzip")
    with pytest.raises(DataSourceError, match="bad-idx1-ubyte.gz"):
        read_idx(gz)


@pytest.mark.parametrize("layout", ["dataset", "flat", "torchvision"])
def test_load_arrays_layouts(tmp_path, layout):
    folder = {"dataset": tmp_path / "mnist", "flat": tmp_path,
              "torchvision": tmp_path / "MNIST" / "raw"}[layout]
    arrays = write_dataset(folder, compress=layout == "dataset")
    got = load_arrays("mnist", data_dir=tmp_path, cache_dir=tmp_path / "cache", download=False)
    np.testing.assert_array_equal(got.train_images, arrays["train_images"])
    np.testing.assert_array_equal(got.test_labels, arrays["test_labels"])
    assert got.train_labels.dtype == np.int64


def test_missing_file_is_named(tmp_path):
    write_dataset(tmp_path / "mnist")
    (tmp_path / "mnist" / "t10k-labels-idx1-ubyte").unlink()
    with pytest.raises(DataSourceError, match="t10k-labels-idx1-ubyte"):
        load_arrays("mnist", data_dir=tmp_path, cache_dir=tmp_path / "cache", download=False)


def test_no_source_message_names_both_ways(tmp_path, monkeypatch):
    monkeypatch.delenv("SAE_DATA_DIR", raising=False)
    with pytest.raises(DataSourceError) as err:
        load_arrays("fashion-mnist", data_dir=None, cache_dir=tmp_path, download=False)
    message = str(err.value)
    assert "--data-dir" in message and "SAE_DATA_DIR" in message and "download" in message
    assert "\n" not in message


def test_cached_torchvision_root_is_used(tmp_path, monkeypatch):
    monkeypatch.delenv("SAE_DATA_DIR", raising=False)
    arrays = write_dataset(tmp_path / "FashionMNIST" / "raw")
    got = load_arrays("fashion-mnist", cache_dir=tmp_path, download=False)
    np.testing.assert_array_equal(got.train_images, arrays["train_images"])


def test_datamodule_split_is_fixed_and_disjoint(tmp_path):
    write_dataset(tmp_path / "mnist", n_train=50, n_test=12)
    a = ImageDataModule("mnist", str(tmp_path), batch_size=8, val_size=10, split_seed=3,
                        cache_dir=str(tmp_path / "c"), download=False)
    b = ImageDataModule("mnist", str(tmp_path), batch_size=8, val_size=10, split_seed=3,
                        cache_dir=str(tmp_path / "c"), download=False)
    a.setup(), b.setup()
    assert a.train_x.shape == (40, 784) and a.val_x.shape == (10, 784)
    assert a.test_x.shape == (12, 784)
    assert float(a.train_x.max()) <= 1.0 and float(a.train_x.min()) >= 0.0
    assert (a.val_x == b.val_x).all()
    rows = {tuple(r.tolist()) for r in a.train_x}
    assert not any(tuple(r.tolist()) in rows for r in a.val_x)
    x, y = next(iter(a.train_dataloader()))
    assert x.shape == (8, 784) and y.shape == (8,)
    assert sum(len(b[0]) for b in a.val_dataloader()) == 10


def test_modules_of_one_split_share_its_tensors_until_the_files_change(tmp_path, monkeypatch):
    """A sweep worker's runs and analyses share one copy of a split; other split settings and
    rewritten files get their own, and the shared moments are those of the training images."""
    from sae.data import images as data

    write_dataset(tmp_path / "mnist", n_train=50, n_test=12)

    def module(**split):
        dm = ImageDataModule("mnist", str(tmp_path), val_size=split.get("val_size", 10),
                             limit_train=split.get("limit_train"),
                             cache_dir=str(tmp_path / "c"), download=False)
        dm.setup()
        return dm

    a, b = module(), module()
    assert a.train_x is b.train_x and a.test_x is b.test_x
    assert torch.equal(a.train_mean, a.train_x.mean(0))
    expected = float((a.train_x - a.train_x.mean(0)).pow(2).sum(-1).mean())
    assert b.train_variance == pytest.approx(expected, rel=1e-6)
    other = module(val_size=20)
    assert other.train_x is not a.train_x and other.train_x.shape == (30, 784)
    assert module(limit_train=5).train_x.shape == (5, 784)
    real = data.load_arrays  # a caller that changes the arrays it was given gets its own split

    def relabelled(*args, **kwargs):
        arrays = real(*args, **kwargs)
        arrays.test_labels[:3] = 9 - arrays.test_labels[:3]
        return arrays

    monkeypatch.setattr(data, "load_arrays", relabelled)
    changed = module()
    assert changed.test_y is not a.test_y and torch.equal(changed.test_y[:3], 9 - a.test_y[:3])
    monkeypatch.setattr(data, "load_arrays", real)
    arrays = write_dataset(tmp_path / "mnist", n_train=50, n_test=12, seed=1)
    os.utime(tmp_path / "mnist" / IDX_FILES["test_images"], ns=(1, 1))  # a new stamp, surely
    fresh = module()
    assert fresh.test_x is not a.test_x
    assert torch.equal(fresh.test_x, torch.from_numpy(arrays["test_images"].astype(np.float32)
                                                      .reshape(12, -1)) / 255.0)


def test_real_mnist_class_counts(data_dir):
    arrays = load_arrays("mnist", data_dir=data_dir, download=False)
    assert arrays.train_images.shape == (60000, 28, 28)
    counts = np.bincount(arrays.test_labels, minlength=10).tolist()
    assert counts == [980, 1135, 1032, 1010, 982, 892, 958, 1028, 974, 1009]


@settings(max_examples=50, deadline=None)
@given(n=st.integers(1, 300), seed=st.integers(0, 2**32 - 1), epoch=st.integers(0, 50),
       batch=st.integers(1, 64), data=st.data())
def test_data_order_resumes_mid_epoch_where_it_stopped(n, seed, epoch, batch, data):
    """A loader whose order is restored from the state saved after b batches serves the rest
    of the epoch's order, and the next epoch as one never stopped."""
    from torch.utils.data import DataLoader, TensorDataset

    from sae.data.images import EpochShuffle

    def loader():
        rows = TensorDataset(torch.arange(n))
        return DataLoader(rows, batch_size=batch, sampler=EpochShuffle(n, seed))

    plain = loader()
    plain.sampler.set_epoch(epoch)
    full = [b[0].tolist() for b in plain]
    stop = data.draw(st.integers(0, len(full)))
    first = loader()
    first.sampler.set_epoch(epoch)
    it = iter(first)
    for _ in range(stop):
        next(it)
    state = first.sampler.state_dict()
    assert state == {"epoch": epoch, "served": min(stop * batch, n)}
    resumed = loader()
    it = iter(resumed)  # made before the position is set, as Lightning does
    resumed.sampler.load_state_dict(state)
    assert [b[0].tolist() for b in it] == full[stop:]
    resumed.sampler.set_epoch(epoch + 1)
    plain.sampler.set_epoch(epoch + 1)
    assert [b[0].tolist() for b in resumed] == [b[0].tolist() for b in plain]


@pytest.mark.parametrize("state", [{"epoch": -1, "served": 0}, {"epoch": 1, "served": True},
                                   {"epoch": 1}, {"epoch": 1.5, "served": 3}])
def test_a_damaged_data_order_state_is_refused(state):
    from sae.data.images import EpochShuffle

    with pytest.raises(ValueError, match="data order"):
        EpochShuffle(10).load_state_dict(state)
