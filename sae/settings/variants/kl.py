"""The KL SAE: sigmoid codes whose mean activation is pulled towards ρ."""

from __future__ import annotations

from dataclasses import dataclass

from sae.settings.setting import setting
from sae.settings.variants.registry import Variant, VariantSettings, register


@dataclass
class KLSettings(VariantSettings):
    rho: float = setting(0.05, "kl: target mean activation ρ", low=0, high=1, low_open=True)
    kl_threshold: float = setting(0.1, "kl: a sigmoid unit fires above this", low=0, high=1,
                                  low_open=True)


register(Variant("kl", "sae.models.kl:KLSAE", config=KLSettings))
