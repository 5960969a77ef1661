"""``sae.export``: a trained SAE written for other tools, or in the toolkit's own portable form.

Two formats:

- ``"sae"`` (every mechanism): ``config.json`` (the model's settings and the SHA-256 of its
  weights) and ``model.safetensors`` (the inference model's tensors under their own names), which
  ``sae.load`` reads. No pickle: loading it cannot run code.
- ``"saelens"``: SAELens' layout, ``cfg.json`` and ``sae_weights.safetensors`` with
  ``W_enc`` [d_in, d_sae], ``b_enc`` [d_sae], ``W_dec`` [d_sae, d_in], ``b_dec`` [d_in], for the
  mechanisms SAELens has:

  =============  ===============  =================================================
  mechanism      architecture     the code, as SAELens computes it
  =============  ===============  =================================================
  ``l1``         ``standard``     ReLU(a)
  ``topk``       ``topk``         ReLU of the k largest entries of a (``k`` in cfg.json)
  ``jumprelu``   ``jumprelu``     ReLU(a) · 1[a > θ] (``threshold`` [d_sae])
  ``batchtopk``  ``jumprelu``     its inference code, a · 1[a > θ], θ its one threshold
  =============  ===============  =================================================

  with a = (x − b_dec) W_enc + b_enc and x̂ = h W_dec + b_dec, as here: the outputs agree to
  float rounding. Other mechanisms, the ``mlp`` encoder and JumpReLU's input gain have no SAELens
  architecture: ``ExportError`` says so in one line (``format="sae"`` keeps them).

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
from sae.models import SparseAutoencoder, build_model
from sae.system.io import write_bytes, write_text
from sae.system.process import EXIT_FAILED, EXIT_USAGE

FORMATS = ("sae", "saelens")
SAELENS_ARCHITECTURES = {"l1": "standard", "topk": "topk", "jumprelu": "jumprelu",
                         "batchtopk": "jumprelu"}


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
    tensors, config = (_saelens if format == "saelens" else _own)(model)
    folder = Path(folder)
    if folder.exists() and (not folder.is_dir() or any(folder.iterdir())):
        raise ExportError(f"{folder} already exists and is not an empty folder; nothing written")
    return _write(folder, tensors, config, format)


def _own(model: SparseAutoencoder) -> tuple[dict, dict]:
    with torch.device("meta"):  # the dtypes sae.load reads: those of the model as built
        built = build_model(model.config, None, 1.0).state_dict()
    tensors = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
    for name, t in tensors.items():
        if name in built and t.dtype != built[name].dtype:
            raise ExportError(f"tensor {name} is {t.dtype}, and sae.load reads "
                              f"{built[name].dtype}: convert the model back (model.float()) "
                              "before exporting it")
    return tensors, {"format": FORMAT, "version": FORMAT_VERSION, "settings": model.settings}


def _saelens(model: SparseAutoencoder) -> tuple[dict, dict]:
    config = model.config
    name = config.model
    architecture = SAELENS_ARCHITECTURES.get(name)
    if architecture is None:
        raise ExportError(f"SAELens has no architecture for --model {name} (it has "
                          f"{', '.join(SAELENS_ARCHITECTURES)}); use format='sae'")
    if config.arch != "linear":
        raise ExportError(f"SAELens has no MLP encoder (this model's --arch is {config.arch}); "
                          "use format='sae'")
    if name == "jumprelu" and config.jumprelu_gain != "none":
        raise ExportError("SAELens' JumpReLU has no input gain (this model's --jumprelu-gain "
                          f"is {config.jumprelu_gain}); use format='sae'")
    weights = {"W_enc": model.W_enc.detach().t(), "b_enc": model.b_enc.detach(),
               "W_dec": (model.W_dec * model.code_scale).detach().t(),
               "b_dec": model.b_dec.detach()}
    H = config.hidden
    if name == "jumprelu":
        weights["threshold"] = model.thresholds().detach().expand(H)
    elif name == "batchtopk":
        weights["threshold"] = model.threshold.detach().expand(H)
    cfg = {"architecture": architecture, "d_in": config.input_dim, "d_sae": H,
           "dtype": "float32", "device": "cpu", "apply_b_dec_to_input": True,
           "normalize_activations": "none", "reshape_activations": "none",
           "meta": {"model_name": None, "hook_name": None},
           # ignored by SAELens, kept for the reader: what the SAE was trained as
           "sae_settings": model.settings}
    if architecture == "topk":
        cfg["k"] = config.k
    tensors = {k: v.float().cpu().contiguous().clone() for k, v in weights.items()}
    return tensors, cfg


def _write(folder: Path, tensors: dict[str, torch.Tensor], config: dict, format: str) -> Path:
    from safetensors.torch import save  # only when a folder is written

    weights_name, config_name = ((WEIGHTS_FILE, CONFIG_FILE) if format == "sae"
                                 else ("sae_weights.safetensors", "cfg.json"))
    # the settings inside the weights file too (its hash covers them): sae.load compares them
    metadata = ({SETTINGS_KEY: json.dumps(config["settings"], sort_keys=True)}
                if format == "sae" else None)
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
                        help="sae: this toolkit's (sae.load reads it, every mechanism); "
                             "saelens: SAELens' cfg.json and sae_weights.safetensors")
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
