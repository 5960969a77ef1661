"""The run folder: who owns it, what may replace it, and its training history across sessions.

- **Ownership.** A run folder has one writer at a time: :func:`claim` takes an exclusive lock
  (``flock`` on ``.lock``) before anything is written and holds it until the process ends, on
  every exit (the kernel releases it, even after ``kill -9``). A second run on the same folder
  is refused with one line.
- **What this tool made.** A new folder gets a marker file (:data:`MARKER`). ``--overwrite``
  replaces only folders that carry it, or that have exactly the shape of a run folder of an
  earlier version (a valid ``config.yaml`` and nothing but run-folder entries); never the
  working directory or one of its parents.
- **History.** Each training session (the first run, then each ``--resume``) logs to its own
  ``logs/session_<n>/metrics.csv`` and records the step it started from; no session's file is
  ever rewritten. ``metrics.csv`` in the run folder is the merged view, rebuilt at the end of
  each session: the rows of each session before the step the next one resumed from, then the next.
"""

from __future__ import annotations

import csv
import fcntl
import json
import os
import shutil
from pathlib import Path

from sae.cli import UsageError, read_settings_file

__all__ = ["MARKER", "RUN_ENTRIES", "claim", "merge_history", "new_session",
           "overwritable", "release"]

MARKER = ".sae-run-folder"
LOCK = ".lock"
# what a run folder of this tool may hold (earlier versions included)
RUN_ENTRIES = {MARKER, LOCK, "config.yaml", "metrics.csv", "metrics.json", "checkpoints",
               "tensorboard", "figures", "report.html", "features.html", "hparams.yaml", "logs",
               "analysis.json", "test_l0.npy"}

_held: dict[Path, int] = {}  # folder -> open lock file descriptor
_made_parents: dict[Path, Path] = {}  # folder -> the outermost of the parents claim made for it


def _lock(folder: Path) -> None:
    fd = os.open(folder / LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise UsageError(f"run folder {folder} is in use by another training process") from None
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())
    _held[folder.resolve()] = fd


def release(folder: Path) -> None:
    """Release this process's lock on ``folder`` (exiting releases it too)."""
    fd = _held.pop(Path(folder).resolve(), None)
    if fd is not None:
        os.close(fd)


def is_locked(folder: Path) -> bool:
    """Whether a process holds ``folder``'s lock (a sweep asks before resuming a run)."""
    path = Path(folder) / LOCK
    if not path.is_file():
        return False
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(fd)


def overwritable(folder: Path) -> str | None:
    """None when ``folder`` may be replaced by ``--overwrite``, else the reason it may not."""
    here = Path.cwd().resolve()
    target = folder.resolve()
    if target == here or target in here.parents:
        return "it is the working directory or one of its parents"
    entries = {p.name for p in folder.iterdir()}
    if MARKER in entries:
        return None
    if "config.yaml" not in entries:
        return "it is not a run folder (no config.yaml)"
    strangers = sorted(entries - RUN_ENTRIES)
    if strangers:
        return f"it holds files a run folder does not ({', '.join(strangers[:3])})"
    try:
        read_settings_file(folder / "config.yaml")
    except UsageError:
        return "its config.yaml is not a run's settings"
    return None


