"""Sparse autoencoders: one LightningModule; the variants differ only in code map and penalty.

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
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict
from pathlib import Path

import lightning.pytorch as L
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor, nn

from sae import metrics
from sae.activations import EntmaxAlpha, entmax_alpha, sparsemax
from sae.config import MODELS, SAEConfig
from sae.schedules import anneal, lambda_at, lr_factor, resolve_steps


def _inverse_softplus(y: float) -> float:
    return y + math.log(-math.expm1(-y))


class SparseAutoencoder(L.LightningModule):
    """Base SAE: shared encoder/decoder, training loop, validation statistics, dead-unit guard.

    Subclasses define ``code(a, x_centred) -> (h, extras)`` and ``penalty(h, extras) -> scalar``.
    """

    fire_threshold: float = 0.0
    code_scale_is_data_norm: bool = False
    resample_encoder_scale: float = 0.2  # Anthropic's 0.2 suits ReLU codes; see SparsemaxSAE

    def __init__(self, config: SAEConfig, mean_image: Tensor | None = None, data_var: float = 1.0,
                 init_inputs: Tensor | None = None):
        super().__init__()
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
        self.register_buffer("nonfinite_loss", torch.zeros((), dtype=torch.bool))
        self._seconds_before = 0.0  # training time of earlier sessions of a resumed run
        self._fit_start: float | None = None

    # ---- the model ------------------------------------------------------------------------
    def pre_activations(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """x [B, D] -> (a [B, H], x - b_dec [B, D])."""
        x_centred = x - self.b_dec
        inner = x_centred if self.config.arch == "linear" else self.enc_in(x_centred)
        return F.linear(inner, self.W_enc, self.b_enc), x_centred

    def code(self, a: Tensor, x_centred: Tensor) -> tuple[Tensor, dict]:
        raise NotImplementedError

    def penalty(self, h: Tensor, extras: dict) -> Tensor:
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
        """x [B, D] -> (x̂ [B, D], h [B, H], extras)."""
        a, x_centred = self.pre_activations(x)
        h, extras = self.code(a, x_centred)
        extras["a"] = a
        return self.decode(h), h, extras

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
        return (x - x_hat).pow(2).sum(-1).mean() / self.data_var

    def extra_loss(self, x: Tensor, x_hat: Tensor, h: Tensor, extras: dict) -> Tensor | None:
        return None

    def lambda_now(self) -> float:
        total = self._total_steps()
        warm = resolve_steps(self.config.lambda_warmup, total)
        return lambda_at(self.global_step, self.config.lam, warm, self.config.lambda_warmup_shape)

    def _total_steps(self) -> int:
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
            active = metrics.active(h, self.fire_threshold)
            self.samples_since_fired.add_(len(x)).masked_fill_(active.any(0), 0)
            self.nonfinite_loss |= ~torch.isfinite(loss)
        if self.logs_this_step():
            self.log("train/loss", loss, prog_bar=True)
            self.log("train/recon", recon)
            self.log("train/penalty", penalty)
            self.log("train/lambda", lam_t)
            self.log("train/l0", active.sum(-1).float().mean(), prog_bar=True)
            self.log("train/dead_fraction", self.dead_mask(reduce=False).float().mean())
            if aux is not None:
                self.log("train/aux", aux)
        return loss

    def logs_this_step(self) -> bool:
        """Whether the trainer writes this training step's logged values.

        Per-step values are only written every ``log_every_n_steps`` steps, and each ``self.log``
        call costs about as much as a small SAE's forward pass, so the other steps skip them.
        """
        trainer = self._trainer
        if trainer is None or trainer.fast_dev_run:
            return True
        return bool(getattr(trainer._logger_connector, "should_update_logs", True))

    def dead_mask(self, reduce: bool = True) -> Tensor:
        """Units that fired on none of the last ``dead_window`` training samples (all ranks)."""
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
            with torch.no_grad():
                g.sub_(self.W_dec * (g * self.W_dec).sum(0, keepdim=True))

    def optimizer_step(self, epoch, batch_idx, optimizer, optimizer_closure=None) -> None:
        optimizer.step(closure=optimizer_closure)
        with torch.no_grad():
            self.W_dec.div_(self.W_dec.norm(dim=0, keepdim=True).clamp_min(1e-8))

    def on_train_batch_end(self, outputs, batch, batch_idx: int) -> None:
        check_every = 1 if self.device.type == "cpu" else 50  # a check is a host sync on GPUs
        if self.global_step % check_every == 0:
            self.check_finite()
        cfg = self.config
        if (cfg.resolved_dead_guard() == "resample" and self.global_step > 0
                and self.global_step % cfg.resample_every == 0
                and self.global_step <= cfg.resample_until * self._total_steps()):
            self.resample_dead(batch[0])

    # ---- training time across resumed sessions ------------------------------------------
    def on_fit_start(self) -> None:
        self._fit_start = time.perf_counter()

    def train_seconds(self) -> float:
        """Wall-clock seconds of fitting so far, summed over the sessions of a resumed run
        (each up to its last checkpoint: work lost to an interruption is not counted twice)."""
        now = 0.0 if self._fit_start is None else time.perf_counter() - self._fit_start
        return self._seconds_before + now

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        checkpoint["train_seconds"] = self.train_seconds()

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        self._seconds_before = float(checkpoint.get("train_seconds", 0.0))

    def check_finite(self) -> None:
        if bool(self.nonfinite_loss):
            raise NonFiniteLossError(self.global_step)

    def on_train_epoch_end(self) -> None:
        self.check_finite()

    def on_validation_epoch_start(self) -> None:
        self.check_finite()  # before any checkpoint of this epoch can be written
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
        self.val_firing_counts = v["fires"]  # summed over ranks, read by tests and callbacks
        # val/loss uses the full λ (not λ_t) so that "best" does not favour warm-up checkpoints
        val_loss = v["sq_err"] / n / self.data_var + self.config.lam * v["penalty"] / n
        self.log_dict({"val/loss": val_loss.float(), "val/fvu": fvu.float(),
                       "val/mse": (v["sq_err"] / n / self.config.input_dim).float(),
                       "val/l0": (v["l0"] / n).float(),
                       "val/dead_fraction": (freq == 0).float().mean(),
                       "val/dense_fraction": (freq > 0.5).float().mean()})

    def configure_optimizers(self):
        opt = torch.optim.Adam(self.parameters(), lr=self.config.lr)
        total = self._total_steps()
        warm = resolve_steps(self.config.lr_warmup, total)
        sched = torch.optim.lr_scheduler.LambdaLR(
            opt, lambda step: lr_factor(step, warm, total, self.config.lr_decay))
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}

    # ---- dead-unit resampling -------------------------------------------------------------
    @torch.no_grad()
    def resample_dead(self, x: Tensor) -> int:
        """Anthropic's recipe: each dead unit gets a high-loss input as its decoder column.

        Inputs are drawn with probability ∝ (per-sample loss)²; decoder column ← the normalised
        centred input; encoder row ← that direction × 0.2 (``resample_encoder_scale``) × the
        mean alive encoder-row norm;
        encoder bias ← 0; Adam's moments of the touched rows are reset. Rank 0 decides and
        broadcasts, so DDP replicas stay identical. Returns the number of resampled units.
        """
        dead = self.dead_mask()
        n_dead = int(dead.sum())
        if n_dead == 0 or self.config.arch != "linear":
            return 0
        x_hat, _, _ = self(x)
        loss = (x - x_hat).pow(2).sum(-1)
        weights = loss.pow(2)
        if not torch.isfinite(weights).all() or weights.sum() <= 0:
            return 0
        # without replacement while the batch allows: two units copied from one input would
        # compete for it and one of them would die again
        replace = n_dead > int((weights > 0).sum())
        pick = torch.multinomial(weights / weights.sum(), n_dead, replacement=replace)
        directions = F.normalize(x[pick] - self.b_dec, dim=-1)  # [n_dead, D]
        alive = ~dead
        enc_norm = self.W_enc[alive].norm(dim=-1).mean() if alive.any() else torch.tensor(1.0)
        idx = dead.nonzero().squeeze(-1)
        self.W_dec[:, idx] = directions.t()
        self.W_enc[idx] = directions * self.resample_encoder_scale * enc_norm
        self.b_enc[idx] = 0.0
        self.after_resample(idx, x[pick])
        if dist.is_available() and dist.is_initialized():
            for p in (self.W_dec, self.W_enc, self.b_enc):
                dist.broadcast(p.data, src=0)
        for opt in self.trainer.optimizers:
            for p, index in ((self.W_dec, (slice(None), idx)), (self.W_enc, idx),
                             (self.b_enc, idx)):
                state = opt.state.get(p, {})
                for key in ("exp_avg", "exp_avg_sq"):
                    if key in state:
                        state[key][index] = 0.0
        self.samples_since_fired[idx] = 0
        self.log("train/resampled", float(n_dead))
        return n_dead


    def after_resample(self, idx: Tensor, inputs: Tensor) -> None:
        """Hook for variants: ``idx`` [n] resampled units, ``inputs`` [n, D] their source inputs."""


class NonFiniteLossError(RuntimeError):
    def __init__(self, step: int):
        super().__init__(f"non-finite loss at step {step}")
        self.step = step


class L1SAE(SparseAutoencoder):
    """ReLU code with a decoder-norm-weighted L1 penalty.

    h = ReLU(a);  penalty = Σ_j ‖W_dec[:, j]‖ · h_j / (sqrt(v) / 8).
    Decoder columns have unit norm, so the weighting is 1 and shrinking h while growing W_dec is not
    possible. Measuring code mass against the data's RMS norm sqrt(v) makes λ independent of the
    data's scale; the factor 8 puts λ = 0.01 at L0 ≈ 40 for 512 units on MNIST.
    """

    def code(self, a, x_centred):
        return F.relu(a), {}

    def penalty(self, h, extras):
        unit = self.data_var.sqrt() / 8.0
        return (h * self.W_dec.norm(dim=0)).sum(-1).mean() / unit


class KLSAE(SparseAutoencoder):
    """Sigmoid code with the KL sparsity penalty (Ng, UFLDL notes).

    h = sigmoid(a);  penalty = Σ_j KL(ρ ‖ ρ̂_j) = Σ_j ρ log(ρ/ρ̂_j) + (1−ρ) log((1−ρ)/(1−ρ̂_j)),
    ρ̂_j = batch mean of h_j. A unit "fires" when h_j > ``kl_threshold`` (0.1). The decoder sees
    h · sqrt(v) with unit-norm columns, so a fully-on unit draws a typical centred image.
    """

    code_scale_is_data_norm = True

    def __init__(self, config: SAEConfig, mean_image=None, data_var: float = 1.0,
                 init_inputs=None):
        super().__init__(config, mean_image, data_var, init_inputs)
        self.fire_threshold = config.kl_threshold

    def code(self, a, x_centred):
        return torch.sigmoid(a), {}

    def penalty(self, h, extras):
        rho = self.config.rho
        rho_hat = h.mean(0).clamp(1e-6, 1 - 1e-6)
        kl = rho * torch.log(rho / rho_hat) + (1 - rho) * torch.log((1 - rho) / (1 - rho_hat))
        return kl.sum()


class SparsemaxSAE(SparseAutoencoder):
    """Which units fire from sparsemax, how much from a learned per-input magnitude.

    For G groups of H/G units (G = ``groups``, default 1):

        p_g = sparsemax(a_g / T_g)                    on the simplex, exact zeros   [B, G, H/G]
        r_g = softplus(w_g · (x − b_dec) + c_g)       magnitude of group g          [B, G]
        h   = r ⊙ p

    On its support sparsemax is p_j = a_j / T − τ(a), so h_j = (r/T) · ReLU(a_j − T τ(a)): a ReLU
    whose threshold adapts to each input. The learnable temperature T_g (one per group, stored
    as log T) sets how many units share the mass: the support of sparsemax(a / T) grows with T.
    It starts at T₀ = 25 sqrt(v / D), some 5-10 % of the units active with the tied init; without
    it the encoder would have to rescale all its rows to change the support size, and training
    settled on few units per input (L0 ≈ 6 of 512 after an epoch on MNIST). The code carries
    magnitude through r (Σ_j h_j = r, and any non-negative h can be written this way), which a
    raw sparsemax code cannot (Σ p = 1).
    ‖p‖₁ ≡ 1, so an L1 penalty on p is a constant with zero gradient. The penalty is instead the
    effective number of active units, the Hill number of order 1/2, summed over groups:

        penalty = Σ_g (Σ_j sqrt(p_gj))² / 5

    It equals k when p is uniform on k units, so λ/5 is a price per active unit (the 1/5 puts
    λ = 0.01 near the L0 of the L1 and KL defaults), and it is 1 for a one-hot code. Lower orders
    weigh small entries more (order 0 is L0 itself). Orders 2 (the participation ratio 1/Σ p²)
    and 1 (the exponential of the entropy) could be lowered by piling mass onto one always-on
    unit while many tiny entries joined the support: in 10-epoch MNIST runs L0 kept rising over
    the last epochs (order 2: 62 → 92, order 1: 43 → 64), against 31 → 35 with order 1/2. Its
    gradient, proportional to 1/sqrt(p_j), pushes small entries out of the support.

    Sparsemax units compete for the support, so a unit whose direction matches no input never
    enters it and never gets a gradient. ``init: auto`` therefore starts the decoder columns
    (and, tied, the encoder rows) at centred training images for this model (31.8 % → 1.4 % dead
    units on Fashion-MNIST in 10 epochs), and resampled units are admitted into the support on
    their source input (``after_resample``).
    """

    # a resampled unit must come near the others' scores on its input to enter the support at
    # all; at 1.0 it out-scores every unit there, and validation fvu jumped by half after each
    # resampling in our MNIST runs; 0.5 resampled as many units without that jump
    resample_encoder_scale = 0.5

    def __init__(self, config: SAEConfig, mean_image=None, data_var: float = 1.0,
                 init_inputs=None):
        super().__init__(config, mean_image, data_var, init_inputs)
        if config.hidden % config.groups:
            raise ValueError(f"hidden {config.hidden} is not divisible by groups {config.groups}")
        self.scale_head = nn.Linear(config.input_dim, config.groups)
        nn.init.zeros_(self.scale_head.weight)
        nn.init.constant_(self.scale_head.bias, _inverse_softplus(math.sqrt(data_var)))
        t0 = 25.0 * math.sqrt(data_var / config.input_dim)
        self.log_temperature = nn.Parameter(torch.full((config.groups,), math.log(t0)))

    def support_map(self, a: Tensor) -> Tensor:
        return sparsemax(a, dim=-1, groups=self.config.groups)

    @torch.no_grad()
    def after_resample(self, idx: Tensor, inputs: Tensor) -> None:
        """Admit each resampled unit into the support on its source input.

        A unit outside the support gets no gradient, so a resampled unit that does not beat the
        threshold τ on any input stays dead. Its bias is set so that, on its source input, its
        score is T·(τ + Σ p²): above the threshold by the support's typical share E_p[p].
        """
        G, n = self.config.groups, len(idx)
        T = self.log_temperature.exp()  # [G]
        a, _ = self.pre_activations(inputs)  # [n, H], the new rows with bias 0
        scores = (a.view(n, G, -1) / T[:, None]).clone()
        scores.view(n, -1)[:, idx] = float("-inf")  # τ of the others, without the new units
        p = self.support_map(scores.view(n, -1)).view(n, G, -1)
        tau = (scores - p).masked_fill(p <= 0, float("-inf")).amax(-1)  # [n, G]
        share = p.pow(2).sum(-1)  # [n, G]
        rows, group = torch.arange(n, device=idx.device), idx // (self.config.hidden // G)
        target = T[group] * (tau[rows, group] + share[rows, group])
        self.b_enc[idx] = target - a[rows, idx]

    def code(self, a, x_centred):
        G = self.config.groups
        scores = (a.view(len(a), G, -1) / self.log_temperature.exp()[:, None]).view_as(a)
        p = self.support_map(scores)
        r = F.softplus(self.scale_head(x_centred))  # [B, G]
        h = (p.view(len(p), G, -1) * r.unsqueeze(-1)).view_as(p)
        return h, {"p": p}

    def penalty(self, h, extras):
        p = extras["p"]
        p = p.view(len(p), self.config.groups, -1)
        # the ε keeps the gradient finite at tiny entries; −sqrt(ε) keeps exact zeros at zero
        eps = 1e-6
        root_sum = ((p + eps).sqrt() - eps**0.5).sum(-1)  # [B, G]
        return root_sum.pow(2).sum(-1).mean() / 5.0


class EntmaxSAE(SparsemaxSAE):
    """As the Sparsemax-SAE with α-entmax as the support map (α = 2 is sparsemax).

    ``alpha_mode``: ``learn`` (α = 1 + softplus(θ), always > 1), ``anneal`` (α from ``alpha`` to
    2 over the first half of training, a soft start that ends as sparsemax) or ``fixed``.
    """

    def __init__(self, config: SAEConfig, mean_image=None, data_var: float = 1.0,
                 init_inputs=None):
        super().__init__(config, mean_image, data_var, init_inputs)
        self.entmax = EntmaxAlpha(alpha=config.alpha, learnable=config.alpha_mode == "learn",
                                  dim=-1, groups=config.groups)

    def current_alpha(self) -> float | Tensor:
        if self.config.alpha_mode == "anneal":
            half = self._total_steps() // 2
            return anneal(self.global_step, self.config.alpha, 2.0, half)
        return self.entmax.alpha

    def support_map(self, a: Tensor) -> Tensor:
        if self.config.alpha_mode == "anneal":
            return entmax_alpha(a, self.current_alpha(), dim=-1, groups=self.config.groups)
        return self.entmax(a)

    def training_step(self, batch, batch_idx):
        loss = super().training_step(batch, batch_idx)
        if self.logs_this_step():
            alpha = self.current_alpha()
            self.log("train/alpha", alpha.detach() if torch.is_tensor(alpha) else float(alpha))
        return loss


class TopKSAE(SparseAutoencoder):
    """h = the k largest entries of ReLU(a), zeros elsewhere (Gao et al. 2024); no penalty.

    k sets L0 directly. AuxK: the ``aux_k`` largest pre-activations of dead units reconstruct the
    residual e = x − x̂ (detached), adding ``aux_coef`` · ‖e − W_dec z_aux‖² / v to the loss, so
    dead units receive gradient.
    """

    def code(self, a, x_centred):
        values, index = torch.topk(a, min(self.config.k, a.shape[-1]), dim=-1)
        h = torch.zeros_like(a).scatter_(-1, index, F.relu(values))
        return h, {}

    def penalty(self, h, extras):
        return h.new_zeros(())

    def extra_loss(self, x, x_hat, h, extras):
        if self.config.resolved_dead_guard() != "auxk":
            return None
        dead = self.dead_mask(reduce=False)
        a = extras["a"].masked_fill(~dead, float("-inf"))
        k_aux = min(self.config.aux_k, a.shape[-1])
        values, index = torch.topk(a, k_aux, dim=-1)
        z = torch.zeros_like(a).scatter_(-1, index, F.relu(values).nan_to_num(0.0))
        residual = (x - x_hat).detach()
        aux = (residual - F.linear(z, self.W_dec)).pow(2).sum(-1).mean() / self.data_var
        # with no dead unit the term is a constant: zero it rather than inflate the logged loss
        return self.config.aux_coef * aux * dead.any()


MODEL_CLASSES: dict[str, type[SparseAutoencoder]] = {
    "l1": L1SAE, "kl": KLSAE, "sparsemax": SparsemaxSAE, "entmax": EntmaxSAE, "topk": TopKSAE}


def build_model(config: SAEConfig, mean_image: Tensor | None = None, data_var: float = 1.0,
                init_inputs: Tensor | None = None) -> SparseAutoencoder:
    """The SAE variant named by ``config.model``; ``init_inputs`` [n, D] seed decoder columns."""
    if config.model not in MODEL_CLASSES:
        raise ValueError(f"unknown model {config.model!r}; choose from {MODELS}")
    return MODEL_CLASSES[config.model](config, mean_image, data_var, init_inputs)


@torch.no_grad()
def encode_dataset(model: SparseAutoencoder, x: Tensor,
                   batch_size: int = 1024) -> tuple[Tensor, Tensor]:
    """Run the model over x [N, D] in eval mode on its device -> (x̂ [N, D], h [N, H]) on CPU."""
    was_training = model.training
    model.eval()
    x_hats, codes = [], []
    for start in range(0, len(x), batch_size):
        batch = x[start:start + batch_size].to(model.device)
        x_hat, h, _ = model(batch)
        x_hats.append(x_hat.float().cpu())
        codes.append(h.float().cpu())
    model.train(was_training)
    H = model.config.hidden
    return (torch.cat(x_hats) if x_hats else x.new_zeros(0, x.shape[-1]),
            torch.cat(codes) if codes else x.new_zeros(0, H))


def load_checkpoint(path: str | Path,
                    map_location: str | torch.device = "cpu") -> SparseAutoencoder:
    """Rebuild a trained SAE from a checkpoint written by ``python -m sae.run``."""
    state = torch.load(path, map_location=map_location, weights_only=False)
    hp = state["hyper_parameters"]
    model = build_model(SAEConfig.from_dict(hp["config"]), data_var=hp["data_var"])
    model.load_state_dict(state["state_dict"])
    return model.eval()


def training_callbacks(config: SAEConfig) -> list:
    return []


@torch.no_grad()
def decode_dataset(model: SparseAutoencoder, codes: Tensor, batch_size: int = 1024) -> Tensor:
    """Decode codes [N, H] in batches on the model's device -> x̂ [N, D] on CPU."""
    return torch.cat([model.decode(codes[i:i + batch_size].to(model.device)).float().cpu()
                      for i in range(0, len(codes), batch_size)])
