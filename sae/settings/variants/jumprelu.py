"""The JumpReLU SAE: a learned threshold per unit (or one shared), an L0 penalty through a
straight-through estimator, optionally the Sparsemax-SAE's per-input gain."""

from __future__ import annotations

from dataclasses import dataclass

from sae.settings.setting import setting
from sae.settings.variants.registry import Variant, VariantSettings, register


@dataclass
class JumpReLUSettings(VariantSettings):
    REFUSED_ELSEWHERE = ("jumprelu_threshold", "jumprelu_gain")

    jumprelu_threshold: str = setting("unit", "jumprelu: a learned threshold per unit (unit), or "
                                      "one shared by every unit (shared: a shared threshold "
                                      "at inference, as BatchTopK's)",
                                      choices=("unit", "shared"))
    jumprelu_gain: str = setting("none", "jumprelu: values a (none), or r(x)·a with a learned "
                                 "per-input gain r(x) = softplus(w·(x − b_dec) + c) (input, the "
                                 "Sparsemax-SAE's)", choices=("none", "input"))
    jumprelu_bandwidth: float = setting(0.001, "jumprelu: bandwidth ε of the threshold's "
                                        "straight-through gradient, in units of the data's RMS "
                                        "per pixel", low=0, low_open=True)


register(Variant("jumprelu", "sae.models.jumprelu:JumpReLUSAE", config=JumpReLUSettings,
                 settings=("energy_rule",)))
