"""Where the IDX files of MNIST and Fashion-MNIST are found, and how many training images they
hold, without reading them: what ``python -m sae.run`` checks its split settings against before
the run folder is made (no numpy, no torch). :mod:`sae.data.images` reads the files from the same
places.
"""

from __future__ import annotations

import gzip
import os
import struct
from pathlib import Path

from sae.system.io import open_regular

__all__ = ["DATASETS", "IDX_FILES", "cache_folder", "candidate_folders", "default_cache_dir",
           "find_folder", "has_any_idx", "idx_path", "not_found", "training_images"]

DATASETS: dict[str, str] = {"mnist": "MNIST", "fashion-mnist": "FashionMNIST"}
IDX_FILES = {
    "train_images": "train-images-idx3-ubyte",
    "train_labels": "train-labels-idx1-ubyte",
    "test_images": "t10k-images-idx3-ubyte",
    "test_labels": "t10k-labels-idx1-ubyte",
}


def idx_path(folder: Path, stem: str) -> Path | None:
    """The IDX file ``stem`` (raw or ``.gz``) in ``folder``, or None."""
    for name in (stem, stem + ".gz"):
        if (folder / name).is_file():
            return folder / name
    return None


def has_any_idx(folder: Path) -> bool:
    return any(idx_path(folder, stem) for stem in IDX_FILES.values())


def default_cache_dir() -> Path:
    return Path(os.environ.get("SAE_CACHE_DIR", Path.home() / ".cache" / "sae"))


def cache_folder(cache_dir: str | Path | None) -> Path:
    """The data cache folder a ``cache_dir`` setting names (None: :func:`default_cache_dir`)."""
    return Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()


def candidate_folders(dataset: str, data_dir: Path | None, cache_dir: Path) -> list[Path]:
    """Folders that may hold the IDX files, in the order they are tried."""
    class_name = DATASETS[dataset]
    folders = []
    if data_dir is not None:
        folders += [data_dir / dataset, data_dir / class_name / "raw", data_dir]
    folders.append(cache_dir / class_name / "raw")
    return folders


def find_folder(dataset: str, data_dir: str | Path | None = None,
                cache_dir: str | Path | None = None) -> Path | None:
    """The first folder of :func:`candidate_folders` holding any of the dataset's IDX files
    (``data_dir`` None: ``$SAE_DATA_DIR``), or None."""
    if data_dir is None and os.environ.get("SAE_DATA_DIR"):
        data_dir = os.environ["SAE_DATA_DIR"]
    data_dir = Path(data_dir).expanduser() if data_dir is not None else None
    for folder in candidate_folders(dataset, data_dir, cache_folder(cache_dir)):
        if folder.is_dir() and has_any_idx(folder):
            return folder
    return None


def training_images(folder: Path) -> int | None:
    """How many images the training IDX file in ``folder`` says it holds (its header: the
    first 8 bytes), or None when it cannot tell (missing, unreadable, not an IDX file): reading
    the file in full checks it later."""
    path = idx_path(folder, IDX_FILES["train_images"])
    if path is None:
        return None
    try:
        with os.fdopen(open_regular(path, follow_links=True), "rb") as f:
            with gzip.GzipFile(fileobj=f) if path.suffix == ".gz" else f as source:
                head = source.read(8)
    except (OSError, EOFError, gzip.BadGzipFile):
        return None
    if len(head) < 8 or head[:2] != b"\0\0" or head[3] < 1:
        return None
    return struct.unpack(">I", head[4:8])[0]


def not_found(dataset: str, data_dir: str | Path | None, offline: bool = False) -> str:
    """What to do when no folder holds the dataset's files (and the download failed, or
    ``offline``: ``$SAE_OFFLINE`` forbids it)."""
    if data_dir is None and os.environ.get("SAE_DATA_DIR"):
        data_dir = os.environ["SAE_DATA_DIR"]
    looked = data_dir if data_dir is not None else "(no --data-dir given)"
    cache_dir = default_cache_dir()
    why = "SAE_OFFLINE is set (no download)" if offline else "the download failed"
    return (f"{dataset} not found in {looked} nor in {cache_dir}, and {why}: pass "
            f"--data-dir DIR (or set SAE_DATA_DIR) to a folder with the four IDX files "
            f"({IDX_FILES['train_images']}[.gz], ...), or run once with internet access so "
            f"that torchvision can download it to {cache_dir}")
