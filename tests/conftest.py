"""Shared fixtures: the offline datasets beside the repository (or $SAE_DATA_DIR)."""

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DATA_DIR = Path(os.environ.get("SAE_DATA_DIR", REPO.parent / "shared" / "datasets"))


@pytest.fixture(scope="session")
def data_dir() -> Path:
    if not (DATA_DIR / "mnist").is_dir():
        pytest.skip(f"MNIST IDX files not found in {DATA_DIR}; set SAE_DATA_DIR")
    return DATA_DIR


@pytest.fixture(scope="session")
def mnist_small(data_dir):
    """A small real MNIST data module (2 000 train, 500 validation, 500 test images)."""
    from sae.data import ImageDataModule

    dm = ImageDataModule("mnist", str(data_dir), batch_size=128, val_size=500,
                         limit_train=2000, limit_test=500)
    dm.setup()
    return dm
