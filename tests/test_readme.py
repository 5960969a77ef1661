"""The README and the documentation say what the code and the published CSVs say.

The results (``docs/results.md``, and the README's headline table) mark each headline table
with ``<!-- headline: <published folder> <dataset> -->`` on the line before it. Those tables must
be exactly what ``sae.sweep.display.headline_display`` makes from that folder's results.csv (at
the targets of its sweep.yaml), and every decimal number in the README and the results must
appear in the published comparison.md files (themselves rendered from the same results.csv).
``docs/history.md`` keeps earlier measurements as they were published and is not checked here.
"""

import re
from pathlib import Path

import pandas as pd
import pytest
import yaml

from sae.sweep import display

REPO = Path(__file__).resolve().parents[1]
README = (REPO / "README.md").read_text(encoding="utf-8")
DOCS = REPO / "docs"
RESULTS = (DOCS / "results.md").read_text(encoding="utf-8")
HEADLINE = re.compile(r"<!-- headline: (\S+) (\S+) -->\n((?:\|.*\n)+)")


def targets(folder: Path):
    spec = yaml.safe_load((folder / "sweep.yaml").read_text(encoding="utf-8"))
    found = spec.get("targets")
    return tuple(sorted(float(t) for t in found)) if found else None


ACROSS = re.compile(r"<!-- across\n(.*?)\n-->\n((?:\|.*\n)+)", re.S)


def test_the_readme_summary_is_made_from_the_published_csvs():
    """The README's table across comparisons: each line of its comment is ``folder dataset
    target metric | heading``; the table is what display.across_display makes of them."""
    (spec, table), = ACROSS.findall(README)
    columns = []
    for line in spec.splitlines():
        where, heading = (part.strip() for part in line.split("|"))
        folder, dataset, target, metric = where.split()
        columns.append((heading, pd.read_csv(REPO / folder / "results.csv"), dataset,
                        float(target), metric))
    expected = display.to_markdown(display.across_display(columns))
    assert table.strip() == expected.strip(), "README: regenerate the summary table"


@pytest.mark.parametrize("name, text", [("README", README), ("results", RESULTS)])
def test_headline_tables_are_made_from_the_published_csv(name, text):
    found = HEADLINE.findall(text)
    if name == "README" and not found:
        return  # the README may quote none: its summary is checked above
    for folder, dataset, table in found:
        results = pd.read_csv(REPO / folder / "results.csv")
        expected = display.to_markdown(display.headline_display(results, dataset,
                                                                targets(REPO / folder)))
        assert table.strip() == expected.strip(), f"{name}: {folder} {dataset}: regenerate"


def test_the_results_cover_the_published_pages():
    folders = {folder for folder, _, _ in HEADLINE.findall(RESULTS)}
    assert {"figures/compare/mnist", "figures/compare/fashion-mnist",
            "figures/compare/mlp-layer", "figures/compare/ground-truth"} <= folders


@pytest.mark.parametrize("name, text", [("README", README), ("results", RESULTS)])
def test_every_number_in_the_results_is_published(name, text):
    section = re.sub(r"\]\([^)]*\)|<!--.*?-->|`[^`]*`|```.*?```", "", text, flags=re.S)
    published = "\n".join(p.read_text(encoding="utf-8")
                          for p in sorted((REPO / "figures" / "compare").glob("*/comparison.md")))
    numbers = set(re.findall(r"(?<![\w.])\d+\.\d+(?![\w.])", section))
    assert numbers, f"{name} quotes numbers"
    missing = sorted(n for n in numbers
                     if not re.search(rf"(?<![\d.]){re.escape(n)}(?![\d])", published))
    assert not missing, f"numbers in {name} that no comparison.md holds: {missing}"


@pytest.mark.parametrize("name", ["mnist", "fashion-mnist", "mlp-layer", "ground-truth"])
def test_published_comparisons_hold_every_model_and_measure(name):
    folder = REPO / "figures" / "compare" / name
    results = pd.read_csv(folder / "results.csv")
    assert {"batchtopk", "jumprelu", "sparsemax", "sparsemax-batch",
            "sparsemax-attention"} <= set(results["model"])
    for column in ("recon_bias", "support_fvu", "adaptivity", "adaptivity_partial",
                   "adaptivity_energy", "dead_fraction", "dense_fraction", "wall_time_s",
                   "val_fvu", "val_l0"):
        rows = results[results["kind"] != "topk"] if column.startswith("adaptivity") \
            else results
        assert rows[column].notna().all(), f"{name}: {column} missing"  # TopK's L0 is constant
    if name == "ground-truth":
        for column in ("gt_recovery", "gt_mcc", "gt_l0_spearman", "val_gt_l0_spearman"):
            assert results[column].notna().all(), f"{name}: {column} missing"
    else:
        assert results["probe_accuracy"].notna().all()
    assert results.groupby(["model", "value"])["seed"].nunique().eq(3).all()
    for file in ("comparison.md", "comparison.html", "fvu_vs_l0.png"):
        assert (folder / file).is_file()


METRIC_TABLE = re.compile(r"<!-- metrics: (\w+) -->\n(.*?)\n<!-- /metrics -->", re.S)


def test_metric_tables_are_the_registry():
    """The metric tables of docs/metrics.md are sae.settings.metric_defs's, row for row."""
    from sae.settings.metric_defs import markdown_table

    found = dict(METRIC_TABLE.findall((DOCS / "metrics.md").read_text(encoding="utf-8")))
    assert set(found) == {"run", "sweep", "truth", "validation"}, "four metric tables"
    for group, table in found.items():
        assert table == markdown_table(group), f"{group}: regenerate with markdown_table"


def test_every_number_a_run_or_sweep_reports_is_a_registered_metric():
    from sae.metrics import DYNAMIC_KEYS, GROUND_TRUTH_KEYS, SUMMARY_KEYS
    from sae.settings.metric_defs import METRIC, METRICS
    from sae.sweep.aggregate import SUMMARY_METRICS

    assert len(METRIC) == len(METRICS), "a metric is registered twice"
    assert set(SUMMARY_KEYS) | set(DYNAMIC_KEYS) | set(GROUND_TRUTH_KEYS) <= set(METRIC)
    assert set(SUMMARY_METRICS) <= set(METRIC)
    for m in METRICS:
        assert m.better in (None, "lower", "higher")
        assert m.group in ("run", "sweep", "truth", "validation", "count")
        assert format(0.5, m.fmt) and m.definition and m.label
        assert "|" not in m.definition  # the definitions are cells of markdown tables


def test_layout_names_every_module_once():
    """docs/layout.md has one line per module of sae/ and names nothing that is not one."""
    layout = (DOCS / "layout.md").read_text(encoding="utf-8")
    start = layout.index("```\n") + 4
    block = layout[start:layout.index("```\n", start)]
    named = [line.split()[0] for line in block.splitlines() if line.startswith("sae/")]
    modules = sorted(str(p.relative_to(REPO)) for p in (REPO / "sae").rglob("*.py"))
    assert len(named) == len(set(named)), "a module is named twice"
    assert sorted(named) == modules


def test_the_readme_is_short_and_every_link_reaches_a_file():
    assert len(README.splitlines()) <= 250
    pages = [(REPO, README)] + [(DOCS, p.read_text(encoding="utf-8"))
                                for p in sorted(DOCS.glob("*.md"))]
    for base, text in pages:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text):
            if not target.startswith(("http://", "https://")):
                assert (base / target).exists(), f"a link to a missing file: {target}"
