"""The settings of an SAE (``SAEConfig``) and their validation: no torch, no Lightning.

``python -m sae.run`` checks every flag against these before it imports anything heavy, so that a
typo costs a fraction of a second, not the seconds Lightning takes to import.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

__all__ = ["DEAD_GUARDS", "MODELS", "SAEConfig"]

MODELS = ("l1", "kl", "sparsemax", "entmax", "topk")
DEAD_GUARDS = ("none", "resample", "auxk")


@dataclass
class SAEConfig:
    """Everything that defines a model and its optimisation (the CLI's flags map onto it)."""

    model: str = "sparsemax"
    input_dim: int = 784
    hidden: int = 512
    lam: float = 0.01  # λ: penalty weight (unused by topk)
    k: int = 32  # topk: active units per input
    rho: float = 0.05  # kl: target mean activation
    alpha: float = 1.5  # entmax: α (initial value when learnable or annealed)
    alpha_mode: str = "learn"  # entmax: learn | anneal (to 2 over training) | fixed
    groups: int = 1  # sparsemax / entmax: independent heads over the code
    arch: str = "linear"  # linear | mlp (784-W-H-W-784)
    mlp_width: int = 512
    lr: float = 1e-3
    lr_warmup: float = 0.01  # steps (>= 1) or fraction of training (< 1)
    lr_decay: str = "none"  # none | cosine
    lambda_warmup: float = 0.05  # steps (>= 1) or fraction of training (< 1)
    lambda_warmup_shape: str = "linear"  # linear | cosine
    dead_guard: str = "auto"  # auto (auxk for topk, resample otherwise) | none | resample | auxk
    dead_window: int = 20_000  # a unit is dead after this many training samples without firing
    resample_every: int = 500  # steps between dead-unit checks (resample guard)
    resample_until: float = 0.7  # no resampling after this fraction of training
    aux_k: int = 256  # AuxK: dead units used to model the residual
    aux_coef: float = 1 / 32
    kl_threshold: float = 0.1  # a sigmoid unit "fires" when its activation exceeds this
    init: str = "auto"  # decoder columns: random | data (centred training images) | auto

    @classmethod
    def from_dict(cls, values: dict) -> SAEConfig:
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in values.items() if k in names})

    def resolved_dead_guard(self) -> str:
        if self.dead_guard != "auto":
            return self.dead_guard
        if self.arch != "linear":
            return "none"
        return "auxk" if self.model == "topk" else "resample"

    def resolved_init(self) -> str:
        """``auto`` starts sparsemax / entmax codes from data: their units compete for support."""
        if self.init != "auto":
            return self.init
        return "data" if self.model in ("sparsemax", "entmax") and self.arch == "linear" \
            else "random"

    def validate(self) -> None:
        """Raise ValueError with a one-line, user-facing message for any invalid value."""
        def need(ok: bool, message: str) -> None:
            if not ok:
                raise ValueError(message)

        need(self.model in MODELS, f"--model must be one of {', '.join(MODELS)}")
        need(self.input_dim >= 1, "input_dim must be >= 1")
        need(self.hidden >= 1, f"--hidden must be >= 1, got {self.hidden}")
        need(math.isfinite(self.lam) and self.lam >= 0, f"--lambda must be >= 0, got {self.lam}")
        need(self.k >= 1, f"--k must be >= 1, got {self.k}")
        need(self.model != "topk" or self.k <= self.hidden,
             f"--k must be <= --hidden ({self.hidden}), got {self.k}")
        need(0 < self.rho < 1, f"--rho must be in (0, 1), got {self.rho}")
        need(math.isfinite(self.alpha) and self.alpha > 1, f"--alpha must be > 1, got {self.alpha}")
        need(self.model != "entmax" or self.alpha_mode != "learn" or self.alpha > 1.001,
             f"--alpha must be > 1.001 when learned (α = 1.001 + softplus), got {self.alpha}")
        need(self.alpha_mode in ("learn", "anneal", "fixed"),
             "--alpha-mode must be one of learn, anneal, fixed")
        need(self.alpha_mode != "anneal" or self.alpha <= 2,
             f"--alpha must be <= 2 when annealed towards 2, got {self.alpha}")
        need(self.groups >= 1 and self.hidden % self.groups == 0,
             f"--groups must divide --hidden ({self.hidden}), got {self.groups}")
        need(self.arch in ("linear", "mlp"), "--arch must be linear or mlp")
        need(self.mlp_width >= 1, "--mlp-width must be >= 1")
        need(math.isfinite(self.lr) and self.lr > 0, f"--lr must be > 0, got {self.lr}")
        need(self.lr_warmup >= 0, "--lr-warmup must be >= 0")
        need(self.lr_decay in ("none", "cosine"), "--lr-decay must be none or cosine")
        need(self.lambda_warmup >= 0, "--lambda-warmup must be >= 0")
        need(self.lambda_warmup_shape in ("linear", "cosine"),
             "--lambda-warmup-shape must be linear or cosine")
        need(self.dead_guard in ("auto",) + DEAD_GUARDS,
             f"--dead-guard must be one of auto, {', '.join(DEAD_GUARDS)}")
        guard = self.resolved_dead_guard()
        need(guard != "auxk" or self.model == "topk", "--dead-guard auxk applies to --model topk")
        need(guard == "none" or self.arch == "linear",
             f"--dead-guard {guard} needs --arch linear (use none with mlp)")
        need(self.dead_window >= 1, "--dead-window must be >= 1")
        need(self.resample_every >= 1, "--resample-every must be >= 1")
        need(0 <= self.resample_until <= 1, "--resample-until must be in [0, 1]")
        need(self.aux_k >= 1, "--aux-k must be >= 1")
        need(0 < self.kl_threshold < 1, "--kl-threshold must be in (0, 1)")
        need(self.init in ("auto", "random", "data"), "--init must be auto, random or data")
        need(self.resolved_init() != "data" or self.arch == "linear",
             "--init data needs --arch linear")
