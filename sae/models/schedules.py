"""Warm-up and decay schedules: pure functions of the optimisation step.

A warm-up length may be given in steps (an integer >= 1) or as a fraction of training (a float in
[0, 1)); ``resolve_steps`` turns either into steps once the total is known.
"""

from __future__ import annotations

import math

SHAPES = ("linear", "cosine")
# the --target-l0 controller (l0_control, lambda_factor): gains measured on MNIST with l1 and
# sparsemax; a pure integral swings with λ's lag, a larger gain or an unclipped error (a
# warm-up L0 of 200 units against 16) drives λ so high that every unit dies
CONTROL_RATE = 0.05  # integral gain a step, on the log-L0 error
CONTROL_KP = 1.0  # proportional gain
MAX_ERROR = 0.5  # the log-L0 error is clipped to ±this (λ moves ≤ e^0.5 at once)


def resolve_steps(value: float, total_steps: int) -> int:
    """Steps of a warm-up given as steps (value >= 1) or as a fraction of ``total_steps`` (< 1)."""
    if value < 0:
        raise ValueError(f"warm-up must be >= 0, got {value}")
    if value < 1:
        return int(round(value * total_steps))
    return int(value)


def ramp(step: int, warmup_steps: int, shape: str = "linear") -> float:
    """Rise from 0 at step 0 to 1 at ``warmup_steps``, then stay at 1.

    linear: t;  cosine: (1 - cos(pi t)) / 2, with t = step / warmup_steps clipped to [0, 1].
    """
    if shape not in SHAPES:
        raise ValueError(f"unknown shape {shape!r}; choose from {SHAPES}")
    if warmup_steps <= 0:
        return 1.0
    t = min(max(step / warmup_steps, 0.0), 1.0)
    return t if shape == "linear" else 0.5 * (1.0 - math.cos(math.pi * t))


def lambda_at(step: int, lam: float, warmup_steps: int, shape: str = "linear") -> float:
    """λ_t: the penalty weight at ``step``, warmed up from 0 so that early features can form."""
    return lam * ramp(step, warmup_steps, shape)


def lr_factor(step: int, warmup_steps: int, total_steps: int, decay: str = "none",
              final_ratio: float = 0.1) -> float:
    """Learning-rate multiplier: linear warm-up, then constant or cosine decay to final_ratio."""
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    if decay == "none" or total_steps <= warmup_steps:
        return 1.0
    if decay != "cosine":
        raise ValueError(f"unknown decay {decay!r}; choose from ('none', 'cosine')")
    t = min((step - warmup_steps) / (total_steps - warmup_steps), 1.0)
    return final_ratio + (1.0 - final_ratio) * 0.5 * (1.0 + math.cos(math.pi * t))


def anneal(step: int, start: float, end: float, steps: int) -> float:
    """Linear interpolation from ``start`` to ``end`` over ``steps`` steps (entmax α anneal)."""
    if steps <= 0:
        return end
    t = min(max(step / steps, 0.0), 1.0)
    return start + (end - start) * t


def control_window(total_steps: int, warmup_steps: int, hold: float) -> tuple[int, int]:
    """The steps ``[start, end)`` over which ``--target-l0`` adapts λ: after the λ warm-up (λ
    still rising says nothing of the λ that lands on the target) and before the last ``hold``
    fraction of training, which trains with λ fixed, so that the final model is a fixed-λ
    model."""
    end = max(int(round(total_steps * (1.0 - hold))), warmup_steps)
    return warmup_steps, end


def l0_control(log_scale, log_l0_ema, l0, log_target, rate: float = CONTROL_RATE,
               beta: float = 0.9):
    """One step of the λ controller of ``--target-l0``; tensors in, tensors out (no host sync).

    ``log_l0_ema`` ← β·ema + (1 − β)·log L0 (the batch's mean L0, smoothed over ~10 steps), and
    the integral ``log_scale`` ← log_scale + rate·clip(ema − log_target), kept within ±25;
    λ's factor is :func:`lambda_factor` of the two. ``log_target``: the log of the training
    batches' L0 to reach (the target, corrected by :func:`training_offset`).
    """
    log_l0 = l0.clamp_min(1e-3).log()
    log_l0_ema = beta * log_l0_ema + (1.0 - beta) * log_l0
    error = (log_l0_ema - log_target).clamp(-MAX_ERROR, MAX_ERROR)
    log_scale = (log_scale + rate * error).clamp(-25.0, 25.0)
    return log_scale, log_l0_ema


def lambda_factor(log_scale, log_l0_ema, log_target):
    """λ's factor: e^(integral + KP·error), a proportional-integral controller in log space,
    so a step is the same for a target of 4 or 400 units; the proportional term answers at
    once and damps the swings that λ's lag (it moves the L0 only through the weights) gives a
    pure integral. Outside the control window both terms are frozen, so λ is fixed.
    ``log_scale`` and ``log_l0_ema`` are 0-d tensors (the training module's buffers)."""
    error = (log_l0_ema - log_target).clamp(-MAX_ERROR, MAX_ERROR)
    return (log_scale + CONTROL_KP * error).clamp(-25.0, 25.0).exp()


def training_offset(offset, log_l0_ema, val_l0):
    """The log-ratio between the training batches' L0 and the validation L0 of the same model,
    smoothed over epochs: the target is a validation L0, the controller sees training batches,
    and the two differ (a model fits its training rows better, and some mechanisms code in
    training as they do not at inference; docs/running.md gives what it changed on MNIST).
    ``offset`` ← (offset + (ema − log val_l0)) / 2, kept within ±1; the training batches then
    aim at target·e^offset."""
    gap = log_l0_ema - val_l0.clamp_min(1e-3).log()
    return (0.5 * (offset + gap)).clamp(-1.0, 1.0)
