"""Checkpoint files: written atomically with a checksum, read without running code from them.

A checkpoint is untrusted input (a run folder can come from anywhere), so reading one is a
sequence of checks, each refusing with a one-line :class:`CheckpointError` before the next step
can cost anything:

1. **The archive.** Every ``torch.save`` since PyTorch 1.6 is a zip archive of *stored*
   (uncompressed) entries. The zip's central directory is read first: a compressed entry (torch
   never writes one; a deflated "zip bomb" of a few MB would unpack to GBs), more than
   :data:`MAX_ENTRIES` entries, or entries larger than :data:`MAX_BYTES` in all are refused
   before ``torch.load``.
2. **Safe loading.** ``torch.load(..., weights_only=True)`` builds only tensors and plain
   containers and refuses anything else: a pickle cannot run code. Lightning's own resume path
   reads through :class:`SafeCheckpointIO` too.
   Entries other than tensor storages (the pickle) hold at most :data:`MAX_PICKLE_BYTES`.
3. **Bounded content**, measured per occurrence (a value the pickle memo refers to 100 000
   times counts 100 000 times, as the checksum reads it 100 000 times): plain values only (dict,
   list, tuple, str, int of at most 64 bits, float, bool, None, tensors), nested at most
   :data:`MAX_DEPTH` deep, at most :data:`MAX_ITEMS` values, :data:`MAX_TEXT` characters of
   text, :data:`MAX_ELEMENTS` tensor elements and :data:`MAX_BYTES` tensor bytes (elements ×
   element size) in all. Every tensor is a plain (strided) tensor of a dtype in
   :data:`TENSOR_DTYPES` whose elements lie within its storage without overlapping: a stride-0
   view of 2²⁸ complex numbers costs 16 bytes on disk but 4 GiB once copied, and ``torch.save``
   of a real tensor never writes one. So checking costs a fixed budget, whatever the file:
   its storages (at most :data:`MAX_BYTES`), the checksum's text (tens of MB at most) and
   pieces of at most :data:`HASH_CHUNK` bytes while tensors are hashed or checked.
4. **The checksum** (``sae_checksum``) is required and covers everything: the SHA-256 of a
   canonical serialisation (:func:`checksum`) in which every tensor is replaced by the hash of
   its dtype, shape and bytes, and every other value (settings, data variance, optimiser
   hyper-parameters, epoch, step, callback states) is written as sorted, typed JSON. A
   checkpoint of an earlier version, whose checksum covers its tensors only, is refused unless
   ``SAE_LEGACY_CHECKPOINTS=1`` is set (its tensors are then verified as before).
5. **The schema.** ``epoch`` and ``global_step`` are integers >= 0; ``hyper_parameters`` holds
   valid model settings (the same checks as the command line) and a finite, positive data
   variance; ``state_dict`` holds exactly the tensors of that model, with their shapes and
   dtypes taken from the model itself, built on PyTorch's ``meta`` device (no memory), and of
   at most :data:`MAX_ELEMENTS` elements (so a huge ``hidden`` is refused before anything is
   allocated; floating-point weights may be 16, 32 or 64 bits wide, as ``--precision`` makes
   them); every weight is finite.

:func:`sae.training.resumable.check_compatible` adds what resuming needs: the same model as the
run, and optimiser, scheduler, loop and callback states of the shapes Lightning restores (so a
crafted checkpoint fails there, before the run folder changes, not inside Lightning after its
logs exist).

Writes go to a temporary file in the checkpoint's own folder, are flushed to disk (``fsync``) and
renamed over the old file, so a crash, a kill or a full disk leaves either the old checkpoint or
the new one, never half of one (a rename within one filesystem is atomic; a temporary file in
another folder, e.g. /tmp on another disk, would make the final step a copy).
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import os
import pickle
import zipfile
from pathlib import Path

import torch
from lightning.pytorch.plugins.io import TorchCheckpointIO

from sae.models import SparseAutoencoder, build_model
from sae.settings.config import SAEConfig
from sae.system.io import UnsafePathError, open_regular, write_bytes
from sae.training.module import SAETraining, model_state

__all__ = ["CheckpointError", "LEGACY_ENV", "MAX_BYTES", "MAX_DEPTH", "MAX_ELEMENTS",
           "MAX_TEXT", "SafeCheckpointIO", "checksum", "is_count", "load_checkpoint",
           "model_from_checkpoint", "read_checkpoint", "tensor_pieces", "tensor_sha256",
           "tensors_checksum", "write_checkpoint"]

CHECKSUM_KEY = "sae_checksum"
CHECKSUM_PREFIX = "v2:"  # a checksum over everything; plain hex: an earlier version's
LEGACY_ENV = "SAE_LEGACY_CHECKPOINTS"  # "1": accept a tensors-only checksum of an earlier version
MAX_BYTES = 4 * 2**30  # the archive's entries, uncompressed, in all; and the tensors' bytes
MAX_PICKLE_BYTES = 64 * 2**20  # the archive's entries that are not tensor storages
MAX_ENTRIES = 10_000
MAX_ELEMENTS = 2**29  # tensor elements in all (2 GiB of float32)
MAX_DEPTH = 32
MAX_ITEMS = 1_000_000  # plain values (keys, numbers, strings) in all
MAX_TEXT = 4 * 2**20  # characters of strings (keys included) in all, each occurrence counted
MAX_INT = 2**64  # integers are counters, steps and seeds: |value| below this
HASH_CHUNK = 16 * 2**20  # bytes: the largest copy made while a tensor is hashed or checked
_PLAIN = (str, int, float, bool, type(None))
# what a checkpoint's tensors may be: its weights (any --precision), counters, masks, RNG states
TENSOR_DTYPES = frozenset({torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32,
                           torch.int64, torch.float16, torch.bfloat16, torch.float32,
                           torch.float64, torch.complex64, torch.complex128})
WEIGHT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


class CheckpointError(Exception):
    """A checkpoint that cannot be read safely, is damaged, or belongs to another model."""


# ---------------------------------------------------------------- checksums


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


def tensor_pieces(t: torch.Tensor):
    """``t``'s elements in row-major order, as views of at most :data:`HASH_CHUNK` bytes each
    (a single element may be more): what hashing or checking a tensor copies at a time."""
    t = t.detach().squeeze()  # size-1 dimensions change neither the order nor the bytes
    if t.dim() == 0 or t.numel() * t.element_size() <= HASH_CHUNK:
        yield t
        return
    row = t[0].numel() * t.element_size()
    if row > HASH_CHUNK:
        for i in range(t.shape[0]):
            yield from tensor_pieces(t[i])
    else:
        step = HASH_CHUNK // row
        for i in range(0, t.shape[0], step):
            yield t[i:i + step]


def _hash_into(digest, t: torch.Tensor) -> None:
    """Feed ``t``'s bytes, in row-major order, to ``digest``, a piece at a time."""
    for piece in tensor_pieces(t):
        flat = piece.cpu().contiguous().reshape(-1)
        if flat.numel() == 1:  # one element counts as contiguous whatever its stride
            flat = flat.as_strided((1,), (1,))
        digest.update(flat.view(torch.uint8).numpy())


