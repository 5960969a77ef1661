"""Rows per position of a sequence layer (``--hook`` on a [B, T, D] output): where each input's
rows lie among a split's rows, the epoch's order of those rows, and what the feature browser
shows of a row (its input, its position, and the tokens around it).

An input of a sequence layer gives several rows (T with ``--positions all``, one with ``last``,
its true mask positions with ``mask``). The rows of a split are numbered input by input,
position by position; :class:`RowLayout` maps a row's number to its input. The epoch's order
(:class:`TokenShuffle`) is an activation buffer's: the inputs in a seeded random order, cut
into chunks of whole inputs (``--buffer-rows`` rows at most), and the rows of each chunk in a
random order of their own, so that every batch mixes inputs and positions. The order is drawn
from (seed, epoch) alone, so a resumed run serves the very rows it would have."""

from __future__ import annotations

import threading

import numpy as np
import torch

from sae.data.hooked import batch
from sae.data.images import EpochShuffle

CONTEXT = 4  # tokens shown on each side of a row's position


def sharded() -> bool:
    """Whether several DDP processes train, each computing only its own batches' rows."""
    dist = torch.distributed
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


class RowLayout:
    """Where the rows of a split's inputs lie: input j's rows are ``offsets[j]`` to
    ``offsets[j + 1]``, its positions in order (``counts[j]`` of them)."""

    def __init__(self, counts: np.ndarray):
        self.counts = np.asarray(counts, dtype=np.int64)
        self.offsets = np.concatenate([[0], np.cumsum(self.counts)]).astype(np.int64)

    def __len__(self) -> int:
        return int(self.offsets[-1])

    def inputs_of(self, rows: np.ndarray) -> np.ndarray:
        """Each row's input (its place in the split) [R]."""
        return np.searchsorted(self.offsets, rows, side="right") - 1

    def fetch(self, reader, dataset, index: np.ndarray, rows: np.ndarray,
              stop: threading.Event | None = None) -> torch.Tensor:
        """The rows numbered ``rows`` [R, D]: the model runs once on each input they come
        from, in the inputs' order, and each row is picked from its input's rows."""
        slots = self.inputs_of(rows)
        inputs, back = np.unique(slots, return_inverse=True)
        block = reader.rows(dataset, index[inputs], stop)[0]
        start = np.concatenate([[0], np.cumsum(self.counts[inputs])[:-1]]).astype(np.int64)
        return block[torch.from_numpy(start[back] + rows - self.offsets[slots])]


def row_counts(dataset, index: np.ndarray, mode: str, t: int, most: int) -> np.ndarray:
    """Rows of each input at ``index``: T for all, one for last, the true positions of its
    mask for mask (the masks read without running the model, ``most`` items at a time)."""
    if mode == "all":
        return np.full(len(index), t, dtype=np.int64)
    if mode == "last":
        return np.ones(len(index), dtype=np.int64)
    counts = [batch(dataset, index[s:s + most]).mask.reshape(-1, t).sum(1).numpy()
              for s in range(0, len(index), most)]
    return np.concatenate(counts).astype(np.int64) if counts else np.zeros(0, np.int64)


