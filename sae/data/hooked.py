"""A model's layer read with a forward hook (``--source`` / ``--hook``): the inputs of a map-style
dataset, at most ``--buffer-rows`` of them a forward pass, the layer's outputs as real rows (one
per input, or one per position ``--positions`` keeps of a [B, T, D] output, :func:`select`);
several layers from one pass (:func:`capture`); and the chunk of rows computed ahead in a thread
of its own (:mod:`sae.data.streamed` uses both).

An item is an input, ``(input, label)``, ``(input, mask)``, ``(input, mask, label)`` or a dict
with ``attention_mask`` (:func:`parts_of`): the mask, true at a real position, chooses the rows
of ``--positions mask`` and the last position of ``last``.

The thread is a daemon that blocks on nothing but its computation, so it never delays the end of
a process, and a cancel stops an item-by-item read at its next item."""

from __future__ import annotations

import difflib
import threading
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn
from torch.utils.data import TensorDataset

from sae.system.process import stop_signals_to_main_thread


class SourceError(ValueError):
    """A source or hook that cannot be used; the message is one line."""


class _Captured(Exception):  # noqa: N818 - control flow, not an error: the layer's output is read
    def __init__(self, output):
        self.output = output


class _Cancelled(Exception):  # noqa: N818 - control flow: a chunk computed ahead is not wanted
    pass


def one_line(e: BaseException) -> str:
    """An error's message on one line, cut to a short prefix."""
    return " ".join(str(e).split())[:160]


def find_layer(model: nn.Module, hook: str, ref: str) -> nn.Module:
    """The submodule ``hook`` of ``model``; :class:`SourceError` naming a few that exist."""
    layers = dict(model.named_modules())
    if hook not in layers or not hook:
        names = [n for n in layers if n]
        closest = difflib.get_close_matches(hook, names, n=1)
        hint = f"; did you mean {closest[0]!r}?" if closest else ""
        raise SourceError(f"--hook {hook}: {ref}'s model has no layer {hook!r} (it has "
                          f"{', '.join(names[:8])}{', ...' if len(names) > 8 else ''}){hint}")
    return layers[hook]


MASK_KEY = "attention_mask"  # a dict item's padding mask (true: a real position)
LABEL_KEYS = ("label", "labels")  # a dict item's label


@dataclass
class Item:
    """One dataset item: its input (a tensor, or a dict of tensors the model takes as keywords),
    its label (an integer, or None) and its padding mask ([T] bool, or None)."""

    x: object
    label: int | None = None
    mask: torch.Tensor | None = None


def parts_of(item) -> Item:
    """An item as :class:`Item`: ``x``, ``(x, label)``, ``(x, mask)``, ``(x, mask, label)`` or
    ``(x, label, mask)`` (a mask is a bool tensor), or a dict whose ``attention_mask`` is the
    mask, ``label`` (or ``labels``) the label, and every other tensor the model's keywords."""
    if isinstance(item, dict):
        label = next((item[k] for k in LABEL_KEYS if k in item), None)
        mask = item.get(MASK_KEY)
        x = {k: torch.as_tensor(v) for k, v in item.items() if k not in LABEL_KEYS}
        return Item(x, int(label) if label is not None and is_label(label) else None,
                    None if mask is None else torch.as_tensor(mask).bool())
    if not isinstance(item, tuple | list):
        return Item(torch.as_tensor(item))
    mask = next((v for v in item[1:3] if isinstance(v, torch.Tensor)
                 and v.dtype == torch.bool and v.dim() >= 1), None)
    # the label is the second value, or the third after a mask
    after = item[1:2] if len(item) < 2 or item[1] is not mask else item[2:3]
    label = after[0] if after and is_label(after[0]) else None
    return Item(torch.as_tensor(item[0]), None if label is None else int(label), mask)


def item_of(item) -> tuple[torch.Tensor, int | None]:
    """(input, label or None) of a dataset item (see :func:`parts_of`)."""
    part = parts_of(item)
    return part.x, part.label


def is_label(value) -> bool:
    if isinstance(value, torch.Tensor):
        return value.numel() == 1 and not value.is_floating_point() \
            and value.dtype != torch.bool
    return isinstance(value, int | np.integer) and not isinstance(value, bool)


def _tensor_mask(tensors) -> torch.Tensor | None:
    """The mask of a ``TensorDataset``: its first bool tensor after the inputs ([n, T])."""
    return next((t for t in tensors[1:3] if t.dtype == torch.bool and t.dim() >= 2), None)


