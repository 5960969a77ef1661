"""The TopK SAE: each input keeps its k largest pre-activations. k is a common setting (it sizes
BatchTopK's budget too). The energy rule, given to TopK, BatchTopK and JumpReLU alike, is the
Sparsemax-SAE's energy power without sparsemax: a baseline with it tells what the sparsemax
support adds beyond "more units for inputs with more energy"."""

from __future__ import annotations

from dataclasses import dataclass

from sae.settings.setting import setting
from sae.settings.variants.registry import Variant, VariantSettings, register


@dataclass
class EnergyRuleSettings(VariantSettings):
    REFUSED_ELSEWHERE = ("energy_rule",)

    energy_rule: float = setting(0.0, "topk, batchtopk, jumprelu: the power γ of the input's "
                                 "energy e(x) = ‖x − b_dec‖ / √v in its budget: topk keeps "
                                 "round(k · e^γ / E[e^γ]) units, batchtopk and jumprelu scale "
                                 "their thresholds by e^−γ (0: off)", low=-4, high=4)

    def check(self, need) -> None:
        need(self.energy_rule == 0 or getattr(self, "batchtopk_gate", "none") == "none",
             "--energy-rule and --batchtopk-gate ste exclude each other (the gate prices the "
             "batch's cut, the rule scales each input's)")


register(Variant("topk", "sae.models.topk:TopKSAE", budget="fixed", config=EnergyRuleSettings))
