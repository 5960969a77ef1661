"""The BatchTopK-SAE (Bussmann, Leask & Nanda 2024): a top-k over the whole batch in training,
one learned threshold at inference; AuxK keeps units alive."""

from __future__ import annotations

import torch

from sae.models.topk import TopKSAE
from sae.thresholds import batch_topk, threshold_code, update_running_threshold


class BatchTopKSAE(TopKSAE):
    """h = the k·B largest entries of ReLU(a) over a batch of B inputs (training); a · 1[a > θ]
    with one threshold θ (inference).

    Each input's L0 varies while the batch's mean L0 is exactly k, so the budget adapts to the
    input. θ is the running mean (rate ``THRESHOLD_RATE``) of the smallest activation each
    training batch kept, averaged over DDP ranks; it is a buffer, saved in the checkpoint. In
    eval mode (validation, test, ``encode``) the code of an input never depends on its batch.
    No penalty: k sets the mean L0. AuxK as for TopK.
    """

    THRESHOLD_RATE = 0.01

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.register_buffer("threshold", torch.zeros(()))
        self.register_buffer("threshold_batches", torch.zeros((), dtype=torch.long))

    def code(self, a, x_centred):
        if not self.training:
            return threshold_code(a, self.threshold), {}
        h, smallest = batch_topk(a, self.config.k)
        if torch.is_grad_enabled():  # a training step (not a resampling pass)
            update_running_threshold(self.threshold, self.threshold_batches, smallest,
                                     self.THRESHOLD_RATE)
        return h, {}
