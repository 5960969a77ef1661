"""Checkpoint files: written atomically with a checksum, read without running code from them.

A checkpoint is untrusted input: a pickle can run any code while it loads, so every read here is
``torch.load(..., weights_only=True)``, which builds only tensors and plain containers and refuses
anything else. Lightning's own resume path reads through :class:`SafeCheckpointIO` too.

Writes go to a temporary file in the checkpoint's own folder, are flushed to disk (``fsync``) and
renamed over the old file, so a crash, a kill or a full disk leaves either the old checkpoint or
the new one, never half of one (a rename within one filesystem is atomic; a temporary file in
another folder, e.g. /tmp on another disk, would make the final step a copy). Each checkpoint
carries the SHA-256 of its tensors (``sae_checksum``), so a file damaged on disk is refused
instead of resuming from garbage.
"""

from __future__ import annotations

import hashlib
import io
import math
import pickle
import zipfile
from pathlib import Path

import torch
from lightning.pytorch.plugins.io import TorchCheckpointIO

from sae.io import write_bytes

__all__ = ["CheckpointError", "SafeCheckpointIO", "check_compatible", "read_checkpoint",
           "tensors_checksum", "write_checkpoint"]

CHECKSUM_KEY = "sae_checksum"


class CheckpointError(Exception):
    """A checkpoint that cannot be read safely, is damaged, or belongs to another model."""


def _tensors(obj, prefix: str = ""):
    """(path, tensor) for every tensor inside nested dicts / lists, in a fixed order."""
    if isinstance(obj, torch.Tensor):
        yield prefix, obj
    elif isinstance(obj, dict):
        for key in sorted(obj, key=str):
            if key != CHECKSUM_KEY:
                yield from _tensors(obj[key], f"{prefix}/{key}")
    elif isinstance(obj, list | tuple):
        for i, item in enumerate(obj):
            yield from _tensors(item, f"{prefix}/{i}")


def tensors_checksum(checkpoint: dict) -> str:
    """SHA-256 over the names, dtypes, shapes and bytes of every tensor in ``checkpoint``."""
    digest = hashlib.sha256()
    for name, t in _tensors(checkpoint):
        t = t.detach().cpu().contiguous()
        digest.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        digest.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def write_checkpoint(checkpoint: dict, path: str | Path) -> None:
    """Save atomically in ``path``'s folder, with the tensors' checksum; no temp file left."""
    checkpoint = {**checkpoint, CHECKSUM_KEY: tensors_checksum(checkpoint)}
    buffer = io.BytesIO()
    torch.save(checkpoint, buffer)
    try:
        write_bytes(path, buffer.getvalue())
    except OSError as e:
        raise CheckpointError(f"cannot write checkpoint {path}: {e.strerror or e}; the previous "
                              "checkpoint is kept") from None


def read_checkpoint(path: str | Path, map_location="cpu") -> dict:
    """Load a checkpoint safely (tensors and plain data only) and verify its checksum.

    Raises :class:`CheckpointError` with a one-line reason for a missing, unreadable, unsafe,
    damaged or non-finite checkpoint.
    """
    path = Path(path)
    if path.is_dir():
        raise CheckpointError(f"checkpoint {path} is a folder, not a file")
    if not path.is_file():
        raise CheckpointError(f"checkpoint {path} does not exist")
    if not zipfile.is_zipfile(path):  # every torch.save since PyTorch 1.6 is a zip archive
        raise CheckpointError(f"checkpoint {path} cannot be read (damaged or not a checkpoint)")
    try:
        state = torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else "unpickling failed"
        unsafe = "weights_only" in str(e) or "Unsupported global" in str(e)
        reason = ("it holds objects other than tensors and plain data, which could run code "
                  "when loaded" if unsafe else first)
        raise CheckpointError(f"refusing checkpoint {path}: {reason[:200]}") from None
    except (RuntimeError, OSError, EOFError, ValueError, zipfile.BadZipFile, KeyError,
            AttributeError, IndexError, TypeError, UnicodeDecodeError) as e:
        reason = " ".join(str(e).split())[:160] or type(e).__name__
        raise CheckpointError(f"checkpoint {path} cannot be read (damaged or not a checkpoint: "
                              f"{reason})") from None
    if not isinstance(state, dict) or "state_dict" not in state:
        raise CheckpointError(f"checkpoint {path} is not a checkpoint of this tool")
    saved = state.get(CHECKSUM_KEY)
    if saved is not None and saved != tensors_checksum(state):
        raise CheckpointError(f"checkpoint {path} is damaged (its tensors do not match their "
                              "checksum)")
    for name, t in _tensors(state["state_dict"]):
        if t.is_floating_point() and not bool(torch.isfinite(t).all()):
            raise CheckpointError(f"checkpoint {path} holds non-finite weights ({name[1:]})")
    return state


def check_compatible(state: dict, config: dict, path: str | Path) -> None:
    """Refuse a checkpoint whose model differs from ``config`` (model, sizes, architecture)."""
    saved = (state.get("hyper_parameters") or {}).get("config")
    if not isinstance(saved, dict):
        raise CheckpointError(f"checkpoint {path} has no model settings; not made by this tool")
    for key in ("model", "hidden", "input_dim", "arch", "groups", "mlp_width"):
        if key in config and saved.get(key) != config[key]:
            raise CheckpointError(f"checkpoint {path} is of another model ({key} "
                                  f"{saved.get(key)!r}, this run has {config[key]!r})")
    var = (state.get("hyper_parameters") or {}).get("data_var")
    if not isinstance(var, int | float) or not math.isfinite(var) or var <= 0:
        raise CheckpointError(f"checkpoint {path} has an invalid data variance")


class SafeCheckpointIO(TorchCheckpointIO):
    """Lightning's checkpoint I/O with :func:`write_checkpoint` and :func:`read_checkpoint`.

    ``preloaded=(path, state)``: a checkpoint already read (and checked) before training; the
    first load of that path returns it instead of reading the file a second time.
    """

    def __init__(self, preloaded: tuple[str | Path, dict] | None = None) -> None:
        super().__init__()
        self._preloaded = preloaded

    def save_checkpoint(self, checkpoint, path, storage_options=None) -> None:
        write_checkpoint(checkpoint, path)

    def load_checkpoint(self, path, map_location=None, weights_only=None) -> dict:
        if self._preloaded is not None and Path(self._preloaded[0]).resolve() == \
                Path(path).resolve():
            state, self._preloaded = self._preloaded[1], None
            return state
        return read_checkpoint(path, map_location=map_location or "cpu")
