"""A sweep's tables as text: the seed summary, the verdict, the headline and the "vs KL-SAE"
table of one dataset, and their rendering as markdown and HTML.

:func:`summary_display` / :func:`kl_display` / :func:`verdict_display` /
:func:`headline_display` turn the frames of :mod:`sae.sweep.aggregate` and
:mod:`sae.sweep.matching` into tables of text (every number at fixed decimals, mean ± std over
seeds where a spread was measured), which :func:`to_markdown` and :func:`to_html` render;
:func:`best_cells` says which cells of the summary table hold a verdict's winner, so both can
mark them.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

import pandas as pd

from sae.settings.metric_defs import METRIC, TABLES
from sae.sweep.aggregate import PROBE_METRICS, config_label, is_finite_number
from sae.sweep.matching import at_l0, criteria, headline, matched_label

__all__ = ["SUMMARY_COLUMNS", "best_cells", "format_criterion", "headline_display", "kl_display",
           "summary_display", "to_html", "to_markdown", "verdict_display"]

_NAN = float("nan")


def best_cells(summary: pd.DataFrame, dataset: str,
               judged: pd.DataFrame) -> set[tuple[int, str]]:
    """Cells of :func:`summary_display` ``(row position, column heading)`` holding a winner of
    the verdict ``judged`` (:func:`sae.sweep.matching.verdict`): the configuration every seed
    took as it is at the target L0 (an interpolated winner has no single cell)."""
    part = summary[summary["dataset"] == dataset]
    positions = {(str(m), float(v)): i for i, (m, v) in
                 enumerate(zip(part["model"], part["value"], strict=True))}
    heads = {metric: head for probe in PROBE_METRICS for metric, _, head in
             criteria(probe).values()}
    cells = set()
    for _, row in judged[judged["dataset"] == dataset].iterrows():
        head = heads[row["metric"]]
        cells |= {(positions[(str(m), float(v))], head) for m, v in row["winners"]
                  if (str(m), float(v)) in positions}
    return cells


def format_criterion(name: str, value: float) -> str:
    """A verdict value as text, in its metric's format (:mod:`sae.settings.metric_defs`): FVU at 4
    decimals, probe accuracy and dead units in percent."""
    m = METRIC[name]
    return _pm(value, _NAN, m.fmt, m.scale, " %" if m.scale == 100 else m.unit)


def verdict_display(judged: pd.DataFrame, dataset: str) -> pd.DataFrame:
    """The verdict of one dataset as a text table: band, criterion, best, runner-up, margin."""
    rows = []
    for _, row in judged[judged["dataset"] == dataset].iterrows():
        metric = row["metric"]
        margin = "–"
        if is_finite_number(row["margin"]):
            # a difference of percentages is in points
            margin = format_criterion(metric, row["margin"]).replace(" %", " points")
            if row["clear"] is True or row["clear"] is False:
                margin += " (beyond seed std)" if row["clear"] else " (within seed std)"
        rows.append({
            "L0 band": f"{row['band']} (at L0 {row['target']:g})",
            "criterion": row["criterion"], "best": row["winner"],
            "value": format_criterion(metric, row["score"]),
            "runner-up": row["runner_up"] or "–",
            "runner-up value": format_criterion(metric, row["runner_up_score"]),
            "margin": margin,
        })
    return pd.DataFrame(rows, columns=["L0 band", "criterion", "best", "value", "runner-up",
                                       "runner-up value", "margin"])


def _pm(mean: float, std: float, fmt: str, scale: float = 1.0, unit: str = "") -> str:
    """'mean ± std unit'; '–' for a missing mean, no '±' part without a measured spread."""
    if not is_finite_number(mean):
        return "–"
    text = format(scale * mean, fmt)
    if is_finite_number(std):
        text += f" ± {format(scale * std, fmt)}"
    return text + unit


def _signed(x: float, fmt: str, scale: float = 1.0, unit: str = "") -> str:
    return "–" if not is_finite_number(x) else format(scale * x, "+" + fmt) + unit


def _converged(mean: float, n_seeds: int) -> str:
    """'2/3': of a configuration's seeds, how many converged (mean of 0/1 over seeds)."""
    return f"{round(mean * n_seeds)}/{n_seeds}" if is_finite_number(mean) else "–"


def _cell(name: str) -> tuple[str, str, float, str]:
    """(metric, number format, scale, unit): a metric's cells as its registry entry says."""
    m = METRIC[name]
    return name, m.fmt, m.scale, m.unit


