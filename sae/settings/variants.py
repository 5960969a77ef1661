"""The registry of SAE variants: one :class:`Variant` per ``--model``, from which everything that
differs between models is derived. No torch, no Lightning (the command line reads it before
anything heavy is imported).

A variant says which class implements it (imported only when a model is built), whether a
penalty weight λ or a fixed budget k sets its sparsity, which model-specific settings apply to it
(``sae.settings.config.SAEConfig`` field names: the report hides the others, and a ``values`` or
``temperature`` other than the common one is refused), and what its ``auto`` settings resolve
to. ``--model`` offers every registered name; ``sae.settings.config.SAEConfig`` (defaults, checks),
``sae.models.build_model``, the dead-unit remedy, the sweep grid (λ or k) and the report's
settings table all read this registry.

Adding a model is a module in ``sae/models/`` with its ``SparseAutoencoder`` subclass and one
:func:`register` call below.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

__all__ = ["BUDGETS", "FIXED_BUDGET", "MODELS", "NO_BUDGET", "VARIANTS", "Variant",
           "models_using", "register", "uses_lambda", "variant"]


@dataclass(frozen=True)
class Variant:
    """One ``--model``.

    ``cls`` is the ``SparseAutoencoder`` subclass, or ``"module:Class"``, which
    ``sae.models.model_class`` imports when a model is first built (this module stays free of
    torch). ``budget``: ``"penalty"`` (λ weighs a sparsity penalty), ``"fixed"`` (k sets
    the (mean) L0; λ is not used; its dead units are remedied by AuxK) or ``"none"`` (neither:
    the model's L0 is its own, λ and k are not used). ``settings``: the
    model-specific settings (field names) that apply to this variant. ``auto``: what an ``auto``
    setting resolves to for it (``values``, ``temperature``, ``init``, ``inference``,
    ``support``), where that differs from the common default (:data:`AUTO_DEFAULTS`).
    """

    name: str
    cls: str | type
    budget: str = "penalty"
    settings: tuple[str, ...] = ()
    auto: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.budget not in BUDGETS:
            raise ValueError(f"variant {self.name}: budget must be one of {BUDGETS}, "
                             f"not {self.budget!r}")
        unknown = set(self.auto) - set(AUTO_DEFAULTS)
        if unknown:
            raise ValueError(f"variant {self.name}: no auto setting {sorted(unknown)}")

    def resolved(self, name: str, settings: Mapping[str, object] | None = None) -> str:
        """What setting ``name`` = ``auto`` means for this variant, given the other ``settings``
        (field names) where its meaning depends on them (:data:`AUTO_DEPENDS`)."""
        meant = self.auto.get(name, AUTO_DEFAULTS[name])
        if name in AUTO_DEPENDS and settings is not None:
            def value(other: str) -> str:  # another setting as this variant resolves it
                given = settings.get(other, "auto")
                return self.resolved(other, settings) if given == "auto" else str(given)

            meant = AUTO_DEPENDS[name](meant, value, settings)
        return meant


BUDGETS = ("penalty", "fixed", "none")  # what sets a variant's sparsity: λ, k, or nothing

# what an ``auto`` setting resolves to unless a variant says otherwise
AUTO_DEFAULTS = {"values": "shrunk", "temperature": "global", "init": "random",
                 "inference": "sparsemax", "support": "input"}

# an ``auto`` whose meaning depends on other settings: what the variant's ``auto`` (``meant``)
# becomes, given ``value(name)``, another setting as resolved, and the ``settings`` as given.
AutoRule = Callable[[str, Callable[[str], str], Mapping[str, object]], str]


def _inference(meant: str, value: Callable[[str], str], settings: Mapping[str, object]) -> str:
    # a threshold at inference is put on unshrunk values, so with shrunk ones the model keeps
    # its own per-input support whatever auto means
    return "sparsemax" if value("values") == "shrunk" else meant


def _temperature(meant: str, value: Callable[[str], str],
                 settings: Mapping[str, object]) -> str:
    # a batch support's scores keep their scale, which is what lets an input with higher
    # scores take more of the batch's units; the per-input temperatures divide it away
    return "global" if value("support") == "batch" else meant


AUTO_DEPENDS: dict[str, AutoRule] = {"inference": _inference, "temperature": _temperature}

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


# a fixed-budget model whose λ still weighs a term when a setting asks for one
_LAMBDA_WHEN = {"batchtopk": lambda settings: settings.get("batchtopk_gate") == "ste"}


def uses_lambda(model: str, settings: Mapping[str, object]) -> bool:
    """Whether λ weighs a term of ``model`` with these settings (field names): every penalty
    model; BatchTopK with the straight-through gate, whose L0 price λ sets."""
    v = variant(model)
    return v.budget == "penalty" or _LAMBDA_WHEN.get(model, lambda s: False)(settings)


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
NO_BUDGET: Sequence[str] = _Names(lambda v: v.budget == "none")

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
register(Variant("batchtopk", "sae.models.batchtopk:BatchTopKSAE", budget="fixed",
                 settings=("batchtopk_gate",)))
register(Variant("jumprelu", "sae.models.jumprelu:JumpReLUSAE",
                 settings=("jumprelu_bandwidth", "jumprelu_threshold", "jumprelu_gain")))
register(Variant("sparsemax-attention", "sae.models.attention:AttentionSAE", budget="none",
                 settings=("attention_factors", "attention_rank", "attention_input",
                           "frequency_mask")))
