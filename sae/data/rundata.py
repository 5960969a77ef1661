"""What a run trains on, checked before any work and recorded in its folder (``data.json``).

For ``--data`` runs :func:`check_data` reads and checks every file of the activation data
(:mod:`sae.data.matrix`: a missing file, wrong rank, a dtype that is not a float, NaN or inf rows,
labels of the wrong length) and, on ``--resume``, compares it with the record the run folder
holds: a file with another D, or the same D and other bytes (SHA-256), is refused, so that no run
mixes two data sets. Each failure is one :class:`sae.settings.setting.UsageError` line (exit 2)
before the
run folder is touched. :func:`write_record` writes the record when a fresh run starts.

Pages built later from a run say whether its data changed since (:func:`changed_data`, by the
SHA-256 it recorded, as ``--resume`` refuses it): ``sae.pages.features`` refuses such a run, the
report says so. A file is hashed once per process while its size and time stay the same.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from pathlib import Path

from sae.data.imagefiles import find_folder, not_found, training_images
from sae.data.splits import large_val_note, val_rows
from sae.settings.config import RunConfig
from sae.settings.setting import UsageError
from sae.system.io import open_regular, read_text, write_json
from sae.system.process import stop_signals_to_main_thread

__all__ = ["RECORD", "DataCheck", "changed_data", "check_data", "check_split", "check_sweep_data",
           "current_sha256", "header_record",
           "read_record", "same_data", "write_record"]

RECORD = "data.json"  # in the run folder: sae.data.matrix.describe of the data it trains on

_HASHED: dict[tuple, str] = {}  # (path, device, inode, size, mtime) -> SHA-256


def _stamp(path: str, info) -> tuple:
    return (path, info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns)


def current_sha256(path: str | Path) -> str:
    """The SHA-256 of the regular file ``path`` now (a link followed; a FIFO or a device is
    refused, never read), hashed once per process while the file stays the same.

    Raises:
        OSError: the file cannot be read (sae.system.io.UnsafePathError: not a regular file).
    """
    with os.fdopen(open_regular(path, follow_links=True), "rb") as f:
        key = _stamp(str(path), os.fstat(f.fileno()))
        if key not in _HASHED:
            digest = hashlib.sha256()
            while chunk := f.read(8 << 20):
                digest.update(chunk)
            _HASHED[key] = digest.hexdigest()
        return _HASHED[key]


def _remember(record: dict) -> None:
    """Keep the SHA-256 the checks computed, so that a page built in the same process does not
    read the files again."""
    for split in ("train", "val", "test"):
        entry = record.get(split)
        if isinstance(entry, dict):
            try:
                _HASHED[_stamp(entry["path"], os.stat(entry["path"]))] = entry["sha256"]
            except (OSError, KeyError, TypeError):
                pass


def changed_data(folder: str | Path) -> str | None:
    """Why the files a ``--data`` run was trained on no longer hold that data (one line), or
    None: an image run, a run without a readable record, or the same bytes (SHA-256)."""
    recorded = read_record(folder)
    if recorded is None:
        return None
    for split in ("train", "val", "test"):
        entry = recorded.get(split)
        if not isinstance(entry, dict) or not isinstance(entry.get("path"), str):
            continue
        path = entry["path"][:4096]
        try:
            now = current_sha256(path)
        except (OSError, ValueError) as e:  # ValueError: a NUL in the recorded path
            reason = getattr(e, "strerror", None) or str(e)
            return f"its {split} matrix {path[:200]} cannot be read now ({reason})"
        if now != entry.get("sha256"):
            return (f"its {split} matrix {path[:200]} has changed since training (SHA-256 "
                    f"{now[:12]}…, recorded {str(entry.get('sha256'))[:12]}…)")
    return None


def read_record(folder: str | Path) -> dict | None:
    """A run folder's data record; None when it has none (an image run) or it is damaged."""
    try:
        value = json.loads(read_text(Path(folder) / RECORD))
    except (OSError, ValueError, RecursionError):
        return None
    return value if isinstance(value, dict) else None


