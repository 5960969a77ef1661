"""The BatchTopK SAE: the k·B largest entries of a batch in training, one threshold at
inference; optionally trained through the Sparsemax-SAE batch support's gate and L0 price."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from sae.settings.setting import setting
from sae.settings.variants.registry import Variant, VariantSettings, register


@dataclass
class BatchTopKSettings(VariantSettings):
    REFUSED_ELSEWHERE = ("batchtopk_gate",)

    batchtopk_gate: str = setting("none", "batchtopk: no gradient outside the kept entries "
                                  "(none), or the straight-through gate of the Sparsemax-SAE's "
                                  "batch support, with its L0 price λ/10 per active unit (ste)",
                                  choices=("none", "ste"))


def _gated(settings: Mapping[str, object]) -> bool:
    return settings.get("batchtopk_gate") == "ste"  # the gate's L0 price is weighed by λ


register(Variant("batchtopk", "sae.models.batchtopk:BatchTopKSAE", budget="fixed",
                 config=BatchTopKSettings, settings=("energy_rule",), lambda_when=_gated))
