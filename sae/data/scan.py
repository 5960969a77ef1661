"""One streamed pass over an activation matrix: its SHA-256, its column sums and whether every
row is usable, read a block at a time.

A run needs three things of its data file before the first step: that no row holds NaN or inf
(or, in a float64 file, a value float32 cannot hold), the mean and variance of the training rows
(the decoder bias and the loss's normaliser), and the file's SHA-256 (``data.json``: a resume
or a sweep refuses other bytes). Three passes over a 3 GB file cost three reads of it; here one
read feeds all three. The blocks are read with ``pread`` into two reused buffers, so the
process holds 2 × :data:`BLOCK_BYTES` whatever the file's size (a memory map read whole counts
the whole file in the process's resident memory), and the hash of one block runs in a second
thread while the next is read and summed (``hashlib`` and numpy's reductions release the GIL).

Finding a bad row costs nothing extra: a block's sum of squares is finite, and (float64 files)
at most ``F32_MAX²`` in every column, only when each value is finite (and within float32's
range), so a row is looked for only in a block whose sums say it may hold one.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from sae.system.io import open_regular
from sae.system.process import stop_signals_to_main_thread

__all__ = ["BLOCK_BYTES", "Scan", "file_sha256", "first_nonfinite_row", "first_unusable_row",
           "moments", "scan_matrix", "sums"]

BLOCK_BYTES = 64 << 20  # bytes read at a time: two such buffers are all a scan holds
F32_MAX = float(np.finfo(np.float32).max)  # training reads every row as float32


@dataclass(frozen=True)
class Scan:
    """What one pass over a matrix found: its file's SHA-256 (None when the pass stopped at a
    bad row), each column's sum and sum of squares over all rows (float64), and the first row
    training cannot use with why (None when every row is usable)."""

    sha256: str | None
    sums: np.ndarray  # [D] float64
    squares: np.ndarray  # [D] float64
    bad: tuple[int, str] | None = None


def sums(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(each column's sum, each column's sum of squares) of ``rows`` [N, D], in float64 without
    a float64 copy of the rows."""
    return (rows.sum(0, dtype=np.float64),
            np.einsum("ij,ij->j", rows, rows, dtype=np.float64))


def moments(total: np.ndarray, squares: np.ndarray, n: int) -> tuple[np.ndarray, float]:
    """(mean row [D], E‖x − mean‖²) of ``n`` rows from their column sums and sums of squares
    (float64); the variance's terms are clamped at 0 against rounding."""
    mean = total / n
    return mean, float(np.clip(squares / n - mean * mean, 0, None).sum())


def _suspect(squares: np.ndarray, wide: bool) -> bool:
    """Whether a block with these column sums of squares may hold a bad row: NaN or inf makes a
    sum NaN or inf; in a float64 file a value beyond float32's range makes one exceed F32_MAX²
    (so may many large values within it: then the rows are looked at and none is found)."""
    return not np.isfinite(squares).all() or (wide and float(squares.max()) > F32_MAX ** 2)


def first_nonfinite_row(x: np.ndarray) -> int | None:
    """The first row holding NaN or ±inf, or None; reads the matrix in blocks of about
    ``BLOCK_BYTES``, so a memory-mapped file larger than memory is scanned, not loaded."""
    found = first_unusable_row(x, beyond_float32=False)
    return None if found is None else found[0]


