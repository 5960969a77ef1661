"""Which runs of a sweep train together as a stack (``sae.training.stack``): the plan, before any
trains (no torch)."""

from __future__ import annotations

import math

from sae.settings.cli import UsageError, run_config

__all__ = ["STACK_AUTO", "plan_stacks"]

STACK_AUTO = 8  # --stack auto: runs a stack holds at most (docs/sweeps.md: its cost per run)


def _stack_key(command: list[str]):
    """What a training must share with others to stack with them (``RunConfig.stack_key``,
    and whether it resumes: a stack resumes all its runs or none); None: it trains alone."""
    argv = command[3:]
    try:
        key = run_config(argv).stack_key()
    except (UsageError, OSError, ValueError):
        return None  # its own run reports what is wrong
    return None if key[0] == "alone" else ("--resume" in argv, key)


def plan_stacks(trainings: list[tuple], size: int | None, slots: int) -> list[list[tuple]]:
    """``trainings`` ((run, command, log) each) grouped into stacks: runs that may share one
    (:func:`_stack_key`), at most ``size`` a stack (None: ``STACK_AUTO``, and no more than
    keeps every one of ``slots`` busy; 1: every run alone), in the order of their first run."""
    groups: dict = {}
    alone = []
    for training in trainings:
        key = _stack_key(training[1]) if size != 1 else None
        if key is None:
            alone.append([training])
        else:
            groups.setdefault(key, []).append(training)
    stacks = []
    for group in groups.values():
        per = size or min(STACK_AUTO, max(1, math.ceil(len(group) / max(1, slots))))
        stacks.extend(group[i:i + per] for i in range(0, len(group), per))
    order = {id(t): n for n, t in enumerate(trainings)}
    return sorted(stacks + alone, key=lambda stack: order[id(stack[0])])
