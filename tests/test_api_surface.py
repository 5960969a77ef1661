"""What a user meets of ``import sae`` before any run: the names ``dir(sae)`` and tab completion
list, the one-line error of a misspelt keyword to ``sae.train``, ``lambda_`` for ``lam``, and the
API reference's table of settings, made from the typed settings."""

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import sae
from sae.settings.cli import SETTINGS

REPO = Path(__file__).resolve().parents[1]


def test_dir_lists_the_public_api_without_importing_torch():
    code = ("import sys, sae; names = dir(sae); "
            "print(','.join(n for n in names if not n.startswith('_'))); "
            "print('torch' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, check=True)
    names, torch_loaded = done.stdout.split()
    assert set(sae.__all__) <= set(names.split(",")) and {"train", "load", "export"} <= \
        set(names.split(","))
    assert torch_loaded == "False"  # listing the names imports nothing heavy


def test_tab_completion_offers_the_lazy_names():
    rlcompleter = pytest.importorskip("rlcompleter")
    completer = rlcompleter.Completer({"sae": sae})
    offered = {completer.complete("sae.tr", i) for i in range(5)} - {None}
    assert "sae.train(" in offered or "sae.train" in offered


@pytest.mark.parametrize("given, says", [
    ({"lamda": 0.1}, "unknown setting lamda (did you mean lam?)"),
    ({"hiden": 8}, "unknown setting hiden (did you mean hidden?)"),
    ({"lamda": 0.1, "hiden": 8}, "unknown settings hiden (did you mean hidden?), lamda (did you "
                                 "mean lam?)"),
    ({"zzqqxx": 1}, "unknown setting zzqqxx; see help(sae.train)"),
    ({"lambda_": 0.1, "lam": 0.2}, "lambda_ and lam are the same setting; give one"),
])
def test_a_misspelt_keyword_is_one_line_naming_the_closest(tmp_path, given, says):
    with pytest.raises(ValueError) as e:
        sae.train(out=str(tmp_path / "run"), **given)
    assert says in str(e.value) and "\n" not in str(e.value)
    assert not (tmp_path / "run").exists()


def test_lambda_underscore_is_lam(tmp_path, data_dir, monkeypatch):
    monkeypatch.setenv("SAE_DATA_DIR", str(data_dir))
    with pytest.raises(ValueError, match="--lambda: must be >= 0, got -1"):  # checked as lam
        sae.train(lambda_=-1)
    out = sae.train(lambda_=0.037, model="l1", hidden=8, max_steps=2, limit_train=256,
                    val_size=64, limit_test=64, no_figures=True, no_report=True,
                    no_features=True, out=str(tmp_path / "run"))
    assert yaml.safe_load((out / "config.yaml").read_text())["lambda"] == 0.037


def test_the_reference_lists_every_setting_from_the_typed_settings():
    sys.path.insert(0, str(REPO / "docs" / "hooks"))
    try:
        from settings import MARKER, on_page_markdown  # the site's hook
    finally:
        sys.path.pop(0)
    page = (REPO / "docs" / "api.md").read_text(encoding="utf-8")
    assert MARKER in page
    shown = on_page_markdown(page, None, None, None)
    for s in SETTINGS.values():
        assert f"| `{s.name}`" in shown and f"`{s.flag}`" in shown, s.name
    assert "`lam` (or `lambda_`)" in shown
    # under the names users call; RunConfig and the input range of encode documented
    assert "heading: sae.train" in page and "heading: sae.load" in page
    assert "heading: sae.export" in page and "sae.settings.config.RunConfig" in page
    assert "[0, 1]" in page


@pytest.mark.skipif(importlib.util.find_spec("mkdocs") is None, reason="mkdocs is not installed")
def test_the_hook_is_part_of_the_site():
    assert "docs/hooks/settings.py" in (REPO / "mkdocs.yml").read_text(encoding="utf-8")


def test_a_run_config_is_taken_as_its_settings(tmp_path):
    from sae.settings.config import RunConfig

    config = RunConfig()
    config.sae.hidden = 0  # checked as the command checks --hidden: its fields are settings
    with pytest.raises(ValueError, match="--hidden"):
        sae.train(config, out=str(tmp_path / "run"))
    assert not (tmp_path / "run").exists()
