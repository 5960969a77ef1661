"""The README's comparison is the published CSVs' comparison: no number it cannot back.

The README marks its comparison section with ``<!-- comparison -->`` … ``<!-- /comparison -->``
and each headline table with ``<!-- headline: <published folder> <dataset> -->`` on the line
before it. The headline tables must be exactly what ``sae.sweep.display.headline_display`` makes
from that folder's results.csv, and every decimal number in the section must appear in the
published comparison.md files (themselves rendered from the same results.csv).
"""

import re
from pathlib import Path

import pandas as pd
import pytest

from sae.sweep import display

REPO = Path(__file__).resolve().parents[1]
README = (REPO / "README.md").read_text(encoding="utf-8")
HEADLINE = re.compile(r"<!-- headline: (\S+) (\S+) -->\n((?:\|.*\n)+)")


def comparison_section() -> str:
    start, end = README.find("<!-- comparison -->"), README.find("<!-- /comparison -->")
    assert 0 <= start < end, "the README marks its comparison section"
    return README[start:end]


def test_headline_tables_are_made_from_the_published_csv():
    found = HEADLINE.findall(comparison_section())
    assert {dataset for _, dataset, _ in found} >= {"mnist", "fashion-mnist", "mnist-mlp-layer-2"}
    for folder, dataset, table in found:
        results = pd.read_csv(REPO / folder / "results.csv")
        expected = display.to_markdown(display.headline_display(results, dataset))
        assert table.strip() == expected.strip(), f"{folder} {dataset}: regenerate the table"


def test_every_number_in_the_comparison_is_published():
    section = re.sub(r"\]\([^)]*\)|<!--.*?-->|`[^`]*`", "", comparison_section())
    published = "\n".join(p.read_text(encoding="utf-8")
                          for p in sorted((REPO / "figures" / "compare").glob("*/comparison.md")))
    numbers = set(re.findall(r"(?<![\w.])\d+\.\d+(?![\w.])", section))
    assert numbers, "the comparison section quotes numbers"
    missing = sorted(n for n in numbers
                     if not re.search(rf"(?<![\d.]){re.escape(n)}(?![\d])", published))
    assert not missing, f"numbers in the README's comparison that no comparison.md holds: {missing}"


@pytest.mark.parametrize("name", ["mnist", "fashion-mnist", "wide", "wide-threshold", "mlp-layer"])
def test_published_comparisons_hold_the_new_models_and_measures(name):
    folder = REPO / "figures" / "compare" / name
    results = pd.read_csv(folder / "results.csv")
    assert {"batchtopk", "jumprelu", "sparsemax"} <= set(results["model"])
    for column in ("recon_bias", "support_fvu", "adaptivity", "probe_accuracy",
                   "probe_sparsemax_accuracy", "probe_sparsemax_classes", "dead_fraction",
                   "dense_fraction", "wall_time_s"):
        rows = results[results["kind"] != "topk"] if column == "adaptivity" else results
        assert rows[column].notna().all(), f"{name}: {column} missing"  # TopK's L0 is constant
    if not name.startswith("wide"):
        assert results.groupby(["model", "value"])["seed"].nunique().eq(3).all()
    for file in ("comparison.md", "comparison.html", "fvu_vs_l0.png", "probe_vs_l0.png"):
        assert (folder / file).is_file()


METRIC_TABLE = re.compile(r"<!-- metrics: (\w+) -->\n(.*?)\n<!-- /metrics -->", re.S)


def test_metric_tables_are_the_registry():
    """The README's metric tables are sae.metric_defs's, row for row."""
    from sae.metric_defs import markdown_table

    found = dict(METRIC_TABLE.findall(README))
    assert set(found) == {"run", "sweep"}, "the README marks its two metric tables"
    for group, table in found.items():
        assert table == markdown_table(group), f"{group}: regenerate with markdown_table"


def test_every_number_a_run_or_sweep_reports_is_a_registered_metric():
    from sae.metric_defs import METRIC, METRICS
    from sae.metrics import DYNAMIC_KEYS, SUMMARY_KEYS
    from sae.sweep.aggregate import SUMMARY_METRICS

    assert len(METRIC) == len(METRICS), "a metric is registered twice"
    assert set(SUMMARY_KEYS) | set(DYNAMIC_KEYS) <= set(METRIC)
    assert set(SUMMARY_METRICS) - {"converged"} <= set(METRIC)
    for m in METRICS:
        assert m.better in (None, "lower", "higher") and m.group in ("run", "sweep", "count")
        assert format(0.5, m.fmt) and m.definition and m.label


def test_layout_names_every_module_once():
    """The Layout section has one line per module of sae/ and names nothing that is not one."""
    start = README.index("```\n", README.index("## Layout")) + 4
    block = README[start:README.index("```\n", start)]
    named = [line.split()[0] for line in block.splitlines() if line.startswith("sae/")]
    modules = sorted(str(p.relative_to(REPO)) for p in (REPO / "sae").rglob("*.py"))
    assert len(named) == len(set(named)), "a module is named twice"
    assert sorted(named) == modules
