"""Atomic file writes (placeholder until the shared helper lands)."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path


def write_bytes(path: Path, data: bytes) -> Path:
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def write_text(path: Path, text: str) -> Path:
    return write_bytes(path, text.encode("utf-8"))


def _plain(obj):
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: _plain(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_plain(v) for v in obj]
    return obj


def write_json(path: Path, data) -> Path:
    return write_text(path, json.dumps(_plain(data), indent=2, allow_nan=False))
