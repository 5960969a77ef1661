"""Activation matrices (``--data``, :mod:`sae.data.matrix`) as a run's data module.

:class:`MatrixDataModule` has the interface of :class:`sae.data.images.ImageDataModule`
(``train_x``,
``val_x``, ``test_x`` and their labels, ``train_mean``, ``train_pca``, ``class_names``, the three
loaders), with the same split conventions: the validation rows are carved from the training
split with the fixed ``split_seed``, ``limit_train`` keeps the first rows of the rest, and a data
set without a test split gives up as many rows again (also carved with ``split_seed``) as its test
split. A manifest's own ``val`` (or ``test``) rows are used as they are, and nothing is carved for
them. Validation and test rows are read into memory (they are small and evaluated whole); the
training rows stay in the memory-mapped file and are read a batch at a time
(:class:`MatrixRows`), so a file larger than memory trains.

Batches are read as runs of consecutive rows: the epoch's order (:class:`BlockShuffle`) shuffles
blocks of about 64 KiB of consecutive training rows, then the rows within each block, so a batch
of 256 rows costs a few sequential reads of the file instead of 256 scattered ones (a cold
page cache makes scattered reads slow). Its state is :class:`sae.data.images.EpochShuffle`'s, so a
stopped run resumes with the very batches it would have seen.

Rows without labels get label 0 of one class (``"all inputs"``): the class figures then show
the whole set, and :attr:`MatrixDataModule.has_labels` tells probes to stay away.

The data are read and checked once per process (:func:`sae.data.matrix.checked`: every file, one
pass over each matrix for the NaN scan, the checksum and the column sums, which give the training
rows' moments without a second pass).
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import lightning.pytorch as L
import numpy as np
import torch

from sae.data.images import EpochShuffle, IndexedLoaders
from sae.data.matrix import MatrixError, checked, manifest_name
from sae.data.scan import moments, sums
from sae.data.splits import val_rows
from sae.metrics import principal_components

__all__ = ["BlockShuffle", "MatrixDataModule", "MatrixRows", "TrainMoments", "Truth", "checked",
           "data_name", "streamed_moments", "streamed_pca"]

BLOCK_BYTES = 64 << 10  # consecutive bytes of training rows one block of the order holds
PCA_ROWS = 65_536  # rows of the training split the adaptivity's PCA reference reads at most
NO_LABELS = ["all inputs"]  # the one class of unlabelled rows

def data_name(path: str | Path) -> str:
    """A data set's short name for folders and tables: the manifest's ``name`` made a file
    name (letters, digits, ``-``), or the file's stem; a manifest without a name (or not made
    yet) called ``dataset.json`` is named after its folder, as ``sae.synth`` and ``sae.layer``
    write one per folder."""
    path = Path(path)
    name = path.stem
    if path.suffix.lower() == ".json":
        generic = path.stem == "dataset" and path.parent.name not in ("", ".", "..")
        name = manifest_name(path) or (path.parent.name if generic else name)
    return re.sub(r"[^A-Za-z0-9_.]+", "-", name).strip("-")[:64] or "data"


class MatrixRows:
    """Rows ``index`` of a (memory-mapped) matrix, read on demand as float32 tensors.

    ``rows[i]`` for an int, a slice, or an integer array / tensor of positions: the file is read
    in increasing row order (sequential where the positions are), then put in the asked order.
    """

    def __init__(self, x: np.ndarray, index: np.ndarray):
        self.x, self.index = x, np.asarray(index, dtype=np.int64)

    def __len__(self) -> int:
        return len(self.index)

    @property
    def shape(self) -> tuple[int, int]:
        return (len(self.index), int(self.x.shape[1]))

    def __getitem__(self, i) -> torch.Tensor:
        if isinstance(i, slice):
            return _tensor(self._read(self.index[i]))
        if isinstance(i, int | np.integer):
            return _tensor(self._read(self.index[[i]]))[0]
        positions = np.asarray(i.cpu() if isinstance(i, torch.Tensor) else i, dtype=np.int64)
        return _tensor(self._read(self.index[positions]))

    def _read(self, rows: np.ndarray) -> np.ndarray:
        if len(rows) == 0:
            return np.zeros((0, self.x.shape[1]), self.x.dtype)
        if len(rows) > 1 and rows[-1] - rows[0] == len(rows) - 1 and \
                np.all(np.diff(rows) == 1):  # one run of consecutive rows: one slice
            return np.array(self.x[rows[0]:rows[-1] + 1])  # a copy: the map is read-only
        order = np.argsort(rows, kind="stable")
        block = np.empty((len(rows), self.x.shape[1]), self.x.dtype)
        block[order] = self.x[rows[order]]
        return block

    def blocks(self, rows: int):
        """The rows in order, ``rows`` at a time, as float32 tensors."""
        for start in range(0, len(self), rows):
            yield self[start:start + rows]


@dataclass
class Truth:
    """The known features of data made by ``python -m sae.synth``: the true dictionary
    ``features`` [F, D] and each validation and test row's true features (``val`` [N_val, F],
    ``test`` [N_test, F], bool)."""

    features: torch.Tensor
    val: torch.Tensor
    test: torch.Tensor


def _bits(packed: np.ndarray, index: np.ndarray, n_features: int) -> torch.Tensor:
    """Rows ``index`` of packed bits [N, ceil(F / 8)] as a bool tensor [len(index), F]."""
    return torch.from_numpy(np.unpackbits(np.asarray(packed[index]), axis=1,
                                          count=n_features).astype(bool))


def _tensor(block: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(block, dtype=np.float32))


class BlockShuffle(EpochShuffle):
    """:class:`sae.data.images.EpochShuffle` whose epoch order keeps runs of ``block`` consecutive
    rows
    together: the blocks are shuffled, then the rows within each block (see the module
    docstring for why)."""

    def __init__(self, n: int, seed: int = 0, block: int = 1):
        super().__init__(n, seed)
        self.block = max(1, int(block))

    def rows(self, g: torch.Generator) -> Iterator[int]:
        # drawn a block at a time as the epoch goes: the first batch does not wait for the
        # whole order of millions of rows (a second), and the draws are the same either way
        starts = torch.arange(0, self.n, self.block)[torch.randperm(
            math.ceil(self.n / self.block), generator=g)]
        for start in starts.tolist():
            size = min(self.block, self.n - start)
            yield from (start + torch.randperm(size, generator=g)).tolist()


def streamed_moments(rows, block: int = 8192) -> tuple[torch.Tensor, float]:
    """(mean row [D] float32, E‖x − mean‖²) of rows read ``block`` at a time, summed in
    float64 (:func:`sae.data.scan.sums`)."""
    total, squares = 0.0, 0.0
    for start in range(0, len(rows), block):
        s, q = sums(rows[start:start + block].numpy())
        total, squares = total + s, squares + q
    mean, var = moments(total, squares, len(rows))
    return torch.from_numpy(mean).float(), var


def streamed_pca(rows, max_rows: int = PCA_ROWS, block: int = 8192):
    """``sae.metrics.PCA`` (all components) of at most ``max_rows`` rows of ``rows``, evenly
    spaced, accumulated a block at a time: the adaptivity's reference for any D without loading
    the training split."""
    n = len(rows)
    pick = np.unique(np.linspace(0, n - 1, min(n, max_rows)).round().astype(np.int64))
    x = torch.cat([rows[pick[i:i + block]] for i in range(0, len(pick), block)])
    return principal_components(x)


class TrainMoments:
    """``train_mean`` and ``train_variance`` of a data module whose ``_moments()`` gives them
    (computed once, from its training rows)."""

    @property
    def train_mean(self) -> torch.Tensor:
        """Mean training row [D]: the decoder-bias init and the x̄ of fvu."""
        return self._moments()[0]

    @property
    def train_variance(self) -> float:
        """E‖x − x̄‖² over the training rows: the loss's normaliser."""
        return self._moments()[1]


