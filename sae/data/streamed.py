"""Activations of any PyTorch model's layer, read while the model runs (``--source``, ``--hook``).

A source is a model and the inputs it runs on: ``factory()`` of ``--source pkg.module:factory``
(or ``sae.train(source=(model, dataset))``) returns ``(model, dataset)`` or ``(model, {"train":
dataset, "test": dataset})``, each dataset map-style (``len`` and ``dataset[i]``), each item an
input tensor or ``(input, label, ...)``. The layer ``--hook`` names (as ``model.named_modules()``
names it) is read with a forward hook, the model in eval mode and without gradients; the rest of
the forward pass is skipped. A row is the layer's output for one input, flattened.

**Training rows are computed as they are needed**, never written to disk: the epoch's order (the
same seeded order as every data module's, :class:`sae.data.images.EpochShuffle`) is cut into
chunks of ``--buffer-rows`` inputs, and the model runs on one chunk at a time, which the batches
then take rows from. Each batch is a uniform sample of the training inputs, drawn anew every epoch
(the shuffling an activation buffer exists for), and memory holds one chunk. Chunks start at fixed
positions of the order, so a run resumed mid-epoch computes the very rows it would have: the
resume is exact. Under DDP each process computes only its share of the batches.

Validation and test rows (a few thousand) are computed once, at the start: validation carved from
the training inputs with the split seed, test from the ``"test"`` dataset when given, else carved
as well. The mean row and variance come from an evenly spaced sample of the training inputs
(:data:`MOMENT_ROWS`). Labels, when the items carry them, feed the probes and the class figures;
inputs that are images (``[h, w]`` or ``[1, h, w]``) are shown in the feature browser.
"""

from __future__ import annotations

import importlib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import lightning.pytorch as L
import numpy as np
import torch
from torch import nn
from torch.utils.data import TensorDataset

from sae.data.images import EpochShuffle, IndexedLoaders
from sae.data.matrixdata import PCA_ROWS, TrainMoments, streamed_moments
from sae.data.rundata import read_record
from sae.metrics import principal_components
from sae.settings.cli import UsageError
from sae.system.process import stop_signals_to_main_thread

MOMENT_ROWS = 65536  # training inputs the mean row and variance are computed from, at most
PYTHON_SOURCE = "python"  # --source of a (model, dataset) handed to sae.train
_PYTHON_SOURCES: dict[str, tuple] = {}  # what sae.train registered under PYTHON_SOURCE
_RESOLVED: dict[str, tuple] = {}  # --source -> (model, train, test): a factory runs once


class SourceError(ValueError):
    """A source or hook that cannot be used; the message is one line."""


class _Captured(Exception):  # noqa: N818 - control flow, not an error: the layer's output is read
    def __init__(self, output):
        self.output = output


def register_python_source(source) -> str:
    """Hold ``(model, dataset)`` for the run :func:`sae.train` starts next; returns the
    ``--source`` that names it."""
    _PYTHON_SOURCES[PYTHON_SOURCE] = source
    _RESOLVED.pop(PYTHON_SOURCE, None)
    return PYTHON_SOURCE


def release_python_source() -> None:
    _PYTHON_SOURCES.pop(PYTHON_SOURCE, None)
    _RESOLVED.pop(PYTHON_SOURCE, None)


def resolve(ref: str):
    """``(model, train, test or None)`` of ``--source`` ``ref``: ``pkg.module:factory``, whose
    factory is imported and called once per process (the user named it: nothing read from a file
    is imported), or the Python source :func:`register_python_source` holds. Raises
    :class:`SourceError`."""
    if ref in _RESOLVED:
        return _RESOLVED[ref]
    if ref == PYTHON_SOURCE:
        if PYTHON_SOURCE not in _PYTHON_SOURCES:
            raise SourceError("--source python names a (model, dataset) given to sae.train; "
                              "from the command line give --source pkg.module:factory")
        made = _PYTHON_SOURCES[PYTHON_SOURCE]
    else:
        module_name, _, attr = ref.partition(":")
        if not module_name or not attr:
            raise SourceError(f"--source {ref}: give pkg.module:factory, factory() returning "
                              "(model, dataset)")
        try:
            module = importlib.import_module(module_name)
        except Exception as e:  # noqa: BLE001 - any import failure is the user's module's
            raise SourceError(f"--source {ref}: cannot import {module_name} "
                              f"({type(e).__name__}: {_line(e)})") from None
        factory = getattr(module, attr, None)
        if not callable(factory):
            raise SourceError(f"--source {ref}: {module_name} has no callable {attr}")
        try:
            made = factory()
        except Exception as e:  # noqa: BLE001 - the factory is the user's code
            raise SourceError(f"--source {ref}: {attr}() failed "
                              f"({type(e).__name__}: {_line(e)})") from None
    _RESOLVED[ref] = _unpack(made, ref)
    return _RESOLVED[ref]


