"""MNIST / Fashion-MNIST as in-memory tensors, batched by index.

Sources, tried in order:
  1. ``data_dir`` (``--data-dir`` or ``$SAE_DATA_DIR``): a folder holding the four standard IDX
     files (``.gz`` or raw), either directly or in a sub-folder named after the dataset
     (``<data_dir>/mnist/``, ``<data_dir>/fashion-mnist/``), or in torchvision's layout
     (``<data_dir>/MNIST/raw/``);
  2. an existing torchvision root (``<cache_dir>/<ClassName>/raw/``, ``$SAE_CACHE_DIR`` or
     ``~/.cache/sae``);
  3. torchvision's download into that cache (skipped when ``$SAE_OFFLINE`` is set).

The whole dataset lives in one float tensor in [0, 1] (60 000 x 784 floats is 188 MB); a batch is an
index slice of it. torchvision's per-sample PIL path costs ~60x more per epoch for the same bytes.
"""

from __future__ import annotations

import contextlib
import gzip
import io
import itertools
import math
import os
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import lightning.pytorch as L
import numpy as np
import torch
import torchvision
from torch.utils.data import DataLoader, Dataset, Sampler

from sae import metrics
from sae.data import splitcache
from sae.data.imagefiles import (  # noqa: F401 (where the files are found: sae.data.imagefiles)
    DATASETS,
    IDX_FILES,
    cache_folder,
    candidate_folders,
    default_cache_dir,
)
from sae.data.imagefiles import has_any_idx as _has_any_idx
from sae.data.imagefiles import idx_path as _idx_path
from sae.data.splits import val_rows
from sae.system.io import open_regular

CLASS_NAMES: dict[str, list[str]] = {
    "mnist": [str(d) for d in range(10)],
    "fashion-mnist": ["T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
                      "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot"],
}
MAX_IDX_BYTES = 256 << 20  # five times the largest file of either dataset (47 MB)
IMAGE_SHAPE = (28, 28)  # both datasets; the figures and pages draw 28x28 images
N_CLASSES = 10
_IDX_DTYPES = {0x08: np.uint8, 0x09: np.int8, 0x0B: np.dtype(">i2"), 0x0C: np.dtype(">i4"),
               0x0D: np.dtype(">f4"), 0x0E: np.dtype(">f8")}


class DataSourceError(RuntimeError):
    """The dataset could not be found or read; the message says what to do."""


def read_idx(path: Path) -> np.ndarray:
    """Read one IDX file (``.gz`` or raw) into an array, checking its header against its size
    and reading at most :data:`MAX_IDX_BYTES` (a small ``.gz`` can unpack to any size)."""
    path = Path(path)
    try:  # a regular file only: a FIFO or a device under the IDX name is refused, not read
        with os.fdopen(open_regular(path, follow_links=True), "rb") as f:
            with gzip.GzipFile(fileobj=f) if path.suffix == ".gz" else f as source:
                raw = source.read(MAX_IDX_BYTES + 1)
    except (OSError, EOFError, gzip.BadGzipFile) as e:
        raise DataSourceError(f"cannot read {path}: {e}") from None
    if len(raw) > MAX_IDX_BYTES:  # a small .gz can unpack to any size
        raise DataSourceError(f"{path} holds more than {MAX_IDX_BYTES >> 20} MiB; not MNIST "
                              "or Fashion-MNIST")
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] not in _IDX_DTYPES:
        raise DataSourceError(f"{path} is not an IDX file (bad magic number)")
    dtype, ndim = np.dtype(_IDX_DTYPES[raw[2]]), raw[3]
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise DataSourceError(f"{path} is truncated (header cut short)")
    shape = struct.unpack(f">{ndim}I", raw[4:header])
    expected = header + math.prod(shape) * dtype.itemsize  # exact: np.prod can wrap to 0
    if len(raw) != expected:
        raise DataSourceError(
            f"{path} is truncated or corrupt: {len(raw)} bytes, header promises {expected}")
    return np.frombuffer(raw, dtype=dtype, offset=header).reshape(shape).copy()


