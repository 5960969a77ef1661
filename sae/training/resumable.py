"""What resuming a checkpoint needs beyond reading it safely (:mod:`sae.training.checkpoints`):
the same model as the run, and optimiser, scheduler, loop and callback states of the shapes
Lightning restores, so that a crafted or foreign checkpoint is refused before the run folder
changes, not inside Lightning after its logs exist."""

from __future__ import annotations

import logging
import math
from pathlib import Path

import lightning.pytorch as L
import torch

from sae.models import build_model
from sae.settings.config import SAEConfig
from sae.training.checkpoints import CheckpointError, is_count

__all__ = ["check_compatible"]


def _scalar(value) -> bool:
    return value is None or (isinstance(value, torch.Tensor) and value.numel() == 1)


def _check_optimizer(state: dict, config: dict, path) -> None:
    """Adam's state as Lightning restores it: one optimizer over the model's parameters."""
    with torch.device("meta"):
        model = build_model(SAEConfig.from_dict(config), None, 1.0)
    shapes = [tuple(p.shape) for g in model.param_groups() for p in g["params"]]
    bad = CheckpointError(f"checkpoint {path} has optimizer states that do not fit its model")
    optimizers = state.get("optimizer_states", [])
    if not isinstance(optimizers, list) or len(optimizers) > 1:
        raise bad
    for opt in optimizers:
        if not isinstance(opt, dict) or not isinstance(opt.get("state"), dict) or \
                not isinstance(opt.get("param_groups"), list):
            raise bad
        groups = opt["param_groups"]
        if not all(isinstance(g, dict) and isinstance(g.get("params"), list) for g in groups):
            raise bad
        ids = [i for g in groups for i in g["params"]]
        if not all(is_count(i) for i in ids) or sorted(ids) != list(range(len(shapes))):
            raise bad
        for group in opt["param_groups"]:
            for key, value in group.items():
                if key != "params" and isinstance(value, float) and not math.isfinite(value):
                    raise bad
        for i, entry in opt["state"].items():
            if not is_count(i) or i >= len(shapes) or not isinstance(entry, dict):
                raise bad
            for value in entry.values():
                if isinstance(value, torch.Tensor) and value.numel() != 1 and \
                        tuple(value.shape) != shapes[i]:
                    raise bad
    schedulers = state.get("lr_schedulers", [])
    if not isinstance(schedulers, list) or not all(isinstance(s, dict) for s in schedulers):
        raise CheckpointError(f"checkpoint {path} has malformed scheduler states")


def _like(value, reference, where: str, path) -> None:
    """``value`` has at least ``reference``'s keys, and integers where it has integers."""
    if isinstance(reference, dict):
        if not isinstance(value, dict):
            raise CheckpointError(f"checkpoint {path} has a malformed training state ({where})")
        for key, ref in reference.items():
            if key in value:
                _like(value[key], ref, f"{where}.{key}", path)
            elif isinstance(ref, dict) and ref:
                raise CheckpointError(f"checkpoint {path} has a malformed training state "
                                      f"({where}.{key} is missing)")
    elif isinstance(reference, bool):
        if not isinstance(value, bool):
            raise CheckpointError(f"checkpoint {path} has a malformed training state ({where})")
    elif isinstance(reference, int) and not is_count(value):
        raise CheckpointError(f"checkpoint {path} has a malformed training state ({where})")


def _loop_reference() -> dict | None:
    """The loop states of a fresh Lightning Trainer (the shape it restores), or None where no
    plain CPU trainer can be made (a DDP worker's environment)."""
    loggers = [logging.getLogger(name) for name in ("lightning.pytorch", "lightning.fabric")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:  # a reference trainer, not a run: no banners
        lg.setLevel(logging.WARNING)
    try:
        trainer = L.Trainer(logger=False, enable_checkpointing=False, enable_progress_bar=False,
                            enable_model_summary=False, accelerator="cpu", devices=1)
        return {name: getattr(trainer, name).state_dict() for name in
                ("fit_loop", "validate_loop", "test_loop", "predict_loop")}
    except Exception:  # noqa: BLE001 (any failure: fall back to the generic check)
        return None
    finally:
        for lg, level in zip(loggers, levels, strict=True):
            lg.setLevel(level)


def _check_loops(state: dict, path) -> None:
    """The loop states: those of a fresh Trainer, counters that are integers >= 0."""
    if "loops" not in state:
        return
    reference = _loop_reference()
    if reference is not None:
        _like(state["loops"], reference, "loops", path)
    stack = [state["loops"]]
    while stack:  # every counter, whatever the reference knows, is a plain value
        value = stack.pop()
        if isinstance(value, dict):
            stack.extend(value.values())
        elif not (value is None or isinstance(value, bool) or is_count(value)):
            raise CheckpointError(f"checkpoint {path} has a malformed training state")


def _check_callbacks(state: dict, path) -> None:
    callbacks = state.get("callbacks", {})
    bad = CheckpointError(f"checkpoint {path} has malformed callback states")
    if not isinstance(callbacks, dict) or not all(isinstance(v, dict) for v in callbacks.values()):
        raise bad
    for name, value in callbacks.items():
        if str(name).startswith("Timer"):
            elapsed = value.get("time_elapsed", {})
            if not isinstance(elapsed, dict) or not all(
                    isinstance(t, int | float) and not isinstance(t, bool) and math.isfinite(t)
                    and t >= 0 for t in elapsed.values()):
                raise bad
        elif str(name).startswith("ModelCheckpoint"):
            for key in ("best_model_score", "current_score", "kth_value"):
                if not _scalar(value.get(key)):
                    raise bad
            for key in ("best_model_path", "kth_best_model_path", "last_model_path", "dirpath"):
                if not isinstance(value.get(key, ""), str | type(None)):
                    raise bad
            if "best_model_path" not in value or not isinstance(value.get("best_k_models", {}),
                                                                dict):
                raise bad
            if not all(isinstance(k, str) and _scalar(v)
                       for k, v in value.get("best_k_models", {}).items()):
                raise bad


def check_compatible(state: dict, config: dict, path: str | Path) -> None:
    """Refuse a checkpoint (already read by :func:`read_checkpoint`) that this run cannot resume:
    another model (model, sizes, architecture), or optimiser, scheduler, loop or callback
    states that Lightning could not restore."""
    saved = (state.get("hyper_parameters") or {}).get("config")
    if not isinstance(saved, dict):
        raise CheckpointError(f"checkpoint {path} has no model settings; not made by this tool")
    for key in ("model", "hidden", "input_dim", "arch", "groups", "mlp_width"):
        if key in config and saved.get(key) != config[key]:
            raise CheckpointError(f"checkpoint {path} is of another model ({key} "
                                  f"{str(saved.get(key))[:40]!r}, this run has "
                                  f"{config[key]!r})")
    var = (state.get("hyper_parameters") or {}).get("data_var")
    if not isinstance(var, int | float) or not math.isfinite(var) or var <= 0:
        raise CheckpointError(f"checkpoint {path} has an invalid data variance")
    _check_optimizer(state, saved, path)
    _check_loops(state, path)
    _check_callbacks(state, path)
    seconds = state.get("train_seconds", 0.0)  # an earlier version's training time
    if isinstance(seconds, bool) or not isinstance(seconds, int | float) or \
            not math.isfinite(seconds) or seconds < 0:
        raise CheckpointError(f"checkpoint {path} has an invalid training time")