def _unpack(made, ref: str):
    if not (isinstance(made, tuple | list) and len(made) == 2):
        raise SourceError(f"--source {ref}: expected (model, dataset), got "
                          f"{type(made).__name__}")
    model, data = made
    if not isinstance(model, nn.Module):
        raise SourceError(f"--source {ref}: the model is a {type(model).__name__}, not a "
                          "torch.nn.Module")
    train, test = (data.get("train"), data.get("test")) if isinstance(data, dict) else (data,
                                                                                       None)
    for name, ds in (("train", train), ("test", test)):
        if ds is None and name == "test":
            continue
        if not (hasattr(ds, "__len__") and hasattr(ds, "__getitem__")):
            raise SourceError(f"--source {ref}: the {name} dataset has no len() and [i] (an "
                              "iterable dataset cannot be split or resumed: give a map-style "
                              "one)")
    return model, train, test


def _line(e: BaseException) -> str:
    return " ".join(str(e).split())[:160]


def find_layer(model: nn.Module, hook: str, ref: str) -> nn.Module:
    """The submodule ``hook`` of ``model``; :class:`SourceError` naming a few that exist."""
    layers = dict(model.named_modules())
    if hook not in layers or not hook:
        names = [n for n in layers if n][:8]
        raise SourceError(f"--hook {hook}: {ref}'s model has no layer {hook!r} (it has "
                          f"{', '.join(names)}{', ...' if len(layers) > 9 else ''})")
    return layers[hook]


def _item(item) -> tuple[torch.Tensor, int | None]:
    if isinstance(item, tuple | list):
        x = item[0]
        label = int(item[1]) if len(item) > 1 and _is_label(item[1]) else None
    else:
        x, label = item, None
    return torch.as_tensor(x), label


def _is_label(value) -> bool:
    if isinstance(value, torch.Tensor):
        return value.numel() == 1 and not value.is_floating_point()
    return isinstance(value, int | np.integer) and not isinstance(value, bool)