def tensor_sha256(t: torch.Tensor) -> str:
    """The SHA-256 of ``t``'s bytes in row-major order (its contiguous copy's bytes), made
    without copying more than :data:`HASH_CHUNK` bytes at a time."""
    digest = hashlib.sha256()
    _hash_into(digest, t)
    return digest.hexdigest()


def tensors_checksum(checkpoint: dict) -> str:
    """SHA-256 over the names, dtypes, shapes and bytes of every tensor in ``checkpoint`` (the
    checksum of earlier versions, which :func:`checksum` replaces)."""
    digest = hashlib.sha256()
    for name, t in _tensors(checkpoint):
        digest.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        _hash_into(digest, t)
    return digest.hexdigest()


def _canonical(obj):
    """A JSON-ready value that names every type: equal iff ``obj`` is equal, type for type."""
    if isinstance(obj, torch.Tensor):
        return {"tensor": [str(obj.dtype), list(obj.shape), tensor_sha256(obj)]}
    if isinstance(obj, dict):
        items = [[_canonical(k), _canonical(v)] for k, v in obj.items() if k != CHECKSUM_KEY]
        return {"dict": sorted(items, key=lambda kv: json.dumps(kv[0], sort_keys=True))}
    if isinstance(obj, list | tuple):
        return {"list" if isinstance(obj, list) else "tuple": [_canonical(v) for v in obj]}
    if isinstance(obj, bool) or obj is None or isinstance(obj, str):
        return obj
    if isinstance(obj, int):
        return {"int": int.__repr__(obj)}
    if isinstance(obj, float):
        return {"float": float.__repr__(obj)}  # exact, NaN and ±inf included
    return {type(obj).__name__: repr(obj)}  # not loadable anyway: refused on reading


