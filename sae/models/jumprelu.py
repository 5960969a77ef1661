"""The JumpReLU-SAE (Rajamanoharan et al. 2024): a learned threshold per unit, an L0 penalty,
straight-through gradients for the thresholds."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from sae.activations import softplus_inverse
from sae.activations.thresholds import energy_factor, jumprelu, step_l0
from sae.models.base import SparseAutoencoder
from sae.settings.config import SAEConfig


class JumpReLUSAE(SparseAutoencoder):
    """h_j = a_j · H(a_j − θ_j), penalty = L0(h) / 8 (``sae.activations.thresholds`` for the
    gradients).

    Active values are not shrunk by the threshold. θ_j = exp(log θ_j) > 0 is learned: the
    penalty raises it through the straight-through estimator, the reconstruction moves it both
    ways. Thresholds and the bandwidth ε are measured in the paper's units, the data's RMS per
    pixel sqrt(v / D) (its inputs are scaled to E‖x‖² = D): θ starts at ``THETA0`` of those units
    and ε = ``jumprelu_bandwidth`` · sqrt(v / D) (the paper's ε = 0.001 by default). The 1/8 makes
    λ/8 the price of one active unit in FVU, which puts λ = 0.01 near the other models' default
    L0 on MNIST with 512 units.

    Two settings take it towards the Sparsemax-SAE's batch support, to tell what that design
    owes to sparsemax: ``jumprelu_threshold: shared`` learns one θ for every unit (at
    inference the batch support is one threshold on the pre-activations too), and
    ``jumprelu_gain: input`` multiplies the code by a learned per-input gain
    r(x) = softplus(w · (x − b_dec) + c), w from 0 and r = 1 at the start (the batch support's
    values carry the same factor): h_j = r(x) · a_j · H(a_j − θ).

    ``energy_rule`` γ ≠ 0 (the energy rule): the thresholds of input x are θ_j · e(x)^−γ,
    e(x) = ‖x − b_dec‖ / √v: h_j = a_j · H(a_j · e^γ − θ_j), more units for inputs with more
    energy as the Sparsemax-SAE's energy temperature gives them.
    """

    THETA0 = 1.0  # about 1 in 6 random-direction units active at the start
    PENALTY_SCALE = 8.0
    # Adam moves log θ by about lr per step at most: at the base lr, 10 epochs move a threshold
    # by a factor of e² at most, too little for λ to reach its balance, and L0 stayed near where
    # the initial θ put it
    THRESHOLD_LR_SCALE = 10.0

    def __init__(self, config: SAEConfig, mean_image=None, data_var: float = 1.0,
                 init_inputs=None):
        super().__init__(config, mean_image, data_var, init_inputs)
        self.unit = math.sqrt(data_var / config.input_dim)
        n = 1 if config.jumprelu_threshold == "shared" else config.hidden
        self.log_threshold = nn.Parameter(torch.full((n,), math.log(self.THETA0 * self.unit)))
        if config.jumprelu_gain == "input":
            self.gain_head = nn.Linear(config.input_dim, 1)
            nn.init.zeros_(self.gain_head.weight)
            nn.init.constant_(self.gain_head.bias, softplus_inverse(1.0))

    def param_groups(self) -> list[dict]:
        rest = [p for name, p in self.named_parameters() if name != "log_threshold"]
        return [{"params": rest},
                {"params": [self.log_threshold],
                 "lr": self.config.lr * self.THRESHOLD_LR_SCALE}]

    def thresholds(self) -> torch.Tensor:
        """θ [H], or [1] when shared."""
        return self.log_threshold.exp()

    def code(self, a, x_centred):
        theta = self.thresholds()
        eps = self.config.jumprelu_bandwidth * self.unit
        if self.config.energy_rule != 0:  # a_j · H(a_j e^γ − θ_j): compared scaled, kept as is
            factor = energy_factor(x_centred, self.data_var, self.config.energy_rule)
            h = jumprelu(a * factor, theta, eps) / factor
            fires = step_l0(a * factor, theta, eps)
            if hasattr(self, "gain_head"):
                h = h * F.softplus(self.gain_head(x_centred))
            return h, {"fires": fires}
        h = jumprelu(a, theta, eps)
        if hasattr(self, "gain_head"):
            h = h * F.softplus(self.gain_head(x_centred))
        return h, {"fires": step_l0(a, theta, eps)}

    def penalty(self, h, extras):
        return extras["fires"].sum(-1).mean() / self.PENALTY_SCALE
