"""The training wrapper: a LightningModule that holds an SAE (``sae.models``) and trains it.

The inference model knows its code, its decoder and the terms of its own objective (``penalty``,
``extra_loss``); everything else about training lives here:

    loss = ‖x − x̂‖² / v  +  λ_t · penalty(h)  (+ the variant's extra term, AuxK for TopK)

with v = E‖x − x̄‖², so the first term is the batch's fraction of variance unexplained, and λ_t
warmed up from 0 to λ. Decoder columns are kept at unit norm (the gradient's component along each
column is removed before the step, and columns are renormalised after it), so a penalty on h
cannot be dodged by shrinking h and growing W_dec. The dead-unit tracker (which AuxK and the
resampler read) and the non-finite flag (which the guard in ``sae.training.guards`` reads) are
buffers of this module, not of the model.

Checkpoints keep the model's own tensor names (``W_dec``, not ``sae.W_dec``): a checkpoint's
``state_dict`` is the inference model's plus this module's two buffers, so :func:`sae.load`
reads it without Lightning, and checkpoints of earlier versions resume unchanged.
"""

from __future__ import annotations

import math
from collections import OrderedDict

import lightning.pytorch as L
import torch
import torch.distributed as dist
from torch import Tensor

from sae import metrics
from sae.models import build_model
from sae.models.base import SparseAutoencoder
from sae.models.losses import column_norms, fvu_term
from sae.models.schedules import (
    control_window,
    l0_control,
    lambda_at,
    lambda_factor,
    lr_factor,
    resolve_steps,
    training_offset,
)
from sae.settings.config import FIXED_BUDGET, SAEConfig

DIVERGED_FVU = 1e3  # a training batch's FVU above this stops training as a NaN does
PREFIX = "sae."  # the model's place in this module (dropped from checkpoint keys)
# this module's own buffers, not the model's (the last three only with --target-l0)
TRAINING_BUFFERS = ("samples_since_fired", "nonfinite_loss", "lambda_log_scale", "l0_log_ema",
                    "l0_log_offset")


