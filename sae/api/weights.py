"""An exported folder's files, read as untrusted: bounded JSON settings, and a ``safetensors``
weights file whose size, hash, recorded settings and every tensor's name, shape and exact dtype
are checked before a tensor is read. Shared by ``sae.load`` (the toolkit's own layout) and the
SAELens layout (``sae.api.saelens_format``); every refusal is a one-line ``LoadError``."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import torch

from sae.system import io as sae_io

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
SETTINGS_KEY = "sae_settings"  # the settings, in the weights file's own metadata
MAX_CONFIG_BYTES = 1_000_000
MAX_HEADER_BYTES = 16 * 2**20  # a safetensors header: names, shapes, offsets, the settings
# the names safetensors gives the dtypes an exported model holds
SAFETENSORS_DTYPES = {torch.float64: "F64", torch.float32: "F32", torch.float16: "F16",
                      torch.bfloat16: "BF16", torch.int64: "I64", torch.int32: "I32",
                      torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8",
                      torch.bool: "BOOL"}


class LoadError(ValueError):
    """A path that holds no trained SAE this version can read; the message is one line."""


def check_weights_file(weights: Path, want: dict, sha256) -> None:
    """The weights file: a regular file no larger than this model's tensors and a header can
    make, with a header of a bounded length and the hash ``config.json`` recorded."""
    try:
        fd = sae_io.open_regular(weights)
    except FileNotFoundError:
        raise LoadError(f"exported folder {weights.parent} has no {WEIGHTS_FILE}") from None
    except OSError as e:  # a link, folder, FIFO or device: named by UnsafePathError
        raise LoadError(f"cannot read {weights}: {e.strerror or e}") from None
    limit = 8 + MAX_HEADER_BYTES + sum(t.numel() * t.element_size() for t in want.values())
    digest = hashlib.sha256()
    with os.fdopen(fd, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size > limit:
            raise LoadError(f"{weights} is {size} bytes, more than this model's tensors and a "
                            f"header take ({limit}): not its weights")
        head = f.read(8)
        length = int.from_bytes(head, "little")
        if len(head) < 8 or length > MAX_HEADER_BYTES or 8 + length > size:
            raise LoadError(f"{weights} is damaged: its header length ({length} bytes) does "
                            f"not fit the file ({size} bytes, at most {MAX_HEADER_BYTES} of "
                            "header)")
        digest.update(head)
        while block := f.read(1 << 20):
            digest.update(block)
    if digest.hexdigest() != sha256:
        raise LoadError(f"{weights} does not match the hash in {weights.parent / CONFIG_FILE}: "
                        "changed or damaged")


def read_tensors(weights: Path, want: dict, settings: dict, prefix: str = "",
                  settings_file: Path | None = None) -> dict[str, torch.Tensor]:
    """The tensors of ``weights``, each checked (name, shape, exact dtype) from the header
    before it is read; the settings the file was written with must be ``settings`` (those of
    ``settings_file``, config.json by default). ``prefix``: the file names each tensor
    ``prefix + name`` (a SAELens folder of the toolkit's own architectures)."""
    from safetensors import SafetensorError, safe_open  # only for an exported folder

    try:
        with safe_open(str(weights), framework="pt") as f:
            _check_metadata(weights, f.metadata(), settings, settings_file)
            keys = set(f.keys())
            outside = sorted(key for key in keys if not key.startswith(prefix))
            if outside:
                raise LoadError(f"{weights} holds tensors not under {prefix!r} "
                                f"({str(outside[:3])[:120]})")
            names = {key[len(prefix):] for key in keys}
            if names != set(want):
                missing, extra = sorted(set(want) - names), sorted(names - set(want))
                raise LoadError(f"{weights} does not hold this model's tensors "
                                f"(missing {missing[:3]}, unexpected {str(extra[:3])[:120]})")
            for name in sorted(names):
                piece = f.get_slice(prefix + name)
                shape, dtype = tuple(piece.get_shape()), piece.get_dtype()
                if shape != tuple(want[name].shape):
                    raise LoadError(f"{weights}: tensor {name} has shape {shape}, the model's "
                                    f"is {tuple(want[name].shape)}")
                if dtype != SAFETENSORS_DTYPES.get(want[name].dtype):
                    raise LoadError(f"{weights}: tensor {name} is {str(dtype)[:20]}, the "
                                    f"model's is {want[name].dtype} "
                                    f"({SAFETENSORS_DTYPES.get(want[name].dtype)})")
            return {name: f.get_tensor(prefix + name) for name in names}
    except LoadError:
        raise
    except (SafetensorError, OSError, ValueError, RuntimeError, TypeError, KeyError,
            NotImplementedError) as e:
        raise LoadError(f"cannot read {weights} (damaged: "
                        f"{' '.join(str(e).split())[:160]})") from None


def _check_metadata(weights: Path, metadata: dict | None, settings: dict,
                    settings_file: Path | None = None) -> None:
    """The settings ``sae.export`` wrote into the weights file (which its hash covers) are
    those of ``config.json``: an edited model or size there is refused. A folder exported by an
    earlier version has none to compare."""
    saved = (metadata or {}).get(SETTINGS_KEY)
    if saved is None:
        return
    try:
        same = _canonical_json(json.loads(saved)) == _canonical_json(settings)
    except (ValueError, TypeError, RecursionError):
        same = False
    if not same:
        where = settings_file or weights.parent / CONFIG_FILE
        raise LoadError(f"{where}: its settings are not those {weights.name} was exported "
                        "with (edited or mixed up)")


def _canonical_json(value) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def file_sha256(path: Path, chunk: int = 1 << 20) -> str:
    """The SHA-256 of the regular file ``path`` (no link followed)."""
    digest = hashlib.sha256()
    with os.fdopen(sae_io.open_regular(path), "rb") as f:
        while block := f.read(chunk):
            digest.update(block)
    return digest.hexdigest()