def batch(dataset, positions, stop: threading.Event | None = None) -> Item:
    """The dataset's items at ``positions`` stacked into one :class:`Item` (inputs [n, ...],
    labels [n] or None, masks [n, T] or None): one index operation for a ``TensorDataset``, an
    item at a time for any other (``stop``, once set, ends that at the next item)."""
    positions = np.asarray(positions, dtype=np.int64)
    if isinstance(dataset, TensorDataset):
        index = torch.from_numpy(positions)
        tensors = dataset.tensors
        mask = _tensor_mask(tensors)
        after = tensors[1:2] if len(tensors) < 2 or tensors[1] is not mask else tensors[2:3]
        label = after[0] if after and is_label(after[0][:1]) else None
        return Item(tensors[0][index], None if label is None else label[index],
                    None if mask is None else mask[index])
    items = [parts_of(dataset[int(i)]) for i in positions if not _cancelled(stop)]
    if _cancelled(stop):
        raise _Cancelled
    labels = [item.label for item in items]
    masks = [item.mask for item in items]
    x = {k: torch.stack([item.x[k] for item in items]) for k in items[0].x} \
        if isinstance(items[0].x, dict) else torch.stack([item.x for item in items])
    return Item(x, None if any(label is None for label in labels) else torch.tensor(labels),
                None if any(m is None for m in masks) else _stacked(masks))


def _stacked(masks: list[torch.Tensor]) -> torch.Tensor:
    if len({tuple(m.shape) for m in masks}) > 1:
        raise SourceError(f"the dataset's masks differ in shape ({tuple(masks[0].shape)} and "
                          f"{next(tuple(m.shape) for m in masks if m.shape != masks[0].shape)})"
                          "; a mask has one value per position of its input")
    return torch.stack(masks)


def inputs(dataset, positions, stop: threading.Event | None = None
           ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(inputs stacked [n, ...], labels [n] or None) of the dataset's items at ``positions``
    (:func:`batch` without the masks)."""
    got = batch(dataset, positions, stop)
    return got.x, got.label


def _cancelled(stop: threading.Event | None) -> bool:
    return stop is not None and stop.is_set()


@dataclass
class Rows:
    """A layer's rows of some inputs: ``rows`` [R, D] float32 on CPU; ``labels`` [R] (each
    row's input's label) or None; ``inputs`` [R] each row's input (its place among the inputs
    asked for) and ``positions`` [R] its position (0 for a layer without positions);
    ``sequence``: the layer's positions T, None for a layer read one row per input."""

    rows: torch.Tensor
    labels: torch.Tensor | None
    inputs: np.ndarray
    positions: np.ndarray
    sequence: int | None


def select(out: torch.Tensor, mode: str, mask: torch.Tensor | None, hook: str
           ) -> tuple[torch.Tensor, np.ndarray, np.ndarray, int | None]:
    """(rows [R, D], input [R], position [R], T or None) of one batch's layer output ``out``:
    [B, D] is one row per input; [B, T, D] one row per kept position (``mode``: all, last, or
    mask: where ``mask`` [B, T] is true; last takes the last true position when there is a
    mask); [B, ...] of more dims one flattened row per input, as a feature map is read."""
    b = len(out)
    if out.dim() < 2:
        raise SourceError(f"--hook {hook}: the layer's outputs have shape {tuple(out.shape)}; "
                          "an SAE reads [B, D] (a row per input) or [B, T, D] (a row per "
                          "position): hook a layer with one of those")
    if out.dim() != 3:
        if mode != "all":
            raise SourceError(f"--positions {mode}: --hook {hook}'s outputs have shape "
                              f"{tuple(out.shape)}, no positions ([B, T, D]) to choose from")
        return out.reshape(b, -1), np.arange(b), np.zeros(b, dtype=np.int64), None
    t = out.shape[1]
    if mask is not None and tuple(mask.shape) != (b, t):
        raise SourceError(f"--hook {hook}: the dataset's mask has shape {tuple(mask.shape[1:])}"
                          f" per input, the layer's outputs {t} positions "
                          f"({tuple(out.shape)}); give one mask value per position")
    if mode == "mask" and mask is None:
        raise SourceError("--positions mask: the dataset gives no mask; give items (input, "
                          "mask) with a bool mask, or dicts with an attention_mask")
    if mode == "all":
        keep = torch.ones(b, t, dtype=torch.bool)
    elif mode == "mask":
        keep = mask.bool().cpu()
    else:
        last = torch.full((b,), t - 1) if mask is None else _last_true(mask.bool().cpu())
        keep = torch.zeros(b, t, dtype=torch.bool)
        keep[torch.arange(b), last] = True
    where = keep.nonzero().numpy()
    return out[keep.to(out.device)], where[:, 0], where[:, 1], t


def _last_true(mask: torch.Tensor) -> torch.Tensor:
    """Each row's last true position [B] (the last position for a row with none true)."""
    t = mask.shape[1]
    ranks = torch.arange(t).expand_as(mask) * mask
    return torch.where(mask.any(1), ranks.argmax(1), torch.full_like(ranks[:, 0], t - 1))