@dataclass
class ImageArrays:
    """Raw arrays of one dataset: uint8 images [N, 28, 28] and int64 labels [N]."""

    train_images: np.ndarray
    train_labels: np.ndarray
    test_images: np.ndarray
    test_labels: np.ndarray
    source: str
    stamp: tuple = ()  # the files read (path, size, mtime of each): same stamp, same arrays

    def copy(self) -> ImageArrays:
        """A copy whose arrays the caller may change without touching the original."""
        return ImageArrays(self.train_images.copy(), self.train_labels.copy(),
                           self.test_images.copy(), self.test_labels.copy(), self.source,
                           self.stamp)


def _read_folder(folder: Path) -> ImageArrays:
    arrays = {}
    for key, stem in IDX_FILES.items():
        path = _idx_path(folder, stem)
        if path is None:
            raise DataSourceError(f"{folder} is missing {stem} (or {stem}.gz)")
        arrays[key] = read_idx(path)
    for split in ("train", "test"):
        images, labels = arrays[f"{split}_images"], arrays[f"{split}_labels"]
        if images.ndim != 3 or labels.ndim != 1 or len(images) != len(labels):
            raise DataSourceError(
                f"{folder}: {split} images {images.shape} do not match labels {labels.shape}")
        _check_split(folder, split, images, labels)
    return ImageArrays(
        arrays["train_images"], arrays["train_labels"].astype(np.int64),
        arrays["test_images"], arrays["test_labels"].astype(np.int64), source=str(folder))


def _check_split(folder: Path, split: str, images: np.ndarray, labels: np.ndarray) -> None:
    """What the models and pages assume of every image and label, refused here rather than as a
    failure in training or in a page built later."""
    stem = IDX_FILES[f"{split}_images"]
    if images.dtype != np.uint8 or labels.dtype != np.uint8:
        raise DataSourceError(f"{folder}: {split} images and labels must be bytes (IDX type "
                              f"0x08), got {images.dtype} and {labels.dtype}")
    if images.shape[1:] != IMAGE_SHAPE:
        raise DataSourceError(f"{folder}: {stem} holds {images.shape[1]}x{images.shape[2]} "
                              f"images; {IMAGE_SHAPE[0]}x{IMAGE_SHAPE[1]} expected")
    if len(images) == 0:
        raise DataSourceError(f"{folder}: {stem} holds no images")
    if labels.max() >= N_CLASSES:
        raise DataSourceError(f"{folder}: {IDX_FILES[f'{split}_labels']} holds label "
                              f"{int(labels.max())}; labels are 0 to {N_CLASSES - 1}")


_READ: dict[tuple, ImageArrays] = {}  # the folders read last, for processes that train many runs


def _read_folder_once(folder: Path) -> ImageArrays:
    """:func:`_read_folder`, remembered while the files stay the same (path, size, mtime), so a
    process that trains run after run (a sweep worker) reads and unzips a dataset once; each
    caller gets its own copy."""
    stamp = [str(folder.resolve())]
    for stem in IDX_FILES.values():
        path = _idx_path(folder, stem)
        info = path.stat() if path is not None else None
        stamp.append((path.name, info.st_size, info.st_mtime_ns) if info else None)
    key = tuple(stamp)
    if key not in _READ:
        arrays = _read_folder(folder)
        arrays.stamp = key
        while len(_READ) >= 2:  # both datasets of a sweep, no more
            _READ.pop(next(iter(_READ)))
        _READ[key] = arrays
    return _READ[key].copy()


