"""SAELens' folder layout both ways, without SAELens: ``cfg.json`` and
``sae_weights.safetensors``.

Writing (:func:`to_saelens`): a model SAELens has an architecture for is written in that
architecture's own tensors, so that SAELens alone loads it:

=============  ===============  =================================================
mechanism      architecture     the code, as SAELens computes it
=============  ===============  =================================================
``l1``         ``standard``     ReLU(a)
``topk``       ``topk``         ReLU of the k largest entries of a (``k`` in cfg.json)
``jumprelu``   ``jumprelu``     ReLU(a) · 1[a > θ] (``threshold`` [d_sae])
``batchtopk``  ``jumprelu``     its inference code, a · 1[a > θ], θ its one threshold (θ > 0)
=============  ===============  =================================================

with a = (x − b_dec) W_enc + b_enc and x̂ = h W_dec + b_dec, ``W_enc`` [d_in, d_sae] and
``W_dec`` [d_sae, d_in]. Every other model (the sigmoid, sparsemax, entmax and attention codes,
the MLP encoder, JumpReLU's input gain, the energy rule, a BatchTopK threshold ≤ 0) is written
under the architecture ``sae.<mechanism>``: ``cfg.json`` carries the model's settings
(``sae_settings``) and the weights file the inference model's own tensors, each under
``model.<name>``; ``sae.saelens`` registers these architectures with SAELens.

Reading (:func:`read_saelens`, what ``sae.load`` does with such a folder): the architectures
``standard``, ``topk`` (also with ``rescale_acts_by_decoder_norm``, folded into the weights),
``jumprelu`` (thresholds > 0) and every ``sae.<mechanism>``; ``apply_b_dec_to_input: false`` is
folded into the encoder bias. SAELens' run-time input normalisations have no form here and are
refused. Each file is read as ``sae.load`` reads its own: bounded, no code run, every tensor's
name and shape checked before it is read; each refusal is one ``LoadError`` line.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import asdict
from pathlib import Path

import torch

from sae.api.weights import (
    MAX_CONFIG_BYTES,
    MAX_HEADER_BYTES,
    SETTINGS_KEY,
    LoadError,
    read_tensors,
)
from sae.models import SparseAutoencoder, build_model
from sae.settings.config import SAEConfig
from sae.system import io as sae_io
from sae.training.checkpoints import CheckpointError, expected_state, tensor_pieces
from sae.training.module import model_state

CFG_FILE = "cfg.json"
WEIGHTS_FILE = "sae_weights.safetensors"
PREFIX = "sae."  # the architectures of this toolkit's own mechanisms: sae.<--model>
MODEL_KEY = "model."  # their tensors: the inference model's, under this prefix
# the cfg.json layout written: SAELens 6's (a cfg.json without a version is read as a
# pre-6 one, whose keys SAELens renames)
SAELENS_VERSION = "6.0.0"
NATIVE = ("standard", "topk", "jumprelu")
NATIVE_DEFAULT_K = 100  # SAELens' TopKSAEConfig default, for a cfg.json without k


def architecture(model: SparseAutoencoder) -> str:
    """The SAELens architecture ``model`` is written as: SAELens' own where one computes the
    same code from the same tensors, else ``sae.<mechanism>``."""
    config = model.config
    own = PREFIX + config.model
    if config.arch != "linear" or getattr(config, "energy_rule", 0) != 0:
        return own
    if config.model == "l1":
        return "standard"
    if config.model == "topk":
        return "topk"
    if config.model == "jumprelu":
        return "jumprelu" if config.jumprelu_gain == "none" else own
    if config.model == "batchtopk":  # a·1[a > θ] is ReLU(a)·1[a > θ] only for θ ≥ 0
        return "jumprelu" if float(model.threshold) > 0 else own
    return own


def to_saelens(model: SparseAutoencoder, metadata: dict) -> tuple[dict, dict, dict | None]:
    """(tensors, cfg.json's dict, the weights file's metadata) of ``model`` in SAELens'
    layout; ``metadata`` (model_name, hook_name, ...) goes into cfg.json's ``metadata``."""
    name = architecture(model)
    config, H = model.config, model.config.hidden
    cfg = {"architecture": name, "d_in": config.input_dim, "d_sae": H,
           "dtype": "float32", "device": "cpu",
           # the toolkit's own architectures centre their input themselves
           "apply_b_dec_to_input": name in NATIVE,
           # the toolkit trains on the data as given: no run-time normalisation to undo
           "normalize_activations": "none", "reshape_activations": "none",
           "metadata": {"sae_lens_version": SAELENS_VERSION, **metadata},
           # what the SAE was trained as (SAELens' own architectures ignore it)
           "sae_settings": model.settings}
    if name not in NATIVE:
        tensors = {MODEL_KEY + k: v.detach().cpu().contiguous().clone()
                   for k, v in model.state_dict().items()}
        return tensors, cfg, {SETTINGS_KEY: json.dumps(model.settings, sort_keys=True)}
    weights = {"W_enc": model.W_enc.detach().t(), "b_enc": model.b_enc.detach(),
               "W_dec": (model.W_dec * model.code_scale).detach().t(),
               "b_dec": model.b_dec.detach()}
    if config.model == "jumprelu":
        weights["threshold"] = model.thresholds().detach().expand(H)
    elif config.model == "batchtopk":
        weights["threshold"] = model.threshold.detach().expand(H)
    if name == "topk":
        cfg["k"] = config.k
    return {k: v.float().cpu().contiguous().clone() for k, v in weights.items()}, cfg, None


