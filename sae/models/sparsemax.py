"""The Sparsemax-SAE and its α-entmax relative: which units fire from a sparse map over the code,
how much from a learned per-input magnitude."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from sae.activations import EntmaxAlpha, entmax_alpha, softplus_inverse, sparsemax
from sae.config import SAEConfig
from sae.models.base import SparseAutoencoder
from sae.models.losses import effective_support
from sae.schedules import anneal


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

    **Values on the support** (``values``). ``shrunk``: h = r·p as above, every active value
    offset by the threshold Tτ. ``unshrunk``: h_j = (r/T)·ReLU(a_j) on sparsemax's support, 0
    elsewhere: the support (and the penalty on p that sets its size) is the same, but the values
    are those of a plain ReLU, not pulled towards zero by the threshold. The reconstruction's
    gradient then reaches only the units on the support, and the support's size only through the
    penalty. ``unshrunk-ste`` keeps the unshrunk values but passes the shrunk code's gradient
    (straight through), so the reconstruction still acts on the support through the threshold.

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
        nn.init.constant_(self.scale_head.bias, softplus_inverse(math.sqrt(data_var)))
        t0 = 25.0 * math.sqrt(data_var / config.input_dim)
        self.log_temperature = nn.Parameter(torch.full((config.groups,), math.log(t0)))

    def support_map(self, a: Tensor) -> Tensor:
        """Scores [B, H] -> p [B, H], each group of H/G entries on the simplex."""
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
        values = p
        if self.config.values != "shrunk":
            # on the support p_j = s_j − τ: give s_j itself (clipped at 0), so no active value
            # is offset by the threshold; the support is still sparsemax's, and the penalty on
            # p still sets its size
            values = F.relu(scores) * (p > 0)
            if self.config.values == "unshrunk-ste":  # forward unshrunk, backward as shrunk
                values = p + (values - p).detach()
        h = (values.view(len(p), G, -1) * r.unsqueeze(-1)).view_as(p)
        return h, {"p": p}

    def penalty(self, h, extras):
        return effective_support(extras["p"], self.config.groups) / 5.0


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
        """α now: the annealed value at this step, else the module's (learned or fixed) α."""
        if self.config.alpha_mode == "anneal":
            half = self.total_steps() // 2
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
