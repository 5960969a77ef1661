"""The training split's PCA on disk: computed once per machine, never trusted blindly."""

import pytest
import torch

from sae.data import images as sae_data
from sae.data import splitcache
from sae.data.images import ImageDataModule
from sae.metrics import dynamic, principal_components


@pytest.fixture
def fresh(data_dir, tmp_path, monkeypatch):
    """A data module factory whose every module loads its split anew (no split in memory),
    with the data cache folder in tmp_path."""
    monkeypatch.setenv("SAE_CACHE_DIR", str(tmp_path / "cache"))

    def make() -> ImageDataModule:
        sae_data._SPLITS.clear()
        dm = ImageDataModule("mnist", str(data_dir), val_size=500, limit_train=1500,
                             limit_test=100)
        dm.setup()
        return dm

    yield make
    sae_data._SPLITS.clear()


def _equal(a, b) -> bool:
    return all(torch.equal(getattr(a, k), getattr(b, k)) for k in ("mean", "basis", "variances"))


def _files(tmp_path):
    return sorted((tmp_path / "cache" / "splits").glob("pca-*.npz"))


@pytest.mark.slow
def test_a_second_process_reads_the_pca_the_first_computed(fresh, tmp_path, monkeypatch):
    first = fresh().train_pca()
    assert _equal(first, principal_components(fresh().train_x))
    assert len(_files(tmp_path)) == 1

    def not_again(*_a, **_k):
        raise AssertionError("computed again")

    monkeypatch.setattr(dynamic, "principal_components", not_again)
    monkeypatch.setattr("sae.metrics.principal_components", not_again)
    assert _equal(fresh().train_pca(), first)


def test_another_split_gets_its_own_file(fresh, tmp_path, data_dir):
    fresh().train_pca()
    sae_data._SPLITS.clear()
    other = ImageDataModule("mnist", str(data_dir), val_size=500, limit_train=1000,
                            limit_test=100)
    other.setup()
    assert _equal(other.train_pca(), principal_components(other.train_x))
    assert len(_files(tmp_path)) == 2


@pytest.mark.parametrize("damage", ["garbage", "truncated", "other mean", "wrong shape",
                                    "not finite", "other key"])
def test_a_damaged_or_foreign_file_is_computed_again_and_replaced(fresh, tmp_path, damage):
    dm = fresh()
    truth = principal_components(dm.train_x)
    dm.train_pca()
    (path,) = _files(tmp_path)
    key, folder = dm._split_key, tmp_path / "cache"
    if damage == "garbage":
        path.write_bytes(b"not an npz file")
    elif damage == "truncated":
        path.write_bytes(path.read_bytes()[:1000])
    elif damage == "other mean":
        splitcache.write_pca(folder, key,
                             dynamic.PCA(truth.mean + 0.01, truth.basis, truth.variances))
    elif damage == "wrong shape":
        splitcache.write_pca(folder, key, truth.top(10))
    elif damage == "not finite":
        splitcache.write_pca(folder, key, dynamic.PCA(truth.mean, truth.basis,
                                              torch.full_like(truth.variances, float("nan"))))
    else:  # a file of another key under this key's name
        other = splitcache._path(folder, ("another split",))
        splitcache.write_pca(folder, ("another split",), truth)
        path.write_bytes(other.read_bytes())
    assert splitcache.read_pca(folder, key, dm.train_mean) is None
    assert _equal(fresh().train_pca(), truth)
    assert _equal(splitcache.read_pca(folder, key, dm.train_mean), truth)  # written again


def test_an_unwritable_cache_folder_only_costs_the_computation(fresh, tmp_path):
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / "splits").write_text("a file where the folder would be")
    dm = fresh()
    assert _equal(dm.train_pca(), principal_components(dm.train_x))