@dataclass
class _Split:
    """One split of a dataset as float tensors, with what is derived from its training part.

    Shared by every data module of the same files and split settings in a process (a sweep
    worker's runs and their analyses): the float conversion, the split and the training moments
    cost more than a short run's test metrics. Nothing in the package writes into these tensors
    (data loaders, metrics and model initialisation index or copy them), which is what makes
    sharing them safe.
    """

    train_x: torch.Tensor
    train_y: torch.Tensor
    val_x: torch.Tensor
    val_y: torch.Tensor
    test_x: torch.Tensor
    test_y: torch.Tensor
    mean: torch.Tensor | None = None  # mean training image, computed when first asked for
    variance: float | None = None  # E‖x − x̄‖² over the training images
    pca: object = None  # sae.metrics.principal_components of the training images
    arrays: ImageArrays | None = None  # what the split was made from

    def made_from(self, arrays: ImageArrays) -> bool:
        """Whether ``arrays`` hold what this split was made from: a caller may change the
        arrays it was given (they are its own copy), and then the stamp no longer says it all."""
        mine = self.arrays
        return mine is not None and all(np.array_equal(getattr(mine, k), getattr(arrays, k))
                                        for k in IDX_FILES)


_SPLITS: dict[tuple, _Split] = {}  # (files' stamp, split settings) -> the split, both datasets


def load_arrays(dataset: str, data_dir: str | Path | None = None,
                cache_dir: str | Path | None = None, download: bool = True) -> ImageArrays:
    """Find and read a dataset; see the module docstring for the order of sources."""
    if dataset not in DATASETS:
        raise DataSourceError(f"unknown dataset {dataset!r}; choose from {sorted(DATASETS)}")
    if data_dir is None and os.environ.get("SAE_DATA_DIR"):
        data_dir = os.environ["SAE_DATA_DIR"]
    data_dir = Path(data_dir).expanduser() if data_dir is not None else None
    cache_dir = cache_folder(cache_dir)
    if data_dir is not None and not data_dir.is_dir():
        raise DataSourceError(f"data folder {data_dir} does not exist")

    for folder in candidate_folders(dataset, data_dir, cache_dir):
        if folder.is_dir() and _has_any_idx(folder):
            return _read_folder_once(folder)  # a partial folder: an error naming the file

    if download and not os.environ.get("SAE_OFFLINE"):
        try:
            _torchvision_download(dataset, cache_dir)
            return _read_folder_once(cache_dir / DATASETS[dataset] / "raw")
        except DataSourceError:
            raise
        except Exception:  # torchvision raises assorted errors when offline
            pass
    looked = data_dir if data_dir is not None else "(no --data-dir given)"
    raise DataSourceError(
        f"{dataset} not found in {looked} nor in {cache_dir}, and the download failed: pass "
        f"--data-dir DIR (or set SAE_DATA_DIR) to a folder with the four IDX files "
        f"({IDX_FILES['train_images']}[.gz], ...), or run once with internet access so that "
        f"torchvision can download it to {cache_dir}")


def _torchvision_download(dataset: str, cache_dir: Path) -> None:
    cls = getattr(torchvision.datasets, DATASETS[dataset])
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        for train in (True, False):
            cls(str(cache_dir), train=train, download=True)


def to_float(images: np.ndarray) -> torch.Tensor:
    """uint8 [N, 28, 28] -> float32 [N, 784] in [0, 1]."""
    return torch.from_numpy(np.ascontiguousarray(images)).reshape(len(images), -1).float() / 255.0


class IndexedTensors(Dataset):
    """Rows of in-memory tensors; ``__getitems__`` fetches a whole batch with one index op."""

    def __init__(self, images: torch.Tensor, labels: torch.Tensor):
        self.images, self.labels = images, labels

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, i: int):
        return self.images[i], self.labels[i]

    def __getitems__(self, indices: list[int]):
        idx = torch.as_tensor(indices)
        return self.images[idx], self.labels[idx]


