"""Lightning callbacks that guard an SAE's training: dead-unit resampling, the non-finite-loss stop.

Both act on the training module (:class:`sae.training.module.SAETraining`) from outside its
training step, which keeps only what its loss needs (the dead-unit tracker, which AuxK uses, and an
on-device non-finite flag set in every step). ``training_callbacks(config)`` lists the callbacks a
configuration needs; add them to the Trainer::

    trainer = L.Trainer(..., callbacks=[*training_callbacks(module.config), ...])
"""

from __future__ import annotations

from collections.abc import Iterable

import lightning.pytorch as L
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor

from sae.settings.config import SAEConfig
from sae.training.module import SAETraining

ADAM_MOMENTS = ("exp_avg", "exp_avg_sq")


class NonFiniteLossError(RuntimeError):
    """Training produced a NaN or infinite loss, or diverged (a batch FVU above
    ``sae.training.module.DIVERGED_FVU``); ``step`` is the step at which it was noticed."""

    def __init__(self, step: int):
        super().__init__(f"non-finite or diverging loss at step {step}")
        self.step = step


class NonFiniteLossGuard(L.Callback):
    """Stop training with ``NonFiniteLossError`` once a loss was not finite, before a checkpoint.

    The training module ORs ``~isfinite(loss)`` into its on-device buffer ``nonfinite_loss`` in
    each step; reading it is a host synchronisation, cheap on a CPU but a stall on an
    accelerator, so it is read after every step on CPU and every ``accelerator_every`` steps
    elsewhere. It is always read at the end of a training epoch, before validation, and before
    any checkpoint is written, so the last checkpoint on disk is one taken before the loss went
    bad.
    """

    def __init__(self, accelerator_every: int = 50):
        self.accelerator_every = accelerator_every

    @staticmethod
    def check(trainer: L.Trainer, pl_module: SAETraining) -> None:
        if bool(pl_module.nonfinite_loss):
            raise NonFiniteLossError(trainer.global_step)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        every = 1 if pl_module.device.type == "cpu" else self.accelerator_every
        if trainer.global_step % every == 0:
            self.check(trainer, pl_module)

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        self.check(trainer, pl_module)

    def on_validation_epoch_start(self, trainer, pl_module) -> None:
        self.check(trainer, pl_module)

    def on_save_checkpoint(self, trainer, pl_module, checkpoint: dict) -> None:
        self.check(trainer, pl_module)  # raised before the file is written