def claim(folder: Path, mode: str) -> bool:
    """Take ``folder`` for this run; ``mode`` is new, resume or overwrite.

    Returns whether the folder was created now (a failed start then removes it again). Raises
    UsageError, before anything is written, if the folder is not this run's to take.
    """
    if folder.exists() and not folder.is_dir():
        raise UsageError(f"--out {folder} exists and is not a folder")
    if mode == "resume":
        _lock(folder)
        return False
    if folder.is_dir() and any(folder.iterdir()):
        if mode != "overwrite":
            raise UsageError(f"run folder {folder} already exists; pass --resume to continue "
                             "it or --overwrite to replace it")
        reason = overwritable(folder)
        if reason:
            raise UsageError(f"refusing to --overwrite {folder}: {reason}")
        _lock(folder)  # not while another process trains in it
        for entry in folder.iterdir():
            if entry.name == LOCK:
                continue
            shutil.rmtree(entry) if entry.is_dir() and not entry.is_symlink() else entry.unlink()
        (folder / MARKER).write_text("made by python -m sae.run\n")
        return False
    created = not folder.exists()
    top = folder.absolute()  # the outermost folder made now: a failed start removes it again
    while not top.parent.exists() and top.parent != top:
        top = top.parent
    try:
        folder.mkdir(parents=True, exist_ok=True)
        if created and top != folder.absolute():
            _made_parents[folder.absolute()] = top
        _lock(folder)
        if any(p.name not in (LOCK,) for p in folder.iterdir()):  # another run got here first
            release(folder)
            raise UsageError(f"run folder {folder} already exists; pass --resume to continue "
                             "it or --overwrite to replace it")
        (folder / MARKER).write_text("made by python -m sae.run\n")
    except OSError as e:
        raise UsageError(f"cannot create run folder {folder}: {e.strerror or e}") from None
    return created


def remove_unfinished(folder: Path, created: bool) -> None:
    """Undo a start that failed before any checkpoint: the retry then simply works."""
    if (folder / "checkpoints").is_dir() and any((folder / "checkpoints").glob("*.ckpt")):
        return
    release(folder)
    if created:
        shutil.rmtree(folder, ignore_errors=True)
        top = _made_parents.pop(folder.absolute(), None)
        parent = folder.absolute().parent
        while top is not None and parent != top.parent:
            try:
                parent.rmdir()  # only while empty: what someone else put there stays
            except OSError:
                break
            parent = parent.parent
    else:
        for entry in folder.iterdir():
            shutil.rmtree(entry, ignore_errors=True) if entry.is_dir() else entry.unlink()


# ---------------------------------------------------------------- history


def _sessions(folder: Path) -> list[tuple[int, Path]]:
    logs = folder / "logs"
    found = []
    for d in logs.glob("session_*") if logs.is_dir() else ():
        if d.name[8:].isdigit():
            found.append((int(d.name[8:]), d))
    return sorted(found)


def new_session(folder: Path, start_step: int) -> str:
    """Open the next session's log folder; returns its name (``session_<n>``).

    A run folder of an earlier version kept one ``metrics.csv``; it becomes session 0 (copied,
    not changed) before the first new session.
    """
    sessions = _sessions(folder)
    if not sessions and (folder / "metrics.csv").is_file():
        first = folder / "logs" / "session_0"
        first.mkdir(parents=True, exist_ok=True)
        shutil.copy2(folder / "metrics.csv", first / "metrics.csv")
        (first / "session.json").write_text(json.dumps({"start_step": 0}))
        sessions = [(0, first)]
    n = sessions[-1][0] + 1 if sessions else 0
    path = folder / "logs" / f"session_{n}"
    path.mkdir(parents=True, exist_ok=True)
    (path / "session.json").write_text(json.dumps({"start_step": int(start_step)}))
    return path.name


def merge_history(folder: Path) -> Path | None:
    """Write ``metrics.csv``: every session's rows that no later session logged again."""
    from sae.io import write_text

    parts = []
    for _, d in _sessions(folder):
        meta, rows = d / "session.json", d / "metrics.csv"
        start = json.loads(meta.read_text()).get("start_step", 0) if meta.is_file() else 0
        if rows.is_file():
            with open(rows, newline="") as f:
                parts.append((start, list(csv.DictReader(f))))
    if not parts:
        return None
    merged: list[dict] = []
    columns: list[str] = []
    for i, (_, rows) in enumerate(parts):
        until = parts[i + 1][0] if i + 1 < len(parts) else None
        for row in rows:
            if until is None or int(float(row.get("step") or 0)) < until:
                merged.append(row)
            for key in row:
                if key not in columns:
                    columns.append(key)
    text = _csv_text(columns, merged)
    write_text(folder / "metrics.csv", text)
    return folder / "metrics.csv"


def _csv_text(columns: list[str], rows: list[dict]) -> str:
    import io

    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=columns, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return buffer.getvalue()
