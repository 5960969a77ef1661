"""The SAE base LightningModule: shared encoder/decoder, loss assembly, validation statistics.

Shared architecture (the classic one-layer SAE, so decoder columns are images)::

    a  = W_enc (x - b_dec) + b_enc        pre-activations         [B, H]
    h  = f(a)                             the code (per variant)  [B, H]
    x̂  = W_dec (s · h) + b_dec            reconstruction          [B, D]

Decoder columns are kept at unit norm (the gradient's component along each column is removed before
the step, and columns are renormalised after it), so a penalty on h cannot be dodged by shrinking h
and growing W_dec. ``s`` is 1 except for the sigmoid (KL) code, whose units saturate at 1: there
``s = sqrt(v)``, the data's RMS distance to the mean image, so one fully-on unit draws a typical
centred image. The reconstruction term is normalised by v = E‖x − x̄‖²:

    loss = ‖x − x̂‖² / v  +  λ_t · penalty(h)   (+ AuxK for TopK)

which is the batch's fraction of variance unexplained; λ_t warms up from 0 to λ.

A variant (one module each in this package) defines the code map ``code`` and the ``penalty``, and
may add a loss term (``extra_loss``) or a hook run after its dead units are resampled
(``after_resample``). Cross-cutting training behaviour lives in callbacks
(``sae.models.guards``): the non-finite-loss guard reads the ``nonfinite_loss`` flag set here in
every step, and the dead-unit resampler reads the tracker kept here (``samples_since_fired``,
``dead_mask``), which AuxK also uses in the loss.
"""

from __future__ import annotations

import math
from dataclasses import asdict

import lightning.pytorch as L
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor, nn

from sae import metrics
from sae.models.losses import column_norms, fvu_term
from sae.models.schedules import lambda_at, lr_factor, resolve_steps
from sae.settings.config import SAEConfig

DIVERGED_FVU = 1e3  # a training batch's FVU above this stops training as a NaN does