def checksum(checkpoint: dict) -> str:
    """The checksum of everything in ``checkpoint`` but the checksum itself.

    SHA-256 of sorted-key JSON of :func:`_canonical`: tensors as (dtype, shape, SHA-256 of the
    bytes), other values with their type, mappings sorted by key.
    """
    text = json.dumps(_canonical(checkpoint), sort_keys=True, ensure_ascii=True,
                      separators=(",", ":"))
    return CHECKSUM_PREFIX + hashlib.sha256(text.encode()).hexdigest()


def write_checkpoint(checkpoint: dict, path: str | Path) -> None:
    """Save atomically in ``path``'s folder, with its checksum; no temp file left."""
    checkpoint = {**checkpoint, CHECKSUM_KEY: checksum(checkpoint)}
    buffer = io.BytesIO()
    torch.save(checkpoint, buffer)
    try:
        write_bytes(path, buffer.getvalue())
    except OSError as e:
        raise CheckpointError(f"cannot write checkpoint {path}: {e.strerror or e}; the previous "
                              "checkpoint is kept") from None


# ---------------------------------------------------------------- reading


def _check_archive(file, path: Path) -> None:
    """Refuse, from the zip's central directory alone, what would cost memory to load."""
    try:
        with zipfile.ZipFile(file) as archive:
            entries = archive.infolist()
    except (zipfile.BadZipFile, OSError, ValueError, EOFError):
        raise CheckpointError(f"checkpoint {path} cannot be read (damaged or not a "
                              "checkpoint)") from None
    if len(entries) > MAX_ENTRIES:
        raise CheckpointError(f"refusing checkpoint {path}: {len(entries)} archive entries "
                              f"(at most {MAX_ENTRIES})")
    if any(e.compress_type != zipfile.ZIP_STORED for e in entries):
        raise CheckpointError(f"refusing checkpoint {path}: it holds compressed entries, which "
                              "torch.save never writes")
    total = sum(e.file_size for e in entries)
    if total > MAX_BYTES:
        raise CheckpointError(f"refusing checkpoint {path}: {total / 2**30:.1f} GiB "
                              f"uncompressed (at most {MAX_BYTES / 2**30:.0f} GiB)")
    # torch.save writes each storage as <archive>/data/<key>; the rest is the pickle and a few
    # bytes of bookkeeping
    pickle_bytes = sum(e.file_size for e in entries if not _is_storage(e.filename))
    if pickle_bytes > MAX_PICKLE_BYTES:
        raise CheckpointError(f"refusing checkpoint {path}: {pickle_bytes / 2**20:.0f} MiB of "
                              f"pickled values (at most {MAX_PICKLE_BYTES // 2**20} MiB)")


def _is_storage(name: str) -> bool:
    parts = name.split("/")
    return len(parts) == 3 and parts[1] == "data"


