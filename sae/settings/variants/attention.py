"""The published Sparsemax-SAE (Wang et al. 2026): sparse cross-attention over learned concepts,
its L0 its own (no λ, no k)."""

from __future__ import annotations

from dataclasses import dataclass

from sae.settings.setting import setting
from sae.settings.variants.registry import Variant, VariantSettings, register


@dataclass
class AttentionSettings(VariantSettings):
    REFUSED_ELSEWHERE = ("attention_factors", "attention_rank", "attention_input",
                         "frequency_mask")

    attention_factors: str = setting("concepts", "sparsemax-attention: concepts, encoder C·K "
                                     "and decoder C·V sharing the concepts C (as published); "
                                     "full, two free [H, D] matrices",
                                     choices=("concepts", "full"))
    attention_rank: int = setting(0, "sparsemax-attention: the concepts' dimension r (C is "
                                  "[H, r], K and V [r, D]); 0 = the input's dimension D, as "
                                  "published", low=0)
    attention_input: str = setting("unit", "sparsemax-attention: scores read x / ‖x‖ and the "
                                   "code is scaled back by ‖x‖ (unit, as published), or x "
                                   "itself (raw)", choices=("unit", "raw"))
    frequency_mask: float = setting(0.1, "sparsemax-attention: a unit whose running firing "
                                    "frequency exceeds this is masked out (0.1 as published; "
                                    "0 = off)", low=0, high=1)


register(Variant("sparsemax-attention", "sae.models.attention:AttentionSAE", budget="none",
                 config=AttentionSettings))
