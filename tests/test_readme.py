"""The README and the documentation say what the code and the published CSVs say.

The results (``docs/results.md``, and the README's summary) are generated tables with the
recipe on the comment line(s) before them: ``<!-- headline: <published folder> <dataset> -->``
(what ``sae.sweep.display.headline_display`` makes of that folder's results.csv at the targets
of its sweep.yaml) or ``<!-- across`` with one ``folder dataset target metric | heading`` line
per column (``display.across_display``). Each table must be exactly what its recipe makes, and
every other decimal number of the README and the results must appear in a published
comparison.md or in one of those tables. ``docs/history.md`` keeps earlier measurements as they
were published and is not checked here.
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


ACROSS = re.compile(r"<!-- across\n(.*?)\n-->\n((?:\|[^\n]*\n)+)", re.S)
PAGES = [("README", README), ("results", RESULTS)]


def across_columns(spec: str) -> list[tuple]:
    """The columns of an across table: each line of its comment is ``folder dataset target
    metric | heading``."""
    columns = []
    for line in spec.splitlines():
        where, heading = (part.strip() for part in line.split("|"))
        folder, dataset, target, metric = where.split()
        columns.append((heading, folder, dataset, float(target), metric))
    return columns


def quoted_folders(text: str) -> set[str]:
    """The published folders a page's generated tables are made from."""
    return ({folder for folder, _, _ in HEADLINE.findall(text)}
            | {c[1] for spec, _ in ACROSS.findall(text) for c in across_columns(spec)})


def test_the_readme_has_one_summary_table():
    assert len(ACROSS.findall(README)) == 1


@pytest.mark.parametrize("name, text", PAGES)
def test_tables_across_comparisons_are_made_from_the_published_csvs(name, text):
    """Each table across comparisons is what display.across_display makes of its comment."""
    for spec, table in ACROSS.findall(text):
        columns = [(heading, pd.read_csv(REPO / folder / "results.csv"), dataset, target,
                    metric) for heading, folder, dataset, target, metric in across_columns(spec)]
        expected = display.to_markdown(display.across_display(columns))
        assert table.strip() == expected.strip(), f"{name}: regenerate the table of {spec!r}"


@pytest.mark.parametrize("name, text", PAGES)
def test_headline_tables_are_made_from_the_published_csv(name, text):
    for folder, dataset, table in HEADLINE.findall(text):
        results = pd.read_csv(REPO / folder / "results.csv")
        expected = display.to_markdown(display.headline_display(results, dataset,
                                                                targets(REPO / folder)))
        assert table.strip() == expected.strip(), f"{name}: {folder} {dataset}: regenerate"


def test_the_results_cover_the_published_pages():
    assert {"figures/compare/mnist", "figures/compare/fashion-mnist",
            "figures/compare/mlp-layer", "figures/compare/ground-truth",
            "figures/compare/attribution-fashion-mnist"} <= quoted_folders(RESULTS)


@pytest.mark.parametrize("name, text", PAGES)
def test_every_number_in_the_results_is_published(name, text):
    """Every number of the prose is in a published comparison.md or in one of the page's
    headline tables (each checked against its results.csv above)."""
    tables = "\n".join([table for _, _, table in HEADLINE.findall(text)]
                       + [table for _, table in ACROSS.findall(text)])
    section = ACROSS.sub("", HEADLINE.sub("", text))
    section = re.sub(r"\]\([^)]*\)|<!--.*?-->|`[^`]*`|```.*?```", "", section, flags=re.S)
    published = "\n".join(p.read_text(encoding="utf-8")
                          for p in sorted((REPO / "figures" / "compare").glob("*/comparison.md")))
    published += "\n" + tables
    numbers = set(re.findall(r"(?<![\w.])\d+\.\d+(?![\w.])", section))
    assert numbers, f"{name} quotes numbers"
    missing = sorted(n for n in numbers
                     if not re.search(rf"(?<![\d.]){re.escape(n)}(?![\d])", published))
    assert not missing, f"numbers in {name} that no comparison.md holds: {missing}"


@pytest.mark.parametrize("name, text", PAGES)
def test_every_quoted_page_placed_its_runs_by_validation_metrics(name, text):
    """The README and the results quote only pages whose runs recorded validation metrics
    (placed by validation L0, their designs chosen on validation data); earlier pages are kept
    in the measurement history."""
    for folder in quoted_folders(text):
        columns = pd.read_csv(REPO / folder / "results.csv", nrows=1).columns
        assert "val_l0" in columns, f"{name}: {folder} predates validation metrics"


def current_pages():
    """The published pages the results quote (each recorded validation metrics: above)."""
    return sorted(Path(f).name for f in quoted_folders(RESULTS))


def test_the_ground_truth_page_is_current():
    assert "ground-truth" in current_pages()


@pytest.mark.parametrize("name", current_pages())
def test_published_comparisons_hold_every_model_and_measure(name):
    folder = REPO / "figures" / "compare" / name
    results = pd.read_csv(folder / "results.csv")
    if name in ("mnist", "fashion-mnist", "mlp-layer", "ground-truth"):  # the attribution
        # pages hold the batch support and the shared thresholds only
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
            rows = results[results["kind"] != "topk"] if "spearman" in column else results
            assert rows[column].notna().all(), f"{name}: {column} missing"
    else:
        assert results["probe_accuracy"].notna().all()
    seeds = results.groupby(["model", "value"])["seed"].nunique()
    if name.endswith("-seeds"):  # seeds 1 and 2 of a page whose seed 0 is published apart
        assert set(results["seed"]) == {1, 2} and seeds.eq(2).all()
    else:
        assert seeds.eq(3).all()
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
    assert len(README.splitlines()) <= 200
    pages = [(REPO, README)] + [(DOCS, p.read_text(encoding="utf-8"))
                                for p in sorted(DOCS.glob("*.md"))]
    for base, text in pages:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text):
            if not target.startswith(("http://", "https://")):
                assert (base / target).exists(), f"a link to a missing file: {target}"


def test_where_a_metric_appears_is_the_registry_s():
    """results.csv holds every metric, the seed summary every one but the counts, and a page's
    tables the registry's TABLES, so no metric is dropped from a table by a list kept apart."""
    from sae.settings.metric_defs import METRIC, METRICS, TABLES
    from sae.sweep import aggregate, display, matching

    assert [c for c in aggregate.RESULT_COLUMNS if c in METRIC] == [m.name for m in METRICS]
    assert set(aggregate.SUMMARY_METRICS) == {m.name for m in METRICS if m.group != "count"}
    assert tuple(display.SUMMARY_COLUMNS) == TABLES["summary"]
    assert tuple(matching.MATCHED_METRICS) == TABLES["matched"]


def test_the_readme_s_layers_are_the_packages():
    """The README's layer section names each package of sae/ once, one line each, and nothing
    that is not one."""
    block = README.split("## The code in layers", 1)[1].split("```text\n", 1)[1].split("```")[0]
    named = [line.split()[0] for line in block.splitlines() if line.strip()]
    packages = sorted(f"sae/{p.parent.name}/" for p in (REPO / "sae").glob("*/__init__.py"))
    assert sorted(named) == packages and len(named) == len(set(named))
