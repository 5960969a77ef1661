"""Activations of any PyTorch model's layer, read while the model runs (``--source``, ``--hook``).

A source is a model and the inputs it runs on: ``factory()`` of ``--source pkg.module:factory``
(or ``sae.train(source=(model, dataset))``) returns ``(model, dataset)`` or ``(model, {"train":
dataset, "test": dataset})``, each dataset map-style (``len`` and ``dataset[i]``), each item an
input tensor or ``(input, label, ...)``. The layer ``--hook`` names (as ``model.named_modules()``
names it) is read with a forward hook, the model in eval mode and without gradients; the rest of
the forward pass is skipped. A row is the layer's output for one input, flattened; a layer of
positions ([B, T, D]) gives a row per position ``--positions`` keeps (:mod:`sae.data.tokens`:
the chunks are then of whole inputs, their rows shuffled among themselves), and
``--hook a,b,c`` reads its layers' rows from the row files of one shared pass
(:mod:`sae.data.rowcache`).

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
(:data:`MOMENT_ROWS`). Labels, when the items carry them, feed the probes and the class figures
(labels are classes, below :data:`sae.data.matrix.MAX_CLASSES`, as for ``--data``); inputs that
are images (``[h, w]`` or ``[1, h, w]``) are shown in the feature browser.

**Every pass through the network takes at most** ``--buffer-rows`` **inputs** (validation, test,
the moments' and the PCA's samples, rows asked for directly): memory grows with that setting,
never with the size of a split. Rows must be real and finite: complex outputs, NaN or Inf are
refused with one line before training.

**Threads end with their run.** The chunk computed ahead runs in a daemon thread of its own,
which blocks on nothing but its computation (an item-by-item read stops at the next item once
cancelled); the data module's ``teardown`` (the fit's end) and ``on_exception`` (a stop, a
non-finite loss) cancel it, and :func:`release_python_source`, where ``sae.train`` ends, closes
every stream still open: no ``sae-source`` thread outlives a run or delays the end of a process.
"""

from __future__ import annotations

import importlib
import threading
import weakref
from pathlib import Path

import lightning.pytorch as L
import numpy as np
import torch
from torch import nn
from torch.utils.data import TensorDataset

from sae.data.hooked import (
    Ahead,
    LayerReader,
    SourceError,
    find_layer,
    inputs,
    item_of,
    one_line,
)
from sae.data.images import EpochShuffle, IndexedLoaders
from sae.data.matrix import MAX_CLASSES
from sae.data.matrixdata import PCA_ROWS, TrainMoments
from sae.data.rowcache import cached_reader
from sae.data.rundata import read_record
from sae.data.scan import moments, sums
from sae.data.splits import val_rows
from sae.data.tokens import RowLayout, TokenShuffle, row_counts, row_texts, sharded
from sae.metrics import principal_components
from sae.settings.cli import UsageError

MOMENT_ROWS = 65536  # training inputs the mean row and variance are computed from, at most
PYTHON_SOURCE = "python"  # --source of a (model, dataset) handed to sae.train
_PYTHON_SOURCES: dict[str, tuple] = {}  # what sae.train registered under PYTHON_SOURCE
_RESOLVED: dict[str, tuple] = {}  # --source -> (model, train, test): a factory runs once
_OPEN: weakref.WeakSet = weakref.WeakSet()  # StreamedRows that may have a chunk computed ahead


def register_python_source(source) -> str:
    """Hold ``(model, dataset)`` for the run :func:`sae.train` starts next; returns the
    ``--source`` that names it."""
    _PYTHON_SOURCES[PYTHON_SOURCE] = source
    _RESOLVED.pop(PYTHON_SOURCE, None)
    return PYTHON_SOURCE


def release_python_source() -> None:
    """The run :func:`sae.train` started is over: the Python source it held is dropped and
    every stream still open is closed (:func:`close_streams`)."""
    _PYTHON_SOURCES.pop(PYTHON_SOURCE, None)
    _RESOLVED.pop(PYTHON_SOURCE, None)
    close_streams()


def close_streams() -> None:
    """Close every :class:`StreamedRows` of this process: a chunk computed ahead is cancelled
    and its thread waited for (at most the one forward pass in flight), so none is left."""
    for rows in list(_OPEN):
        rows.close()


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
                              f"({type(e).__name__}: {one_line(e)})") from None
        except SystemExit as e:  # sys.exit() in the module: its code, not the run's end
            raise SourceError(f"--source {ref}: importing {module_name} {_exited(e)}") from None
        factory = getattr(module, attr, None)
        if not callable(factory):
            raise SourceError(f"--source {ref}: {module_name} has no callable {attr}")
        try:
            made = factory()
        except Exception as e:  # noqa: BLE001 - the factory is the user's code
            raise SourceError(f"--source {ref}: {attr}() failed "
                              f"({type(e).__name__}: {one_line(e)})") from None
        except SystemExit as e:
            raise SourceError(f"--source {ref}: {attr}() {_exited(e)}") from None
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


