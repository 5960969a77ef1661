"""Shared fixtures: the offline datasets beside the repository (or $SAE_DATA_DIR); the quick run.

``python -m pytest`` is the quick run: the tests marked ``slow`` (trainings on real data,
subprocess and signal cases, the pages in a browser) are left out unless ``--all`` is given
(what CI runs) or ``-m`` chooses the tests itself.

The suite runs on every core (pytest-xdist, ``-n auto --dist loadfile`` in pyproject.toml):
each worker takes whole test files, so module fixtures (a trained run, a finished sweep) are
made once, and gets its share of the cores as torch threads, so that workers do not oversubscribe
the machine (several processes each spinning a thread per core slow each other down many times).
"""

import os
from pathlib import Path

import pytest

_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if _WORKERS > 1:
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // _WORKERS)))

REPO = Path(__file__).resolve().parents[1]
DATA_DIR = Path(os.environ.get("SAE_DATA_DIR", REPO.parent / "shared" / "datasets"))


def pytest_addoption(parser):
    parser.addoption("--all", action="store_true",
                     help="run the slow tests too (trainings, subprocess and signal cases, pages "
                          "in a browser): the whole suite, as CI runs it")


def pytest_collection_modifyitems(config, items):
    if config.getoption("--all") or config.getoption("-m"):
        return
    slow = [item for item in items if item.get_closest_marker("slow")]
    if slow:
        config.hook.pytest_deselected(items=slow)
        items[:] = [item for item in items if not item.get_closest_marker("slow")]


def pytest_report_header(config):
    if not (config.getoption("--all") or config.getoption("-m")):
        return "the quick run: tests marked slow are left out (--all runs them too)"
    return None


@pytest.fixture(scope="session")
def data_dir() -> Path:
    if not (DATA_DIR / "mnist").is_dir():
        pytest.skip(f"MNIST IDX files not found in {DATA_DIR}; set SAE_DATA_DIR")
    return DATA_DIR


@pytest.fixture(scope="session")
def mnist_small(data_dir):
    """A small real MNIST data module (2 000 train, 500 validation, 500 test images)."""
    from sae.data.images import ImageDataModule

    dm = ImageDataModule("mnist", str(data_dir), batch_size=128, val_size=500,
                         limit_train=2000, limit_test=500)
    dm.setup()
    return dm
