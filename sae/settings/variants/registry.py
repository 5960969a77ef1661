"""The registry of SAE variants: one :class:`Variant` per ``--model``, from which everything that
differs between models is derived. No torch, no Lightning (the command line reads it before
anything heavy is imported).

A variant says which class implements it (imported only when a model is built), whether a
penalty weight λ or a fixed budget k sets its sparsity, its settings class (a dataclass of the
settings only it reads, which become fields of ``sae.settings.config.SAEConfig``, flags and
``config.yaml`` keys), what its ``auto`` settings resolve to and the rules by which they depend
on its other settings. ``--model`` offers every registered name; ``SAEConfig`` (fields,
defaults, checks), ``sae.models.build_model``, the dead-unit remedy, the sweep grid (λ or k) and
the report's settings table all read this registry. Each mechanism registers itself in its own
module of this package.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, fields

__all__ = ["AUTO_DEFAULTS", "BUDGETS", "FIXED_BUDGET", "MODELS", "NO_BUDGET", "VARIANTS",
           "AutoRule", "Variant", "VariantSettings", "models_using", "register", "settings_classes",
           "uses_lambda", "variant"]


@dataclass(frozen=True)
class Variant:
    """One ``--model``.

    ``cls`` is the ``SparseAutoencoder`` subclass, or ``"module:Class"``, which
    ``sae.models.model_class`` imports when a model is first built (this module stays free of
    torch). ``budget``: ``"penalty"`` (λ weighs a sparsity penalty), ``"fixed"`` (k sets
    the (mean) L0; λ is not used; its dead units are remedied by AuxK) or ``"none"`` (neither:
    the model's L0 is its own, λ and k are not used). ``config``: its settings class
    (:class:`VariantSettings`), whose fields are the settings only it reads; ``settings``:
    other model-specific settings (field names) that apply to it too. ``auto``: what an
    ``auto`` setting resolves to for it (``values``, ``temperature``, ``init``, ``inference``,
    ``support``), where that differs from the common default (:data:`AUTO_DEFAULTS`);
    ``rules``: an ``auto`` whose meaning depends on its other settings (:data:`AutoRule`);
    ``saved_auto``: what a saved ``auto`` meant in configurations saved before ``auto`` was
    resolved when saving; ``lambda_when``: for a fixed budget, the settings under which λ
    still weighs a term.
    """

    name: str
    cls: str | type
    budget: str = "penalty"
    config: type | None = None
    settings: tuple[str, ...] = ()
    auto: dict[str, str] = field(default_factory=dict)
    rules: dict[str, AutoRule] = field(default_factory=dict)
    saved_auto: dict[str, str] = field(default_factory=dict)
    lambda_when: Callable[[Mapping[str, object]], bool] | None = None

    def __post_init__(self) -> None:
        if self.budget not in BUDGETS:
            raise ValueError(f"variant {self.name}: budget must be one of {BUDGETS}, "
                             f"not {self.budget!r}")
        unknown = (set(self.auto) | set(self.rules)) - set(AUTO_DEFAULTS)
        if unknown:
            raise ValueError(f"variant {self.name}: no auto setting {sorted(unknown)}")
        if self.config is not None:  # its own settings apply to it, then any it shares
            own = tuple(f.name for f in fields(self.config))
            object.__setattr__(self, "settings", tuple(dict.fromkeys(own + self.settings)))

    def resolved(self, name: str, settings: Mapping[str, object] | None = None) -> str:
        """What setting ``name`` = ``auto`` means for this variant, given the other ``settings``
        (field names) where its meaning depends on them (``rules``)."""
        meant = self.auto.get(name, AUTO_DEFAULTS[name])
        if name in self.rules and settings is not None:
            def value(other: str) -> str:  # another setting as this variant resolves it
                given = settings.get(other, "auto")
                return self.resolved(other, settings) if given == "auto" else str(given)

            meant = self.rules[name](meant, value, settings)
        return meant


class VariantSettings:
    """Base of a variant's settings class: a dataclass whose fields (declared with
    ``sae.settings.setting.setting``) are the settings only that variant reads.

    ``SAEConfig`` inherits every registered variant's settings class, so a variant's fields and
    methods are the configuration's. :meth:`check` refuses what is wrong with the
    configuration's values as this variant sees them, whichever model it names (another
    model given one of this variant's settings, say); ``REFUSED_ELSEWHERE`` names the settings
    that another model may not be given other than at their default or ``auto``; ``PINNED``
    the settings whose ``auto`` a new run saves resolved, and ``SAVED_BEFORE`` the value of a
    setting in a configuration saved before the setting existed.
    """

    REFUSED_ELSEWHERE: tuple[str, ...] = ()
    PINNED: tuple[str, ...] = ()
    SAVED_BEFORE: dict[str, object] = {}

    def check(self, need: Callable[[bool, str], None]) -> None:
        """Call ``need(ok, one-line message)`` for each check of this variant's settings."""

    def resolved_setting(self, name: str) -> str:
        """Setting ``name`` of the configuration, an ``auto`` resolved for its model."""
        value = getattr(self, name)
        if value != "auto":
            return value
        model = getattr(self, "model", None)
        return variant(model).resolved(name, vars(self)) if model in VARIANTS \
            else AUTO_DEFAULTS[name]


BUDGETS = ("penalty", "fixed", "none")  # what sets a variant's sparsity: λ, k, or nothing

# what an ``auto`` setting resolves to unless a variant says otherwise
AUTO_DEFAULTS = {"values": "shrunk", "temperature": "global", "init": "random",
                 "inference": "sparsemax", "support": "input"}

# an ``auto`` whose meaning depends on other settings: what the variant's ``auto`` (``meant``)
# becomes, given ``value(name)``, another setting as resolved, and the ``settings`` as given.
AutoRule = Callable[[str, Callable[[str], str], Mapping[str, object]], str]

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


def uses_lambda(model: str, settings: Mapping[str, object]) -> bool:
    """Whether λ weighs a term of ``model`` with these settings (field names): every penalty
    model, and a fixed-budget one whose ``lambda_when`` says so."""
    v = variant(model)
    return v.budget == "penalty" or (v.lambda_when is not None and v.lambda_when(settings))


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


def settings_classes() -> tuple[type, ...]:
    """The registered variants' settings classes, each once, in the order of registration."""
    return tuple(dict.fromkeys(v.config for v in VARIANTS.values() if v.config is not None))