class SAETraining(L.LightningModule):
    """Trains ``sae``: loss assembly, logging, the optimiser, validation statistics."""

    def __init__(self, sae: SparseAutoencoder):
        super().__init__()
        self.sae = sae
        self.save_hyperparameters(sae.settings)
        # dead-unit tracking: this rank's training samples since each unit last fired (on device)
        self.register_buffer("samples_since_fired",
                             torch.zeros(sae.config.hidden, dtype=torch.long))
        # set in the step, read by sae.training.guards.NonFiniteLossGuard (a read is a host sync)
        self.register_buffer("nonfinite_loss", torch.zeros((), dtype=torch.bool))
        # (id of the trainer, its fit's step count) while a fit trains: read twice a step, and
        # the trainer's estimate is recomputed on each read
        self._fit_steps: tuple[int, int] | None = None
        self._controls_l0 = False
        # where ``log`` sends values instead of Lightning: set while this module trains as a
        # member of a stack (``sae.training.stack``), whose members each keep their own logs
        self.log_sink = None
        if sae.config.target_l0 is not None and sae.config.model not in FIXED_BUDGET:
            self._controls_l0 = True
            # --target-l0: λ = λ₀·e^lambda_log_scale, adapted each step (sae.models.schedules)
            self.register_buffer("lambda_log_scale", torch.zeros((), dtype=torch.float64))
            self.register_buffer("l0_log_ema", torch.full(
                (), math.log(sae.config.target_l0), dtype=torch.float64))
            # log(training-batch L0 / validation L0), measured at each validation
            self.register_buffer("l0_log_offset", torch.zeros((), dtype=torch.float64))

    @property
    def config(self) -> SAEConfig:
        return self.sae.config

    # ---- checkpoints keep the model's own names ---------------------------------------------
    def state_dict(self, *args, **kwargs):
        prefix = kwargs.get("prefix", args[1] if len(args) > 1 else "")
        inner = prefix + PREFIX
        return OrderedDict((prefix + k[len(inner):] if k.startswith(inner) else k, v)
                           for k, v in super().state_dict(*args, **kwargs).items())

    def load_state_dict(self, state_dict, strict: bool = True, assign: bool = False):
        named = OrderedDict((k if k in TRAINING_BUFFERS else PREFIX + k, v)
                            for k, v in state_dict.items())
        return super().load_state_dict(named, strict=strict, assign=assign)

    def log(self, name: str, value, *args, **kwargs) -> None:
        """Lightning's ``log``, or, in a stack, the member's own record of ``name``."""
        if self.log_sink is not None:
            self.log_sink(name, value, prog_bar=kwargs.get("prog_bar", False))
            return
        super().log(name, value, *args, **kwargs)

    # ---- one pass ---------------------------------------------------------------------------
    def forward(self, x: Tensor) -> tuple[Tensor, Tensor, dict]:
        """x [B, D] -> (x̂, h, extras): the model's ``forward_pass`` (what ``torch.compile``
        compiles when the run asks for it)."""
        return self.sae.forward_pass(x)

    @property
    def controls_l0(self) -> bool:
        """Whether λ adapts to land on ``--target-l0`` (a model with a λ given a target): a plain
        flag, as ``hasattr`` on a module without the buffer raises and formats an error."""
        return self._controls_l0

    def lambda_now(self):
        """λ_t: the penalty weight at this step, warmed up from 0 to λ (a float), times the
        controller's factor with ``--target-l0`` (a 0-d tensor: read without a host sync)."""
        total = self.total_steps()
        warm = resolve_steps(self.config.lambda_warmup, total)
        lam = lambda_at(self.global_step, self.config.lam, warm, self.config.lambda_warmup_shape)
        if self.controls_l0:
            return lam * self.lambda_factor()
        return lam

    def lambda_factor(self) -> Tensor:
        """The controller's factor on λ (``sae.models.schedules.lambda_factor``), float32."""
        return lambda_factor(self.lambda_log_scale, self.l0_log_ema, self.log_target()).float()

    def log_target(self) -> Tensor:
        """The log of the training batches' L0 the controller aims at: the target, corrected by
        the training / validation gap (``sae.models.schedules.training_offset``)."""
        return math.log(self.config.target_l0) + self.l0_log_offset

    def in_control_window(self) -> bool:
        total = self.total_steps()
        warm = resolve_steps(self.config.lambda_warmup, total)
        start, end = control_window(total, warm, self.config.l0_hold)
        return start <= self.global_step < end

    def lambda_full(self):
        """λ after its warm-up: ``--lambda``, times the controller's factor."""
        if self.controls_l0:
            return self.config.lam * self.lambda_factor()
        return self.config.lam

    def control_l0(self, h: Tensor) -> None:
        """One step of the ``--target-l0`` controller on this batch's mean L0, inside the
        control window (``sae.models.schedules.control_window``); λ is fixed outside it."""
        if not self.in_control_window():
            return
        l0 = metrics.active(h, self.sae.fire_threshold).sum(-1).double().mean()
        if dist.is_available() and dist.is_initialized():  # every rank keeps the same λ
            dist.all_reduce(l0)
            l0 = l0 / dist.get_world_size()
        scale, ema = l0_control(self.lambda_log_scale, self.l0_log_ema, l0, self.log_target())
        self.lambda_log_scale.copy_(scale)
        self.l0_log_ema.copy_(ema)

    def total_steps(self) -> int:
        """Optimiser steps this fit will take (1 when not fitting); while training, the count
        taken as training started (the trainer's estimate does not change during a fit)."""
        fit = self._fit_steps
        if fit is not None and fit[0] == id(self._trainer):
            return fit[1]
        try:
            return max(int(self.trainer.estimated_stepping_batches), 1)
        except (RuntimeError, AttributeError):
            return 1

    def setup(self, stage: str) -> None:
        # every fit, validation or test starts here (before configure_optimizers): nothing is
        # kept from an earlier fit, even one stopped by an error before on_train_end
        self._fit_steps = None

    def on_train_start(self) -> None:
        self._fit_steps = None
        self._fit_steps = (id(self._trainer), self.total_steps())

    def on_train_end(self) -> None:
        self._fit_steps = None

    # ---- training -------------------------------------------------------------------------
    def training_step(self, batch, batch_idx: int) -> Tensor:
        x = batch[0]
        sae = self.sae
        sae.set_progress(self.global_step, self.total_steps())
        x_hat, h, extras = self(x)
        recon = fvu_term(x, x_hat, sae.data_var)
        lam_t = self.lambda_now()
        penalty = sae.penalty(h, extras)
        loss = recon + lam_t * penalty
        if sae.needs_dead_units:
            extras["dead"] = self.dead_mask(reduce=False)
        aux = sae.extra_loss(x, x_hat, h, extras)
        if aux is not None:
            loss = loss + aux
        with torch.no_grad():
            if self.controls_l0:
                self.control_l0(h.detach())
            # a unit fired in this batch iff its largest code is above the threshold (a [H]
            # reduction instead of a [B, H] mask; NaN codes, which stop training, differ)
            fired = h.amax(0) > sae.fire_threshold
            self.samples_since_fired.add_(len(x)).masked_fill_(fired, 0)
            # a NaN, or a blow-up that stays finite: the batch FVU far above that of x̂ = x̄ (1)
            # in place: ``|=`` would assign the buffer again through Module.__setattr__
            self.nonfinite_loss.logical_or_(~torch.isfinite(loss) | (recon > DIVERGED_FVU))
        if self.logs_this_step():
            active = metrics.active(h.detach(), sae.fire_threshold)
            self.log("train/loss", loss, prog_bar=True)
            self.log("train/recon", recon)
            self.log("train/penalty", penalty)
            self.log("train/lambda", lam_t)
            self.log("train/l0", active.sum(-1).float().mean(), prog_bar=True)
            # over all DDP ranks (every rank logs on the same steps, so the collective matches)
            self.log("train/dead_fraction", self.dead_mask().float().mean())
            if aux is not None:
                self.log("train/aux", aux)
            for name, value in sae.train_logs().items():
                self.log(f"train/{name}", value)
        return loss

    def logs_this_step(self) -> bool:
        """Whether the trainer writes this training step's logged values to its loggers.

        Per-step values are only written every ``log_every_n_steps`` steps, and each ``self.log``
        call costs about as much as a small SAE's forward pass, so the other steps skip them.
        The rule is the one Lightning's logger connector applies after the step: the count of
        optimiser steps taken so far plus one (this one) is a multiple of ``log_every_n_steps``,
        or the trainer is about to stop; fast_dev_run writes every step.
        """
        try:
            trainer = self.trainer
        except RuntimeError:  # not attached to a trainer: a direct call, nothing to skip
            return True
        if trainer.fast_dev_run:
            return True
        every = trainer.log_every_n_steps
        if every == 0:
            return False
        return (self.global_step + 1) % every == 0 or trainer.should_stop

    def dead_mask(self, reduce: bool = True) -> Tensor:
        """[H] bool: units that fired on none of the last ``dead_window`` training samples.

        With ``reduce`` the count is taken over all DDP ranks (a collective: every rank must
        call it); without, over this rank's samples, scaled as if all ranks saw the same.
        """
        since = self.samples_since_fired
        if reduce and dist.is_available() and dist.is_initialized():
            since = since.clone()
            dist.all_reduce(since, op=dist.ReduceOp.MIN)
            return since * dist.get_world_size() >= self.config.dead_window
        return since >= self.config.dead_window  # one process: no scaling, one op a step

    def on_before_optimizer_step(self, optimizer) -> None:
        # keep W_dec's columns on the unit sphere: drop the gradient's radial component
        if not self.sae.unit_norm_decoder:
            return
        W = self.sae.W_dec
        g = W.grad
        if g is not None:
            # no_grad: otherwise the in-place update records a graph on .grad that chains every
            # step's to the last one (memory grew by ~3 MB a step)
            with torch.no_grad():  # g − W (Wᵀg per column), in place, without [D, H] temporaries
                g.addcmul_(W, torch.linalg.vecdot(g, W, dim=0), value=-1)

    def optimizer_step(self, epoch, batch_idx, optimizer, optimizer_closure=None) -> None:
        optimizer.step(closure=optimizer_closure)
        self.renormalise()

    def renormalise(self) -> None:
        """Put W_dec's columns back on the unit sphere after a step (the variants that keep
        them there)."""
        if self.sae.unit_norm_decoder:
            with torch.no_grad():
                W = self.sae.W_dec
                W.div_(column_norms(W).clamp_min_(1e-8))

    # ---- validation -----------------------------------------------------------------------
    def on_validation_epoch_start(self) -> None:
        zeros = {"dtype": torch.float64, "device": self.device}
        self._val = {"sq_err": torch.zeros((), **zeros), "sq_dev": torch.zeros((), **zeros),
                     "penalty": torch.zeros((), **zeros), "l0": torch.zeros((), **zeros),
                     "n": torch.zeros((), **zeros),
                     "fires": torch.zeros(self.config.hidden, **zeros)}

    def validation_step(self, batch, batch_idx: int) -> dict:
        x = batch[0]
        self.sae.set_progress(self.global_step, self.total_steps())
        x_hat, h, extras = self(x)
        active = metrics.active(h, self.sae.fire_threshold)
        v = self._val
        v["sq_err"] += (x - x_hat).pow(2).sum()
        v["sq_dev"] += (x - self.sae.mean_image).pow(2).sum()
        v["penalty"] += self.sae.penalty(h, extras).double() * len(x)
        v["l0"] += active.sum()
        v["n"] += len(x)
        v["fires"] += active.sum(0)
        return {"codes": h, "x_hat": x_hat, "active": active}

    def on_validation_epoch_end(self) -> None:
        v = {k: self.trainer.strategy.reduce(t, reduce_op="sum") for k, t in self._val.items()}
        n = v["n"].clamp_min(1)
        fvu = v["sq_err"] / v["sq_dev"].clamp_min(1e-12)
        freq = v["fires"] / n
        self.val_firing_counts = v["fires"]  # summed over ranks
        # val/loss uses the full λ (not λ_t) so that "best" does not favour warm-up checkpoints
        val_loss = v["sq_err"] / n / self.sae.data_var + self.lambda_full() * v["penalty"] / n
        self.log_dict({"val/loss": val_loss.float(), "val/fvu": fvu.float(),
                       "val/mse": (v["sq_err"] / n / self.config.input_dim).float(),
                       "val/l0": (v["l0"] / n).float(),
                       "val/dead_fraction": (freq == 0).float().mean(),
                       "val/dense_fraction": (freq > 0.5).float().mean()})
        if self.controls_l0:  # the λ this epoch's model was trained with
            self.log("val/lambda", torch.as_tensor(self.lambda_full(), dtype=torch.float32))
            if self.in_control_window() and not self.trainer.sanity_checking:
                self.l0_log_offset.copy_(training_offset(self.l0_log_offset, self.l0_log_ema,
                                                         (v["l0"] / n).to(torch.float64)))

    def configure_optimizers(self):
        opt = torch.optim.Adam(self.sae.param_groups(), lr=self.config.lr)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, self.lr_schedule())
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}

    def lr_schedule(self):
        """step -> the factor on the learning rate (warm-up and decay of this fit's steps)."""
        total = self.total_steps()
        warm = resolve_steps(self.config.lr_warmup, total)
        decay = self.config.lr_decay
        return lambda step: lr_factor(step, warm, total, decay)


def training_module(config: SAEConfig, mean_image: Tensor | None = None, data_var: float = 1.0,
                    init_inputs: Tensor | None = None) -> SAETraining:
    """A new model of ``config`` (``sae.models.build_model``) in its training wrapper."""
    return SAETraining(build_model(config, mean_image, data_var, init_inputs))


def model_state(state_dict: dict) -> dict:
    """The inference model's tensors of a checkpoint's ``state_dict`` (without this module's)."""
    return {k: v for k, v in state_dict.items() if k not in TRAINING_BUFFERS}