class SparseAutoencoder(L.LightningModule):
    """Base SAE: shared encoder/decoder, loss assembly, validation statistics, optimiser.

    Subclasses define ``code(a, x_centred) -> (h, extras)`` and ``penalty(h, extras) -> scalar``.
    Class attributes a variant may override: ``fire_threshold`` (a unit fires when its code is
    above it), ``code_scale_is_data_norm`` (the decoder sees sqrt(v) · h) and
    ``resample_encoder_scale`` (the encoder-row scale a resampled unit starts with).
    """

    fire_threshold: float = 0.0
    code_scale_is_data_norm: bool = False
    resample_encoder_scale: float = 0.2  # Anthropic's 0.2 suits ReLU codes; see SparsemaxSAE

    def __init__(self, config: SAEConfig, mean_image: Tensor | None = None, data_var: float = 1.0,
                 init_inputs: Tensor | None = None):
        super().__init__()
        config = config.pinned()  # the checkpoint names the modes auto meant at training time
        self.config = config
        self.save_hyperparameters({"config": asdict(config), "data_var": float(data_var)})
        D, H = config.input_dim, config.hidden
        self.register_buffer("data_var", torch.tensor(float(data_var)))
        code_scale = math.sqrt(data_var) if self.code_scale_is_data_norm else 1.0
        self.register_buffer("code_scale", torch.tensor(code_scale))
        mean_image = mean_image.clone().float() if mean_image is not None else torch.zeros(D)
        self.register_buffer("mean_image", mean_image)  # x̄ of fvu, fixed at construction
        self.b_dec = nn.Parameter(mean_image.clone())
        width = D if config.arch == "linear" else config.mlp_width
        atoms = torch.randn(width, H)
        if init_inputs is not None and config.arch == "linear":
            atoms = (init_inputs[:H].float() - mean_image).t()  # [D, n <= H] centred inputs
            atoms = torch.cat([atoms, torch.randn(width, H - atoms.shape[1])], dim=1)
        self.W_dec = nn.Parameter(F.normalize(atoms, dim=0))  # [width, H]
        self.W_enc = nn.Parameter(self.W_dec.detach().t().clone())  # tied init (Gao et al. 2024)
        self.b_enc = nn.Parameter(torch.zeros(H))
        if config.arch == "mlp":
            self.enc_in = nn.Sequential(nn.Linear(D, width), nn.ReLU())
            self.dec_out = nn.Sequential(nn.ReLU(), nn.Linear(width, D))
        # dead-unit tracking: this rank's training samples since each unit last fired (on device)
        self.register_buffer("samples_since_fired", torch.zeros(H, dtype=torch.long))
        # set in the step, read by sae.models.guards.NonFiniteLossGuard (a read is a host sync)
        self.register_buffer("nonfinite_loss", torch.zeros((), dtype=torch.bool))

    # ---- the model ------------------------------------------------------------------------
    def pre_activations(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """x [B, D] -> (a [B, H], x - b_dec [B, D])."""
        x_centred = x - self.b_dec
        inner = x_centred if self.config.arch == "linear" else self.enc_in(x_centred)
        return F.linear(inner, self.W_enc, self.b_enc), x_centred

    def code(self, a: Tensor, x_centred: Tensor) -> tuple[Tensor, dict]:
        """a [B, H], x − b_dec [B, D] -> (h [B, H], extras the penalty needs)."""
        raise NotImplementedError

    def penalty(self, h: Tensor, extras: dict) -> Tensor:
        """h [B, H] (and ``code``'s extras) -> the scalar that λ weighs."""
        raise NotImplementedError

    def encode(self, x: Tensor) -> Tensor:
        """x [B, D] -> h [B, H]."""
        a, x_centred = self.pre_activations(x)
        return self.code(a, x_centred)[0]

    def decode(self, h: Tensor) -> Tensor:
        """h [B, H] -> x̂ [B, D]."""
        out = F.linear(h * self.code_scale, self.W_dec)
        if self.config.arch == "mlp":
            out = self.dec_out(out)
        return out + self.b_dec

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor, dict]:
        """x [B, D] -> (x̂ [B, D], h [B, H], extras with the pre-activations a [B, H])."""
        a, x_centred = self.pre_activations(x)
        h, extras = self.code(a, x_centred)
        extras["a"] = a
        return self.decode(h), h, extras

    def linear_decoder(self) -> tuple[Tensor, Tensor] | None:
        """(atoms W [D, H], offset b [D]) with x̂ = W h + b, detached, or None for a
        non-linear decoder: what the least-squares and ground-truth measures read."""
        if self.config.arch != "linear":
            return None
        return (self.W_dec * self.code_scale).detach(), self.b_dec.detach()

    def attribution(self) -> tuple[Tensor, Tensor] | None:
        """(encoder rows [H, D], centre [D]), detached, such that unit j's pre-activation less
        its bias is Σ_i (x − centre)_i · rows[j, i]: what the feature browser's per-pixel
        attributions show; None where no such sum exists (a non-linear encoder)."""
        if self.config.arch != "linear":
            return None
        return self.W_enc.detach(), self.b_dec.detach()

    def atoms(self) -> Tensor:
        """What each unit draws, [D, H]: decoder columns (linear) or decode(s·e_j) − decode(0)."""
        if self.config.arch == "linear":
            return self.W_dec.detach()
        with torch.no_grad():
            eye = torch.eye(self.config.hidden, device=self.device)
            zero = self.decode(torch.zeros(1, self.config.hidden, device=self.device))
            return (self.decode(eye) - zero).t()

    # ---- losses ---------------------------------------------------------------------------
    def recon_loss(self, x: Tensor, x_hat: Tensor) -> Tensor:
        """Batch ‖x − x̂‖² / v, v = E‖x − x̄‖²: the batch's fraction of variance unexplained."""
        return fvu_term(x, x_hat, self.data_var)

    def extra_loss(self, x: Tensor, x_hat: Tensor, h: Tensor, extras: dict) -> Tensor | None:
        """A variant's additional loss term (not weighted by λ), or None."""
        return None

    def lambda_now(self) -> float:
        """λ_t: the penalty weight at this step, warmed up from 0 to λ."""
        total = self.total_steps()
        warm = resolve_steps(self.config.lambda_warmup, total)
        return lambda_at(self.global_step, self.config.lam, warm, self.config.lambda_warmup_shape)

    def total_steps(self) -> int:
        """Optimiser steps this fit will take (1 when not fitting)."""
        try:
            return max(int(self.trainer.estimated_stepping_batches), 1)
        except (RuntimeError, AttributeError):
            return 1

    # ---- training -------------------------------------------------------------------------
    def training_step(self, batch, batch_idx: int) -> Tensor:
        x = batch[0]
        x_hat, h, extras = self(x)
        recon = self.recon_loss(x, x_hat)
        lam_t = self.lambda_now()
        penalty = self.penalty(h, extras)
        loss = recon + lam_t * penalty
        aux = self.extra_loss(x, x_hat, h, extras)
        if aux is not None:
            loss = loss + aux
        with torch.no_grad():
            # a unit fired in this batch iff its largest code is above the threshold (a [H]
            # reduction instead of a [B, H] mask; NaN codes, which stop training, differ)
            fired = h.amax(0) > self.fire_threshold
            self.samples_since_fired.add_(len(x)).masked_fill_(fired, 0)
            # a NaN, or a blow-up that stays finite: the batch FVU far above that of x̂ = x̄ (1)
            self.nonfinite_loss |= ~torch.isfinite(loss) | (recon > DIVERGED_FVU)
        if self.logs_this_step():
            active = metrics.active(h.detach(), self.fire_threshold)
            self.log("train/loss", loss, prog_bar=True)
            self.log("train/recon", recon)
            self.log("train/penalty", penalty)
            self.log("train/lambda", lam_t)
            self.log("train/l0", active.sum(-1).float().mean(), prog_bar=True)
            # over all DDP ranks (every rank logs on the same steps, so the collective matches)
            self.log("train/dead_fraction", self.dead_mask().float().mean())
            if aux is not None:
                self.log("train/aux", aux)
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
        world = 1
        if reduce and dist.is_available() and dist.is_initialized():
            since = since.clone()
            dist.all_reduce(since, op=dist.ReduceOp.MIN)
            world = dist.get_world_size()
        return since * world >= self.config.dead_window

    def on_before_optimizer_step(self, optimizer) -> None:
        # keep W_dec's columns on the unit sphere: drop the gradient's radial component
        g = self.W_dec.grad
        if g is not None:
            # no_grad: otherwise the in-place update records a graph on .grad that chains every
            # step's to the last one (memory grew by ~3 MB a step)
            with torch.no_grad():  # g − W (Wᵀg per column), in place, without [D, H] temporaries
                g.addcmul_(self.W_dec, torch.linalg.vecdot(g, self.W_dec, dim=0), value=-1)

    def optimizer_step(self, epoch, batch_idx, optimizer, optimizer_closure=None) -> None:
        optimizer.step(closure=optimizer_closure)
        with torch.no_grad():
            self.W_dec.div_(column_norms(self.W_dec).clamp_min_(1e-8))

    def after_resample(self, idx: Tensor, inputs: Tensor) -> None:
        """Hook for variants, run by the dead-unit resampler after it re-initialised units.

        ``idx`` [n] the resampled units, ``inputs`` [n, D] the input each was copied from.
        """

    def result_extras(self) -> dict[str, float]:
        """What a variant adds to a run's test results (``metrics.json``) besides the common
        measures: the state it learned that a reader compares across runs (none here)."""
        return {}

    # ---- validation -----------------------------------------------------------------------
    def on_validation_epoch_start(self) -> None:
        H = self.config.hidden
        self._val = {"sq_err": torch.zeros((), device=self.device, dtype=torch.float64),
                     "sq_dev": torch.zeros((), device=self.device, dtype=torch.float64),
                     "penalty": torch.zeros((), device=self.device, dtype=torch.float64),
                     "l0": torch.zeros((), device=self.device, dtype=torch.float64),
                     "n": torch.zeros((), device=self.device, dtype=torch.float64),
                     "fires": torch.zeros(H, device=self.device, dtype=torch.float64)}

    def validation_step(self, batch, batch_idx: int) -> dict:
        x = batch[0]
        x_hat, h, extras = self(x)
        active = metrics.active(h, self.fire_threshold)
        v = self._val
        v["sq_err"] += (x - x_hat).pow(2).sum()
        v["sq_dev"] += (x - self.mean_image).pow(2).sum()
        v["penalty"] += self.penalty(h, extras).double() * len(x)
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
        val_loss = v["sq_err"] / n / self.data_var + self.config.lam * v["penalty"] / n
        self.log_dict({"val/loss": val_loss.float(), "val/fvu": fvu.float(),
                       "val/mse": (v["sq_err"] / n / self.config.input_dim).float(),
                       "val/l0": (v["l0"] / n).float(),
                       "val/dead_fraction": (freq == 0).float().mean(),
                       "val/dense_fraction": (freq > 0.5).float().mean()})

    def param_groups(self) -> list[dict]:
        """The optimiser's parameter groups; a variant may give some parameters another lr."""
        return [{"params": list(self.parameters())}]

    def configure_optimizers(self):
        opt = torch.optim.Adam(self.param_groups(), lr=self.config.lr)
        total = self.total_steps()
        warm = resolve_steps(self.config.lr_warmup, total)
        sched = torch.optim.lr_scheduler.LambdaLR(
            opt, lambda step: lr_factor(step, warm, total, self.config.lr_decay))
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}