# the summary table's metric columns, in order (sae.settings.metric_defs.TABLES); one without a
# value in any row is left out (no probes without labels, no ground truth on images, no
# validation columns in a results.csv written before they were measured)
SUMMARY_COLUMNS = TABLES["summary"]
# column heading -> (metric, number format, scale, unit), each the metric's own
_SUMMARY_CELLS = {METRIC[name].label: _cell(name) for name in SUMMARY_COLUMNS}


def summary_display(summary: pd.DataFrame, dataset: str,
                    raw_probe: float | Mapping[str, float] | None = None) -> pd.DataFrame:
    """The per-configuration table of one dataset as text (mean ± std over seeds).

    A last row "raw input" holds the probes fitted on the raw input (pixels, or the rows of an
    activation matrix) when ``raw_probe`` is given: a mapping from summary metric
    (``probe_accuracy``, ``probe_sparsemax_accuracy``, ``probe_sparsemax_classes``) to its value,
    or one number, the softmax probe's accuracy.
    """
    part = summary[summary["dataset"] == dataset]
    rows = []
    for _, row in part.iterrows():
        cells = {"model": row["model"], "λ / k": config_label(row["param"], row["value"]),
                 "seeds": str(int(row["n_seeds"]))}
        for head, (metric, fmt, scale, unit) in _SUMMARY_CELLS.items():
            cells[head] = _pm(row[f"{metric}_mean"], row[f"{metric}_std"], fmt, scale, unit)
        cells["converged"] = _converged(row["converged_mean"], int(row["n_seeds"]))
        rows.append(cells)
    raw = {"probe_accuracy": raw_probe} if not isinstance(raw_probe, Mapping) else raw_probe
    raw = {k: v for k, v in (raw or {}).items() if is_finite_number(v)}
    if raw:
        cells = dict.fromkeys(["model", "λ / k", "seeds", *_SUMMARY_CELLS, "converged"], "–")
        cells["model"] = "raw input"
        for head, (metric, fmt, scale, unit) in _SUMMARY_CELLS.items():
            if metric in raw:
                cells[head] = _pm(raw[metric], _NAN, fmt, scale, unit)
        rows.append(cells)
    table = pd.DataFrame(rows, columns=["model", "λ / k", "seeds", *_SUMMARY_CELLS, "converged"])
    return _drop_empty(table, _METRIC_HEADS)


def _drop_empty(table: pd.DataFrame, optional: set[str]) -> pd.DataFrame:
    """``table`` without the ``optional`` columns that hold no value ('–' in every row)."""
    empty = [c for c in table.columns if c in optional and (table[c] == "–").all()]
    return table.drop(columns=empty)


# the headline's columns (sae.settings.metric_defs.TABLES), as the summary table formats them
# (interpolated per seed, mean ± std over seeds), and what the values lose against the best
# values on the same supports
_HEADLINE_CELLS = {}
for _name in TABLES["headline"]:
    _HEADLINE_CELLS[METRIC[_name].label] = _cell(_name)
    if _name == "support_fvu":  # what the values lose against the best values on those supports
        _HEADLINE_CELLS["values lose"] = ("values_lose", ".4f", 1.0, "")
_METRIC_HEADS = {METRIC[m].label for m in METRIC}  # the columns that may be left out empty


def headline_display(results: pd.DataFrame, dataset: str,
                     targets: tuple[float, ...] | None = None) -> pd.DataFrame:
    """:func:`headline` of one dataset's runs as text: one row per target L0 and model, with
    the settings interpolated ("from"), the seeds that reach the target, the mean ± std over
    those seeds of each interpolated metric, and ``values lose`` = FVU at L0 − support FVU,
    what the model's values lose against the best values on its own supports."""
    part = headline(results, targets)
    part = part[part["dataset"] == dataset].assign(
        values_lose=lambda f: f["fvu_at_l0"] - f["support_fvu"],
        values_lose_std=_NAN)
    rows = []
    for _, row in part.iterrows():
        seeds = str(int(row["n_seeds"]))
        if row["n_missing"]:
            seeds += f" of {int(row['n_seeds'] + row['n_missing'])}"
        cells = {"target": f"{row['target']:g}", "L0": f"{row['l0']:.1f}", "model": row["model"],
                 "from": matched_label(row), "seeds": seeds}
        for head, (metric, fmt, scale, unit) in _HEADLINE_CELLS.items():
            cells[head] = _pm(row[metric], row.get(f"{metric}_std", _NAN), fmt, scale, unit)
        rows.append(cells)
    table = pd.DataFrame(rows, columns=["target", "L0", "model", "from", "seeds",
                                        *_HEADLINE_CELLS])
    return _drop_empty(table, _METRIC_HEADS)


