"""The registry of SAE variants: one :class:`Variant` per ``--model``, from which everything that
differs between models is derived. No torch, no Lightning (the command line reads it before
anything heavy is imported).

A variant says which class implements it (imported only when a model is built), whether a
penalty weight λ or a fixed budget k sets its sparsity, which model-specific settings apply to it
(``sae.config.SAEConfig`` field names: the report hides the others, and a ``values`` or
``temperature`` other than the common one is refused), and what its ``auto`` settings resolve
to. ``--model`` offers every registered name; ``sae.config.SAEConfig`` (defaults, checks),
``sae.models.build_model``, the dead-unit remedy, the sweep grid (λ or k) and the report's
settings table all read this registry.

Adding a model is a module in ``sae/models/`` with its ``SparseAutoencoder`` subclass and one
:func:`register` call below.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

__all__ = ["FIXED_BUDGET", "MODELS", "VARIANTS", "Variant", "models_using", "register",
           "variant"]


@dataclass(frozen=True)
class Variant:
    """One ``--model``.

    ``cls`` is the ``SparseAutoencoder`` subclass, or ``"module:Class"``, which
    ``sae.models.model_class`` imports when a model is first built (this module stays free of
    torch). ``budget``: ``"penalty"`` (λ weighs a sparsity penalty) or ``"fixed"`` (k sets
    the (mean) L0; λ is not used; its dead units are remedied by AuxK). ``settings``: the
    model-specific settings (field names) that apply to this variant. ``auto``: what an ``auto``
    setting resolves to for it (``values``, ``temperature``, ``init``, ``inference``), where that
    differs from the common default (:data:`AUTO_DEFAULTS`).
    """

    name: str
    cls: str | type
    budget: str = "penalty"
    settings: tuple[str, ...] = ()
    auto: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.budget not in ("penalty", "fixed"):
            raise ValueError(f"variant {self.name}: budget must be penalty or fixed, "
                             f"not {self.budget!r}")
        unknown = set(self.auto) - set(AUTO_DEFAULTS)
        if unknown:
            raise ValueError(f"variant {self.name}: no auto setting {sorted(unknown)}")

    def resolved(self, name: str, settings: Mapping[str, object] | None = None) -> str:
        """What setting ``name`` = ``auto`` means for this variant, given the other ``settings``
        (field names) where its meaning depends on one of them (:data:`AUTO_DEPENDS`)."""
        meant = self.auto.get(name, AUTO_DEFAULTS[name])
        if name in AUTO_DEPENDS and settings is not None:
            other, rule = AUTO_DEPENDS[name]
            value = settings.get(other, "auto")
            meant = rule(meant, self.resolved(other, settings) if value == "auto" else value)
        return meant


# what an ``auto`` setting resolves to unless a variant says otherwise
AUTO_DEFAULTS = {"values": "shrunk", "temperature": "global", "init": "random",
                 "inference": "sparsemax", "support": "input"}

# an ``auto`` whose meaning depends on another (resolved) setting: that setting's name, and what
# the variant's ``auto`` becomes given its value. A threshold at inference is put on unshrunk
# values, so with shrunk ones the model keeps its own per-input support whatever auto means.
AUTO_DEPENDS: dict[str, tuple[str, Callable[[str, str], str]]] = {
    "inference": ("values", lambda meant, values: "sparsemax" if values == "shrunk" else meant),
    # a batch support's scores keep their scale, which is what lets an input with higher
    # scores take more of the batch's units; the per-input temperatures divide it away
    "temperature": ("support", lambda meant, support: "global" if support == "batch" else meant),
}

VARIANTS: dict[str, Variant] = {}


def register(v: Variant) -> Variant:
    """Add a variant: its name becomes a ``--model`` choice everywhere."""
    if v.name in VARIANTS:
        raise ValueError(f"model {v.name!r} is registered already")
    VARIANTS[v.name] = v
    return v


def variant(name: str) -> Variant:
    """The registered variant ``name`` (ValueError naming the choices otherwise)."""
    if name not in VARIANTS:
        raise ValueError(f"unknown model {name!r}; choose from {', '.join(VARIANTS)}")
    return VARIANTS[name]


def models_using(setting: str) -> tuple[str, ...]:
    """The models a model-specific setting applies to (empty: not model-specific)."""
    return tuple(n for n, v in VARIANTS.items() if setting in v.settings)


class _Names(Sequence):
    """The registered model names (those that ``keep`` accepts), read live, so a variant
    registered after import is offered too."""

    def __init__(self, keep: Callable[[Variant], bool] = lambda v: True):
        self._keep = keep

    def _names(self) -> tuple[str, ...]:
        return tuple(n for n, v in VARIANTS.items() if self._keep(v))

    def __getitem__(self, i):
        return self._names()[i]

    def __len__(self) -> int:
        return len(self._names())

    def __iter__(self) -> Iterator[str]:
        return iter(self._names())

    def __contains__(self, name: object) -> bool:
        return name in self._names()

    def __repr__(self) -> str:
        return repr(self._names())


MODELS: Sequence[str] = _Names()
FIXED_BUDGET: Sequence[str] = _Names(lambda v: v.budget == "fixed")

_SUPPORT_MAP = ("temperature", "groups")  # the sparsemax family's support-map settings
register(Variant("l1", "sae.models.l1:L1SAE"))
register(Variant("kl", "sae.models.kl:KLSAE", settings=("rho", "kl_threshold")))
register(Variant("sparsemax", "sae.models.sparsemax:SparsemaxSAE",
                 settings=("values", "energy_power", "energy_power_mode", "inference",
                           "support", *_SUPPORT_MAP),
                 auto={"values": "unshrunk-ste", "temperature": "energy", "init": "data"}))
register(Variant("entmax", "sae.models.sparsemax:EntmaxSAE",
                 settings=("alpha", "alpha_mode", *_SUPPORT_MAP), auto={"init": "data"}))
register(Variant("topk", "sae.models.topk:TopKSAE", budget="fixed"))
register(Variant("batchtopk", "sae.models.batchtopk:BatchTopKSAE", budget="fixed"))
register(Variant("jumprelu", "sae.models.jumprelu:JumpReLUSAE",
                 settings=("jumprelu_bandwidth",)))