def _exited(e: SystemExit) -> str:
    """What ``sys.exit(code)`` in a source's code said: its code, or its message."""
    if e.code is None or isinstance(e.code, int):
        return f"exited with code {e.code or 0}"
    return f"exited ({one_line(e)})"


class StreamedRows:
    """The training rows of a source, computed a chunk of the epoch's order at a time.

    ``rows[positions]`` (what the loader asks for, one batch in the sampler's order) is served
    from the current chunk, which is the chunk that holds the first position (computed then,
    unless it was computed ahead: while the batches of one chunk train, the next one's rows are
    computed in a background thread, the same rows the same way). Positions the chunk does not
    hold (a batch across two chunks, another rank's order, a direct call) are computed as they
    are asked for."""

    def __init__(self, reader: LayerReader, dataset, index: np.ndarray, width: int,
                 sampler: BufferedShuffle | TokenShuffle, chunk: int,
                 layout: RowLayout | None = None):
        self.reader, self.dataset, self.index = reader, dataset, np.asarray(index)
        self.layout = layout  # a layer of positions: rows per input (None: one each)
        self.width, self.sampler, self.chunk = width, sampler, max(1, int(chunk))
        self._key, self._order = None, np.zeros(0, dtype=np.int64)  # the chunk's positions
        self._slot = np.full(len(self), -1, dtype=np.int64)  # position -> row of block
        self._block = torch.zeros(0, width)
        self._ahead: Ahead | None = None  # the chunk computed in the background
        self._closed = False  # after close(): rows computed as asked, none ahead
        _OPEN.add(self)

    def __len__(self) -> int:
        return len(self.index) if self.layout is None else len(self.layout)

    @property
    def shape(self) -> tuple[int, int]:
        return (len(self), self.width)

    def __getitem__(self, i) -> torch.Tensor:
        if isinstance(i, slice):
            positions = np.arange(len(self))[i]
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
        out[torch.from_numpy(~held)] = self.fetch(positions[~held])
        return out

    def fetch(self, positions: np.ndarray, stop: threading.Event | None = None
              ) -> torch.Tensor:
        """The rows at ``positions`` [n, D], computed now."""
        if self.layout is None:
            return self.reader.rows(self.dataset, self.index[positions], stop)[0]
        return self.layout.fetch(self.reader, self.dataset, self.index, positions, stop)

    def _compute(self, order: np.ndarray, stop: threading.Event | None = None
                 ) -> tuple[np.ndarray, torch.Tensor]:
        return order, self.fetch(order, stop)

    def close(self, wait: bool = True) -> None:
        """No chunk is computed ahead from now on; the one in flight is cancelled and, with
        ``wait``, its thread waited for (the data module's teardown, the end of sae.train)."""
        self._closed = True
        ahead, self._ahead = self._ahead, None
        if ahead is not None:
            ahead.cancel(wait)
        _OPEN.discard(self)

    def _load_chunk_of(self, position: int) -> None:
        where = self.sampler.chunk_of(position, self.chunk)
        if where is None or where == self._key:
            return
        epoch, start = where
        self._slot[self._order] = -1  # the previous chunk is dropped first
        self._block = torch.zeros(0, self.width)
        ahead, self._ahead = self._ahead, None
        if ahead is not None and ahead.key == where:
            order, block = ahead.result()
        else:
            if ahead is not None:  # not the chunk asked for: one computation at a time
                ahead.cancel()
            order, block = self._compute(self.sampler.epoch_order(epoch)[
                start:self.sampler.span(start, self.chunk)])
        self._slot[order] = np.arange(len(order))
        self._key, self._order, self._block = where, order, block
        following = self.sampler.span(start, self.chunk)
        if following < len(self) and not self._closed:  # the next chunk, meanwhile
            order = self.sampler.epoch_order(epoch)[
                following:self.sampler.span(following, self.chunk)].copy()
            self._ahead = Ahead((epoch, following), self._compute, order)


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
        if sharded():
            return None
        self.epoch_order(self.epoch)
        if not 0 <= position < len(self._place):
            return None
        place = int(self._place[position])
        return (self.epoch, place - place % chunk)

    def span(self, start: int, chunk: int) -> int:
        """Where the chunk that starts at ``start`` ends."""
        return start + chunk


