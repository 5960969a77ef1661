"""The published Sparsemax-SAE (Wang, Zhang, Su & Huang, "Improving Sparse Autoencoder with Dynamic
Attention", CVPR 2026): sparse cross-attention from concepts to the input, no sparsity penalty."""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from sae.activations import sparsemax
from sae.models.base import SparseAutoencoder
from sae.settings.config import SAEConfig


class AttentionSAE(SparseAutoencoder):
    """Concepts attend to the input through sparsemax; the support is each input's own.

    With x̃ = x / ‖x‖ (``attention_input: unit``, as published; ``raw`` keeps x), C [H, r] the
    concepts, K and V [r, D] the key and value projections (``attention_factors: concepts``,
    as published, r = ``attention_rank``, 0 meaning D as published):

        s   = (C K) x̃                                  scores            [B, H]
        S   = {j : sparsemax(s)_j > 0}                  each input's own support
        h   = ‖x‖ · s ⊙ 1_S                             values: the scores, unshrunk
        x̂   = (C V)ᵀ h                                 no decoder bias

    so the published output ``‖x‖ · (C V)ᵀ (s ⊙ 1_S)`` is a linear decoder of the code h, and
    every measure of a linear decoder applies (its atoms are the columns of (C V)ᵀ, of any
    length). The support gets no gradient (the mask is a comparison); the scores on it get the
    reconstruction's. There is no sparsity penalty (λ is not used): the support's size is what
    sparsemax makes of the scores' scale, which training moves. A unit whose running firing
    frequency (the mean over all training batches so far of the share of inputs it fires on)
    exceeds ``frequency_mask`` (0.1 as published; 0 turns it off) has its score set to 0 before
    sparsemax, as published, which keeps it out of every code. ``attention_factors: full``
    learns the encoder rows and decoder atoms as two free [H, D] matrices instead.

    Published choices this toolkit does not copy, so that every mechanism trains alike: the
    loss is the toolkit's (squared error over the data's variance, the batch FVU; the published
    one weighs each input's squared error by 1 / ‖x‖), with its optimiser, learning-rate
    schedule and gradient clipping; the firing frequency is tracked in training steps only.
    """

    unit_norm_decoder = False  # the atoms' lengths are free (the code's scale is the scores')

    def __init__(self, config: SAEConfig, mean_image=None, data_var: float = 1.0,
                 init_inputs=None):
        super().__init__(config, mean_image, data_var, init_inputs)
        # the base's dictionary (W_enc, b_enc, W_dec, b_dec) is not this model's
        del self.W_enc, self.b_enc, self.W_dec, self.b_dec
        D, H = config.input_dim, config.hidden
        if config.attention_factors == "concepts":
            r = config.attention_rank or D
            self.concepts = nn.Parameter(torch.empty(H, r))
            nn.init.kaiming_uniform_(self.concepts.T)  # fan-in H, as published
            self.key = nn.Parameter(nn.init.kaiming_uniform_(torch.empty(r, D)))
            self.value = nn.Parameter(nn.init.kaiming_uniform_(torch.empty(r, D)))
        else:
            self.encoder = nn.Parameter(nn.init.kaiming_uniform_(torch.empty(H, D)))
            self.decoder = nn.Parameter(nn.init.kaiming_uniform_(torch.empty(H, D)))
        self.register_buffer("firing_frequency", torch.zeros(H))
        self.register_buffer("frequency_batches", torch.zeros((), dtype=torch.long))

    def encoder_rows(self) -> Tensor:
        """C K [H, D] (or the free encoder): the rows the scores are read with."""
        return self.concepts @ self.key if hasattr(self, "concepts") else self.encoder

    def decoder_rows(self) -> Tensor:
        """C V [H, D] (or the free decoder): what each unit draws, per unit of its code."""
        return self.concepts @ self.value if hasattr(self, "concepts") else self.decoder

    def input_norm(self, x: Tensor) -> Tensor:
        """‖x‖ per input, [B, 1] (1 with ``attention_input: raw``)."""
        if self.config.attention_input == "raw":
            return x.new_ones(len(x), 1)
        return x.norm(dim=-1, keepdim=True).clamp_min(torch.finfo(x.dtype).tiny)

    def pre_activations(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """x [B, D] -> (scores s [B, H], x itself: its norm scales the code)."""
        return F.linear(x / self.input_norm(x), self.encoder_rows()), x

    def code(self, a: Tensor, x: Tensor) -> tuple[Tensor, dict]:
        if self.config.frequency_mask > 0:
            a = a.masked_fill(self.firing_frequency > self.config.frequency_mask, 0.0)
        on = sparsemax(a, dim=-1) > 0
        h = a * on * self.input_norm(x)
        if self.training and torch.is_grad_enabled():
            self.track_frequency((h > self.fire_threshold).float().mean(0).detach())
        return h, {}

    @torch.no_grad()
    def track_frequency(self, batch: Tensor) -> None:
        """The running mean over training batches of each unit's firing share [H] (as
        published: every batch weighs the same)."""
        self.frequency_batches += 1
        self.firing_frequency += (batch - self.firing_frequency) / self.frequency_batches

    def penalty(self, h: Tensor, extras: dict) -> Tensor:
        return h.new_zeros(())

    def decode(self, h: Tensor) -> Tensor:
        return h @ self.decoder_rows()

    def atoms(self) -> Tensor:
        return self.decoder_rows().detach().t()

    def attribution(self) -> None:
        """None: its scores read x / ‖x‖, so per-pixel products of x do not sum to them."""
        return None

    def linear_decoder(self) -> tuple[Tensor, Tensor]:
        return self.decoder_rows().detach().t(), torch.zeros(self.config.input_dim,
                                                             device=self.mean_image.device)
