"""Atomic file writes: a reader (a report, TensorBoard, a resumed sweep) never sees half a file.

Every writer here goes through :func:`atomic_file`: the data goes to a temporary file in the
target's own folder (so the final rename never crosses a file system), is flushed and fsynced,
and then ``os.replace`` puts it in place in one step. If writing fails, the temporary file is
removed and an earlier file at the path is left as it was. Parent folders are created as needed.
Files get mode 0o644 (``mkstemp`` creates 0o600; these files are meant to be shared).

JSON is written strictly: NaN and ±inf (which ``json`` would write as the non-standard ``NaN`` /
``Infinity``) become ``null``, so every file parses with any JSON reader.

Folders the tool did not make itself (a run folder received as a tarball, a sweep folder) are
untrusted: a planted link would make a write land outside them. :func:`open_regular` opens a
file there without following a link and without blocking (a FIFO or a device never hangs the
tool) and accepts only a regular file; :func:`read_text` reads one with a size bound taken from
the bytes read, not from the size the file claims (``/proc`` files and devices claim 0). The
files a user names (``--data``, ``--config``) may be links (``follow_links``), but what they
lead to must be a regular file all the same;
:func:`find_link` finds a link anywhere in a folder tree, so that a command can refuse the
folder before it writes anything. The atomic writers themselves never write through a link:
``os.replace`` replaces a link at the target path, not what it points to.
"""

from __future__ import annotations

import errno
import json
import math
import os
import shutil
import stat
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import IO

__all__ = ["UnsafePathError", "atomic_file", "copy_file", "find_link", "finite_json",
           "outermost_new", "remove_made_folders",
           "open_regular", "read_bytes", "read_text", "write_bytes",
           "write_json", "write_png", "write_text"]

READ_LIMIT = 64 * 2**20  # bytes: the largest metadata file (JSON, YAML, CSV) a reader takes


class UnsafePathError(OSError):
    """A path the tool would open is a link, a folder or a special file: refused, not followed.

    An ``OSError``, so the commands' disk-error handling reports it as one line too.
    """


def _kind(mode: int) -> str:
    """What a file that is not a regular file is, for a message."""
    for test, name in ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
                       (stat.S_ISCHR, "a device"), (stat.S_ISBLK, "a device"),
                       (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "a special file"


def open_regular(path: str | os.PathLike[str], flags: int = os.O_RDONLY,
                 mode: int = 0o644, follow_links: bool = False) -> int:
    """A file descriptor of the regular file ``path``, opened without following a link.

    ``O_NOFOLLOW`` refuses a link as the last component (a dangling one too, even with
    ``O_CREAT``); ``O_NONBLOCK`` keeps a FIFO from blocking the open; ``fstat`` then refuses
    anything but a regular file (FIFO, device, socket). With ``follow_links`` (a file the user
    named) a link is followed, and what it leads to is checked the same way. Raises
    :class:`UnsafePathError` with a one-line reason for these, and the plain ``OSError``
    otherwise.
    """
    path = Path(path)
    nofollow = 0 if follow_links else os.O_NOFOLLOW
    try:
        fd = os.open(path, flags | nofollow | os.O_NONBLOCK | os.O_CLOEXEC, mode)
    except OSError as e:
        if not follow_links and (e.errno == errno.ELOOP or path.is_symlink()):
            raise UnsafePathError(f"{path} is a link; refusing to follow it") from None
        if e.errno == errno.EISDIR or path.is_dir():
            raise UnsafePathError(f"{path} is a folder, not a file") from None
        if e.errno == errno.ENXIO:  # a FIFO opened for writing with no reader
            raise UnsafePathError(f"{path} is not a regular file") from None
        raise
    kind = os.fstat(fd).st_mode
    if not stat.S_ISREG(kind):
        os.close(fd)
        raise UnsafePathError(f"{path} is {_kind(kind)}, not a regular file")
    os.set_blocking(fd, True)
    return fd


def _size(limit: int) -> str:
    return f"{limit // 2**20} MiB" if limit >= 2**20 else f"{limit:,} bytes"


def read_bytes(path: str | os.PathLike[str], limit: int = READ_LIMIT,
               follow_links: bool = False) -> bytes:
    """The bytes of the regular file ``path`` (no link followed unless ``follow_links``), at
    most ``limit`` of them: a larger file is refused from its size before it is read, and
    the read stops at ``limit`` + 1 bytes whatever size the file claims.

    Raises:
        UnsafePathError: a link, folder or special file, or a file over ``limit`` bytes.
        OSError: the file cannot be read.
    """
    fd = open_regular(path, follow_links=follow_links)
    with os.fdopen(fd, "rb") as fh:
        if os.fstat(fh.fileno()).st_size > limit:
            raise UnsafePathError(f"{path} is larger than {_size(limit)}")
        data = fh.read(limit + 1)
    if len(data) > limit:
        raise UnsafePathError(f"{path} is larger than {_size(limit)}")
    return data


def read_text(path: str | os.PathLike[str], limit: int = READ_LIMIT,
              follow_links: bool = False) -> str:
    """The UTF-8 text of the regular file ``path`` (:func:`read_bytes`).

    Raises:
        UnsafePathError: a link, folder or special file, or a file over ``limit`` bytes.
        OSError: the file cannot be read.
        UnicodeDecodeError: the bytes are not UTF-8.
    """
    return read_bytes(path, limit, follow_links).decode("utf-8")


def find_link(folder: str | os.PathLike[str], skip: tuple[str, ...] = ()) -> Path | None:
    """The first link inside ``folder``'s tree (links are not followed), or None.

    ``skip`` names top-level entries not to look into (they are checked on their own).
    """
    folder = Path(folder)
    for root, dirs, files in os.walk(folder, followlinks=False):
        if Path(root) == folder:
            dirs[:] = [d for d in dirs if d not in skip]
        for name in (*dirs, *files):
            if os.path.islink(os.path.join(root, name)):
                return Path(root) / name
    return None


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
    """Copy ``source``'s bytes to ``target`` atomically; returns the target path.

    ``source`` must be a regular file, not a link (:func:`open_regular`).
    """
    with os.fdopen(open_regular(source), "rb") as src, atomic_file(target) as fh:
        shutil.copyfileobj(src, fh)
    return Path(target)


def outermost_new(out: str | os.PathLike[str]) -> Path | None:
    """The outermost folder that making ``out`` (with its parents) creates, or None when ``out``
    exists: what a command that fails or is stopped removes again (:func:`remove_made_folders`)."""
    out = Path(out)
    if out.exists():
        return None
    made = out.absolute()
    while not made.parent.exists() and made.parent != made:
        made = made.parent
    return made


def remove_made_folders(out: str | os.PathLike[str], made: Path | None) -> None:
    """Remove ``out`` and its parents up to ``made`` (:func:`outermost_new`), each only while it
    is empty: what someone else put there stays, and so do the folders above it."""
    if made is None:
        return
    folder = Path(out).absolute()
    while True:
        try:
            folder.rmdir()
        except OSError:
            return
        if folder == made:
            return
        folder = folder.parent
