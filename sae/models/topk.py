"""The TopK-SAE (Gao et al. 2024): the k largest pre-activations fire; AuxK keeps units alive."""

from __future__ import annotations

import torch

from sae.activations.thresholds import (
    energy_factor,
    rows_topk_relu,
    topk_relu,
    update_running_threshold,
)
from sae.models.base import SparseAutoencoder
from sae.models.losses import auxk_term


class TopKSAE(SparseAutoencoder):
    """h = the k largest entries of ReLU(a), zeros elsewhere (Gao et al. 2024); no penalty.

    k sets L0 directly. AuxK: the ``aux_k`` largest pre-activations of dead units reconstruct the
    residual e = x − x̂ (detached), adding ``aux_coef`` · ‖e − W_dec z_aux‖² / v to the loss, so
    dead units receive gradient.

    ``energy_rule`` γ ≠ 0 (the energy rule): input x keeps k(x) = round(k · e(x)^γ / m) units,
    e(x) = ‖x − b_dec‖ / √v, clipped to [1, H], with m the running mean (rate
    ``ENERGY_RATE``) of e^γ over training batches, a buffer saved in the checkpoint, so the
    mean L0 stays near k and an input's budget never depends on its batch.
    """

    needs_dead_units = True
    ENERGY_RATE = 0.01

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if self.config.energy_rule != 0 and type(self) is TopKSAE:
            self.register_buffer("energy_mean", torch.ones(()))
            self.register_buffer("energy_batches", torch.zeros((), dtype=torch.long))

    def input_budget(self, x_centred):
        """k(x) [B] long: each input's number of units under the energy rule."""
        factor = energy_factor(x_centred, self.data_var, self.config.energy_rule)[:, 0]
        if self.training and torch.is_grad_enabled():  # a training step
            update_running_threshold(self.energy_mean, self.energy_batches,
                                     factor.detach().mean(), self.ENERGY_RATE)
        k = torch.round(self.config.k * factor / self.energy_mean)
        return k.clamp(1, self.config.hidden).long()

    def code(self, a, x_centred):
        if self.config.energy_rule != 0:
            return rows_topk_relu(a, self.input_budget(x_centred)), {}
        return topk_relu(a, self.config.k), {}

    def penalty(self, h, extras):
        return h.new_zeros(())

    def extra_loss(self, x, x_hat, h, extras):
        if self.config.resolved_dead_guard() != "auxk":
            return None
        dead = extras["dead"]  # this rank's dead units, from the training module
        if dead.device.type == "cpu" and not bool(dead.any()):
            # no dead unit: the term is zero with zero gradient, so skip its matrix products
            # (on an accelerator the test would be a host synchronisation: computed as below)
            return x.new_zeros(())
        aux = auxk_term((x - x_hat).detach(), extras["a"], dead, self.W_dec, self.config.aux_k,
                        self.data_var)
        # with no dead unit the term is a constant: zero it rather than inflate the logged loss
        return self.config.aux_coef * aux * dead.any()