def inputs(dataset, positions) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(inputs stacked [n, ...], labels [n] or None) of the dataset's items at ``positions``:
    one index operation for a ``TensorDataset``, an item at a time for any other."""
    positions = np.asarray(positions, dtype=np.int64)
    if isinstance(dataset, TensorDataset):
        index = torch.from_numpy(positions)
        tensors = dataset.tensors
        labels = tensors[1][index] if len(tensors) > 1 and _is_label(tensors[1][:1]) else None
        return tensors[0][index], labels
    items = [_item(dataset[int(i)]) for i in positions]
    labels = [label for _, label in items]
    return (torch.stack([x for x, _ in items]),
            None if any(label is None for label in labels) else torch.tensor(labels))


@dataclass
class LayerReader:
    """Runs ``model`` on inputs of ``dataset`` and returns ``hook``'s output, one row each."""

    model: nn.Module
    layer: nn.Module
    device: torch.device = torch.device("cpu")

    @torch.no_grad()
    def rows(self, dataset, positions) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(rows [n, D] float32 on CPU, labels [n] or None) of the inputs at ``positions``."""
        if len(positions) == 0:
            return torch.zeros(0, 0), None
        x, labels = inputs(dataset, positions)
        x = x.to(self.device)
        self.model.eval()

        def capture(module, inputs, output):
            raise _Captured(output[0] if isinstance(output, tuple | list) else output)

        handle = self.layer.register_forward_hook(capture)
        try:
            self.model(x)
        except _Captured as c:
            out = c.output
        else:
            raise SourceError("the hooked layer did not run in the model's forward pass")
        finally:
            handle.remove()
        return out.detach().reshape(len(x), -1).float().cpu(), labels


class StreamedRows:
    """The training rows of a source, computed a chunk of the epoch's order at a time.

    ``rows[positions]`` (what the loader asks for, one batch in the sampler's order) is served
    from the current chunk, which is the chunk that holds the first position (computed then,
    unless it was computed ahead: while the batches of one chunk train, the next one's rows are
    computed in a background thread, the same rows the same way). Positions the chunk does not
    hold (a batch across two chunks, another rank's order, a direct call) are computed as they
    are asked for."""

    def __init__(self, reader: LayerReader, dataset, index: np.ndarray, width: int,
                 sampler: BufferedShuffle, chunk: int):
        self.reader, self.dataset, self.index = reader, dataset, np.asarray(index)
        self.width, self.sampler, self.chunk = width, sampler, max(1, int(chunk))
        self._key, self._order = None, np.zeros(0, dtype=np.int64)  # the chunk's positions
        self._slot = np.full(len(self.index), -1, dtype=np.int64)  # position -> row of block
        self._block = torch.zeros(0, width)
        self._ahead = None  # (key, future) of the chunk computed in the background
        self._pool = None

    def __len__(self) -> int:
        return len(self.index)

    @property
    def shape(self) -> tuple[int, int]:
        return (len(self.index), self.width)

    def __getitem__(self, i) -> torch.Tensor:
        if isinstance(i, slice):
            positions = np.arange(len(self.index))[i]
        elif isinstance(i, int | np.integer):
            return self[[int(i)]][0]
        else:
            positions = np.asarray(i.cpu() if isinstance(i, torch.Tensor) else i,
                                   dtype=np.int64)
        if len(positions) == 0:
            return torch.zeros(0, self.width)
        self._load_chunk_of(int(positions[0]))
        slots = self._slot[positions]
        held = slots >= 0
        if held.all():
            return self._block[torch.from_numpy(slots)]
        out = torch.empty(len(positions), self.width)
        out[torch.from_numpy(held)] = self._block[torch.from_numpy(slots[held])]
        out[torch.from_numpy(~held)] = self.reader.rows(self.dataset,
                                                        self.index[positions[~held]])[0]
        return out

    def _compute(self, order: np.ndarray) -> tuple[np.ndarray, torch.Tensor]:
        return order, self.reader.rows(self.dataset, self.index[order])[0]

    def _load_chunk_of(self, position: int) -> None:
        where = self.sampler.chunk_of(position, self.chunk)
        if where is None or where == self._key:
            return
        epoch, start = where
        self._slot[self._order] = -1  # the previous chunk is dropped first
        self._block = torch.zeros(0, self.width)
        if self._ahead is not None and self._ahead[0] == where:
            order, block = self._ahead[1].result()
        else:
            order, block = self._compute(self.sampler.epoch_order(epoch)[start:start +
                                                                          self.chunk])
        self._ahead = None
        self._slot[order] = np.arange(len(order))
        self._key, self._order, self._block = where, order, block
        following = start + self.chunk
        if following < len(self.index):  # the next chunk of this epoch, while this one trains
            self._pool = self._pool or ThreadPoolExecutor(
                1, thread_name_prefix="sae-source", initializer=stop_signals_to_main_thread)
            order = self.sampler.epoch_order(epoch)[following:following + self.chunk].copy()
            self._ahead = ((epoch, following), self._pool.submit(self._compute, order))

class BufferedShuffle(EpochShuffle):
    """:class:`EpochShuffle` that also tells where a position falls in the epoch's order, so the
    rows of a whole chunk of the order can be computed at once."""

    def __init__(self, n: int, seed: int = 0):
        super().__init__(n, seed)
        self._epoch, self._order, self._place = None, np.zeros(0, np.int64), np.zeros(0, np.int64)

    def epoch_order(self, epoch: int) -> np.ndarray:
        if epoch != self._epoch:  # the order EpochShuffle.__iter__ draws for this epoch
            state = np.random.SeedSequence([self.seed, epoch]).generate_state(2)
            g = torch.Generator().manual_seed(int(state[0]) << 32 | int(state[1]))
            self._order = np.asarray(self.order(g), dtype=np.int64)
            self._place = np.empty_like(self._order)
            self._place[self._order] = np.arange(len(self._order))
            self._epoch = epoch
        return self._order

    def chunk_of(self, position: int, chunk: int) -> tuple[int, int] | None:
        """(epoch, start of the chunk in the order) of ``position`` in this epoch's order;
        None under DDP, where each process computes only the rows of its own batches."""
        if torch.distributed.is_available() and torch.distributed.is_initialized() \
                and torch.distributed.get_world_size() > 1:
            return None
        self.epoch_order(self.epoch)
        if not 0 <= position < len(self._place):
            return None
        place = int(self._place[position])
        return (self.epoch, place - place % chunk)


class StreamedDataModule(TrainMoments, IndexedLoaders, L.LightningDataModule):
    """Train / validation / test rows of a source's layer (see the module docstring)."""

    images = None  # no image dataset behind the rows (the inputs themselves may be images)
    test_rows = None
    test_texts = None
    truth = None

    def __init__(self, source: str, hook: str, batch_size: int = 256, val_size: int = 5000,
                 split_seed: int = 0, limit_train: int | None = None,
                 limit_test: int | None = None, shuffle_seed: int = 0, buffer_rows: int = 8192):
        super().__init__()
        self.source, self.hook = source, hook
        self.batch_size, self.val_size, self.split_seed = batch_size, val_size, split_seed
        self.limit_train, self.limit_test = limit_train, limit_test
        self.shuffle_seed, self.buffer_rows = shuffle_seed, buffer_rows
        self.stamp = ()
        self._loaded = False
        self._moments_cache = None
        self._pca = None

    def open(self):
        """(model, train, test, layer) of the source, checked; :class:`SourceError`."""
        model, train, test = resolve(self.source)
        return model, train, test, find_layer(model, self.hook, self.source)

    def load(self) -> None:
        if self._loaded:
            return
        model, train, test, layer = self.open()
        self.reader = LayerReader(model, layer, _device_of(model))
        n = len(train)
        carved = 1 if test is not None else 2
        if not 0 < self.val_size or carved * self.val_size >= n:
            raise SourceError(f"--val-size {self.val_size}: the source has {n} training inputs, "
                              "too few for validation (and test) inputs and training")
        perm = torch.randperm(n, generator=torch.Generator().manual_seed(self.split_seed))
        perm = perm.numpy()
        v = self.val_size
        rest = perm[v * carved:]
        if self.limit_train:
            rest = rest[: self.limit_train]
        self.train_index = np.sort(rest)
        self.val_x, val_y = self.reader.rows(train, np.sort(perm[:v]))
        test_set, test_idx = (test, np.arange(len(test))) if test is not None else \
            (train, np.sort(perm[v:2 * v]))
        if self.limit_test:
            test_idx = test_idx[: self.limit_test]
        self.test_x, test_y = self.reader.rows(test_set, test_idx)
        self.has_labels = val_y is not None and test_y is not None
        if self.has_labels:
            n_classes = int(max(val_y.max(), test_y.max())) + 1
            self.class_names = [str(c) for c in range(n_classes)]
        else:
            self.class_names = ["all inputs"]
        self.val_y = val_y if self.has_labels else torch.zeros(len(self.val_x), dtype=torch.long)
        self.test_y = test_y if self.has_labels else torch.zeros(len(self.test_x),
                                                                 dtype=torch.long)
        self.test_row_numbers = test_idx
        self.test_images = _images(test_set, test_idx)
        self.dataset = f"{type(model).__name__}.{self.hook}"
        width = self.val_x.shape[1]
        self._sampler = BufferedShuffle(len(self.train_index), self.shuffle_seed)
        self.train_x = StreamedRows(self.reader, train, self.train_index, width, self._sampler,
                                    self.buffer_rows)
        # labels of training rows are only used for probes on the training split: read lazily
        self.train_y = _Labels(train, self.train_index, self.has_labels)
        self._loaded = True

    def setup(self, stage: str | None = None) -> None:
        self.load()
        trainer = getattr(self, "trainer", None)
        if trainer is not None:  # the source runs where training runs
            device = trainer.strategy.root_device
            self.reader.model.to(device)
            self.reader.device = device

    def sampler(self, n: int) -> BufferedShuffle:
        return self._sampler

    def _moments(self):
        if self._moments_cache is None:
            self.load()  # a block of rows at a time: memory holds one block
            self._moments_cache = streamed_moments(self._sample(MOMENT_ROWS), block=4096)
        return self._moments_cache

    def _sample(self, n: int) -> _Sample:
        rows = len(self.train_x)
        pick = np.unique(np.linspace(0, rows - 1, min(rows, n)).round().astype(np.int64))
        return _Sample(self.reader, self.train_x.dataset, self.train_index[pick])

    def train_pca(self):
        if self._pca is None:
            sample = self._sample(PCA_ROWS)
            self._pca = principal_components(sample[0:len(sample)])
        return self._pca


class _Sample:
    """Rows of the inputs at ``index``, computed a slice at a time as they are read."""

    def __init__(self, reader: LayerReader, dataset, index: np.ndarray):
        self.reader, self.dataset, self.index = reader, dataset, index

    def __len__(self) -> int:
        return len(self.index)

    def __getitem__(self, i: slice) -> torch.Tensor:
        return self.reader.rows(self.dataset, self.index[i])[0]


class _Labels:
    """Training labels, read from the dataset's items when asked for (0 without labels)."""

    def __init__(self, dataset, index: np.ndarray, has_labels: bool):
        self.dataset, self.index, self.has_labels = dataset, index, has_labels

    def __len__(self) -> int:
        return len(self.index)

    def __getitem__(self, i) -> torch.Tensor:
        positions = np.arange(len(self.index))[i] if isinstance(i, slice) else \
            np.atleast_1d(np.asarray(i.cpu() if isinstance(i, torch.Tensor) else i))
        if not self.has_labels:
            return torch.zeros(len(positions), dtype=torch.long)
        if isinstance(self.dataset, TensorDataset):
            return inputs(self.dataset, self.index[positions])[1]
        return torch.tensor([_item(self.dataset[int(self.index[p])])[1] for p in positions])


def _images(dataset, index: np.ndarray) -> np.ndarray | None:
    """[n, h, w] of inputs that are images (2-D, or one channel), else None."""
    if len(index) == 0:
        return None
    first = _item(dataset[int(index[0])])[0]
    if first.dim() == 3 and first.shape[0] == 1:
        first = first[0]
    if first.dim() != 2:
        return None
    return np.stack([_item(dataset[int(i)])[0].reshape(first.shape).float().numpy()
                     for i in index])


def _device_of(model: nn.Module) -> torch.device:
    for tensor in (*model.parameters(), *model.buffers()):
        return tensor.device
    return torch.device("cpu")


def check_source(config, explicit: bool) -> dict:
    """Open ``config``'s source and check its hook (the factory runs once, now, before any run
    folder is made; later reads reuse what it made) and, on resume, that it is the run's:
    returns the record ``data.json`` keeps. ``explicit``: --source was given as a flag (a
    resumed run's source is never taken from its folder's files, which are not trusted to name
    code to import). Raises ``UsageError`` with one line."""
    data, out = config.data, Path(config.folder.out)
    recorded = read_record(out) if config.folder.resume is not None else None
    if config.folder.resume is not None:
        if recorded is None or not recorded.get("streamed"):
            raise UsageError(f"cannot resume {out} with --source: it was not trained on a "
                             "model's layer")
        if not explicit:
            raise UsageError(f"cannot resume {out} without naming its source again: give "
                             f"--source {recorded.get('source')} --hook {recorded.get('hook')} "
                             "(a run folder's files never name code to import)")
    try:
        model, train, test = resolve(data.source)
        layer = find_layer(model, data.hook, data.source)
        if len(train) == 0:
            raise SourceError(f"--source {data.source}: the training dataset is empty")
        width = LayerReader(model, layer, _device_of(model)).rows(train, [0])[0].shape[1]
    except SourceError as e:
        raise UsageError(str(e)) from None
    except Exception as e:  # noqa: BLE001 - the user's model or dataset failed on an input
        raise UsageError(f"--source {data.source} --hook {data.hook}: reading the layer "
                         f"failed ({type(e).__name__}: {_line(e)})") from None
    record = {"streamed": True, "source": data.source, "hook": data.hook, "inputs": len(train),
              "test_inputs": None if test is None else len(test), "width": int(width)}
    if recorded is not None:
        for key in ("hook", "inputs", "test_inputs", "width"):
            if recorded.get(key) != record[key]:
                raise UsageError(f"cannot resume {out}: its source had {key} "
                                 f"{recorded.get(key)!r}, this one has {record[key]!r}")
    return record
