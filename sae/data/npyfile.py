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

__all__ = ["Header", "NpyError", "map_array", "open_npy", "read_array", "read_header"]


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
    from sae.system.io import UnsafePathError, open_regular

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
    from numpy.lib import format as npy

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