def read_saelens(folder: Path) -> SparseAutoencoder:
    """The model of the SAELens folder ``folder`` (see the module's docstring), in eval mode.
    Raises ``LoadError`` with a one-line reason."""
    cfg_path, weights = folder / CFG_FILE, folder / WEIGHTS_FILE
    cfg = _read_cfg(cfg_path)
    name = cfg["architecture"]
    if name.startswith(PREFIX):
        return _read_own(cfg, cfg_path, weights)
    if name not in NATIVE:
        raise LoadError(f"{cfg_path}: SAELens architecture {name[:60]!r} has no form here "
                        f"(sae.load reads {', '.join(NATIVE)} and {PREFIX}<mechanism>)")
    return _read_native(cfg, cfg_path, weights)


def folder_metadata(folder: Path) -> dict:
    """The ``metadata`` of the SAELens folder ``folder``'s cfg.json (what its model and data
    were), without the SAELens versions, which the writer sets; {} where there is none."""
    try:
        cfg = json.loads(sae_io.read_text(folder / CFG_FILE, limit=MAX_CONFIG_BYTES))
    except (OSError, ValueError, RecursionError):
        return {}
    meta = cfg.get("metadata") if isinstance(cfg, dict) else None
    if not isinstance(meta, dict):
        return {}
    return {k: v for k, v in meta.items()
            if k not in ("sae_lens_version", "sae_lens_training_version")}


def _read_cfg(path: Path) -> dict:
    """cfg.json: a JSON object with an architecture, positive d_in and d_sae, and no run-time
    normalisation."""
    try:
        cfg = json.loads(sae_io.read_text(path, limit=MAX_CONFIG_BYTES))
    except FileNotFoundError:
        raise LoadError(f"SAELens folder {path.parent} has no {path.name}") from None
    except (OSError, ValueError, RecursionError) as e:
        raise LoadError(f"cannot read {path}: {' '.join(str(e).split())[:160]}") from None
    if not isinstance(cfg, dict) or not isinstance(cfg.get("architecture", "standard"), str):
        raise LoadError(f"{path} is not a SAELens config (a JSON object naming an architecture)")
    cfg.setdefault("architecture", "standard")  # SAELens' default for an older cfg.json
    for key in ("d_in", "d_sae"):
        value = cfg.get(key)
        if type(value) is not int or value < 1:
            raise LoadError(f"{path}: {key} must be a positive integer, got {str(value)[:40]}")
    norm = cfg.get("normalize_activations", "none")
    if norm not in ("none", None):
        raise LoadError(f"{path}: normalize_activations {str(norm)[:40]!r} is a run-time "
                        "normalisation sae.load has no form for (fold it into the weights first)")
    return cfg


def _read_own(cfg: dict, cfg_path: Path, weights: Path) -> SparseAutoencoder:
    """A ``sae.<mechanism>`` folder: the settings in cfg.json, the model's own tensors."""
    settings = cfg.get("sae_settings")
    if not isinstance(settings, dict) or not isinstance(settings.get("config"), dict):
        raise LoadError(f"{cfg_path} holds no model settings (sae_settings)")
    if settings["config"].get("model") != cfg["architecture"][len(PREFIX):]:
        described = str(settings["config"].get("model"))[:40]
        raise LoadError(f"{cfg_path}: architecture {cfg['architecture'][:60]!r} is not the "
                        f"model its settings describe ({described})")
    data_var = settings.get("data_var")
    if isinstance(data_var, bool) or not isinstance(data_var, (int, float)) \
            or not math.isfinite(data_var) or data_var <= 0:
        raise LoadError(f"{cfg_path}: data_var must be a finite positive number")
    try:
        want = model_state(expected_state(settings["config"], cfg_path))
    except CheckpointError as e:
        raise LoadError(str(e)) from None
    _check_size(weights, want.values())
    state = read_tensors(weights, want, settings, prefix=MODEL_KEY, settings_file=cfg_path)
    _check_finite(weights, state)
    model = build_model(SAEConfig.from_dict(settings["config"]), data_var=float(data_var))
    model.load_state_dict(state)
    return model.eval()


