"""``.npy`` files from untrusted sources: checked against the opened file before any use.

A ``.npy`` file names its own shape and dtype in a header; ``numpy.load`` believes it, so a
header that claims (2**62, 2**62) costs numpy warnings and a MemoryError, and a file cut short
is found only once the data is read. Here the header is read from the opened file (a regular
file only: never a FIFO, a device or a folder, which would block or never end; see
:func:`sae.system.io.open_regular`), parsed without unpickling anything, and its promise (shape x
item
size, in Python integers) is checked against the size of that same open file before anything is
allocated or mapped. :func:`read_array` then reads a small array (labels, indices) whole from
that file, up to a bound the caller gives; :func:`map_array` memory-maps a large one from it.

Every failure is one :class:`NpyError` line that names the file.
"""

from __future__ import annotations

import math
import os
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import numpy as np
from numpy.lib import format as npy

from sae.system.io import UnsafePathError, open_regular

__all__ = ["FileRows", "Header", "NpyError", "map_array", "open_npy", "open_rows", "read_array",
           "read_header"]


class NpyError(ValueError):
    """A ``.npy`` file that cannot be used; the message names it and says why, in one line."""


@dataclass(frozen=True)
class Header:
    shape: tuple[int, ...]
    dtype: np.dtype
    fortran: bool
    offset: int  # where the data starts
    data_bytes: int  # what the header promises: the product of the shape times the item size
    file_bytes: int  # the size of the opened file


def open_npy(path: str | Path) -> BinaryIO:
    """The regular file ``path`` opened for reading (a link the user made is followed; what it
    leads to must be a regular file). Raises :class:`NpyError`."""
    path = Path(path)
    try:
        return os.fdopen(open_regular(path, follow_links=True), "rb")
    except FileNotFoundError:
        raise NpyError(f"{path} does not exist") from None
    except UnsafePathError as e:
        if "folder" in str(e):
            raise NpyError(f"{path} is a folder, not a .npy file") from None
        raise NpyError(str(e)) from None
    except OSError as e:
        raise NpyError(f"{path} cannot be read ({e.strerror or e})") from None