class StreamedDataModule(TrainMoments, IndexedLoaders, L.LightningDataModule):
    """Train / validation / test rows of a source's layer (see the module docstring)."""

    images = None  # no image dataset behind the rows (the inputs themselves may be images)
    test_rows = None
    test_texts = None
    truth = None

    def __init__(self, source: str, hook: str, batch_size: int = 256,
                 val_size: int | float | None = None,
                 split_seed: int = 0, limit_train: int | None = None,
                 limit_test: int | None = None, shuffle_seed: int = 0, buffer_rows: int = 8192,
                 positions: str = "all"):
        super().__init__()
        self.source, self.hook, self.positions = source, hook, positions
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
        # --hook a,b,c: the layer's rows were read with the others', into a row file
        self.reader = cached_reader(self.source, self.hook) or LayerReader(
            model, layer, _device_of(model), self.buffer_rows, self.hook, self.positions)
        n = len(train)
        carved = 1 if test is not None else 2
        self.val_size = val_rows(self.val_size, n)  # a count from here on
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
        sequence = self.reader.read(train, self.train_index[:1]).sequence
        if sequence is not None:  # rows per position: a pass holds --buffer-rows rows
            self.reader.most = max(1, self.buffer_rows // (1 if self.positions == "last" else
                                                           sequence))
        val = self.reader.read(train, np.sort(perm[:v]))
        self.val_x, val_y = val.rows, val.labels
        test_set, test_idx = (test, np.arange(len(test))) if test is not None else \
            (train, np.sort(perm[v:2 * v]))
        if self.limit_test:
            test_idx = test_idx[: self.limit_test]
        read = self.reader.read(test_set, test_idx)
        self.test_x, test_y = read.rows, read.labels
        if sequence is not None:  # what the feature browser shows of each row
            self.test_texts = row_texts(test_set, test_idx, read.inputs, read.positions)
            test_idx = test_idx[read.inputs]
        self._check_finite((self.val_x, self.test_x), "the validation and test inputs")
        self.has_labels = val_y is not None and test_y is not None
        self.class_names = _class_names((val_y, test_y), len(self.train_index), self.source) \
            if self.has_labels else ["all inputs"]
        self.val_y = val_y if self.has_labels else torch.zeros(len(self.val_x), dtype=torch.long)
        self.test_y = test_y if self.has_labels else torch.zeros(len(self.test_x),
                                                                 dtype=torch.long)
        self.test_row_numbers = test_idx  # each test row's input
        self.test_positions = read.positions  # and its position (0 without positions)
        self.test_images = _images(test_set, test_idx) if sequence is None else None
        self.dataset = f"{type(model).__name__}.{self.hook}"
        self._train_rows(train, self.val_x.shape[1], sequence)
        self._loaded = True
        self._moments()  # here, where a SourceError is the run's one line: NaN or Inf rows

    def _train_rows(self, train, width: int, sequence: int | None) -> None:
        """The training rows, streamed: a row per input, or per kept position of a layer of
        positions (:mod:`sae.data.tokens`), and their labels (read lazily: only probes on the
        training split use them)."""
        layout = None
        if sequence is None:
            self._sampler = BufferedShuffle(len(self.train_index), self.shuffle_seed)
        else:
            layout = RowLayout(row_counts(train, self.train_index, self.positions, sequence,
                                          self.reader.most))
            self._sampler = TokenShuffle(layout, self.reader.most, self.shuffle_seed)
        self.train_x = StreamedRows(self.reader, train, self.train_index, width, self._sampler,
                                    self.buffer_rows, layout)
        self.train_y = _Labels(train, self.train_index, self.has_labels, layout)

    def _check_finite(self, blocks, what: str) -> None:
        bad = sum(int((~torch.isfinite(rows)).sum()) for rows in blocks)
        if bad:
            raise SourceError(f"--source {self.source} --hook {self.hook}: the layer's outputs "
                              f"hold NaN or Inf ({bad:,} values in the rows of {what}); an SAE "
                              "trains on finite rows")

    def teardown(self, stage: str | None = None) -> None:
        """The fit's end: the chunk computed ahead is dropped and its thread ends."""
        self.close()

    def on_exception(self, exception: BaseException) -> None:
        """A stop or failure in the fit: the chunk computed ahead is cancelled, not waited for
        (its daemon thread never delays the end of the process)."""
        self.close(wait=False)

    def close(self, wait: bool = True) -> None:
        rows = getattr(self, "train_x", None)
        if isinstance(rows, StreamedRows):
            rows.close(wait)

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
        """(mean row, E‖x − x̄‖²) of the moment sample, summed in float64 a block of rows at a
        time (memory holds one block); NaN or Inf rows are refused, counted, before any sum."""
        if self._moments_cache is None:
            self.load()
            sample, block = self._sample(MOMENT_ROWS), 4096
            total, squares, bad = 0.0, 0.0, 0
            for start in range(0, len(sample), block):
                rows = sample[start:start + block]
                finite = torch.isfinite(rows)
                if bad or not finite.all():
                    bad += int((~finite).sum())
                    continue
                s, q = sums(rows.numpy())
                total, squares = total + s, squares + q
            if bad:
                raise SourceError(f"--source {self.source} --hook {self.hook}: the layer's "
                                  f"outputs hold NaN or Inf ({bad:,} values in the rows of "
                                  f"{len(sample):,} training inputs); an SAE trains on finite "
                                  "rows")
            mean, var = moments(total, squares, len(sample))
            self._moments_cache = torch.from_numpy(mean).float(), var
        return self._moments_cache

    def _sample(self, n: int) -> _Sample:
        rows = len(self.train_x)
        pick = np.unique(np.linspace(0, rows - 1, min(rows, n)).round().astype(np.int64))
        return _Sample(self.train_x, pick)

    def train_pca(self):
        if self._pca is None:
            sample = self._sample(PCA_ROWS)
            self._pca = principal_components(sample[0:len(sample)])
        return self._pca