def _read_native(cfg: dict, cfg_path: Path, weights: Path) -> SparseAutoencoder:
    """A ``standard``, ``topk`` or ``jumprelu`` folder as the toolkit's l1, topk or jumprelu
    model computing the same code and reconstruction."""
    name, D, H = cfg["architecture"], cfg["d_in"], cfg["d_sae"]
    model_name = {"standard": "l1", "topk": "topk", "jumprelu": "jumprelu"}[name]
    k = cfg.get("k", NATIVE_DEFAULT_K) if name == "topk" else 1
    if type(k) is not int or k < 1:
        raise LoadError(f"{cfg_path}: k must be a positive integer, got {str(k)[:40]}")
    try:
        config = SAEConfig(model=model_name, input_dim=D, hidden=H, k=min(k, H))
        expected_state(asdict(config), cfg_path)  # valid, and within the size a model may have
    except CheckpointError as e:
        raise LoadError(str(e)) from None
    shapes = {"W_enc": (D, H), "b_enc": (H,), "W_dec": (H, D), "b_dec": (D,)}
    if name == "jumprelu":
        shapes["threshold"] = (H,)
    meta = {n: torch.empty(s, dtype=torch.float64, device="meta") for n, s in shapes.items()}
    _check_size(weights, meta.values())
    # folded in float64, then rounded once to the model's float32
    w = {n: t.double() for n, t in _read_float_tensors(weights, shapes).items()}
    _check_finite(weights, w)
    W_enc, b_enc, W_dec, b_dec = w["W_enc"], w["b_enc"], w["W_dec"], w["b_dec"]
    if name == "topk" and cfg.get("rescale_acts_by_decoder_norm"):
        # SAELens' codes are topk(a · ‖W_dec row‖), decoded divided by the norm: the same
        # codes from the folded weights
        norm = W_dec.norm(dim=-1)
        W_enc, b_enc, W_dec = W_enc * norm, b_enc * norm, W_dec / norm[:, None]
    if cfg.get("apply_b_dec_to_input", True) is False:  # a = x W_enc + b_enc: centre it here
        b_enc = b_enc + b_dec @ W_enc
    model = build_model(config, data_var=1.0)
    state = dict(model.state_dict())
    state.update(W_enc=W_enc.t().float().contiguous(), b_enc=b_enc.float(),
                 W_dec=W_dec.t().float().contiguous(), b_dec=b_dec.float())
    if name == "jumprelu":
        if not bool((w["threshold"] > 0).all()):
            raise LoadError(f"{weights}: a JumpReLU threshold is not positive (the toolkit's "
                            "JumpReLU learns θ > 0)")
        state["log_threshold"] = w["threshold"].log().float()
    model.load_state_dict(state)
    return model.eval()


def _check_size(weights: Path, tensors) -> None:
    """The weights file: a regular file no larger than the tensors (at 8 bytes a number) and a
    header of bounded length take."""
    try:
        fd = sae_io.open_regular(weights)
    except FileNotFoundError:
        raise LoadError(f"SAELens folder {weights.parent} has no {weights.name}") from None
    except OSError as e:
        raise LoadError(f"cannot read {weights}: {e.strerror or e}") from None
    with os.fdopen(fd, "rb") as f:
        size = os.fstat(f.fileno()).st_size
    limit = 8 + MAX_HEADER_BYTES + sum(8 * t.numel() for t in tensors)
    if size > limit:
        raise LoadError(f"{weights} is {size} bytes, more than this model's tensors and a "
                        f"header take ({limit}): not its weights")


def _read_float_tensors(weights: Path, shapes: dict) -> dict[str, torch.Tensor]:
    """The tensors ``shapes`` names, each a float tensor of that shape (checked from the
    header before it is read); any other tensor in the file is refused."""
    from safetensors import SafetensorError, safe_open  # only for a SAELens folder

    try:
        with safe_open(str(weights), framework="pt") as f:
            names = set(f.keys())
            if names != set(shapes):
                missing, extra = sorted(set(shapes) - names), sorted(names - set(shapes))
                raise LoadError(f"{weights} does not hold this architecture's tensors "
                                f"(missing {missing[:3]}, unexpected {str(extra[:3])[:120]})")
            for name in sorted(names):
                piece = f.get_slice(name)
                shape, dtype = tuple(piece.get_shape()), piece.get_dtype()
                if shape != shapes[name]:
                    raise LoadError(f"{weights}: tensor {name} has shape {shape}, cfg.json "
                                    f"gives {shapes[name]}")
                if dtype not in ("F64", "F32", "F16", "BF16"):
                    raise LoadError(f"{weights}: tensor {name} is {str(dtype)[:20]}, not floats")
            return {name: f.get_tensor(name) for name in names}
    except LoadError:
        raise
    except (SafetensorError, OSError, ValueError, RuntimeError, TypeError, KeyError) as e:
        raise LoadError(f"cannot read {weights} (damaged: "
                        f"{' '.join(str(e).split())[:160]})") from None


def _check_finite(weights: Path, state: dict[str, torch.Tensor]) -> None:
    for name, t in state.items():
        if t.is_floating_point() and not all(bool(torch.isfinite(p).all())
                                             for p in tensor_pieces(t)):
            raise LoadError(f"{weights} holds non-finite weights ({name})")
