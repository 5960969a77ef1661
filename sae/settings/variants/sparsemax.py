"""The Sparsemax-SAE and its entmax relative: codes from a projection of scores onto the simplex.

Their support map reads scores a / T, with the temperature T and a number of independent groups
(:class:`SupportMapSettings`, shared by both). The Sparsemax-SAE chooses what its support covers
(each input, or the whole batch), its values on the support and its rule at inference; entmax
its α. docs/models.md gives the math and why each default was chosen.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from sae.settings.setting import setting
from sae.settings.variants.registry import Variant, VariantSettings, register

Need = Callable[[bool, str], None]


@dataclass
class SupportMapSettings(VariantSettings):
    """The support map's settings, read by the Sparsemax-SAE and by entmax."""

    REFUSED_ELSEWHERE = ("temperature",)
    PINNED = ("temperature",)
    SAVED_BEFORE = {"temperature": "global"}

    temperature: str = setting("auto", "sparsemax/entmax: the temperature T of the support "
                               "map(a / T); auto = energy for sparsemax's per-input support, "
                               "global for its batch support and for entmax; "
                               "global, one learned T per group; learned, "
                               "T·exp(u·(x − b_dec)) with u learned from 0; normalized, T times "
                               "the spread (std) of the input's scores over the group's "
                               "units; energy, normalized times (‖x − b_dec‖ / ν)^γ with γ "
                               "learned from 0 (--energy-power, --energy-power-mode), sizing "
                               "the support only",
                               choices=("auto", "global", "learned", "normalized", "energy"))
    groups: int = setting(1, "sparsemax/entmax: independent heads over the code", low=1)

    def resolved_temperature(self) -> str:
        """``auto``: the energy temperature for the Sparsemax-SAE's per-input support (a
        configuration saved with ``auto`` before that became the default: the normalized one),
        the global one for its batch support (a per-input temperature would divide away the
        scale its shared threshold reads) and for entmax (see docs/models.md)."""
        return self.resolved_setting("temperature")

    def check(self, need: Need) -> None:
        need(self.hidden % self.groups == 0,
             f"--groups must divide --hidden ({self.hidden}), got {self.groups}")


