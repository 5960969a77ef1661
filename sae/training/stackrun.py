"""Train a stack of runs (:mod:`sae.training.stack`) from their checked settings.

The stacked counterpart of :func:`sae.training.engine.train`: the same data module, models built
from the generator state a single run builds its model from, the same seed handling, each
member's run folder written as a single run's (checkpoints, ``metrics.csv``, TensorBoard,
``metrics.json``). Runs stack when everything that decides their batches and their loop is the
same (:meth:`sae.settings.config.RunConfig.stack_key`); what may differ is the model: mechanism,
width, λ, k, target L0, learning rate, initialisation and the mechanism's own settings.
"""

from __future__ import annotations

import math
import signal
from dataclasses import dataclass
from pathlib import Path

import lightning.pytorch as L
import torch
from lightning.pytorch.callbacks import Timer

from sae.settings.config import RunConfig
from sae.training import guards, runfolder
from sae.training.callbacks import EpochSeed, StopOnSignal
from sae.training.engine import (
    Terminated,
    Trained,
    TrainingSetupError,
    build_trainer,
    checked_resume,
    finish,
    fit,
    load_data,
    new_module,
    quiet_lightning,
    run_loggers,
)
from sae.training.stack import (
    MemberCallbacks,
    StackCheckpointIO,
    StackCheckpoints,
    StackTraining,
    checkpoint_keys,
    stack_checkpoint,
)

__all__ = ["MemberOutcome", "train_stack"]


@dataclass
class MemberOutcome:
    """One member's end: its trained results, or the error that stopped it alone."""

    trained: Trained | None = None
    error: Exception | None = None


def _resume_all(configs: list[RunConfig]):
    """The members' checked checkpoints to resume (all or none), and their step."""
    resumes = [checked_resume(c) for c in configs]
    resumed = [r[0] is not None for r in resumes]
    if any(resumed) and not all(resumed):
        raise TrainingSetupError("a stack resumes all its runs or none")
    return resumes


def _with_resume(stack: StackTraining, states: list[dict], configs: list[RunConfig]):
    """(path, checkpoint) the stack resumes from, made of its members' last checkpoints; each
    member's best score and generator state are taken from its own."""
    try:
        merged = stack_checkpoint(states)
    except ValueError as e:
        raise TrainingSetupError(str(e)) from None
    for i, state in enumerate(states):
        callbacks = state.get("callbacks", {})
        best_key, _ = checkpoint_keys(Path(configs[i].folder.out) / "checkpoints")
        best = callbacks.get(best_key, {}).get("best_model_score")
        stack.best[i] = float(best) if best is not None else None
        rng = callbacks.get("EpochSeed", {}).get("rng")
        stack.rng_states[i] = rng.clone() if isinstance(rng, torch.Tensor) else None
    return Path(configs[0].folder.out) / "checkpoints" / "last.ckpt", merged


def train_stack(configs: list[RunConfig]) -> list[MemberOutcome]:
    """Fit the runs of ``configs`` (one ``stack_key``) as one stack; one outcome each."""
    first = configs[0]
    if len({c.stack_key() for c in configs}) != 1 or configs[0].stack_key()[0] == "alone":
        raise TrainingSetupError("these runs cannot share a stack: their data, loop or "
                                 "hardware settings differ")
    quiet_lightning()
    L.seed_everything(first.train.seed, workers=True, verbose=False)
    resumes = _resume_all(configs)
    dm = load_data(first)
    start = torch.get_rng_state()
    members = []
    for config in configs:  # each from the generator state a single run starts from
        torch.set_rng_state(start)
        members.append(new_module(config, dm))
    outs = [Path(c.folder.out) for c in configs]
    loggers = []
    for config, out, (_, _, start_step, _) in zip(configs, outs, resumes, strict=True):
        loggers.append(run_loggers(config, out, runfolder.new_session(out, start_step)))
    stack = StackTraining(members, outs, loggers)
    stack.until_converged = first.train.until_converged
    preloaded = None
    if resumes[0][0] is not None:
        preloaded = _with_resume(stack, [r[1] for r in resumes], configs)
    timer, stop = Timer(), StopOnSignal(outs[0] / "checkpoints" / "last.ckpt")
    callbacks = [timer, EpochSeed(first.train.seed),
                 MemberCallbacks([guards.training_callbacks(c.sae) for c in configs]),
                 StackCheckpoints(), stop]
    steps_per_epoch = math.ceil(len(dm.train_x) / first.train.batch_size)
    trainer = build_trainer(first, outs[0], steps_per_epoch, callbacks, [],
                            checkpoint_io=StackCheckpointIO(stack, preloaded))
    try:
        fit(trainer, stack, dm, preloaded[0] if preloaded else None)
    finally:
        for record, out in zip(stack.records, outs, strict=True):
            for logger in record.loggers:
                logger.save()
            runfolder.merge_history(out)
    trainer.save_checkpoint(outs[0] / "checkpoints" / "last.ckpt")  # the live members' last
    if stop.signum is not None:
        raise Terminated if stop.signum == signal.SIGTERM else KeyboardInterrupt
    legacy = max(r[3] for r in resumes)
    wall = (legacy + timer.time_elapsed("train")) / len(configs)  # each member's share
    return [_finish_member(stack, i, config, dm, wall, trainer)
            for i, config in enumerate(configs)]


def _finish_member(stack: StackTraining, i: int, config: RunConfig, dm, wall: float,
                   trainer) -> MemberOutcome:
    if stack.failures[i] is not None:
        return MemberOutcome(error=stack.failures[i])
    member = stack.members[i]
    steps, epochs = stack.finished[i] or (int(trainer.global_step), int(trainer.current_epoch))
    held = float(member.lambda_full()) if member.controls_l0 else None
    trained = finish(config, member.sae, dm, wall, steps, epochs, stack.records[i].loggers,
                     lambda_held=held)
    return MemberOutcome(trained=trained)
