"""``sae.export``: a trained SAE written for other tools, or in the toolkit's own portable form.

Two formats:

- ``"sae"`` (every mechanism): ``config.json`` (the model's settings and the SHA-256 of its
  weights) and ``model.safetensors`` (the inference model's tensors under their own names), which
  ``sae.load`` reads. No pickle: loading it cannot run code.
- ``"saelens"`` (every mechanism): SAELens' layout, ``cfg.json`` and
  ``sae_weights.safetensors``, as ``sae.api.saelens_format`` writes it: SAELens' own
  ``standard``, ``topk`` or ``jumprelu`` architecture where one computes the model's code
  (``l1``, ``topk``, ``jumprelu``, ``batchtopk`` at inference), else the architecture
  ``sae.<mechanism>`` that ``import sae.saelens`` registers with SAELens. ``cfg.json`` carries
  what the run's records know of its data in ``metadata``: ``hook_name`` and ``model_name``
  (``--hook`` and ``--source`` of a run on a network's layer), ``dataset_path`` (the image
  data set or ``--data`` file) and ``sae_data`` (the run's ``data.json``); the toolkit trains on
  its data as given, so ``normalize_activations`` is ``none``.

Nothing is overwritten: the target folder must not exist or be empty. Both files are written
atomically with the same mode, that of a new file under the user's umask (0644 under the usual
022). The ``"sae"`` weights file carries the model's settings in its own metadata, which its
hash covers, so that ``sae.load`` refuses a ``config.json`` whose settings were edited.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch

from sae.api import saelens_format
from sae.api.load import (
    CONFIG_FILE,
    FORMAT,
    FORMAT_VERSION,
    SETTINGS_KEY,
    WEIGHTS_FILE,
    LoadError,
    file_sha256,
    load,
)
from sae.data.rundata import read_record
from sae.data.streamed import PYTHON_SOURCE
from sae.models import SparseAutoencoder, build_model
from sae.system.io import write_bytes, write_text
from sae.system.process import EXIT_FAILED, EXIT_USAGE
from sae.training.runfolder import RunFolder, RunFolderError

FORMATS = ("sae", "saelens")


class ExportError(ValueError):
    """A model, format or folder that cannot be exported; the message is one line."""


def export(run: str | Path | SparseAutoencoder, folder: str | Path, format: str = "sae") -> Path:
    """Write the trained SAE ``run`` (a run folder, checkpoint, exported folder, or a model from
    ``sae.load``) to the new folder ``folder`` in ``format`` (``"sae"`` or ``"saelens"``);
    returns the folder. Raises ``ExportError`` for an unknown format, a mechanism the
    format has no place for, or a folder that already holds files."""
    if format not in FORMATS:
        raise ExportError(f"unknown format {format!r}; choose one of {', '.join(FORMATS)}")
    model = run if isinstance(run, SparseAutoencoder) else load(run)
    if format == "saelens":
        tensors, config, metadata = _saelens(model, run_metadata(run))
    else:
        (tensors, config), metadata = _own(model), None
    folder = Path(folder)
    if folder.exists() and (not folder.is_dir() or any(folder.iterdir())):
        raise ExportError(f"{folder} already exists and is not an empty folder; nothing written")
    return _write(folder, tensors, config, format, metadata)


def _own(model: SparseAutoencoder) -> tuple[dict, dict]:
    _check_dtypes(model)
    tensors = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
    return tensors, {"format": FORMAT, "version": FORMAT_VERSION, "settings": model.settings}


def _saelens(model: SparseAutoencoder, metadata: dict) -> tuple[dict, dict, dict | None]:
    if saelens_format.architecture(model) not in saelens_format.NATIVE:
        _check_dtypes(model)  # its own tensors, which sae.load reads in their exact dtypes
    return saelens_format.to_saelens(model, metadata)


def _check_dtypes(model: SparseAutoencoder) -> None:
    """Each tensor in the dtype of the model as built, which is what sae.load reads."""
    with torch.device("meta"):
        built = build_model(model.config, None, 1.0).state_dict()
    for name, t in model.state_dict().items():
        if name in built and t.dtype != built[name].dtype:
            raise ExportError(f"tensor {name} is {t.dtype}, and sae.load reads "
                              f"{built[name].dtype}: convert the model back (model.float()) "
                              "before exporting it")


def run_metadata(run) -> dict:
    """What ``run``'s folder records of the data it trained on, in SAELens' metadata fields:
    ``model_name`` and ``hook_name`` (a run on a network's layer: ``--source`` and ``--hook``),
    ``dataset_path`` (the image data set or the ``--data`` training file) and ``sae_data`` (the
    run's ``data.json``); each ``None`` where nothing records it (a model object, a folder in
    the toolkit's own format). A SAELens folder passes its own metadata on."""
    meta = {"model_name": None, "hook_name": None, "dataset_path": None}
    if not isinstance(run, SparseAutoencoder) and Path(run).is_dir() \
            and not (Path(run) / "config.yaml").exists():
        return {**meta, **saelens_format.folder_metadata(Path(run))}
    folder = _run_folder(run)
    if folder is None:
        return meta
    record = read_record(folder) or {}
    try:
        settings = RunFolder(folder).settings()
    except RunFolderError:
        settings = {}
    if record.get("streamed"):  # a (model, dataset) given to sae.train has no name to record
        source = record.get("source")
        meta.update(model_name=None if source == PYTHON_SOURCE else source,
                    hook_name=record.get("hook"))
    elif isinstance(record.get("train"), dict):
        meta.update(model_name=record["train"].get("path"),
                    dataset_path=record["train"].get("path"))
    elif not settings.get("data") and not settings.get("source") and settings.get("dataset"):
        meta.update(model_name=settings["dataset"], dataset_path=settings["dataset"])
    if record:
        meta["sae_data"] = record
    return meta


def _run_folder(run) -> Path | None:
    """The run folder of a run folder or of a checkpoint inside one (``checkpoints/*.ckpt``)."""
    if isinstance(run, SparseAutoencoder):
        return None
    path = Path(run)
    folder = path.parent.parent if path.parent.name == "checkpoints" else path
    return folder if (folder / "config.yaml").is_file() else None


def _write(folder: Path, tensors: dict[str, torch.Tensor], config: dict, format: str,
           metadata: dict | None) -> Path:
    """``metadata``: the weights file's own (the settings, which sae.load compares)."""
    from safetensors.torch import save  # only when a folder is written

    weights_name, config_name = ((WEIGHTS_FILE, CONFIG_FILE) if format == "sae"
                                 else (saelens_format.WEIGHTS_FILE, saelens_format.CFG_FILE))
    if format == "sae":  # the settings inside the weights file too (its hash covers them)
        metadata = {SETTINGS_KEY: json.dumps(config["settings"], sort_keys=True)}
    folder.mkdir(parents=True, exist_ok=True)
    weights = write_bytes(folder / weights_name, save(tensors, metadata=metadata))
    if format == "sae":
        config = {**config, "weights_sha256": file_sha256(weights)}
    written = write_text(folder / config_name, json.dumps(config, indent=2) + "\n")
    mode = 0o666 & ~_umask()  # what the user's umask gives a new file, the same for both
    for path in (weights, written):
        path.chmod(mode)
    return folder


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def main(argv: list[str] | None = None) -> int:
    """``python -m sae.export RUN FOLDER [--format sae|saelens]``: one line, and exit 0, 1
    (the folder could not be written) or 2 (a bad run, format or target)."""
    parser = argparse.ArgumentParser(
        prog="python -m sae.export", description="Write a trained SAE for other tools.")
    parser.add_argument("run", help="run folder, checkpoint, or folder exported before")
    parser.add_argument("folder", type=Path, help="the new folder to write (must not hold files)")
    parser.add_argument("--format", choices=FORMATS, default="sae",
                        help="sae: this toolkit's own; saelens: SAELens' cfg.json and "
                             "sae_weights.safetensors (both: every mechanism, and sae.load "
                             "reads them)")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    try:
        folder = export(args.run, args.folder, args.format)
    except (LoadError, ExportError) as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except OSError as e:
        print(f"error: cannot write {args.folder}: {e.strerror or e}", file=sys.stderr)
        return EXIT_FAILED
    print(f"exported ({args.format}): {folder}")
    return 0
