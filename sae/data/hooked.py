"""A model's layer read with a forward hook (``--source`` / ``--hook``): the inputs of a map-style
dataset, at most ``--buffer-rows`` of them a forward pass, the layer's outputs as real rows; and
the chunk of rows computed ahead in a thread of its own (:mod:`sae.data.streamed` uses both).

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


def item_of(item) -> tuple[torch.Tensor, int | None]:
    if isinstance(item, tuple | list):
        x = item[0]
        label = int(item[1]) if len(item) > 1 and is_label(item[1]) else None
    else:
        x, label = item, None
    return torch.as_tensor(x), label


def is_label(value) -> bool:
    if isinstance(value, torch.Tensor):
        return value.numel() == 1 and not value.is_floating_point()
    return isinstance(value, int | np.integer) and not isinstance(value, bool)


def inputs(dataset, positions, stop: threading.Event | None = None
           ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(inputs stacked [n, ...], labels [n] or None) of the dataset's items at ``positions``:
    one index operation for a ``TensorDataset``, an item at a time for any other (``stop``, once
    set, ends that at the next item)."""
    positions = np.asarray(positions, dtype=np.int64)
    if isinstance(dataset, TensorDataset):
        index = torch.from_numpy(positions)
        tensors = dataset.tensors
        labels = tensors[1][index] if len(tensors) > 1 and is_label(tensors[1][:1]) else None
        return tensors[0][index], labels
    items = [item_of(dataset[int(i)]) for i in positions if not _cancelled(stop)]
    if _cancelled(stop):
        raise _Cancelled
    labels = [label for _, label in items]
    return (torch.stack([x for x, _ in items]),
            None if any(label is None for label in labels) else torch.tensor(labels))


def _cancelled(stop: threading.Event | None) -> bool:
    return stop is not None and stop.is_set()


@dataclass
class LayerReader:
    """Runs ``model`` on inputs of ``dataset`` and returns ``hook``'s output, one row each,
    at most ``most`` inputs a forward pass (``--buffer-rows``: the network's inner widths times
    this is what a pass holds, whatever the number of inputs asked for)."""

    model: nn.Module
    layer: nn.Module
    device: torch.device = torch.device("cpu")
    most: int = 8192
    hook: str = ""  # the layer's name, for messages

    @torch.no_grad()
    def rows(self, dataset, positions, stop: threading.Event | None = None
             ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(rows [n, D] float32 on CPU, labels [n] or None) of the inputs at ``positions``;
        ``stop``: see :func:`inputs`."""
        positions = np.asarray(positions, dtype=np.int64)
        if len(positions) == 0:
            return torch.zeros(0, 0), None
        self.model.eval()

        def capture(module, inputs, output):
            raise _Captured(output[0] if isinstance(output, tuple | list) else output)

        handle = self.layer.register_forward_hook(capture)
        out, labels, most = None, [], max(1, int(self.most))
        try:
            for start in range(0, len(positions), most):
                x, y = inputs(dataset, positions[start:start + most], stop)
                rows = self._forward(x)
                if out is None:  # the rows' width is known from the first pass
                    out = torch.empty(len(positions), rows.shape[1])
                out[start:start + len(rows)] = rows
                labels.append(y)
        finally:
            handle.remove()
        return out, None if any(y is None for y in labels) else torch.cat(labels)

    def _forward(self, x: torch.Tensor) -> torch.Tensor:
        """The hooked layer's output of one batch of inputs, flattened to rows."""
        try:
            self.model(x.to(self.device))
        except _Captured as c:
            out = c.output
        else:
            raise SourceError("the hooked layer did not run in the model's forward pass")
        if not isinstance(out, torch.Tensor):
            raise SourceError(f"--hook {self.hook}: the layer's output is a "
                              f"{type(out).__name__}, not a tensor")
        if out.is_complex():
            raise SourceError(f"--hook {self.hook}: the layer's outputs are complex "
                              f"({out.dtype}); an SAE trains on real rows: hook a layer with "
                              "real outputs")
        return out.detach().reshape(len(x), -1).float().cpu()


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