def same_data(record: dict, recorded: dict, path: str) -> str | None:
    """Why the data of ``record`` is not that of ``recorded`` (one line), or None."""
    for split in ("train", "val", "test"):
        new, old = record.get(split), recorded.get(split)
        if new is None and old is None:
            continue
        if new is None or not isinstance(old, dict):
            return (f"--data {path} has {'no' if new is None else 'a'} {split} split; the data "
                    f"the run was trained on had {'one' if new is None else 'none'}")
        shape = old.get("shape") if isinstance(old.get("shape"), list) else []  # untrusted
        if list(new["shape"])[1:] != shape[1:]:
            width = shape[1] if len(shape) > 1 else "?"
            return (f"--data {path} holds rows of {new['shape'][1]} numbers; the run was "
                    f"trained on rows of {str(width)[:20]} ({str(old.get('path'))[:200]})")
        if new["sha256"] != old.get("sha256"):
            return (f"--data {path}: its {split} matrix {new['path']} differs from the one the "
                    f"run was trained on (SHA-256 {new['sha256'][:12]}…, recorded "
                    f"{str(old.get('sha256'))[:12]}… for {str(old.get('path'))[:200]})")
    return None


class DataCheck:
    """:func:`sae.data.matrix.checked` of a ``--data`` file in a thread, started before the
    command imports torch and Lightning (seconds of one core) so that the pass over a large
    matrix (seconds of the other) is done by the time they are; :func:`check_data` takes its
    result. It needs numpy only."""

    def __init__(self, path: str | Path, data_dir: str | Path | None = None):
        self.path, self.data_dir = path, data_dir
        self._outcome: tuple | None = None
        self._thread = threading.Thread(target=self._run, name="data-check", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        stop_signals_to_main_thread()
        from sae.data.matrix import checked  # numpy: in the thread, not at the start

        try:
            self._outcome = (checked(self.path, self.data_dir), None)
        except Exception as e:  # handed to the caller, raised there
            self._outcome = (None, e)

    def result(self):
        """(data, record) of :func:`sae.data.matrix.checked`, waited for (Ctrl-C and SIGTERM
        still reach the caller meanwhile); raises what it raised."""
        while self._thread.is_alive():
            self._thread.join(0.1)
        value, error = self._outcome
        if error is not None:
            raise error
        return value


def check_data(config: RunConfig, pending: DataCheck | None = None) -> dict | None:
    """Check ``config.data.data`` (and, on resume, that it is the run's data); returns its
    record (None for an image run). ``pending``: the same check started earlier in a thread,
    whose result is taken. Raises UsageError."""
    out, resume, data = Path(config.folder.out), config.folder.resume, config.data.data
    recorded = read_record(out) if resume is not None else None
    if not data:
        if recorded is not None and recorded.get("streamed"):
            raise UsageError(f"cannot resume {out}: it was trained on a model's layer; give "
                             f"--source {recorded.get('source')} --hook {recorded.get('hook')}")
        if recorded is not None:
            raise UsageError(f"cannot resume {out}: it was trained on --data "
                             f"{recorded.get('source')}; give that file, not images")
        return None
    from sae.data.matrix import MatrixError, checked  # numpy: only for --data runs

    try:
        _, record = pending.result() if pending is not None else \
            checked(data, config.data.data_dir)
    except MatrixError as e:
        raise UsageError(f"--data: {e}") from None
    _remember(record)
    if resume is not None:
        if recorded is None:
            raise UsageError(f"cannot resume {out} with --data {data}: the run holds no "
                             f"{RECORD} (it was trained on {config.data.dataset} images)")
        why = same_data(record, recorded, data)
        if why:
            raise UsageError(f"cannot resume {out}: {why}")
    return record


MIN_TRAIN_ROWS = 2  # what training needs (sae.training.engine.load_data refuses fewer)


def _image_count(dataset: str, data_dir) -> int | None:
    """The training images the dataset's files say they hold; None where the files are not
    found but may still be downloaded, or cannot tell. Offline and not found: UsageError."""
    folder = find_folder(dataset, data_dir)
    if folder is None:
        if os.environ.get("SAE_OFFLINE"):  # nothing will be downloaded: say so now
            raise UsageError(not_found(dataset, data_dir, offline=True))
        return None
    return training_images(folder)


def header_record(settings: dict) -> dict | None:
    """The rows of a plain ``.npy`` ``--data`` file from its header alone (numpy, no torch):
    enough for :func:`check_split` to refuse a split before the data's full check, which
    imports torch and reads every row (seconds); None for a manifest or a header the full
    check refuses (it says why)."""
    data = settings.get("data")
    if not data or Path(data).suffix.lower() == ".json":
        return None
    # numpy: only for --data runs (an image run's command starts without it)
    from sae.data.matrix import FLOAT_DTYPES
    from sae.data.npyfile import NpyError, open_npy, read_header  # likewise

    try:
        with open_npy(Path(data).expanduser()) as f:
            header = read_header(f, data)
    except (NpyError, OSError):
        return None
    shape = header.shape
    # a matrix the full check would refuse from its header is refused for that reason first
    usable = len(shape) == 2 and shape[0] >= 2 and shape[1] >= 1 \
        and header.dtype.type in FLOAT_DTYPES
    return {"train": {"shape": list(shape)}, "test": None} if usable else None


def check_split(settings: dict, record: dict | None = None, note: bool = True) -> int | None:
    """Refuse split settings that the data cannot hold, before any work: a ``--val-size``
    (and as many test rows, carved from the training rows when the data has no test split)
    that leaves fewer than 2 rows to train on. ``settings``: a run's flat settings; ``record``:
    its ``--data`` record (:func:`check_data`), None for images (their files' header is read).
    Returns the validation rows ``--val-size`` resolves to (:func:`sae.data.splits.val_rows`),
    None where the rows are not known yet (or a manifest gives its own ``val`` rows); with
    ``note``, a split over a quarter of the rows prints a note. Raises UsageError."""
    if settings.get("data"):
        if record is None:
            return None
        n = int(record["train"]["shape"][0])
        carved = (0 if record.get("val") else 1) + (0 if record.get("test") else 1)
        holds = f"--data {settings['data']} has {n:,} training rows"
        unit = "rows"
    else:
        dataset = settings.get("dataset", "mnist")
        n, carved = _image_count(dataset, settings.get("data_dir")), 1
        if n is None:
            return None
        holds, unit = f"{dataset} has {n:,} training images", "images"
    if carved == 0:  # validation and test rows of their own
        return None
    val = val_rows(settings.get("val_size"), n)
    if carved * val + MIN_TRAIN_ROWS <= n:
        if record is not None and record.get("val") is not None:
            return None  # only test rows are carved: --val-size validates nothing here
        line = large_val_note(val, n, unit) if note else None
        if line:
            print(line, flush=True)
        return val
    default = " (the default)" if settings.get("val_size") is None else ""
    test = " and as many test rows (it has no test split)" if carved == 2 else ""
    most = (n - MIN_TRAIN_ROWS) // carved
    fix = f"give --val-size {most:,} or less" if most >= 1 else \
        f"training needs more {unit}"
    raise UsageError(f"--val-size {val:,}{default}: {holds}, too few for {val:,} validation "
                     f"{unit}{test} and at least {MIN_TRAIN_ROWS} to train on; {fix}")


def check_sweep_data(sweep_dir: Path, runs) -> None:
    """Check each data file of a sweep's runs once, and refuse a sweep whose started runs were
    trained on other data than their file holds now (a changed file would mix two data sets in
    one table). Raises UsageError."""
    records: dict[str, dict] = {}
    for run in runs:
        data = run.settings.get("data")
        if not data:
            continue
        from sae.data.matrix import MatrixError, checked  # numpy: only for --data runs

        if data not in records:
            try:
                records[data] = checked(data, run.settings.get("data_dir"))[1]
            except MatrixError as e:
                raise UsageError(f"data of {run.model}: {e}") from None
        recorded = read_record(Path(sweep_dir) / run.rel)
        why = None if recorded is None else same_data(records[data], recorded, data)
        if why:
            raise UsageError(f"{Path(sweep_dir) / run.rel} was trained on other data: {why}")
    for run in runs:  # a split the data cannot hold fails every run: refused before the first
        try:
            check_split(run.settings, records.get(run.settings.get("data") or ""))
        except UsageError as e:
            raise UsageError(f"{run.rel}: {e}") from None


def write_record(out: Path, record: dict) -> None:
    write_json(Path(out) / RECORD, record)
