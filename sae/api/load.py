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

import json
import math
import os
from pathlib import Path

import torch

from sae.api.weights import (  # what sae.export writes with, named here too
    CONFIG_FILE,
    MAX_CONFIG_BYTES,
    SAFETENSORS_DTYPES,
    SETTINGS_KEY,
    WEIGHTS_FILE,
    LoadError,
    check_weights_file,
    file_sha256,
    read_tensors,
)
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

__all__ = ["CONFIG_FILE", "FORMAT", "FORMAT_VERSION", "SAFETENSORS_DTYPES", "SETTINGS_KEY",
           "WEIGHTS_FILE", "LoadError", "file_sha256", "load", "read_exported"]

FORMAT = "sae"  # the toolkit's own exported layout (sae.export(..., format="sae"))
FORMAT_VERSION = 1
SAELENS_FILES = ("cfg.json", "sae_weights.safetensors")


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
    check_weights_file(weights, want, config.get("weights_sha256"))
    state = read_tensors(weights, want, settings)
    for name, t in state.items():
        if t.is_floating_point() and not all(bool(torch.isfinite(p).all())
                                             for p in tensor_pieces(t)):
            raise LoadError(f"{weights} holds non-finite weights ({name})")
    model = build_model(SAEConfig.from_dict(settings["config"]), data_var=float(data_var))
    model.load_state_dict(state)
    return model.eval()


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