class TokenShuffle(EpochShuffle):
    """The epoch's order of a split's rows (see the module docstring): inputs shuffled, cut
    into chunks of ``chunk`` inputs, the rows of each chunk shuffled among themselves; tells
    where a row falls, so a chunk's rows are computed together, one forward pass each input."""

    def __init__(self, layout: RowLayout, chunk: int, seed: int = 0):
        super().__init__(len(layout), seed)
        self.layout, self.chunk = layout, max(1, int(chunk))
        self._epoch, self._order = None, np.zeros(0, np.int64)
        self._place, self._starts = np.zeros(0, np.int64), np.zeros(1, np.int64)

    def rows(self, g: torch.Generator):
        return iter(self._draw(g)[0].tolist())

    def _draw(self, g: torch.Generator) -> tuple[np.ndarray, np.ndarray]:
        """(the rows' order, where each chunk starts in it), drawn from ``g``."""
        counts, offsets = self.layout.counts, self.layout.offsets
        inputs = torch.randperm(len(counts), generator=g).numpy()
        lengths = counts[inputs]
        ends = np.cumsum(lengths)
        order = np.repeat(offsets[inputs] - (ends - lengths), lengths) + np.arange(int(ends[-1])
                                                                                   if len(ends)
                                                                                   else 0)
        starts = np.concatenate([[0], ends[self.chunk - 1::self.chunk]]).astype(np.int64)
        starts = np.unique(np.append(starts, len(order)))
        for a, b in zip(starts[:-1], starts[1:], strict=True):
            order[a:b] = order[a:b][torch.randperm(int(b - a), generator=g).numpy()]
        return order.astype(np.int64), starts

    def epoch_order(self, epoch: int) -> np.ndarray:
        if epoch != self._epoch:  # the order __iter__ draws for this epoch
            state = np.random.SeedSequence([self.seed, epoch]).generate_state(2)
            g = torch.Generator().manual_seed(int(state[0]) << 32 | int(state[1]))
            self._order, self._starts = self._draw(g)
            self._place = np.empty_like(self._order)
            self._place[self._order] = np.arange(len(self._order))
            self._epoch = epoch
        return self._order

    def chunk_of(self, position: int, chunk: int) -> tuple[int, int] | None:
        """(epoch, start in the order of the chunk that holds row ``position``); None under
        DDP, where each process computes only the rows of its own batches."""
        if sharded():
            return None
        self.epoch_order(self.epoch)
        if not 0 <= position < len(self._place):
            return None
        place = int(self._place[position])
        k = int(np.searchsorted(self._starts, place, side="right")) - 1
        return (self.epoch, int(self._starts[k]))

    def span(self, start: int, chunk: int) -> int:
        """Where the chunk that starts at ``start`` ends, in the current epoch's order."""
        k = int(np.searchsorted(self._starts, start, side="right"))
        return int(self._starts[min(k, len(self._starts) - 1)])


def token_names(dataset):
    """id -> the token's text, when ``dataset`` gives one: a ``vocab`` (a sequence of strings,
    or a mapping from id to string) or a ``decode(ids) -> str`` (a tokenizer's); else None and
    the ids are shown. The dataset is the user's own object: a failing lookup shows the id."""
    vocab, decode = getattr(dataset, "vocab", None), getattr(dataset, "decode", None)
    if vocab is None and not callable(decode):
        return None

    def name(token: int) -> str:
        try:
            text = vocab[token] if vocab is not None else decode([token])
        except (IndexError, KeyError, TypeError, ValueError):
            return str(token)
        return text if isinstance(text, str) and text.strip() else str(token)
    return name


def row_texts(dataset, index: np.ndarray, inputs: np.ndarray, positions: np.ndarray
              ) -> np.ndarray:
    """What the feature browser shows of each row: ``input i · position t``, and for an input
    of token ids (a 1-D integer tensor) the tokens around the position, the row's in brackets,
    as text where the dataset gives its vocabulary (:func:`token_names`).
    ``index``: the split's inputs; ``inputs`` [R], ``positions`` [R]: each row's."""
    texts, tokens = [], {}
    name = token_names(dataset) or str
    for slot, t in zip(inputs.tolist(), positions.tolist(), strict=True):
        i = int(index[slot])
        if i not in tokens:
            x = batch(dataset, [i]).x
            x = x[0] if isinstance(x, torch.Tensor) else x.get("input_ids", [None])[0]
            ids = isinstance(x, torch.Tensor) and x.dim() == 1 and not x.is_floating_point()
            tokens[i] = [name(v) for v in x.tolist()] if ids else None
        text = f"input {i} · position {t}"
        ids = tokens[i]
        if ids is not None and t < len(ids):
            left = " ".join(ids[max(0, t - CONTEXT):t])
            right = " ".join(ids[t + 1:t + 1 + CONTEXT])
            text += f": {'… ' if t > CONTEXT else ''}{left} [{ids[t]}] {right}" \
                    f"{' …' if t + 1 + CONTEXT < len(ids) else ''}"
        texts.append(" ".join(text.split()))
    return np.array(texts, dtype=object)
