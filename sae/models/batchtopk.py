"""The BatchTopK-SAE (Bussmann, Leask & Nanda 2024): a top-k over the whole batch in training,
one learned threshold at inference; AuxK keeps units alive."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from sae.activations.thresholds import (
    batch_topk,
    energy_factor,
    threshold_code,
    update_running_threshold,
)
from sae.models.gates import support_gate
from sae.models.topk import TopKSAE


class BatchTopKSAE(TopKSAE):
    """h = the k·B largest entries of ReLU(a) over a batch of B inputs (training); a · 1[a > θ]
    with one threshold θ (inference).

    Each input's L0 varies while the batch's mean L0 is exactly k, so the budget adapts to the
    input. θ is the running mean (rate ``THRESHOLD_RATE``) of the smallest activation each
    training batch kept, averaged over DDP ranks; it is a buffer, saved in the checkpoint. In
    eval mode (validation, test, ``encode``) the code of an input never depends on its batch.
    No penalty: k sets the mean L0. AuxK as for TopK.

    ``batchtopk_gate: ste`` trains it as the Sparsemax-SAE's batch support trains, but for the
    rule that picks the batch's threshold: the kept entries are ReLU(a_j) · H(u_j), u_j =
    a_j − θ_B the margin over the batch's cut θ_B (the smallest kept value), with the step's
    straight-through pseudo-derivative (``sae.models.gates``, a rectangle of width ε, the mean
    margin of the kept entries), so units just below the cut learn whether entering would pay,
    and the penalty is L0 through the same gate at λ / ``GATE_PRICE`` per active unit (as the
    batch support's), with the batch support's running-mean rate for the inference threshold.
    The cut is differentiated as sparsemax's threshold is, ∂θ_B/∂a_k = 1/|S| for each of the
    |S| kept entries, so what the gate pushes on the units near the cut is taken back evenly
    from the kept ones and the pre-activations do not drift as a whole. (Undifferentiated, the
    price pushed every unit near the cut down whatever k kept: MNIST runs at k 16 lost half
    their units within 20 epochs.) k still sets the mean L0.

    ``energy_rule`` γ ≠ 0 (the energy rule): entries are chosen by a_j · e(x)^γ, e(x) =
    ‖x − b_dec‖ / √v, in training (the batch's k·B largest) and against θ at inference, so an
    input's threshold is θ · e(x)^−γ; the kept values are a_j, as without it.
    """

    THRESHOLD_RATE = 0.01
    # with the gate the cut moves as the batch support's threshold does (units near it are
    # pulled in and priced out), and a running mean at rate 0.01 lagged it: a one-seed MNIST
    # pilot at k 32 kept 28 to 41 units per input at validation; the batch support's rate, for
    # the same reason
    GATED_THRESHOLD_RATE = 0.1
    GATE_PRICE = 10.0  # as the Sparsemax-SAE's unshrunk-ste: λ / 10 per active unit

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.register_buffer("threshold", torch.zeros(()))
        self.register_buffer("threshold_batches", torch.zeros((), dtype=torch.long))

    def code(self, a, x_centred):
        if self.config.energy_rule != 0:  # choose by a · e^γ, keep a
            factor = energy_factor(x_centred, self.data_var, self.config.energy_rule)
            if not self.training:
                return threshold_code(a * factor, self.threshold) / factor, {}
            chosen, smallest = batch_topk(a * factor, self.config.k)
            if torch.is_grad_enabled():
                update_running_threshold(self.threshold, self.threshold_batches, smallest,
                                         self.THRESHOLD_RATE)
            return chosen / factor, {}
        if not self.training:
            return threshold_code(a, self.threshold), {}
        h, smallest = batch_topk(a, self.config.k)
        if torch.is_grad_enabled():  # a training step (not a resampling pass)
            gated = self.config.batchtopk_gate == "ste"
            update_running_threshold(self.threshold, self.threshold_batches, smallest,
                                     self.GATED_THRESHOLD_RATE if gated else self.THRESHOLD_RATE)
        if self.config.batchtopk_gate != "ste":
            return h, {}
        on = h > 0
        size = on.sum().clamp_min(1)
        kept = (a * on).sum()
        # the cut's value is the smallest kept entry; its derivative is sparsemax's threshold's,
        # 1/|S| for each kept entry, so what the gate pushes on units near the cut is taken back
        # from every kept unit (without it the gate's gradient drifted every pre-activation)
        cut = smallest + (kept - kept.detach()) / size
        margin = a - cut
        eps = (margin.detach() * on).sum() / size  # the kept entries' mean margin
        gate = support_gate(margin, on, eps.clamp_min(torch.finfo(a.dtype).tiny))
        return F.relu(a) * gate, {"gate": gate}

    def penalty(self, h, extras):
        if "gate" in extras:  # L0 through the gate, as the batch support prices it
            return extras["gate"].sum(-1).mean() / self.GATE_PRICE
        return h.new_zeros(())