def kl_display(matched: pd.DataFrame, dataset: str) -> pd.DataFrame:
    """The "vs KL-SAE" table of one dataset as text."""
    part = matched[matched["dataset"] == dataset]
    rows = []
    for _, row in part.iterrows():
        has_kl = is_finite_number(row["kl_l0"])
        rows.append({
            "model": row["model"], "λ / k": config_label(row["param"], row["value"]),
            "L0": _pm(row["l0"], _NAN, ".1f"),
            "KL-SAE": (f"{row['kl_model']} {config_label('lambda', row['kl_value'])}"
                       if has_kl else "no KL-SAE run"),
            "KL L0": _pm(row["kl_l0"], _NAN, ".1f"),
            "Δ FVU": _signed(row["d_fvu"], ".4f"),
            "Δ FVU at L0": _signed(row["d_fvu_at_l0"], ".4f"),
            "Δ probe acc. (points)": _signed(row["d_probe"], ".2f", 100.0),
        })
    return pd.DataFrame(rows, columns=["model", "λ / k", "L0", "KL-SAE", "KL L0", "Δ FVU",
                                       "Δ FVU at L0", "Δ probe acc. (points)"])


def _is_number_text(text: str) -> bool:
    head = text.lstrip("+-−").split(" ")[0]
    return bool(head) and head.replace(".", "", 1).isdigit()


def to_markdown(table: pd.DataFrame, best: set[tuple[int, str]] = frozenset()) -> str:
    """A GitHub-flavoured markdown table; number columns are right-aligned, cells of ``best``
    (row position, column heading) bold."""
    heads = [str(c) for c in table.columns]
    body = [[str(v).replace("|", "\\|") for v in row] for row in table.itertuples(index=False)]
    shown = [h.replace("|", "\\|") for h in heads]
    numeric = [bool(body) and all(_is_number_text(r[i]) or r[i] == "–" for r in body)
               for i in range(len(heads))]
    for r, row in enumerate(body):
        for i, head in enumerate(heads):
            if (r, head) in best:
                row[i] = f"**{row[i]}**"
    lines = ["| " + " | ".join(shown) + " |",
             "|" + "|".join("---:" if n else "---" for n in numeric) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in body]
    return "\n".join(lines)


def to_html(table: pd.DataFrame, best: set[tuple[int, str]] = frozenset(), wide: bool = False,
            stack: bool = False):
    """An HTML ``<table>`` (:func:`sae.pages.html.table`: escaped text; number cells get class
    ``num``; cells of ``best``, (row position, column heading), are marked ``best``; ``wide``:
    the box spans the window; ``stack``: a list of its rows on a narrow screen)."""
    from sae.pages import html as pages  # jinja2: only for the HTML page, not the markdown

    heads = [str(c) for c in table.columns]
    marked = {(r, heads.index(head)) for r, head in best if head in heads}
    return pages.table(heads, table.itertuples(index=False), cell_class=_cell_class,
                       best=marked, wide=wide, stack=stack)


def _cell_class(_: int, text: str) -> str | None:
    """``num`` for a number, ``key`` for a setting kept on one line ('λ = 0.003', 'k = 16',
    'kl λ = 0.01')."""
    if _is_number_text(text):
        return "num"
    return "key" if _SETTING.fullmatch(text) else None


_SETTING = re.compile(r"(\S{1,40} )?(λ|k) = \S{1,20}")


def across_display(columns: list[tuple[str, pd.DataFrame, str, float, str]]) -> pd.DataFrame:
    """One table across comparisons: a row per model, a column per (comparison, target L0,
    metric), each cell the model's mean ± std over seeds there (:func:`sae.sweep.matching.at_l0`,
    placed by validation L0), '–' where it does not reach the target.

    Args:
        columns: ``(heading, results, dataset, target, metric)`` per column: the runs of one
            comparison (its results.csv), the dataset in it, the target L0 and the metric.
    """
    cells: dict[str, dict[str, str]] = {}
    for heading, results, dataset, target, metric in columns:
        matched = at_l0(results[results["dataset"] == dataset], [target])
        m = METRIC[metric]
        for _, row in matched.iterrows():
            cells.setdefault(row["model"], {})[heading] = _pm(
                row[metric], row[f"{metric}_std"], m.fmt, m.scale, m.unit)
        for model in dict.fromkeys(results.loc[results["dataset"] == dataset, "model"]):
            cells.setdefault(model, {})
    heads = [c[0] for c in columns]
    rows = [{"model": model, **{h: got.get(h, "–") for h in heads}} for model, got in
            cells.items()]
    return pd.DataFrame(rows, columns=["model", *heads])
