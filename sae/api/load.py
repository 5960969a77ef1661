"""``sae.load``: a trained SAE from a run folder, a checkpoint or an exported folder.

What comes back is the inference model (``sae.models.SparseAutoencoder``), a plain
``torch.nn.Module`` in eval mode::

    model = sae.load("runs/mnist-sparsemax")
    codes = model.encode(x)          # x [B, D] -> codes [B, H]
    x_hat = model.decode(codes)      # -> [B, D]; model(x) is decode(encode(x))

Every file is untrusted and read without running code from it, within a fixed memory budget
(nothing is expanded before it is counted): a checkpoint through
``sae.training.checkpoints.read_checkpoint`` (the checks ``--resume`` makes: archive, safe
loading, bounded content, checksum, schema, shapes), an exported folder through
``read_exported`` (``safetensors``, which holds tensors only: the file's size bounded by the
model its settings describe, its hash, the settings it was written with, and every tensor's
name, shape and exact dtype checked before a tensor is read). A folder (run or exported) with a
link anywhere inside it is refused, as the commands refuse one; a path the user names may be a
link. Every refusal is a one-line ``LoadError`` naming its cause.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from pathlib import Path

import torch

from sae.models import SparseAutoencoder, build_model
from sae.settings.config import SAEConfig
from sae.system import io as sae_io
from sae.training.checkpoints import (
    CheckpointError,
    expected_state,
    load_checkpoint,
    tensor_pieces,
)
from sae.training.module import model_state
from sae.training.runfolder import RunFolder, RunFolderError

FORMAT = "sae"  # the toolkit's own exported layout (sae.export(..., format="sae"))
FORMAT_VERSION = 1
CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
SETTINGS_KEY = "sae_settings"  # the settings, in the weights file's own metadata
SAELENS_FILES = ("cfg.json", "sae_weights.safetensors")
MAX_CONFIG_BYTES = 1_000_000
MAX_HEADER_BYTES = 16 * 2**20  # a safetensors header: names, shapes, offsets, the settings
# the names safetensors gives the dtypes an exported model holds
SAFETENSORS_DTYPES = {torch.float64: "F64", torch.float32: "F32", torch.float16: "F16",
                      torch.bfloat16: "BF16", torch.int64: "I64", torch.int32: "I32",
                      torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8",
                      torch.bool: "BOOL"}


class LoadError(ValueError):
    """A path that holds no trained SAE this version can read; the message is one line."""


def load(path: str | Path, device: str | torch.device = "cpu") -> SparseAutoencoder:
    """The trained SAE at ``path``, in eval mode on ``device``.

    ``path`` is a run folder (its ``checkpoints/last.ckpt``, the model its ``metrics.json``
    measured), a checkpoint file, a folder written by ``sae.export(..., format="sae")``, or a
    SAELens folder (``cfg.json``, ``sae_weights.safetensors``: the architectures
    ``sae.api.saelens_format`` reads, among them every ``format="saelens"`` export).
    The model's settings are ``model.config`` (an ``sae.settings.config.SAEConfig``, every
    ``auto`` resolved) and ``model.settings`` (as saved). Raises ``LoadError`` (missing
    path, not a run, refused file, unknown or unavailable device) with a one-line reason.
    """
    path = Path(path)
    device = _device(device)
    try:
        model = _read_folder(path) if path.is_dir() else _read_file(path)
    except (CheckpointError, RunFolderError) as e:
        raise LoadError(str(e)) from None
    try:
        return model.to(device).eval()
    except (RuntimeError, AssertionError, ValueError) as e:
        raise LoadError(f"cannot move the model to device {device}: "
                        f"{' '.join(str(e).split())[:160]}") from None


def _device(device) -> torch.device:
    """``device`` as torch names it, checked to exist here before anything is read."""
    try:
        device = torch.device(device)
    except (RuntimeError, TypeError, ValueError) as e:
        raise LoadError(f"unknown device {str(device)[:60]!r} "
                        f"({' '.join(str(e).split())[:120]})") from None
    try:
        torch.empty(0, device=device)
    except (RuntimeError, AssertionError, ValueError, TypeError) as e:
        raise LoadError(f"device {device} cannot be used here "
                        f"({' '.join(str(e).split())[:120]})") from None
    return device


def _read_file(path: Path) -> SparseAutoencoder:
    """A checkpoint file the user named (it may be a link; a FIFO or a device is named)."""
    if not os.path.lexists(path):
        RunFolder.open(path)  # "run folder not found": what the user most likely meant
    return load_checkpoint(path)


def _read_folder(path: Path) -> SparseAutoencoder:
    """A run folder or an exported folder: refused whole if a link lies inside it."""
    link = sae_io.find_link(path)
    if link is not None:
        raise LoadError(f"refusing {path}: {link} is a link (a run folder or an exported "
                        "folder holds no links; remove it)")
    entries = {name for name in (CONFIG_FILE, WEIGHTS_FILE, "config.yaml", *SAELENS_FILES)
               if os.path.lexists(path / name)}
    if {CONFIG_FILE, WEIGHTS_FILE} <= entries or (
            "config.yaml" not in entries and entries & {CONFIG_FILE, WEIGHTS_FILE}):
        return read_exported(path)
    if "config.yaml" not in entries and entries & set(SAELENS_FILES):
        # deferred: the SAELens layout imports this module
        from sae.api.saelens_format import read_saelens

        return read_saelens(path)
    run = RunFolder.open(path)
    if not os.path.lexists(run.checkpoint):
        raise LoadError(f"run folder {path} has no checkpoint yet "
                        "(checkpoints/last.ckpt is written at the first validation)")
    return load_checkpoint(run.checkpoint)  # a folder, FIFO or device there is named


def read_exported(folder: Path) -> SparseAutoencoder:
    """The model of an exported folder: ``config.json`` (format, settings, the weights' hash)
    and ``model.safetensors``, each checked before the next step reads anything."""
    config = _read_config(folder / CONFIG_FILE)
    settings = config.get("settings")
    if not isinstance(settings, dict) or not isinstance(settings.get("config"), dict):
        raise LoadError(f"{folder / CONFIG_FILE} holds no model settings")
    data_var = settings.get("data_var")
    if isinstance(data_var, bool) or not isinstance(data_var, (int, float)) \
            or not math.isfinite(data_var) or data_var <= 0:
        raise LoadError(f"{folder / CONFIG_FILE}: data_var must be a finite positive number")
    try:  # the settings checked as a checkpoint's are, and the tensors the model must have
        want = model_state(expected_state(settings["config"], folder / CONFIG_FILE))
    except CheckpointError as e:
        raise LoadError(str(e)) from None
    weights = folder / WEIGHTS_FILE
    _check_weights_file(weights, want, config.get("weights_sha256"))
    state = _read_tensors(weights, want, settings)
    for name, t in state.items():
        if t.is_floating_point() and not all(bool(torch.isfinite(p).all())
                                             for p in tensor_pieces(t)):
            raise LoadError(f"{weights} holds non-finite weights ({name})")
    model = build_model(SAEConfig.from_dict(settings["config"]), data_var=float(data_var))
    model.load_state_dict(state)
    return model.eval()


def _check_weights_file(weights: Path, want: dict, sha256) -> None:
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


def _read_tensors(weights: Path, want: dict, settings: dict, prefix: str = "",
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


def _read_config(path: Path) -> dict:
    try:
        config = json.loads(sae_io.read_text(path, limit=MAX_CONFIG_BYTES))
    except FileNotFoundError:
        raise LoadError(f"exported folder {path.parent} has no {path.name}") from None
    except (OSError, ValueError, RecursionError) as e:
        raise LoadError(f"cannot read {path}: {' '.join(str(e).split())[:160]}") from None
    if not isinstance(config, dict) or config.get("format") != FORMAT:
        raise LoadError(f"{path} is not an exported SAE of this toolkit (format {FORMAT!r})")
    version = config.get("version")
    if type(version) is not int or version != FORMAT_VERSION:
        raise LoadError(f"{path} is format version {str(version)[:40]!r}; this version "
                        f"reads {FORMAT_VERSION} (an integer)")
    return config


def file_sha256(path: Path, chunk: int = 1 << 20) -> str:
    """The SHA-256 of the regular file ``path`` (no link followed)."""
    digest = hashlib.sha256()
    with os.fdopen(sae_io.open_regular(path), "rb") as f:
        while block := f.read(chunk):
            digest.update(block)
    return digest.hexdigest()