class EpochShuffle(Sampler):
    """A new order of n rows every epoch, drawn from (seed, epoch) alone.

    torch's ``RandomSampler`` draws each epoch's order from the global generator, whose state a
    checkpoint does not hold, so a run resumed at an epoch boundary would see other batches than
    one never stopped. Lightning calls ``set_epoch`` at the start of every epoch.

    Mid-epoch resumes: :meth:`state_dict` holds the epoch and how many rows of its order were
    served; after :meth:`load_state_dict` the next iteration serves the rest of that order, so a
    run stopped after any training step goes on with the very batches it would have seen
    (``sae.training.callbacks.EpochSeed`` sets it from the checkpoint). The order is drawn when the
    first
    row is asked for, so the position may be set after the iterator was made.
    """

    def __init__(self, n: int, seed: int = 0):
        self.n, self.seed, self.epoch = n, seed, 0
        self.served = 0  # rows of the current epoch's order handed out so far
        self._skip = 0  # rows to skip once, at the next iteration (set by load_state_dict)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return self.n

    def order(self, g: torch.Generator) -> list[int]:
        """The epoch's order of the n rows, drawn from ``g`` (seeded from (seed, epoch))."""
        return list(self.rows(g))

    def rows(self, g: torch.Generator) -> Iterator[int]:
        """:meth:`order` one row at a time (a subclass may draw it as it goes)."""
        return iter(torch.randperm(self.n, generator=g).tolist())

    def __iter__(self):
        state = np.random.SeedSequence([self.seed, self.epoch]).generate_state(2)
        g = torch.Generator().manual_seed(int(state[0]) << 32 | int(state[1]))
        start, self._skip = min(self._skip, self.n), 0
        self.served = start
        for index in itertools.islice(self.rows(g), start, None):
            self.served += 1
            yield index

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "served": self.served}

    def load_state_dict(self, state: dict) -> None:
        """Restore a :meth:`state_dict`; values that are not counts (a damaged checkpoint) are
        refused with ValueError."""
        epoch, served = state.get("epoch"), state.get("served")
        if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0
                   for v in (epoch, served)):
            raise ValueError("the data order's state holds no valid epoch and position")
        self.epoch, self._skip = epoch, served


def keep_batch(batch):
    """Collate for ``IndexedTensors``: the batch is already stacked."""
    return batch


