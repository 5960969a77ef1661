"""The TopK-SAE (Gao et al. 2024): the k largest pre-activations fire; AuxK keeps units alive."""

from __future__ import annotations

from sae.activations.thresholds import topk_relu
from sae.models.base import SparseAutoencoder
from sae.models.losses import auxk_term


class TopKSAE(SparseAutoencoder):
    """h = the k largest entries of ReLU(a), zeros elsewhere (Gao et al. 2024); no penalty.

    k sets L0 directly. AuxK: the ``aux_k`` largest pre-activations of dead units reconstruct the
    residual e = x − x̂ (detached), adding ``aux_coef`` · ‖e − W_dec z_aux‖² / v to the loss, so
    dead units receive gradient.
    """

    needs_dead_units = True

    def code(self, a, x_centred):
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
