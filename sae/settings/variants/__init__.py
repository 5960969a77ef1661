"""The SAE variants: the registry (:mod:`sae.settings.variants.registry`) and one module per
mechanism, each declaring its settings class, its rules and its :class:`Variant`. No torch.

Adding a mechanism is its model in ``sae/models/`` and its module here, which is found and
imported on its own; :data:`MECHANISMS` orders ``--model``'s choices (a module it does not name
comes after those it does, by name).
"""

import pkgutil
from importlib import import_module

from sae.settings.variants.registry import (
    AUTO_DEFAULTS,
    BUDGETS,
    FIXED_BUDGET,
    MODELS,
    NO_BUDGET,
    VARIANTS,
    AutoRule,
    Variant,
    VariantSettings,
    models_using,
    register,
    settings_classes,
    uses_lambda,
    variant,
)

__all__ = ["AUTO_DEFAULTS", "BUDGETS", "FIXED_BUDGET", "MECHANISMS", "MODELS", "NO_BUDGET",
           "VARIANTS", "AutoRule", "Variant", "VariantSettings", "models_using", "register",
           "settings_classes", "uses_lambda", "variant"]

# the modules of this package that register a mechanism, in the order --model offers them
MECHANISMS = ("l1", "kl", "sparsemax", "topk", "batchtopk", "jumprelu", "attention")
_FOUND = sorted(m.name for m in pkgutil.iter_modules(__path__) if m.name != "registry")
for _name in sorted(_FOUND, key=lambda n: (n not in MECHANISMS, MECHANISMS.index(n)
                                           if n in MECHANISMS else 0, n)):
    import_module(f"{__name__}.{_name}")