class IndexedLoaders:
    """The three loaders of a data module with ``train_x`` / ``train_y`` (and val, test),
    ``batch_size`` and ``shuffle_seed``: batches by index, the training order by
    :meth:`sampler`."""

    def sampler(self, n: int) -> EpochShuffle:
        return EpochShuffle(n, self.shuffle_seed)

    def _loader(self, x, y: torch.Tensor, shuffle: bool) -> DataLoader:
        sampler = self.sampler(len(x)) if shuffle else None
        return DataLoader(IndexedTensors(x, y), batch_size=self.batch_size, sampler=sampler,
                          collate_fn=keep_batch, num_workers=0, drop_last=False)

    def train_dataloader(self) -> DataLoader:
        return self._loader(self.train_x, self.train_y, shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return self._loader(self.val_x, self.val_y, shuffle=False)

    def test_dataloader(self) -> DataLoader:
        return self._loader(self.test_x, self.test_y, shuffle=False)


class ImageDataModule(IndexedLoaders, L.LightningDataModule):
    """Train / validation / test splits of MNIST or Fashion-MNIST as flat float tensors.

    The validation split is carved from the training set with a fixed seed (``split_seed``), so
    runs with different training seeds see the same validation images; ``val_size`` is a count,
    a fraction or None (:func:`sae.data.splits.val_rows`: 5 000 of MNIST's 60 000).
    ``limit_train`` keeps only the first n training images (after the split) for quick runs.
    """

    def __init__(self, dataset: str = "mnist", data_dir: str | None = None, batch_size: int = 256,
                 val_size: int | float | None = None, split_seed: int = 0,
                 limit_train: int | None = None, limit_test: int | None = None,
                 cache_dir: str | None = None,
                 download: bool = True, shuffle_seed: int = 0):
        super().__init__()
        self.shuffle_seed = shuffle_seed  # the training order's seed (EpochShuffle)
        self.dataset, self.data_dir, self.cache_dir = dataset, data_dir, cache_dir
        self.batch_size, self.val_size, self.split_seed = batch_size, val_size, split_seed
        self.limit_train, self.limit_test, self.download = limit_train, limit_test, download
        self.class_names = CLASS_NAMES[dataset]
        self._loaded = False

    def load(self) -> None:
        """Read the arrays once (idempotent); raises DataSourceError with a user-facing message."""
        if self._loaded:
            return
        arrays = load_arrays(self.dataset, self.data_dir, self.cache_dir, self.download)
        n_train = len(arrays.train_images)
        self.val_size = val_rows(self.val_size, n_train)  # a count from here on
        if not 0 < self.val_size < n_train:
            raise DataSourceError(f"val_size {self.val_size} must be in (0, {n_train})")
        key = (arrays.stamp, self.val_size, self.split_seed, self.limit_train, self.limit_test)
        split = _SPLITS.get(key) if arrays.stamp else None
        if split is None or not split.made_from(arrays):
            split = self._split(arrays)
            split.arrays = arrays
            if arrays.stamp:  # arrays of unknown origin: nothing to share
                while len(_SPLITS) >= 2:
                    _SPLITS.pop(next(iter(_SPLITS)))
                _SPLITS[key] = split
        self._shared = split
        self._split_key = key if arrays.stamp else None  # names the split's files on disk
        self.train_x, self.train_y = split.train_x, split.train_y
        self.val_x, self.val_y = split.val_x, split.val_y
        self.test_x, self.test_y = split.test_x, split.test_y
        self.source, self.stamp = arrays.source, arrays.stamp
        self._loaded = True

    def _split(self, arrays: ImageArrays) -> _Split:
        """The float tensors of this module's split of ``arrays``."""
        images, labels = to_float(arrays.train_images), torch.from_numpy(arrays.train_labels)
        perm = torch.randperm(len(images), generator=torch.Generator().manual_seed(self.split_seed))
        val_idx, train_idx = perm[: self.val_size], perm[self.val_size:]
        if self.limit_train:
            train_idx = train_idx[: self.limit_train]
        test_x, test_y = to_float(arrays.test_images), torch.from_numpy(arrays.test_labels)
        if self.limit_test:
            test_x, test_y = test_x[: self.limit_test], test_y[: self.limit_test]
        return _Split(images[train_idx], labels[train_idx], images[val_idx], labels[val_idx],
                      test_x, test_y)

    def setup(self, stage: str | None = None) -> None:
        self.load()

    def train_pca(self):
        """``sae.metrics.principal_components`` of the training split (the adaptivity measure's
        reference), computed once per split and machine (:mod:`sae.data.splitcache`) and kept in
        memory for the process: it costs more than the rest of a short run's test metrics, and
        a sweep worker's runs (and their analyses) share their split."""
        self.load()
        if self._shared.pca is None:
            key, pca = self._split_key, None
            folder = cache_folder(self.cache_dir)
            if key is not None:
                pca = splitcache.read_pca(folder, key, self.train_mean)
            if pca is None:
                pca = metrics.principal_components(self.train_x)
                if key is not None:
                    splitcache.write_pca(folder, key, pca)
            self._shared.pca = pca
        return self._shared.pca

    @property
    def train_mean(self) -> torch.Tensor:
        """Mean training image [784]: the decoder-bias init and the x̄ of fvu."""
        self.load()
        if self._shared.mean is None:
            self._shared.mean = self.train_x.mean(0)
        return self._shared.mean

    @property
    def train_variance(self) -> float:
        """E‖x − x̄‖² over the training images: the scale the models' losses are divided by."""
        mean = self.train_mean  # loads the split first
        if self._shared.variance is None:
            self._shared.variance = float((self.train_x - mean).pow(2).sum(-1).mean())
        return self._shared.variance