class MatrixDataModule(TrainMoments, IndexedLoaders, L.LightningDataModule):
    """Train / validation / test splits of an activation matrix (see the module docstring)."""

    def __init__(self, path: str | Path, batch_size: int = 256,
                 val_size: int | float | None = None,
                 split_seed: int = 0, limit_train: int | None = None,
                 limit_test: int | None = None, shuffle_seed: int = 0, in_memory: bool = False,
                 data_dir: str | Path | None = None):
        super().__init__()
        self.path, self.data_dir = Path(path), data_dir
        self.batch_size, self.val_size, self.split_seed = batch_size, val_size, split_seed
        self.limit_train, self.limit_test = limit_train, limit_test
        self.shuffle_seed, self.in_memory = shuffle_seed, in_memory
        self._loaded = False
        self._mean: tuple[torch.Tensor, float] | None = None
        self._pca = None

    def load(self) -> None:
        """Check and map the files once (idempotent); raises MatrixError."""
        if self._loaded:
            return
        data, record = checked(self.path, self.data_dir)
        self.data, self.record = data, record
        self.dataset, self.images, self.has_labels = data.name, data.images, \
            data.train.labels is not None
        self.class_names = (data.class_names or [str(c) for c in range(data.n_classes)]) \
            if self.has_labels else list(NO_LABELS)
        n = len(data.train.x)
        val_idx, test_idx, rest = self._carve(data, n)
        if self.limit_train:
            rest = rest[: self.limit_train]
        self.train_index = np.sort(rest)  # file order: a block of the order is one read
        val_split = data.val if data.val is not None else data.train
        self.val_x, self.val_y = self._split(val_split, val_idx)
        self.held_out = [i for i, split in ((val_idx, data.val), (test_idx, data.test))
                         if split is None]  # the rows of the training file not trained on
        test_split = data.test if data.test is not None else data.train
        if self.limit_test:
            test_idx = test_idx[: self.limit_test]
        self.test_x, self.test_y = self._split(test_split, test_idx)
        self.test_rows = None if test_split.rows is None else test_split.rows[test_idx]
        # which split of the image dataset the rows index: its test split for the data's own
        # test split, its training split for test rows carved from the training rows
        self.test_rows_split = "test" if data.test is not None else "train"
        self.test_row_numbers = test_idx  # each test input's row in its file
        self.test_texts = None if test_split.texts is None else \
            [test_split.texts[i] for i in test_idx]
        self.truth = None if data.truth_features is None else Truth(
            torch.from_numpy(data.truth_features),
            val=_bits(val_split.active, val_idx, len(data.truth_features)),
            test=_bits(test_split.active, test_idx, len(data.truth_features)))
        rows = MatrixRows(data.train.x, self.train_index)
        self.train_x = rows[:] if self.in_memory else rows
        self.train_y = self._labels(data.train, self.train_index)
        self.source, self.stamp = str(self.path), ()
        self._loaded = True

    def _carve(self, data, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(validation rows, test rows, training rows): of their own split where the data
        gives one, else carved from the ``n`` training rows with ``split_seed`` (validation
        first, then test; ``--val-size`` rows each, :func:`sae.data.splits.val_rows`)."""
        carved = (data.val is None) + (data.test is None)
        self.val_size = val_rows(self.val_size, n) if carved else len(data.val.x)
        if carved and (self.val_size < 1 or carved * self.val_size >= n):
            what = "validation rows" if data.val is None else "test rows"
            what = "validation and as many test rows" if carved == 2 else what
            raise MatrixError(f"--val-size {self.val_size}: {self.path} has {n} training rows, "
                              f"too few for {what} and training; give a smaller --val-size")
        perm = torch.randperm(n, generator=torch.Generator().manual_seed(self.split_seed))
        perm, v, used = perm.numpy(), self.val_size, 0
        own = {"val": data.val, "test": data.test}
        rows = {}
        for name in ("val", "test"):
            if own[name] is not None:
                rows[name] = np.arange(len(own[name].x))
            else:
                rows[name], used = np.sort(perm[used:used + v]), used + v
        return rows["val"], rows["test"], perm[used:]

    def _labels(self, split, index: np.ndarray) -> torch.Tensor:
        if split.labels is None:
            return torch.zeros(len(index), dtype=torch.int64)
        return torch.from_numpy(split.labels[index])

    def _split(self, split, index: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        return MatrixRows(split.x, index)[:], self._labels(split, index)

    def setup(self, stage: str | None = None) -> None:
        self.load()

    def _moments(self) -> tuple[torch.Tensor, float]:
        if self._mean is None:
            self.load()
            self._mean = self._moments_from_scan() or streamed_moments(self.train_x)
        return self._mean

    def _moments_from_scan(self) -> tuple[torch.Tensor, float] | None:
        """The training rows' moments from the check's column sums over the whole file, less
        the rows held out for validation (and test, carved from the same file): no second pass
        over the file. None where the check kept no sums or ``limit_train`` drops rows."""
        scan = self.data.train.scan
        if scan is None or self.limit_train:
            return None
        total, squares = scan.sums.copy(), scan.squares.copy()
        for index in self.held_out:  # read again in the file's own dtype, as the scan read them
            s, q = sums(self.data.train.x[index])
            total -= s
            squares -= q
        mean, var = moments(total, squares, len(self.train_index))
        return torch.from_numpy(mean).float(), var

    def train_pca(self):
        """The adaptivity measure's reference: :func:`streamed_pca` of the training split."""
        if self._pca is None:
            self.load()
            self._pca = streamed_pca(self.train_x)
        return self._pca

    def sampler(self, n: int) -> BlockShuffle:
        row_bytes = int(self.data.train.x.shape[1]) * self.data.train.x.itemsize
        return BlockShuffle(n, self.shuffle_seed, BLOCK_BYTES // max(1, row_bytes))


def train_moments(dm) -> tuple[torch.Tensor, float]:
    """(mean training row, E‖x − x̄‖²) of either data module."""
    return dm.train_mean, dm.train_variance


def drop_cache(path: str | Path) -> None:
    """Ask the kernel to forget a file's cached pages (Linux; elsewhere nothing happens), so
    the next reads come from the disk: what a file larger than memory costs."""
    if not hasattr(os, "posix_fadvise"):
        return
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
