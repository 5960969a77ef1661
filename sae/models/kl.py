"""The KL-SAE: a sigmoid code with the KL-divergence sparsity penalty (Ng, UFLDL notes)."""

from __future__ import annotations

import torch

from sae.models.base import SparseAutoencoder
from sae.models.losses import kl_sparsity
from sae.settings.config import SAEConfig


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
        return kl_sparsity(h, self.config.rho)