def _within_storage(t: torch.Tensor) -> bool:
    """Whether ``t``'s elements are distinct places of its storage, all inside it: what every
    tensor that ``torch.save`` writes of a real tensor is (a transposed one included), and what
    a stride-0 or overlapping view, larger than its storage once copied, is not."""
    if t.numel() == 0:
        return True
    span, last = 1, t.storage_offset()
    for stride, size in sorted((st, sz) for st, sz in zip(t.stride(), t.shape, strict=True)
                               if sz > 1):
        if stride < span:  # this dimension steps back into the ones before it
            return False
        span, last = stride * size, last + stride * (size - 1)
    return (last + 1) * t.element_size() <= t.untyped_storage().nbytes()


def _tensor_refusal(t: torch.Tensor, counts: dict) -> str | None:
    """Why the tensor ``t`` is refused (adding its elements and bytes to ``counts``), or None."""
    if t.layout != torch.strided or t.is_nested:
        return f"it holds a {t.layout} tensor, which checkpoints of this tool never hold"
    if t.device.type == "meta":
        return "it holds a tensor without data (on the meta device)"
    if t.dtype not in TENSOR_DTYPES:
        return f"it holds a tensor of dtype {t.dtype}, which checkpoints of this tool never hold"
    counts["elements"] += t.numel()
    if counts["elements"] > MAX_ELEMENTS:
        return f"its tensors hold more than {MAX_ELEMENTS} elements"
    if not _within_storage(t):
        return (f"it holds a tensor of {t.numel()} elements that overlap or lie beyond its "
                "storage (a stride-0 or overlapping view, which torch.save of a real tensor "
                "never writes)")
    counts["bytes"] += t.numel() * t.element_size()
    if counts["bytes"] > MAX_BYTES:
        return f"its tensors hold more than {MAX_BYTES // 2**30} GiB"
    return None


def _plain_refusal(obj, counts: dict) -> str | None:
    """Why the plain value ``obj`` is refused (adding its text to ``counts``), or None."""
    if isinstance(obj, str):
        counts["text"] += len(obj)
        if counts["text"] > MAX_TEXT:
            return (f"its text (strings, each time it occurs) is longer than {MAX_TEXT} "
                    "characters in all")
    elif isinstance(obj, int) and not -MAX_INT < obj < MAX_INT:
        return "it holds an integer of more than 64 bits"
    elif not isinstance(obj, _PLAIN):
        return f"it holds a value of type {type(obj).__name__}"
    return None


def _check_values(state, path: Path) -> None:
    """Plain values only, bounded in depth, count, text, tensor elements and bytes, each value
    counted every time it occurs (no recursion, nothing copied)."""
    stack, items = [(state, 0)], 0
    counts = {"elements": 0, "bytes": 0, "text": 0}
    while stack:
        obj, depth = stack.pop()
        items += 1
        if depth > MAX_DEPTH or items > MAX_ITEMS:
            raise CheckpointError(f"refusing checkpoint {path}: nested deeper than {MAX_DEPTH} "
                                  f"levels or more than {MAX_ITEMS} values")
        if isinstance(obj, torch.Tensor):
            refusal = _tensor_refusal(obj, counts)
        elif isinstance(obj, dict):
            stack.extend((k, depth + 1) for k in obj)
            stack.extend((v, depth + 1) for v in obj.values())
            refusal = None
        elif isinstance(obj, list | tuple):
            stack.extend((v, depth + 1) for v in obj)
            refusal = None
        else:
            refusal = _plain_refusal(obj, counts)
        if refusal:
            raise CheckpointError(f"refusing checkpoint {path}: {refusal}")


def _check_checksum(state: dict, path: Path) -> None:
    saved = state.get(CHECKSUM_KEY)
    if saved is None:
        raise CheckpointError(f"refusing checkpoint {path}: it has no checksum ({CHECKSUM_KEY}), "
                              "so damage or changes cannot be detected")
    if not isinstance(saved, str):
        raise CheckpointError(f"refusing checkpoint {path}: its checksum is not text")
    if saved.startswith(CHECKSUM_PREFIX):
        if saved != checksum(state):
            raise CheckpointError(f"checkpoint {path} is damaged or was changed (its content "
                                  "does not match its checksum)")
        return
    if os.environ.get(LEGACY_ENV) != "1":
        raise CheckpointError(f"refusing checkpoint {path}: it was written by an earlier version "
                              "whose checksum covers its tensors only (set "
                              f"{LEGACY_ENV}=1 to accept it)")
    if saved != tensors_checksum(state):
        raise CheckpointError(f"checkpoint {path} is damaged (its tensors do not match their "
                              "checksum)")


