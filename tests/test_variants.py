"""The variant registry: each mechanism's module declares its settings, and they become the
configuration's fields, flags and checks without being listed anywhere else."""

from dataclasses import fields
from pathlib import Path

import pytest

from sae.settings import variants
from sae.settings.cli import build_parser
from sae.settings.config import REFUSED_ELSEWHERE, SAEConfig
from sae.settings.variants import (
    AUTO_DEFAULTS,
    MECHANISMS,
    MODELS,
    VARIANTS,
    settings_classes,
)


def test_every_mechanism_module_is_imported_and_registers_in_order():
    folder = Path(variants.__file__).parent
    modules = {p.stem for p in folder.glob("*.py")} - {"__init__", "registry"}
    assert modules == set(MECHANISMS)  # a module left out of the order would still register
    registered_in = [v.config.__module__.rpartition(".")[2] if v.config else None
                     for v in VARIANTS.values()]
    assert {m for m in registered_in if m} <= modules
    assert list(MODELS)[:3] == ["l1", "kl", "sparsemax"]


def test_a_variant_s_own_settings_are_the_configuration_s_fields_and_flags():
    config_fields = {f.name for f in fields(SAEConfig)}
    flags = {a.dest for a in build_parser()._actions}
    for cls in settings_classes():
        own = {f.name for f in fields(cls)}
        assert own <= config_fields and own <= flags, cls.__name__
    sparsemax = VARIANTS["sparsemax"]
    assert {"values", "support", "temperature", "groups"} <= set(sparsemax.settings)
    assert "alpha" in VARIANTS["entmax"].settings and "temperature" in VARIANTS["entmax"].settings
    assert "alpha" not in sparsemax.settings


@pytest.mark.parametrize("name", REFUSED_ELSEWHERE)
def test_a_variant_s_setting_given_to_another_model_is_refused(name):
    owners = [n for n, v in VARIANTS.items() if name in v.settings]
    other = next(n for n in ("l1", "topk") if n not in owners)
    f = next(f for f in fields(SAEConfig) if f.name == name)
    choices = f.metadata["setting"]["choices"]
    common = ("auto", f.default, AUTO_DEFAULTS.get(name))  # what every model means by auto
    value = next((c for c in choices or () if c not in common), None)
    if value is None:  # a number: one inside its bounds, not its default
        value = f.default + 1 if isinstance(f.default, int) else (f.default / 2 or 0.5)
    with pytest.raises(ValueError, match=f"applies to --model {' and '.join(owners)}"):
        SAEConfig(model=other, **{name: value}).validate()
    SAEConfig(model=owners[0], **{name: value})  # its own model takes it (checks apart)


def test_checks_of_a_shared_settings_class_run_for_each_model_that_reads_it():
    for model in ("sparsemax", "entmax"):
        with pytest.raises(ValueError, match="--groups must divide --hidden"):
            SAEConfig(model=model, hidden=512, groups=3).validate()
    with pytest.raises(ValueError, match="--alpha must be > 1.001"):
        SAEConfig(model="entmax", alpha=1.0005).validate()
