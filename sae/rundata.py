"""What a run trains on, checked before any work and recorded in its folder (``data.json``).

For ``--data`` runs :func:`check_data` reads and checks every file of the activation data
(:mod:`sae.matrix`: a missing file, wrong rank, a dtype that is not a float, NaN or inf rows,
labels of the wrong length) and, on ``--resume``, compares it with the record the run folder
holds: a file with another D, or the same D and other bytes (SHA-256), is refused, so that no run
mixes two data sets. Each failure is one :class:`sae.setting.UsageError` line (exit 2) before the
run folder is touched. :func:`write_record` writes the record when a fresh run starts.
"""

from __future__ import annotations

from pathlib import Path

from sae.config import RunConfig
from sae.setting import UsageError

__all__ = ["RECORD", "check_data", "check_sweep_data", "read_record", "same_data",
           "write_record"]

RECORD = "data.json"  # in the run folder: sae.matrix.describe of the data it trains on


def read_record(folder: str | Path) -> dict | None:
    """A run folder's data record; None when it has none (an image run) or it is damaged."""
    import json

    from sae.io import read_text

    try:
        value = json.loads(read_text(Path(folder) / RECORD))
    except (OSError, ValueError, RecursionError):
        return None
    return value if isinstance(value, dict) else None


def same_data(record: dict, recorded: dict, path: str) -> str | None:
    """Why the data of ``record`` is not that of ``recorded`` (one line), or None."""
    for split in ("train", "test"):
        new, old = record.get(split), recorded.get(split)
        if new is None and old is None:
            continue
        if new is None or not isinstance(old, dict):
            return (f"--data {path} has {'no' if new is None else 'a'} {split} split; the data "
                    f"the run was trained on had {'one' if new is None else 'none'}")
        if list(new["shape"])[1:] != list(old.get("shape") or [])[1:]:
            return (f"--data {path} holds rows of {new['shape'][1]} numbers; the run was "
                    f"trained on rows of {(old.get('shape') or ['?', '?'])[1]} "
                    f"({old.get('path')})")
        if new["sha256"] != old.get("sha256"):
            return (f"--data {path}: its {split} matrix {new['path']} differs from the one the "
                    f"run was trained on (SHA-256 {new['sha256'][:12]}…, recorded "
                    f"{str(old.get('sha256'))[:12]}… for {old.get('path')})")
    return None


def check_data(config: RunConfig) -> dict | None:
    """Check ``config.data.data`` (and, on resume, that it is the run's data); returns its
    record (None for an image run). Raises UsageError."""
    out, resume, data = Path(config.folder.out), config.folder.resume, config.data.data
    recorded = read_record(out) if resume is not None else None
    if not data:
        if recorded is not None:
            raise UsageError(f"cannot resume {out}: it was trained on --data "
                             f"{recorded.get('source')}; give that file, not images")
        return None
    from sae.matrix import MatrixError
    from sae.matrixdata import checked

    try:
        _, record = checked(data, config.data.data_dir)
    except MatrixError as e:
        raise UsageError(f"--data: {e}") from None
    if resume is not None:
        if recorded is None:
            raise UsageError(f"cannot resume {out} with --data {data}: the run holds no "
                             f"{RECORD} (it was trained on {config.data.dataset} images)")
        why = same_data(record, recorded, data)
        if why:
            raise UsageError(f"cannot resume {out}: {why}")
    return record


def check_sweep_data(sweep_dir: Path, runs) -> None:
    """Check each data file of a sweep's runs once, and refuse a sweep whose started runs were
    trained on other data than their file holds now (a changed file would mix two data sets in
    one table). Raises UsageError."""
    records: dict[str, dict] = {}
    for run in runs:
        data = run.settings.get("data")
        if not data:
            continue
        # imported only for --data runs: it brings Lightning, which an image sweep's process
        # would otherwise import before its workers start
        from sae.matrix import MatrixError
        from sae.matrixdata import checked

        if data not in records:
            try:
                records[data] = checked(data, run.settings.get("data_dir"))[1]
            except MatrixError as e:
                raise UsageError(f"data of {run.model}: {e}") from None
        recorded = read_record(Path(sweep_dir) / run.rel)
        why = None if recorded is None else same_data(records[data], recorded, data)
        if why:
            raise UsageError(f"{Path(sweep_dir) / run.rel} was trained on other data: {why}")


def write_record(out: Path, record: dict) -> None:
    from sae.io import write_json

    write_json(Path(out) / RECORD, record)
