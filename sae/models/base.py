"""The SAE base model: the shared encoder and decoder, and the hooks a variant fills in.

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

This module is the inference model, a plain ``torch.nn.Module``: the code, the decoder and what a
trained SAE is read through (``encode``, ``decode``, ``atoms``). A variant (one module each in
this package) defines the code map ``code`` and the ``penalty``, and may add a loss term
(``extra_loss``), its own optimiser groups (``param_groups``) or a hook run after its dead units
are resampled (``after_resample``): the terms of its own objective, stated beside its code.
How it is trained (the loss assembly, logging, the optimiser, the dead-unit tracker and the
guards) is ``sae.training.module.SAETraining``, a LightningModule that holds one.
"""

from __future__ import annotations

import math
from dataclasses import asdict

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from sae.settings.config import SAEConfig


class SparseAutoencoder(nn.Module):
    """Base SAE: the shared encoder and decoder; a variant adds its code map and penalty.

    Subclasses define ``code(a, x_centred) -> (h, extras)`` and ``penalty(h, extras) -> scalar``.
    Class attributes a variant may override: ``fire_threshold`` (a unit fires when its code is
    above it), ``code_scale_is_data_norm`` (the decoder sees sqrt(v) · h),
    ``resample_encoder_scale`` (the encoder-row scale a resampled unit starts with) and
    ``unit_norm_decoder`` (training keeps W_dec's columns on the unit sphere).

    ``settings`` is what the model was built from, ``{"config": {...}, "data_var": v}``: what a
    checkpoint's ``hyper_parameters`` hold, and what ``sae.load`` reports.
    """

    fire_threshold: float = 0.0
    code_scale_is_data_norm: bool = False
    resample_encoder_scale: float = 0.2  # Anthropic's 0.2 suits ReLU codes; see SparsemaxSAE
    unit_norm_decoder: bool = True
    needs_dead_units: bool = False  # extra_loss reads extras["dead"] (AuxK)

    def __init__(self, config: SAEConfig, mean_image: Tensor | None = None, data_var: float = 1.0,
                 init_inputs: Tensor | None = None):
        super().__init__()
        config = config.pinned()  # the checkpoint names the modes auto meant at training time
        self.config = config
        self.settings = {"config": asdict(config), "data_var": float(data_var)}
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

    @property
    def device(self) -> torch.device:
        """The device the model's tensors are on."""
        return self.mean_image.device

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
        """x [B, D] -> h [B, H]: the codes of rows as the model was trained on them (images:
        floats in [0, 1], 784 of them; own activations: as given to training)."""
        a, x_centred = self.pre_activations(x)
        return self.code(a, x_centred)[0]

    def decode(self, h: Tensor) -> Tensor:
        """h [B, H] -> x̂ [B, D]."""
        out = F.linear(h * self.code_scale, self.W_dec)
        if self.config.arch == "mlp":
            out = self.dec_out(out)
        return out + self.b_dec

    def forward(self, x: Tensor) -> Tensor:
        """x [B, D] -> x̂ [B, D], the reconstruction."""
        return self.forward_pass(x)[0]

    def forward_pass(self, x: Tensor) -> tuple[Tensor, Tensor, dict]:
        """x [B, D] -> (x̂ [B, D], h [B, H], extras with the pre-activations a [B, H]): one pass
        giving what training and the measures read."""
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

    def extra_loss(self, x: Tensor, x_hat: Tensor, h: Tensor, extras: dict) -> Tensor | None:
        """A variant's additional loss term (not weighted by λ), or None. ``extras`` holds the
        code's extras, the pre-activations ``a`` and, for a variant with ``needs_dead_units``,
        this rank's ``dead`` units [H] bool."""
        return None

    def set_progress(self, step: int, total: int) -> None:
        """Told by the trainer before each step: a variant whose code follows a schedule (the
        annealed α of ``EntmaxSAE``) reads it; a loaded model keeps the end of training."""

    def train_logs(self) -> dict[str, float | Tensor]:
        """Values a variant adds to the training log (logged as ``train/<name>``)."""
        return {}

    def param_groups(self) -> list[dict]:
        """The optimiser's parameter groups; a variant may give some parameters another lr."""
        return [{"params": list(self.parameters())}]

    def after_resample(self, idx: Tensor, inputs: Tensor) -> None:
        """Hook for variants, run by the dead-unit resampler after it re-initialised units.

        ``idx`` [n] the resampled units, ``inputs`` [n, D] the input each was copied from.
        """

    def result_extras(self) -> dict[str, float]:
        """What a variant adds to a run's test results (``metrics.json``) besides the common
        measures: the state it learned that a reader compares across runs (none here)."""
        return {}