def capture(model: nn.Module, layers: list[nn.Module], x, device: torch.device) -> list:
    """The outputs of ``layers`` (a tuple's first element) in one forward pass of ``model``
    on ``x`` (a tensor, or a dict of keyword tensors); the rest of the pass is skipped once
    every layer has run."""
    got: dict[int, object] = {}
    me = threading.get_ident()  # the thread computing ahead may run the model meanwhile

    def hook_of(i):
        def read(module, inputs, output):
            if threading.get_ident() != me:  # another pass's: its own hook reads it
                return
            got.setdefault(i, output[0] if isinstance(output, tuple | list) else output)
            if len(got) == len(layers):
                raise _Captured(None)
        return read

    handles = [layer.register_forward_hook(hook_of(i)) for i, layer in enumerate(layers)]
    try:
        if isinstance(x, dict):
            model(**{k: v.to(device) for k, v in x.items()})
        else:
            model(x.to(device))
    except _Captured:
        pass
    finally:
        for handle in handles:
            handle.remove()
    if len(got) < len(layers):
        raise SourceError("the hooked layer did not run in the model's forward pass")
    return [got[i] for i in range(len(layers))]


def checked(out, hook: str) -> torch.Tensor:
    """A layer's output as a real tensor; :class:`SourceError` otherwise."""
    if not isinstance(out, torch.Tensor):
        raise SourceError(f"--hook {hook}: the layer's output is a "
                          f"{type(out).__name__}, not a tensor")
    if out.is_complex():
        raise SourceError(f"--hook {hook}: the layer's outputs are complex "
                          f"({out.dtype}); an SAE trains on real rows: hook a layer with "
                          "real outputs")
    return out.detach()


@dataclass
class LayerReader:
    """Runs ``model`` on inputs of ``dataset`` and returns ``hook``'s output as rows, at most
    ``most`` inputs a forward pass (``--buffer-rows``: the network's inner widths times this is
    what a pass holds, whatever the number of inputs asked for). A layer of positions
    ([B, T, D]) gives a row per position ``positions`` keeps (:func:`select`)."""

    model: nn.Module
    layer: nn.Module
    device: torch.device = torch.device("cpu")
    most: int = 8192
    hook: str = ""  # the layer's name, for messages
    positions: str = "all"

    @torch.no_grad()
    def rows(self, dataset, positions, stop: threading.Event | None = None
             ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(rows [R, D] float32 on CPU, each row's label [R] or None) of the inputs at
        ``positions`` (R = n for a layer without positions); ``stop``: see :func:`inputs`."""
        read = self.read(dataset, positions, stop)
        return read.rows, read.labels

    @torch.no_grad()
    def read(self, dataset, positions, stop: threading.Event | None = None) -> Rows:
        """:class:`Rows` of the inputs at ``positions``, in their order (an input's rows in
        the order of its positions)."""
        positions = np.asarray(positions, dtype=np.int64)
        if len(positions) == 0:
            return Rows(torch.zeros(0, 0), None, np.zeros(0, np.int64), np.zeros(0, np.int64),
                        None)
        self.model.eval()
        parts, most = [], max(1, int(self.most))
        for start in range(0, len(positions), most):
            got = batch(dataset, positions[start:start + most], stop)
            out = checked(capture(self.model, [self.layer], got.x, self.device)[0], self.hook)
            rows, which, where, t = select(out, self.positions, got.mask, self.hook)
            labels = None if got.label is None else got.label[torch.from_numpy(which)]
            parts.append((rows.float().cpu(), labels, which + start, where, t))
        labels = [p[1] for p in parts]
        return Rows(torch.cat([p[0] for p in parts]) if len(parts) > 1 else parts[0][0],
                    None if any(y is None for y in labels) else torch.cat(labels),
                    np.concatenate([p[2] for p in parts]), np.concatenate([p[3] for p in parts]),
                    parts[0][4])


class Ahead:
    """The rows of one chunk, computed in a daemon thread of its own (``sae-source``) while the
    previous chunk trains: it blocks on nothing but the computation, never delays the end of the
    process, and :meth:`cancel` stops an item-by-item read at its next item."""

    def __init__(self, key, compute, order: np.ndarray):
        self.key, self._stop = key, threading.Event()
        self._done, self._error = None, None
        self._thread = threading.Thread(target=self._run, args=(compute, order),
                                        name="sae-source", daemon=True)
        self._thread.start()

    def _run(self, compute, order: np.ndarray) -> None:
        stop_signals_to_main_thread()  # Ctrl-C and SIGTERM reach the main thread only
        try:
            self._done = compute(order, self._stop)
        except BaseException as e:  # noqa: BLE001 - raised where the rows are asked for
            self._error = e

    def result(self):
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self._done

    def cancel(self, wait: bool = True) -> None:
        self._stop.set()
        if wait:
            self._thread.join()
