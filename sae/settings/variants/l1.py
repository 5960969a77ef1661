"""The L1 SAE: ReLU codes, λ times their L1 norm. No settings of its own."""

from sae.settings.variants.registry import Variant, register

register(Variant("l1", "sae.models.l1:L1SAE"))