@dataclass
class SparsemaxSettings(SupportMapSettings):
    """The Sparsemax-SAE's own settings."""

    REFUSED_ELSEWHERE = ("values", "support")
    PINNED = ("values", "inference", "support")
    SAVED_BEFORE = {"values": "shrunk", "inference": "sparsemax", "support": "input"}

    values: str = setting("auto", "sparsemax: the values on the support; auto = unshrunk-ste "
                          "for sparsemax; shrunk, r·p (every "
                          "value offset by the threshold); unshrunk, (r/T)·a (a ReLU whose "
                          "support sparsemax chooses); unshrunk-ste, unshrunk values whose "
                          "support can grow back (a straight-through pseudo-derivative of the "
                          "support gate reaches units near the threshold)",
                          choices=("auto", "shrunk", "unshrunk", "unshrunk-ste"))
    energy_power: float = setting(0.0, "sparsemax, energy temperature: the power γ of the "
                                  "input's energy in T(x), its start value when learned",
                                  low=-4, high=4)
    energy_power_mode: str = setting("learn", "sparsemax, energy temperature: learn γ from "
                                     "--energy-power, or keep it fixed there",
                                     choices=("learn", "fixed"))
    inference: str = setting("auto", "sparsemax: the rule that chooses the support at "
                             "inference (validation, test, encoding); auto = sparsemax, the "
                             "rule it trains with (each input's own support, or the batch "
                             "support's running threshold); threshold, one threshold θ on "
                             "every unit's unshrunk value, estimated in training as the value "
                             "that keeps as many units as sparsemax kept (as BatchTopK's)",
                             choices=("auto", "sparsemax", "threshold"))
    support: str = setting("auto", "sparsemax: what one projection onto the simplex covers; "
                           "auto = input, each input's scores (its own support, chosen from "
                           "its own scores in training and at inference, mass 1 per input); "
                           "batch, the whole batch's scores at once in training (an input "
                           "with higher scores gets more units, as BatchTopK to TopK) and one "
                           "shared threshold, the batch threshold's running mean, at "
                           "inference; its auto temperature is global",
                           choices=("auto", "input", "batch"))

    def resolved_values(self) -> str:
        """``auto``: unshrunk values whose support can grow back (``unshrunk-ste``) for the
        Sparsemax-SAE, the only model with a choice of values; ``shrunk`` names the others'."""
        return self.resolved_setting("values")

    def resolved_inference(self) -> str:
        """``auto``: the Sparsemax-SAE infers with the rule it trains with (``sparsemax``): each
        input's own support, or with the batch support its running batch threshold. (A
        threshold on a model trained with per-input supports, once the default, follows input
        difficulty more at 512 units but loses most of the reconstruction at 4 096; see the
        documentation.) A configuration saved before the setting existed: its own support.
        Runs save the rule they used, so a run trained with the threshold default keeps it."""
        return self.resolved_setting("inference")

    def resolved_support(self) -> str:
        """``auto``: each input's own support (``input``), what the name sparsemax promises:
        the projection of the input's own scores onto the simplex, at inference as in
        training. The batch support (``batch``) trains with one threshold for the batch and
        infers with one shared threshold, BatchTopK's rule; it was the default for a while,
        and runs saved with it keep it (configurations save the support they resolved to).
        ``input`` for a configuration saved before the setting existed."""
        return self.resolved_setting("support")

    def check(self, need: Need) -> None:
        energy = self.model == "sparsemax" and self.resolved_temperature() == "energy"
        need(energy or (self.energy_power == 0 and self.energy_power_mode == "learn"),
             "--energy-power and --energy-power-mode apply to --model sparsemax with the energy "
             "temperature")
        need(self.inference != "threshold" or (self.model == "sparsemax"
                                               and self.resolved_values() != "shrunk"),
             "--inference threshold applies to --model sparsemax with unshrunk values")
        batch = self.model == "sparsemax" and self.resolved_support() == "batch"
        need(not batch or self.resolved_values() == "unshrunk-ste",
             "--support batch needs --values unshrunk-ste (or auto)")
        need(not batch or self.resolved_temperature() == "global",
             "--support batch has one temperature per group: leave --temperature auto (global)")
        need(not batch or self.inference in ("auto", "sparsemax"),
             "--support batch infers with its batch threshold: leave --inference auto")


@dataclass
class EntmaxSettings(SupportMapSettings):
    """The entmax SAE's own settings."""

    alpha: float = setting(1.5, "entmax: α (start value when learned or annealed)", low=1,
                           low_open=True)
    alpha_mode: str = setting("learn", "entmax: learn α, anneal it to 2, or keep it fixed",
                              choices=("learn", "anneal", "fixed"))

    def check(self, need: Need) -> None:
        need(self.model != "entmax" or self.alpha_mode != "learn" or self.alpha > 1.001,
             f"--alpha must be > 1.001 when learned (α = 1.001 + softplus), got {self.alpha}")
        need(self.alpha_mode != "anneal" or self.alpha <= 2,
             f"--alpha must be <= 2 when annealed towards 2, got {self.alpha}")


def _inference(meant: str, value: Callable[[str], str], settings: Mapping[str, object]) -> str:
    # a threshold at inference is put on unshrunk values, so with shrunk ones the model keeps
    # its own per-input support whatever auto means
    return "sparsemax" if value("values") == "shrunk" else meant


def _temperature(meant: str, value: Callable[[str], str],
                 settings: Mapping[str, object]) -> str:
    # a batch support's scores keep their scale, which is what lets an input with higher
    # scores take more of the batch's units; the per-input temperatures divide it away
    return "global" if value("support") == "batch" else meant


register(Variant("sparsemax", "sae.models.sparsemax:SparsemaxSAE", config=SparsemaxSettings,
                 auto={"values": "unshrunk-ste", "temperature": "energy", "init": "data"},
                 rules={"inference": _inference, "temperature": _temperature},
                 # then the Sparsemax-SAE's auto temperature was normalized
                 saved_auto={"temperature": "normalized", "values": "unshrunk-ste"}))
register(Variant("entmax", "sae.models.sparsemax:EntmaxSAE", config=EntmaxSettings,
                 auto={"init": "data"}, saved_auto={"temperature": "global"}))
