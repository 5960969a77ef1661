"""Atomic file writes: a reader (a report, TensorBoard, a resumed sweep) never sees half a file.

Every writer here goes through :func:`atomic_file`: the data goes to a temporary file in the
target's own folder (so the final rename never crosses a file system), is flushed and fsynced,
and then ``os.replace`` puts it in place in one step. If writing fails, the temporary file is
removed and an earlier file at the path is left as it was. Parent folders are created as needed.
Files get mode 0o644 (``mkstemp`` creates 0o600; these files are meant to be shared).

JSON is written strictly: NaN and ±inf (which ``json`` would write as the non-standard ``NaN`` /
``Infinity``) become ``null``, so every file parses with any JSON reader.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import IO

__all__ = ["atomic_file", "copy_file", "finite_json", "write_bytes", "write_json", "write_png",
           "write_text"]


@contextmanager
def atomic_file(path: str | os.PathLike[str], mode: str = "wb",
                encoding: str | None = None) -> Iterator[IO]:
    """Open a temporary file next to ``path``; on a clean exit it replaces ``path``.

    ``mode`` is ``"wb"`` or ``"w"`` (text, ``encoding`` default UTF-8). On an exception, the
    temporary file is removed, ``path`` is untouched and the exception propagates.
    """
    if mode not in ("w", "wb"):
        raise ValueError(f"mode must be 'w' or 'wb', not {mode!r}")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}-", suffix=".tmp")
    try:
        with os.fdopen(fd, mode, encoding=(encoding or "utf-8") if mode == "w" else None) as fh:
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_bytes(path: str | os.PathLike[str], data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically; returns the path."""
    with atomic_file(path) as fh:
        fh.write(data)
    return Path(path)


def write_text(path: str | os.PathLike[str], text: str, encoding: str = "utf-8") -> Path:
    """Write ``text`` to ``path`` atomically (UTF-8 unless told); returns the path."""
    with atomic_file(path, "w", encoding=encoding) as fh:
        fh.write(text)
    return Path(path)


def finite_json(data: object) -> object:
    """``data`` with every non-finite float replaced by None, ready for strict JSON.

    Walks mappings, lists and tuples; objects with ``tolist`` (NumPy arrays and scalars) are
    converted to Python values first.
    """
    if hasattr(data, "tolist") and not isinstance(data, str | bytes):
        data = data.tolist()
    if isinstance(data, float):
        return data if math.isfinite(data) else None
    if isinstance(data, Mapping):
        return {k: finite_json(v) for k, v in data.items()}
    if isinstance(data, list | tuple):
        return [finite_json(v) for v in data]
    return data


def write_json(path: str | os.PathLike[str], data: object, indent: int | None = 2) -> Path:
    """Write ``data`` as strict JSON (NaN and ±inf as null) atomically; returns the path.

    Raises:
        TypeError: ``data`` holds something JSON cannot represent (raised before ``path`` is
            touched).
    """
    text = json.dumps(finite_json(data), indent=indent, allow_nan=False)
    return write_text(path, text + "\n")


def write_png(path: str | os.PathLike[str], rgb) -> Path:
    """Write an RGB image ``[H, W, 3]`` uint8 as a PNG atomically; returns the path."""
    from PIL import Image  # matplotlib's own dependency, loaded only when a PNG is written

    image = Image.fromarray(rgb)
    with atomic_file(path) as fh:
        image.save(fh, format="PNG")
    return Path(path)


def copy_file(source: str | os.PathLike[str], target: str | os.PathLike[str]) -> Path:
    """Copy ``source``'s bytes to ``target`` atomically; returns the target path."""
    with open(source, "rb") as src, atomic_file(target) as fh:
        shutil.copyfileobj(src, fh)
    return Path(target)