class DeadUnitResampler(L.Callback):
    """Every ``every`` steps up to ``until`` × the run's steps, give dead units new directions.

    Anthropic's recipe ("Towards Monosemanticity", 2023), on a batch of training inputs x [B, D]:
    inputs are drawn without replacement with probability ∝ (per-sample squared error)², one
    per dead unit and at most one per input (the rest wait for the next call); each unit j gets

        W_dec[:, j] ← d = normalise(x_i − b_dec)
        W_enc[j]    ← d · s · mean ‖W_enc[alive]‖      s = the variant's resample_encoder_scale
        b_enc[j]    ← 0, then the variant's ``after_resample`` hook (Sparsemax: admission)

    and Adam's moments of the touched rows and columns are reset to zero, so stale momentum
    does not push the new directions away. "Dead" is the training module's ``dead_mask()`` (no
    firing over its last ``dead_window`` training samples, over all ranks). Under DDP every rank
    takes the same decision (a resampling happens only when every rank's batch gives usable
    weights) and rank 0's new rows are broadcast, so the replicas stay identical. ``history``
    records (step, units resampled) for each resampling.
    """

    def __init__(self, every: int, until: float = 1.0):
        self.every, self.until = every, until
        self.history: list[tuple[int, int]] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        step = trainer.global_step
        if (step > 0 and step % self.every == 0
                and step <= self.until * pl_module.total_steps()):
            n = self.resample(pl_module, batch[0], trainer.optimizers)
            if n:
                self.history.append((step, n))
                pl_module.log("train/resampled", float(n))

    @torch.no_grad()
    def resample(self, module: SAETraining, x: Tensor,
                 optimizers: Iterable[torch.optim.Optimizer] = ()) -> int:
        """Resample the dead units of ``module``'s model from the inputs x [B, D]; return how many.

        Adam moments are reset in each of ``optimizers`` that holds state for the parameters.
        Every DDP rank must call this at the same step (it runs collectives).
        """
        model = module.sae
        dead = module.dead_mask()
        if not dead.any() or model.config.arch != "linear":
            return 0
        x_hat = model(x)
        loss = (x - x_hat).pow(2).sum(-1)  # [B]
        weights = loss.pow(2)
        usable = bool(torch.isfinite(weights).all()) and bool(weights.sum() > 0)
        if not _on_every_rank(usable, x.device):
            return 0
        # One input per unit, never two: units copied from one input add up on it (and on
        # every input near it), so with more dead units than inputs they would multiply its
        # reconstruction (thousands of dead units on a batch of 256 put the batch FVU above
        # 1 000). Units beyond the batch's inputs with an error stay dead until the next call.
        # The same count on every rank: the broadcast below sends rank 0's rows.
        n = min(int(dead.sum()), int((weights > 0).sum()))
        n = _min_on_every_rank(n, x.device)
        pick = torch.multinomial(weights / weights.sum(), n, replacement=False)
        directions = F.normalize(x[pick] - model.b_dec, dim=-1)  # [n, D]
        alive = ~dead
        enc_norm = model.W_enc[alive].norm(dim=-1).mean() if alive.any() else torch.tensor(1.0)
        idx = dead.nonzero().squeeze(-1)[:n]
        model.W_dec[:, idx] = directions.t()
        model.W_enc[idx] = directions * model.resample_encoder_scale * enc_norm
        model.b_enc[idx] = 0.0
        model.after_resample(idx, x[pick])
        if dist.is_available() and dist.is_initialized():
            for p in (model.W_dec, model.W_enc, model.b_enc):
                dist.broadcast(p.data, src=0)
        reset_moments(optimizers, [(model.W_dec, (slice(None), idx)), (model.W_enc, idx),
                                   (model.b_enc, idx)])
        module.samples_since_fired[idx] = 0
        return n


def reset_moments(optimizers: Iterable[torch.optim.Optimizer],
                  rows: list[tuple[Tensor, object]], keys: tuple[str, ...] = ADAM_MOMENTS) -> None:
    """Zero the optimiser state ``keys`` of each (parameter, index) in ``rows``, in place.

    Reads each optimiser's public ``state`` mapping; a parameter without state yet (no step
    taken) is left alone, and no state is created for it.
    """
    for opt in optimizers:
        for param, index in rows:
            state = opt.state.get(param, {})
            for key in keys:
                if key in state:
                    state[key][index] = 0.0


def _on_every_rank(flag: bool, device: torch.device) -> bool:
    """Whether ``flag`` holds on every DDP rank (just ``flag`` in a single process)."""
    return bool(_min_on_every_rank(int(flag), device))


def _min_on_every_rank(n: int, device: torch.device) -> int:
    """The smallest ``n`` over DDP ranks (just ``n`` in a single process)."""
    if not (dist.is_available() and dist.is_initialized()):
        return n
    least = torch.tensor(n, device=device)
    dist.all_reduce(least, op=dist.ReduceOp.MIN)
    return int(least)


def training_callbacks(config: SAEConfig) -> list[L.Callback]:
    """The guard callbacks that training a model of ``config`` needs, in the order to add them."""
    callbacks: list[L.Callback] = [NonFiniteLossGuard()]
    if config.resolved_dead_guard() == "resample":
        callbacks.append(DeadUnitResampler(config.resample_every, config.resample_until))
    return callbacks