def first_unusable_row(x: np.ndarray, beyond_float32: bool = True) -> tuple[int, str] | None:
    """(the first row training cannot use, why), or None: NaN or ±inf, or (``beyond_float32``,
    float64 files) a finite value that float32, which training computes in, cannot hold (it
    would become inf). Reads the matrix in blocks of about ``BLOCK_BYTES``; no numpy warning."""
    step = max(1, BLOCK_BYTES // max(1, x.shape[1] * x.itemsize))
    wide = beyond_float32 and x.dtype.itemsize > 4
    for start in range(0, len(x), step):
        block = np.asarray(x[start:start + step])
        with np.errstate(all="ignore"):
            # NaN compares False: one test finds NaN, inf and (float64) values too large
            bad = ~(np.abs(block) <= F32_MAX).all(axis=1) if wide else \
                ~np.isfinite(block).all(axis=1)
        if bad.any():
            row = int(np.argmax(bad))
            values = block[row]
            if not np.isfinite(values).all():
                return start + row, "holds NaN or inf"
            big = float(values[np.argmax(np.abs(values))])
            return start + row, (f"holds {big:.3g}, beyond the float32 range (±{F32_MAX:.3g}) "
                                 "that training computes in: numeric overflow; scale the data "
                                 "down")
    return None


def file_sha256(path: str | Path, block: int = 8 << 20) -> str:
    """SHA-256 of a file's bytes, read in blocks (a large matrix is never held whole)."""
    digest = hashlib.sha256()
    with os.fdopen(open_regular(path, follow_links=True), "rb") as f:
        while chunk := f.read(block):
            digest.update(chunk)
    return digest.hexdigest()


def scan_matrix(x, progress: Callable[[int], None] | None = None) -> Scan:
    """One pass over the matrix ``x`` (:class:`sae.data.npyfile.FileRows`, or any (N, D) array,
    whose file is then hashed separately by :func:`file_sha256`).

    ``progress(bytes read so far)`` is called after each block; an exception it raises stops
    the pass (a stopped command). Stops at the first bad row (:func:`first_unusable_row` says
    why), without a hash."""
    n, dim = x.shape
    wide = x.dtype.itemsize > 4
    total, squares = np.zeros(dim), np.zeros(dim)
    block_rows = max(1, BLOCK_BYTES // max(1, dim * x.dtype.itemsize))
    reads_file = hasattr(x, "read_into")
    digest = hashlib.sha256() if reads_file else None
    buffers = [np.empty(min(block_rows, n) * dim, x.dtype) for _ in range(2 if reads_file else 0)]
    with ThreadPoolExecutor(1, thread_name_prefix="sha256",
                            initializer=stop_signals_to_main_thread) as hasher:
        if reads_file:
            _hash_range(x, digest, 0, x.offset)  # the header: the hash is the whole file's
        pending = None
        for k, start in enumerate(range(0, n, block_rows)):
            rows = min(block_rows, n - start)
            if reads_file:
                flat = buffers[k % 2][: rows * dim]  # hashed two blocks ago: waited for below
                got = x.read_into(memoryview(flat).cast("B"), start * x.row_bytes)
                if got != flat.nbytes:
                    raise OSError(f"{x.path} was cut short while being read")
                block = flat.reshape(rows, dim)
            else:
                block = np.asarray(x[start:start + rows])
            s, q = sums(block)
            if _suspect(q, wide):
                found = first_unusable_row(block, beyond_float32=wide)
                if found is not None:
                    return Scan(None, total, squares, (start + found[0], found[1]))
            total += s
            squares += q
            if pending is not None:
                pending.result()
            if reads_file:
                pending = hasher.submit(digest.update, memoryview(flat).cast("B"))
            if progress is not None:
                progress((start + rows) * dim * x.dtype.itemsize)
        if pending is not None:
            pending.result()
    if reads_file:
        _hash_range(x, digest, x.offset + x.nbytes, os.fstat(x.fileno()).st_size)
        sha = digest.hexdigest()
    else:
        sha = file_sha256(x.filename) if getattr(x, "filename", None) else None
    return Scan(sha, total, squares)


def _hash_range(x, digest, start: int, stop: int) -> None:
    """Add the file's bytes [start, stop) (its header, or what follows the data) to ``digest``."""
    while start < stop:
        chunk = os.pread(x.fileno(), min(stop - start, BLOCK_BYTES), start)
        if not chunk:
            raise OSError(f"{x.path} was cut short while being read")
        digest.update(chunk)
        start += len(chunk)
