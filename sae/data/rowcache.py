"""Several layers of one model read in one pass (``--hook a,b,c``): every layer's rows written to
a row file of its own, which each layer's run then reads instead of running the model.

One forward pass per batch of inputs yields the rows of every hooked layer
(:func:`sae.data.hooked.capture` stops the pass once the last of them has run); the rows of
each layer go to a raw float32 file of their own, input by input, in the order of the inputs.
A run on one of those layers then takes :class:`CachedReader` where it would take
:class:`sae.data.hooked.LayerReader`: the same rows of the same inputs, read from the file, so
the run serves the very batches, in the very order, a run that reads that layer alone would.
The files are this process's own, in a folder made for them, and removed when the runs end."""

from __future__ import annotations

import shutil
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch import nn

from sae.data.hooked import Rows, SourceError, batch, capture, checked, select

_CACHES: dict[tuple[str, str], CachedReader] = {}  # (source, hook) -> its row files


@dataclass
class RowFile:
    """One dataset's rows of one layer: ``path`` raw float32 [R, width]; input i's rows are
    ``offsets[i]`` to ``offsets[i + 1]``, at ``positions`` (0 for a layer without positions)."""

    path: Path
    width: int
    offsets: np.ndarray
    positions: np.ndarray
    sequence: int | None

    def rows(self, inputs: np.ndarray) -> tuple[torch.Tensor, np.ndarray, np.ndarray]:
        """(rows [R, width], each row's place among ``inputs``, its position)."""
        counts = self.offsets[inputs + 1] - self.offsets[inputs]
        which = np.repeat(np.arange(len(inputs)), counts)
        at = np.repeat(self.offsets[inputs] - np.concatenate([[0], np.cumsum(counts)[:-1]]),
                       counts) + np.arange(int(counts.sum()))
        data = np.memmap(self.path, dtype=np.float32, mode="r",
                         shape=(int(self.offsets[-1]), self.width)) if self.offsets[-1] else \
            np.zeros((0, self.width), np.float32)
        return torch.from_numpy(np.array(data[at])), which, self.positions[at]


@dataclass
class CachedReader:
    """A layer's rows read from its row files (one per dataset), as a ``LayerReader`` gives
    them; ``model`` and ``device`` are kept for the data module's setup only."""

    model: nn.Module
    files: list[tuple[object, RowFile]] = field(default_factory=list)  # (dataset, its rows)
    device: torch.device = torch.device("cpu")
    most: int = 8192

    def read(self, dataset, positions, stop: threading.Event | None = None) -> Rows:
        found = next((f for d, f in self.files if d is dataset), None)
        if found is None:
            raise SourceError("the rows of a dataset the layers were not read on were asked for")
        inputs = np.asarray(positions, dtype=np.int64)
        rows, which, where = found.rows(inputs)
        label = batch(dataset, inputs).label if len(inputs) else None
        return Rows(rows, None if label is None else label[torch.from_numpy(which)], which,
                    where, found.sequence)

    def rows(self, dataset, positions, stop: threading.Event | None = None):
        read = self.read(dataset, positions, stop)
        return read.rows, read.labels


def cached_reader(source: str, hook: str) -> CachedReader | None:
    """The rows of ``hook`` that :func:`dump` wrote for ``source``, if it did."""
    return _CACHES.get((source, hook))


@torch.no_grad()
def dump(source: str, model: nn.Module, hooks: list[str], layers: list[nn.Module],
         datasets: list, positions: str, most: int, folder: Path) -> None:
    """Every layer's rows of every dataset's inputs, one forward pass per ``most`` inputs for
    all the layers together, each layer's rows to a file of its own in ``folder``; registered
    for :func:`cached_reader` until :func:`release`. Raises :class:`SourceError`."""
    device = next((t.device for t in (*model.parameters(), *model.buffers())),
                  torch.device("cpu"))
    model.eval()
    for hook in hooks:
        _CACHES[(source, hook)] = CachedReader(model, [], device, most)
    for d, dataset in enumerate(datasets):
        paths = [folder / f"{d}-{k}.f32" for k in range(len(hooks))]
        kept: list[list] = [[] for _ in hooks]  # (counts, positions) of each batch, each layer
        width, sequence = [0] * len(hooks), [None] * len(hooks)
        handles = [open(p, "wb") for p in paths]  # noqa: SIM115 - closed below, all together
        try:
            for start in range(0, len(dataset), most):
                got = batch(dataset, np.arange(start, min(start + most, len(dataset))))
                outs = capture(model, layers, got.x, device)
                for k, (hook, out) in enumerate(zip(hooks, outs, strict=True)):
                    rows, which, where, sequence[k] = select(checked(out, hook), positions,
                                                             got.mask, hook)
                    handles[k].write(rows.float().cpu().contiguous().numpy().tobytes())
                    width[k] = rows.shape[1]
                    n = min(start + most, len(dataset)) - start  # the batch's inputs
                    kept[k].append((np.bincount(which, minlength=n), where))
        finally:
            for h in handles:
                h.close()
        for k, hook in enumerate(hooks):
            counts = np.concatenate([c for c, _ in kept[k]]) if kept[k] else np.zeros(0)
            offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
            where = np.concatenate([w for _, w in kept[k]]) if kept[k] else np.zeros(0)
            _CACHES[(source, hook)].files.append((dataset, RowFile(
                paths[k], width[k], offsets, where.astype(np.int64), sequence[k])))


def row_folder(near: Path) -> Path:
    """A new folder for row files beside ``near`` (the runs' folder: row files can be as
    large as the layers' activations, which a system's temporary folder may not hold)."""
    near.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=".sae-rows-", dir=near))


def release(source: str, folder: Path | None) -> None:
    """The row files of ``source`` are no longer read: unregistered, and ``folder`` removed."""
    for key in [k for k in _CACHES if k[0] == source]:
        del _CACHES[key]
    if folder is not None:
        shutil.rmtree(folder, ignore_errors=True)
