"""Warm-up and decay schedules: pure functions of the optimisation step.

A warm-up length may be given in steps (an integer >= 1) or as a fraction of training (a float in
[0, 1)); ``resolve_steps`` turns either into steps once the total is known.
"""

from __future__ import annotations

import math

SHAPES = ("linear", "cosine")


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