class _Sample:
    """The training rows at ``picked``, computed a slice at a time as they are read."""

    def __init__(self, rows: StreamedRows, picked: np.ndarray):
        self.rows, self.picked = rows, picked

    def __len__(self) -> int:
        return len(self.picked)

    def __getitem__(self, i: slice) -> torch.Tensor:
        return self.rows.fetch(self.picked[i])


def _class_names(labels, rows: int, ref: str) -> list[str]:
    """The class names of labels (each tensor of a split): labels are classes, 0 to
    :data:`MAX_CLASSES` − 1 and no more of them than training ``rows``, as for ``--data``
    (ids such as 10⁹ would size every class figure and probe); :class:`SourceError`."""
    low = min(int(y.min()) for y in labels if len(y))
    high = max(int(y.max()) for y in labels if len(y))
    if low < 0 or high >= MAX_CLASSES:
        raise SourceError(f"--source {ref}: a label of {low if low < 0 else high:,}; labels are "
                          f"classes, 0 to {MAX_CLASSES - 1:,} (an item's integer second value is "
                          "its label)")
    if high + 1 > rows:
        raise SourceError(f"--source {ref}: {high + 1:,} classes (labels up to {high}) for "
                          f"{rows:,} training inputs; more classes than inputs cannot be learned")
    return [str(c) for c in range(high + 1)]


class _Labels:
    """Training labels, read from the dataset's items when asked for (0 without labels)."""

    def __init__(self, dataset, index: np.ndarray, has_labels: bool,
                 layout: RowLayout | None = None):
        self.dataset, self.index, self.has_labels = dataset, index, has_labels
        self.layout = layout  # rows per position: a row's label is its input's

    def __len__(self) -> int:
        return len(self.index) if self.layout is None else len(self.layout)

    def __getitem__(self, i) -> torch.Tensor:
        positions = np.arange(len(self))[i] if isinstance(i, slice) else \
            np.atleast_1d(np.asarray(i.cpu() if isinstance(i, torch.Tensor) else i))
        if not self.has_labels:
            return torch.zeros(len(positions), dtype=torch.long)
        if self.layout is not None:
            positions = self.layout.inputs_of(positions)
        if isinstance(self.dataset, TensorDataset):
            return inputs(self.dataset, self.index[positions])[1]
        return torch.tensor([item_of(self.dataset[int(self.index[p])])[1] for p in positions])


def _images(dataset, index: np.ndarray) -> np.ndarray | None:
    """[n, h, w] of inputs that are images (2-D, or one channel), else None."""
    if len(index) == 0:
        return None
    first = item_of(dataset[int(index[0])])[0]
    if first.dim() == 3 and first.shape[0] == 1:
        first = first[0]
    if first.dim() != 2:
        return None
    return np.stack([item_of(dataset[int(i)])[0].reshape(first.shape).float().numpy()
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
        reader = LayerReader(model, layer, _device_of(model), hook=data.hook,
                             positions=data.positions)
        read = reader.read(train, [0])
        width = read.rows.shape[1]
    except SourceError as e:
        raise UsageError(str(e)) from None
    except Exception as e:  # noqa: BLE001 - the user's model or dataset failed on an input
        raise UsageError(f"--source {data.source} --hook {data.hook}: reading the layer "
                         f"failed ({type(e).__name__}: {one_line(e)})") from None
    record = {"streamed": True, "source": data.source, "hook": data.hook, "inputs": len(train),
              "test_inputs": None if test is None else len(test), "width": int(width)}
    if read.sequence is not None:  # a row per position: which, of how many
        record.update(positions=data.positions, sequence=read.sequence)
    if recorded is not None:
        for key in ("hook", "inputs", "test_inputs", "width", "positions", "sequence"):
            if recorded.get(key) != record.get(key):
                raise UsageError(f"cannot resume {out}: its source had {key} "
                                 f"{recorded.get(key)!r}, this one has {record.get(key)!r}")
    return record
