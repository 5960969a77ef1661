"""``sae.load``: a trained SAE from a run folder, a checkpoint or an exported folder.

What comes back is the inference model (``sae.models.SparseAutoencoder``), a plain
``torch.nn.Module`` in eval mode::

    model = sae.load("runs/mnist-sparsemax")
    codes = model.encode(x)          # x [B, D] -> codes [B, H]
    x_hat = model.decode(codes)      # -> [B, D]; model(x) is decode(encode(x))

Every file is untrusted and read without running code from it: a checkpoint through
``sae.training.checkpoints.read_checkpoint`` (the checks ``--resume`` makes: archive, safe
loading, checksum, schema, shapes), an exported folder through ``read_exported``
(``safetensors``, which holds tensors only, with its hash, names and shapes checked against the
model its settings describe before a tensor is read).
"""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path

import torch

from sae.models import SparseAutoencoder, build_model
from sae.settings.config import SAEConfig
from sae.system import io as sae_io
from sae.training.checkpoints import CheckpointError, expected_state, load_checkpoint
from sae.training.module import model_state
from sae.training.runfolder import RunFolder, RunFolderError

FORMAT = "sae"  # the toolkit's own exported layout (sae.export(..., format="sae"))
FORMAT_VERSION = 1
CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
MAX_CONFIG_BYTES = 1_000_000


class LoadError(ValueError):
    """A path that holds no trained SAE this version can read; the message is one line."""


def load(path: str | Path, device: str | torch.device = "cpu") -> SparseAutoencoder:
    """The trained SAE at ``path``, in eval mode on ``device``.

    ``path`` is a run folder (its ``checkpoints/last.ckpt``, the model its ``metrics.json``
    measured), a checkpoint file, or a folder written by ``sae.export(..., format="sae")``.
    The model's settings are ``model.config`` (an ``sae.settings.config.SAEConfig``, every
    ``auto`` resolved) and ``model.settings`` (as saved). Raises ``LoadError`` (missing
    path, not a run, refused file) with a one-line reason.
    """
    path = Path(path)
    try:
        if path.is_file():
            model = load_checkpoint(path)
        elif (path / CONFIG_FILE).is_file() and (path / WEIGHTS_FILE).is_file():
            model = read_exported(path)
        else:
            run = RunFolder.open(path)
            if not run.checkpoint.is_file():
                raise LoadError(f"run folder {path} has no checkpoint yet "
                                "(checkpoints/last.ckpt is written at the first validation)")
            model = load_checkpoint(run.checkpoint)
    except (CheckpointError, RunFolderError) as e:
        raise LoadError(str(e)) from None
    return model.to(device).eval()


def read_exported(folder: Path) -> SparseAutoencoder:
    """The model of an exported folder: ``config.json`` (format, settings, the weights' hash)
    and ``model.safetensors``, each checked before the next step reads anything."""
    from safetensors import safe_open  # only for an exported folder

    config = _read_config(folder / CONFIG_FILE)
    weights = folder / WEIGHTS_FILE
    if file_sha256(weights) != config.get("weights_sha256"):
        raise LoadError(f"{weights} does not match the hash in {folder / CONFIG_FILE}: "
                        "changed or damaged")
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
    try:
        with safe_open(str(weights), framework="pt") as f:
            names = set(f.keys())
            if names != set(want):
                missing, extra = sorted(set(want) - names), sorted(names - set(want))
                raise LoadError(f"{weights} does not hold this model's tensors "
                                f"(missing {missing[:3]}, unexpected {extra[:3]})")
            for name in names:
                if tuple(f.get_slice(name).get_shape()) != tuple(want[name].shape):
                    raise LoadError(f"{weights}: tensor {name} has shape "
                                    f"{tuple(f.get_slice(name).get_shape())}, the model's is "
                                    f"{tuple(want[name].shape)}")
            state = {name: f.get_tensor(name) for name in names}
    except (OSError, ValueError, RuntimeError) as e:
        if isinstance(e, LoadError):
            raise
        raise LoadError(f"cannot read {weights}: {' '.join(str(e).split())[:160]}") from None
    if not all(torch.isfinite(t).all() for t in state.values() if t.is_floating_point()):
        raise LoadError(f"{weights} holds non-finite weights")
    model = build_model(SAEConfig.from_dict(settings["config"]), data_var=float(data_var))
    model.load_state_dict(state)
    return model.eval()


def _read_config(path: Path) -> dict:
    try:
        config = json.loads(sae_io.read_text(path, limit=MAX_CONFIG_BYTES))
    except (OSError, ValueError, RecursionError) as e:
        raise LoadError(f"cannot read {path}: {' '.join(str(e).split())[:160]}") from None
    if not isinstance(config, dict) or config.get("format") != FORMAT:
        raise LoadError(f"{path} is not an exported SAE of this toolkit (format {FORMAT!r})")
    if config.get("version") != FORMAT_VERSION:
        raise LoadError(f"{path} is format version {config.get('version')!r}; this version "
                        f"reads {FORMAT_VERSION}")
    return config


def file_sha256(path: Path, chunk: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            digest.update(block)
    return digest.hexdigest()