def read_header(f: BinaryIO, path: str | Path) -> Header:
    """The header of the ``.npy`` file open as ``f`` (positioned at its start), checked: a
    version numpy writes, a shape of integers >= 0, a dtype. Nothing is unpickled; numpy's own
    warnings (a header of Python 2) are not printed."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            version = npy.read_magic(f)
            if version == (1, 0):
                shape, fortran, dtype = npy.read_array_header_1_0(f)
            elif version in ((2, 0), (3, 0)):
                shape, fortran, dtype = npy.read_array_header_2_0(f)
            else:
                raise NpyError(f"{path}: unsupported .npy version {version}")
    except NpyError:
        raise
    except (OSError, ValueError, SyntaxError, TypeError, RecursionError, MemoryError) as e:
        reason = (str(e).splitlines() or [type(e).__name__])[0][:200]
        raise NpyError(f"{path} is not a readable .npy file ({reason})") from None
    shape = tuple(shape)
    if not all(isinstance(n, int) and n >= 0 for n in shape):
        raise NpyError(f"{path} is not a readable .npy file (its header claims shape "
                       f"{str(shape)[:80]})")
    dtype = np.dtype(dtype)
    return Header(shape, dtype, bool(fortran), f.tell(), math.prod(shape) * dtype.itemsize,
                  os.fstat(f.fileno()).st_size)


def _bytes(n: int) -> str:
    return f"{n:,}" if n < 10**15 else f"{n:.3g}"


def _checked_size(header: Header, path: Path, verb: str) -> None:
    if header.dtype.hasobject:  # reading it would unpickle
        raise NpyError(f"{path} holds {header.dtype} values (Python objects are never read)")
    held = header.file_bytes - header.offset
    if held < header.data_bytes:
        raise NpyError(f"{path} {verb}: its header promises {_bytes(header.data_bytes)} bytes of "
                       f"data (shape {str(header.shape)[:80]}, {header.dtype}) and the file "
                       f"holds {max(held, 0):,} (cut short?)")


def read_array(path: str | Path, limit: int) -> np.ndarray:
    """The array in the ``.npy`` file ``path``, read whole (a writable copy), if its data is at
    most ``limit`` bytes; refused from its header otherwise. Raises :class:`NpyError`."""
    path = Path(path)
    with open_npy(path) as f:
        header = read_header(f, path)
        if header.data_bytes > limit:
            raise NpyError(f"{path} holds {_bytes(header.data_bytes)} bytes of data (shape "
                           f"{str(header.shape)[:80]}); at most {limit:,} are read")
        _checked_size(header, path, "cannot be read")
        buffer = bytearray(header.data_bytes)
        if f.readinto(buffer) != header.data_bytes:
            raise NpyError(f"{path} cannot be read: it was cut short while being read")
    return np.frombuffer(buffer, header.dtype).reshape(
        header.shape, order="F" if header.fortran else "C")


def map_array(path: str | Path) -> np.ndarray:
    """The array in the ``.npy`` file ``path``, memory-mapped read-only from the opened file
    once its size is checked against its header. Raises :class:`NpyError`."""
    path = Path(path)
    with open_npy(path) as f:
        header = read_header(f, path)
        _checked_size(header, path, "cannot be mapped")
        if header.data_bytes == 0:
            return np.empty(header.shape, header.dtype)
        try:
            return np.memmap(f, dtype=header.dtype, mode="r", offset=header.offset,
                             shape=header.shape, order="F" if header.fortran else "C")
        except (OSError, ValueError) as e:
            reason = (str(e).splitlines() or [type(e).__name__])[0][:200]
            raise NpyError(f"{path} cannot be mapped: {reason}") from None


GAP_BYTES = 4096  # rows this close (a page) are read in one call, the gap between them too


class FileRows:
    """The rows of an (N, D) C-order array in an open ``.npy`` file, read on demand with
    ``os.pread``: indexed like a read-only numpy array by an int, a slice of step 1 or an
    integer array, each giving a new numpy array.

    Nothing is mapped, so the process holds only the rows it asked for: a memory map of a file
    read whole (a scan, an epoch) counts every page it touched in the process's resident memory,
    3 GB for a 3 GB file, while the page cache the reads go through stays the kernel's to keep
    or drop. Rows asked for together are read in increasing order, with the rows within
    :data:`GAP_BYTES` of each other in one call, then put in the asked order.
    """

    def __init__(self, fd: int, header: Header, path: Path):
        self._fd, self.shape, self.dtype = fd, header.shape, header.dtype
        self.offset, self.row_bytes = header.offset, header.shape[1] * header.dtype.itemsize
        self.path = path

    def __reduce__(self):  # to another process: the file opened and checked again there
        return open_rows, (self.path,)

    @property
    def itemsize(self) -> int:
        return self.dtype.itemsize

    @property
    def nbytes(self) -> int:
        return self.shape[0] * self.row_bytes

    def __len__(self) -> int:
        return self.shape[0]

    def fileno(self) -> int:
        return self._fd

    def read_into(self, buffer: memoryview, start_byte: int) -> int:
        """Bytes of the data from ``start_byte`` on into ``buffer``; how many were read (fewer
        only at the file's end). One call reads at most about 2 GiB on Linux: as many as it
        takes."""
        done, size = 0, len(buffer)
        while done < size:
            got = os.preadv(self._fd, [buffer[done:]], self.offset + start_byte + done)
            if got == 0:
                break
            done += got
        return done

    def _span(self, start: int, stop: int) -> np.ndarray:
        """Rows [start, stop) in one read, as a new (stop - start, D) array."""
        out = np.empty((max(stop - start, 0), self.shape[1]), self.dtype)
        if out.nbytes:
            got = self.read_into(memoryview(out).cast("B"), start * self.row_bytes)
            if got != out.nbytes:
                raise OSError(f"{self.path} was cut short while being read")
        return out

    def __getitem__(self, index) -> np.ndarray:
        n = self.shape[0]
        if isinstance(index, slice):
            start, stop, step = index.indices(n)
            if step != 1:
                raise IndexError("rows of a file are read by slices of step 1")
            return self._span(start, max(start, stop))
        if isinstance(index, int | np.integer):
            i = int(index) + n if index < 0 else int(index)
            if not 0 <= i < n:
                raise IndexError(f"row {int(index)} of {n}")
            return self._span(i, i + 1)[0]
        rows = np.asarray(index, dtype=np.int64).reshape(-1)
        rows = np.where(rows < 0, rows + n, rows)
        if len(rows) and (rows.min() < 0 or rows.max() >= n):
            raise IndexError(f"rows up to {int(rows.max())} of {n}")
        out = np.empty((len(rows), self.shape[1]), self.dtype)
        if not len(rows):
            return out
        order = np.argsort(rows, kind="stable")
        wanted = rows[order]
        # runs of rows to read at once: break where the gap to the next row passes a page
        gap_rows = max(1, GAP_BYTES // max(self.row_bytes, 1))
        breaks = np.flatnonzero(np.diff(wanted) > gap_rows) + 1
        for lo, hi in zip(np.r_[0, breaks], np.r_[breaks, len(wanted)], strict=True):
            first = int(wanted[lo])
            span = self._span(first, int(wanted[hi - 1]) + 1)
            out[order[lo:hi]] = span[wanted[lo:hi] - first]
        return out

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        whole = self[:]
        return whole if dtype is None else whole.astype(dtype)

    def close(self) -> None:
        fd, self._fd = getattr(self, "_fd", -1), -1
        if fd >= 0:
            os.close(fd)

    # closed with its last reference, as a memory map is unmapped (a plain descriptor: no
    # warning about a file left open when a check refused the data after opening it)
    __del__ = close


def open_rows(path: str | Path) -> FileRows | np.ndarray:
    """The (N, D) array in the ``.npy`` file ``path`` for reading rows on demand: a
    :class:`FileRows` of the opened file once its size is checked against its header, or,
    where rows are not contiguous in the file (Fortran order) or ``os.pread`` is missing, the
    file memory-mapped (:func:`map_array`). Raises :class:`NpyError`."""
    path = Path(path)
    f = open_npy(path)
    try:
        header = read_header(f, path)
        _checked_size(header, path, "cannot be read")
        usable = len(header.shape) == 2 and not header.fortran and hasattr(os, "preadv")
    except BaseException:
        f.close()
        raise
    if not usable:
        f.close()
        return map_array(path)
    with f:
        return FileRows(os.dup(f.fileno()), header, path)