def is_count(value) -> bool:
    """An integer >= 0 that is not a bool (a step, an epoch, a count)."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def expected_state(config: dict, path: str | Path) -> dict[str, torch.Tensor]:
    """The ``state_dict`` (on the meta device: shapes and dtypes, no memory) of the model that
    ``config`` (a checkpoint's saved settings) describes; CheckpointError when those settings
    are invalid or the model would exceed :data:`MAX_ELEMENTS`."""
    if not isinstance(config, dict) or not all(isinstance(k, str) for k in config):
        raise CheckpointError(f"checkpoint {path} has no model settings; not made by this tool")
    try:
        settings = SAEConfig.from_dict(config)
        if isinstance(settings.input_dim, bool) or not isinstance(settings.input_dim, int):
            raise ValueError(f"input_dim must be an integer, got {settings.input_dim!r:.40}")
        settings.validate()
    except (TypeError, ValueError) as e:
        reason = " ".join(str(e).split())[:160]
        raise CheckpointError(f"checkpoint {path} has invalid model settings ({reason})") from None
    width = settings.input_dim if settings.arch == "linear" else settings.mlp_width
    rough = 2 * width * settings.hidden + 2 * width * settings.input_dim
    if rough > MAX_ELEMENTS:  # before building even on meta: a 10^12-unit model is not built
        raise CheckpointError(f"refusing checkpoint {path}: its model (hidden "
                              f"{settings.hidden}) would hold more than {MAX_ELEMENTS} weights")
    try:
        with torch.device("meta"):
            module = SAETraining(build_model(settings, None, 1.0))
    except (RuntimeError, ValueError, TypeError) as e:
        raise CheckpointError(f"checkpoint {path} has model settings this version cannot "
                              f"build ({' '.join(str(e).split())[:160]})") from None
    return module.state_dict()


def _check_schema(state: dict, path: Path) -> None:
    for key in ("epoch", "global_step"):
        if key in state and not is_count(state[key]):
            raise CheckpointError(f"checkpoint {path}: {key} must be an integer >= 0, got "
                                  f"{str(state[key])[:40]!r}")
    hp, weights = state.get("hyper_parameters"), state.get("state_dict")
    if not isinstance(weights, dict) or not isinstance(hp, dict):
        raise CheckpointError(f"checkpoint {path} is not a checkpoint of this tool (no "
                              "state_dict or hyper_parameters mapping)")
    var = hp.get("data_var")
    if isinstance(var, bool) or not isinstance(var, int | float) or not math.isfinite(var) \
            or var <= 0:
        raise CheckpointError(f"checkpoint {path} has an invalid data variance")
    expected = expected_state(hp.get("config"), path)
    missing = [k for k in expected if k not in weights]
    extra = [str(k) for k in weights if k not in expected]
    if missing or extra:
        what = f"lacks {', '.join(missing[:3])}" if missing else \
            f"has unknown {', '.join(extra[:3])[:120]}"
        raise CheckpointError(f"checkpoint {path} does not fit its model: its state_dict {what}")
    for name, want in expected.items():
        got = weights[name]
        # floating weights may be 16, 32 or 64 bits wide (--precision bf16-true, 16-true, ...)
        fits = isinstance(got, torch.Tensor) and tuple(got.shape) == tuple(want.shape) and (
            got.dtype == want.dtype or (got.dtype in WEIGHT_DTYPES and want.is_floating_point()))
        if not fits:
            shown = (f"{tuple(got.shape)} {got.dtype}" if isinstance(got, torch.Tensor)
                     else type(got).__name__)
            raise CheckpointError(f"checkpoint {path} does not fit its model: {name} is "
                                  f"{shown}, expected {tuple(want.shape)} {want.dtype}")


def _open(path: Path):
    """The checkpoint's file, opened once for every later step (a link the user made is
    followed): CheckpointError for a missing file, a folder, a FIFO or a device, named."""
    if path.is_dir():
        raise CheckpointError(f"checkpoint {path} is a folder, not a file")
    try:
        return os.fdopen(open_regular(path, follow_links=True), "rb")
    except FileNotFoundError:
        raise CheckpointError(f"checkpoint {path} does not exist") from None
    except UnsafePathError as e:
        raise CheckpointError(f"refusing checkpoint: {e}") from None
    except OSError as e:
        raise CheckpointError(f"cannot read checkpoint {path}: {e.strerror or e}") from None


def _unpickle(file, path: Path, map_location) -> dict:
    """``torch.load(weights_only=True)`` of the opened checkpoint, errors as one line."""
    try:
        state = torch.load(file, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else "unpickling failed"
        unsafe = "weights_only" in str(e) or "Unsupported global" in str(e)
        reason = ("it holds objects other than tensors and plain data, which could run code "
                  "when loaded" if unsafe else first)
        raise CheckpointError(f"refusing checkpoint {path}: {reason[:200]}") from None
    except RecursionError:
        raise CheckpointError(f"refusing checkpoint {path}: nested too deeply") from None
    except MemoryError:
        raise CheckpointError(f"refusing checkpoint {path}: too large to load") from None
    except (RuntimeError, OSError, EOFError, ValueError, zipfile.BadZipFile, KeyError,
            AttributeError, IndexError, TypeError, UnicodeDecodeError,
            NotImplementedError) as e:
        reason = " ".join(str(e).split())[:160] or type(e).__name__
        raise CheckpointError(f"checkpoint {path} cannot be read (damaged or not a checkpoint: "
                              f"{reason})") from None
    if not isinstance(state, dict):
        raise CheckpointError(f"checkpoint {path} is not a checkpoint of this tool")
    return state


def _finite(t: torch.Tensor) -> bool:
    """Whether every element of the floating tensor ``t`` is finite, a piece at a time."""
    return all(bool(torch.isfinite(piece).all()) for piece in tensor_pieces(t))


def read_checkpoint(path: str | Path, map_location="cpu") -> dict:
    """Load a checkpoint safely (tensors and plain data only) and check it (module docstring).

    Raises :class:`CheckpointError` with a one-line reason for a missing, unreadable, unsafe,
    oversized, damaged, changed, malformed or non-finite checkpoint.
    """
    path = Path(path)
    with _open(path) as file:  # the same opened file for the directory check and the load
        _check_archive(file, path)
        file.seek(0)
        state = _unpickle(file, path, map_location)
    _check_values(state, path)
    _check_checksum(state, path)
    _check_schema(state, path)
    for name, t in _tensors(state["state_dict"]):
        if t.is_floating_point() and not _finite(t):
            raise CheckpointError(f"checkpoint {path} holds non-finite weights ({name[1:]})")
    return state


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


# ---------------------------------------------------------------- the model of a checkpoint


def load_checkpoint(path: str | Path,
                    map_location: str | torch.device = "cpu") -> SparseAutoencoder:
    """Rebuild a trained SAE, in eval mode, from a checkpoint written by ``python -m sae.run``.

    The file is untrusted: it is read with :func:`read_checkpoint` (tensors and plain
    data only, checksum verified; CheckpointError otherwise). Reads its ``hyper_parameters``
    ({"config": {...}, "data_var": v}) and ``state_dict``; keys a newer config does not know
    are ignored, missing ones take defaults.
    """
    return model_from_checkpoint(read_checkpoint(path, map_location=map_location))


def model_from_checkpoint(state: dict) -> SparseAutoencoder:
    """The SAE, in eval mode, of a checkpoint already read with ``read_checkpoint`` (callers
    that also want its step or epoch read the file once)."""
    hp = state["hyper_parameters"]
    model = build_model(SAEConfig.from_dict(hp["config"]), data_var=hp["data_var"])
    model.load_state_dict(model_state(state["state_dict"]))
    return model.eval()
