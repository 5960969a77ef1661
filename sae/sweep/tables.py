"""Comparison tables of a sweep: pure functions, DataFrame in, DataFrame (or text) out.

``results`` has one row per finished run (the columns of :data:`RESULT_COLUMNS`); everything else
is derived from it:

- :func:`summarize_seeds` averages each configuration (dataset × model × λ or k) over its seeds:
  ``<metric>_mean`` and ``<metric>_std`` for every metric of :data:`SUMMARY_METRICS`, where std is
  the *sample* standard deviation (ddof = 1), so a configuration with one seed has std NaN ("no
  spread measured") rather than a misleading 0;
- :func:`match_kl` sets each non-KL configuration beside the KL-SAE configuration of the same
  dataset whose mean L0 is nearest (absolute difference; a tie goes to the smaller λ);
- ``fvu_at_l0`` is the FVU of the reconstruction from only the units that L0 counts (sae.run's
  metrics.json). It equals ``fvu`` for every model with exact zeros; a KL-SAE's sigmoid units
  below the firing threshold still add to its reconstruction, so its L0 understates how many
  units its ``fvu`` uses, and ``fvu_at_l0`` is the fair number to set beside the others' L0;
- :func:`verdict` names, per dataset and L0 band (:data:`L0_BANDS`), the best configuration on
  each criterion of :data:`CRITERIA` (FVU at L0, probe accuracy, dead units); only
  configurations with exact zeros (``fvu_at_l0 == fvu``: :func:`exact_zeros`) compete on FVU at
  L0, since a KL-SAE's FVU at its stated L0 is not the FVU it reports;
- :func:`headline` keeps, per dataset and L0 band of :data:`HEADLINE_BANDS`, the best setting of
  every model (lowest FVU at L0): the one-table answer the README quotes;
- :func:`summary_display` / :func:`kl_display` / :func:`verdict_display` /
  :func:`headline_display` turn those into tables
  of text, which :func:`to_markdown` and :func:`to_html` render; :func:`best_cells` says which
  cells of the summary table hold a band's winner, so both can mark them.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

import numpy as np
import pandas as pd

__all__ = [
    "CONFIG_KEYS",
    "CRITERIA",
    "HEADLINE_BANDS",
    "L0_BANDS",
    "PROBE_METRICS",
    "RESULT_COLUMNS",
    "SUMMARY_METRICS",
    "best_cells",
    "config_label",
    "criteria",
    "exact_zeros",
    "format_criterion",
    "headline",
    "headline_display",
    "kl_display",
    "l0_band",
    "match_kl",
    "results_frame",
    "summarize_seeds",
    "summary_display",
    "to_html",
    "to_markdown",
    "verdict",
    "verdict_display",
]

# A configuration: model is the sweep's name for the entry, kind the sae.run model behind it,
# param "lambda" or "k" (what the entry sweeps) and value its value.
CONFIG_KEYS = ["dataset", "model", "kind", "param", "value"]

RESULT_COLUMNS = [
    *CONFIG_KEYS, "seed",
    # final test metrics of the run (metrics.json)
    "mse", "fvu", "fvu_at_l0", "explained_variance", "recon_bias", "l0_mean", "l0_std",
    "dead_fraction", "dense_fraction", "n_samples", "n_units", "hidden", "lam", "fire_threshold",
    "alpha", "steps", "epochs", "wall_time_s",
    # analysis of the last checkpoint (analysis.json)
    "probe_accuracy", "probe_train_accuracy", "probe_sparsemax_accuracy",
    "probe_sparsemax_classes", "l0_ink_corr", "checkpoint_step",
    "support_fvu", "support_fvu_const", "adaptive_gain", "adaptivity",
    "run",  # run folder, relative to the sweep folder
]

SUMMARY_METRICS = ["mse", "fvu", "fvu_at_l0", "l0_mean", "l0_std", "dead_fraction",
                   "dense_fraction",
                   "probe_accuracy", "probe_sparsemax_accuracy", "probe_sparsemax_classes",
                   "l0_ink_corr", "recon_bias", "support_fvu", "adaptive_gain",
                   "adaptivity", "wall_time_s"]

# L0 bands (lower, upper]: configurations are only compared with others of similar sparsity
L0_BANDS: tuple[tuple[float, float], ...] = ((0.0, 20.0), (20.0, 50.0), (50.0, math.inf))

# the bands of the headline table: sparse (about 16 active units) and moderate (about 32)
HEADLINE_BANDS: tuple[tuple[float, float], ...] = L0_BANDS[:2]

# probe loss -> (summary metric of its test accuracy, heading in the summary table)
PROBE_METRICS = {
    "softmax": ("probe_accuracy", "probe acc. %"),
    "sparsemax": ("probe_sparsemax_accuracy", "sparsemax probe %"),
}


def criteria(probe_loss: str = "softmax") -> dict[str, tuple[str, str, str]]:
    """criterion -> (summary metric, "min" or "max" is best, heading in the summary table);
    the probe criterion judges the probe trained with ``probe_loss``."""
    metric, head = PROBE_METRICS[probe_loss]
    return {
        "FVU at L0": ("fvu_at_l0", "min", "FVU at L0"),
        "probe accuracy": (metric, "max", head),
        "dead units": ("dead_fraction", "min", "dead %"),
    }


CRITERIA = criteria()

# |fvu_at_l0 - fvu| at or below this: the code has exact zeros (both are the same number)
_EXACT_TOL = 1e-6

_NAN = float("nan")


def results_frame(records: Iterable[Mapping]) -> pd.DataFrame:
    """One row per run with exactly :data:`RESULT_COLUMNS`, in that order (missing -> NaN)."""
    frame = pd.DataFrame(list(records))
    for column in RESULT_COLUMNS:
        if column not in frame.columns:
            frame[column] = _NAN
    return frame[RESULT_COLUMNS]


def _order(values: pd.Series) -> pd.Categorical:
    """Keep first-appearance order (the sweep file's order of datasets and models) when sorting."""
    return pd.Categorical(values, categories=list(dict.fromkeys(values)), ordered=True)


def summarize_seeds(results: pd.DataFrame) -> pd.DataFrame:
    """Mean and sample std over seeds of each configuration.

    Returns one row per configuration: :data:`CONFIG_KEYS`, ``n_seeds`` and
    ``<metric>_mean`` / ``<metric>_std`` for each of :data:`SUMMARY_METRICS`. Rows are ordered
    by dataset and model as they first appear in ``results``, then by value. NaN metrics (e.g. a
    probe that failed) are left out of their mean; an all-NaN metric stays NaN.
    """
    columns = [*CONFIG_KEYS, "n_seeds"] + [f"{m}_{s}" for m in SUMMARY_METRICS
                                           for s in ("mean", "std")]
    if results.empty:
        return pd.DataFrame(columns=columns)
    data = results.copy()
    for metric in SUMMARY_METRICS:  # a results.csv of an older version may lack a column
        data[metric] = pd.to_numeric(data[metric], errors="coerce") if metric in data else _NAN
    grouped = data.groupby(CONFIG_KEYS, sort=False, dropna=False)
    stats = grouped[SUMMARY_METRICS].agg(["mean", "std"])
    stats.columns = [f"{m}_{s}" for m, s in stats.columns]
    stats.insert(0, "n_seeds", grouped["seed"].nunique())
    summary = stats.reset_index()
    summary["_d"], summary["_m"] = _order(summary["dataset"]), _order(summary["model"])
    summary = summary.sort_values(["_d", "_m", "value"], kind="stable")
    return summary[columns].reset_index(drop=True)


def match_kl(summary: pd.DataFrame) -> pd.DataFrame:
    """Each non-KL configuration beside the KL-SAE configuration with the nearest mean L0.

    Candidates are the configurations of kind ``kl`` in the same dataset with a finite mean L0;
    the nearest is the one with the smallest ``|L0 − L0_kl|``, ties going to the smaller λ (then
    to the one listed first). Rows of datasets without any KL-SAE keep NaN in the KL columns.

    Returns:
        One row per non-KL configuration: :data:`CONFIG_KEYS`, ``l0``, ``fvu``, ``fvu_at_l0``,
        ``probe``, ``kl_model``, ``kl_value``, ``kl_l0``, ``kl_fvu``, ``kl_fvu_at_l0``,
        ``kl_probe``, ``d_fvu`` (fvu − KL's; negative is better), ``d_fvu_at_l0`` (fvu at L0 −
        KL's fvu at L0) and ``d_probe`` (probe accuracy − KL's; positive is better).
    """
    columns = [*CONFIG_KEYS, "l0", "fvu", "fvu_at_l0", "probe", "kl_model", "kl_value", "kl_l0",
               "kl_fvu", "kl_fvu_at_l0", "kl_probe", "d_fvu", "d_fvu_at_l0", "d_probe"]
    rows = []
    for _, row in summary[summary["kind"] != "kl"].iterrows():
        kl = summary[(summary["kind"] == "kl") & (summary["dataset"] == row["dataset"])
                     & np.isfinite(summary["l0_mean_mean"].astype(float))]
        out = {k: row[k] for k in CONFIG_KEYS}
        out.update(l0=row["l0_mean_mean"], fvu=row["fvu_mean"], fvu_at_l0=row["fvu_at_l0_mean"],
                   probe=row["probe_accuracy_mean"])
        if len(kl) and math.isfinite(row["l0_mean_mean"]):
            gap = (kl["l0_mean_mean"] - row["l0_mean_mean"]).abs()
            best = kl.assign(_gap=gap).sort_values(["_gap", "value"], kind="stable").iloc[0]
            out.update(kl_model=best["model"], kl_value=best["value"], kl_l0=best["l0_mean_mean"],
                       kl_fvu=best["fvu_mean"], kl_fvu_at_l0=best["fvu_at_l0_mean"],
                       kl_probe=best["probe_accuracy_mean"])
            out.update(d_fvu=out["fvu"] - out["kl_fvu"],
                       d_fvu_at_l0=out["fvu_at_l0"] - out["kl_fvu_at_l0"],
                       d_probe=out["probe"] - out["kl_probe"])
        rows.append(out)
    return pd.DataFrame(rows, columns=columns)


# --------------------------------------------------------------------------- verdict


def _band_label(lo: float, hi: float) -> str:
    if lo <= 0:
        return f"L0 ≤ {hi:g}"
    return f"L0 > {lo:g}" if math.isinf(hi) else f"{lo:g} < L0 ≤ {hi:g}"


def l0_band(l0: float) -> str | None:
    """The label of the band of :data:`L0_BANDS` holding a mean L0 ('L0 ≤ 20', '20 < L0 ≤ 50',
    'L0 > 50'); None when L0 is missing."""
    if not _finite(l0):
        return None
    for lo, hi in L0_BANDS:
        if float(l0) <= hi and (float(l0) > lo or lo == L0_BANDS[0][0]):
            return _band_label(lo, hi)
    return None


def exact_zeros(summary: pd.DataFrame) -> pd.Series:
    """Per configuration: does its code have exact zeros, i.e. is its FVU at L0 its FVU?

    Models with exact zeros reconstruct from only the units L0 counts, so both numbers are one;
    a KL-SAE's sigmoid units below the firing threshold still reconstruct, so its FVU at L0 is
    larger. A missing FVU at L0 counts as not shown to be exact.
    """
    at_l0 = pd.to_numeric(summary["fvu_at_l0_mean"], errors="coerce")
    plain = pd.to_numeric(summary["fvu_mean"], errors="coerce")
    return ((at_l0 - plain).abs() <= _EXACT_TOL).fillna(False).astype(bool)


_VERDICT_COLUMNS = ["dataset", "band", "criterion", "metric", "n_candidates", "winners",
                    "winner", "score", "score_std", "runner_up", "runner_up_score", "margin",
                    "clear", "excluded"]


def verdict(summary: pd.DataFrame, probe_loss: str = "softmax") -> pd.DataFrame:
    """The best configuration per dataset, L0 band and criterion, from the seed means.

    For each dataset, each band of :data:`L0_BANDS` holding at least one configuration (by its
    mean L0) and each criterion of :func:`criteria` (the probe trained with ``probe_loss``), the
    configurations of the band with a
    finite mean compete: lowest FVU at L0, highest probe accuracy, fewest dead units. Only
    configurations with exact zeros (:func:`exact_zeros`) compete on FVU at L0; the others are
    named in ``excluded``. Equal means (a tie, e.g. 0 % dead) all win.

    Returns:
        One row per (dataset, band, criterion) with candidates: ``n_candidates``, ``winners``
        (list of ``summary`` index labels), ``winner`` (text: model and λ or k, ties joined by
        ", "), ``score`` / ``score_std`` (the winner's mean and seed std), ``runner_up`` and
        ``runner_up_score`` (the best non-winner, '' and NaN when none), ``margin`` (absolute
        gap to it), ``clear`` (the margin exceeds both seed stds; NaN when not measurable) and
        ``excluded`` (configurations of the band left out, as text). Bands follow
        :data:`L0_BANDS`, datasets their order in ``summary``.
    """
    rows = []
    if summary.empty:
        return pd.DataFrame(rows, columns=_VERDICT_COLUMNS)
    bands = summary["l0_mean_mean"].map(l0_band)
    exact = exact_zeros(summary)
    labels = [_band_label(lo, hi) for lo, hi in L0_BANDS]
    for dataset in dict.fromkeys(summary["dataset"]):
        for band in labels:
            in_band = summary[(summary["dataset"] == dataset) & (bands == band)]
            if in_band.empty:
                continue
            for criterion, (metric, better, _) in criteria(probe_loss).items():
                means = pd.to_numeric(in_band[f"{metric}_mean"], errors="coerce")
                eligible = means.notna()
                excluded = []
                if metric == "fvu_at_l0":
                    excluded = [_name(in_band.loc[i]) for i in in_band.index
                                if eligible[i] and not exact[i]]
                    eligible &= exact[in_band.index]
                if not eligible.any():
                    continue
                scores = means[eligible]
                best = scores.min() if better == "min" else scores.max()
                winners = list(scores.index[(scores - best).abs() <= 1e-12])
                others = scores.drop(winners)
                out = {"dataset": dataset, "band": band, "criterion": criterion,
                       "metric": metric, "n_candidates": int(eligible.sum()),
                       "winners": winners,
                       "winner": ", ".join(_name(summary.loc[i]) for i in winners),
                       "score": float(best),
                       "score_std": float(summary.loc[winners[0], f"{metric}_std"]),
                       "runner_up": "", "runner_up_score": _NAN, "margin": _NAN,
                       "clear": _NAN, "excluded": ", ".join(excluded)}
                if len(others):
                    second = others.idxmin() if better == "min" else others.idxmax()
                    margin = abs(float(others[second]) - float(best))
                    spread = [float(summary.loc[i, f"{metric}_std"]) for i in (winners[0], second)]
                    out.update(runner_up=_name(summary.loc[second]),
                               runner_up_score=float(others[second]), margin=margin,
                               clear=(margin > max(spread)) if all(map(_finite, spread))
                               else _NAN)
                rows.append(out)
    return pd.DataFrame(rows, columns=_VERDICT_COLUMNS)


def _name(row: pd.Series) -> str:
    """'sparsemax λ = 0.01 (L0 19.2)': a configuration as the verdict names it; its L0 shows
    how it sits within its band."""
    return (f"{row['model']} {config_label(row['param'], row['value'])} "
            f"(L0 {_pm(row['l0_mean_mean'], _NAN, '.1f')})")


def best_cells(summary: pd.DataFrame, dataset: str,
               judged: pd.DataFrame | None = None) -> set[tuple[int, str]]:
    """Cells of :func:`summary_display` ``(row position, column heading)`` holding a winner of
    the verdict (``judged``, computed from ``summary`` when not given)."""
    judged = verdict(summary) if judged is None else judged
    positions = {label: i for i, label in
                 enumerate(summary.index[summary["dataset"] == dataset])}
    heads = {metric: head for probe in PROBE_METRICS for metric, _, head in
             criteria(probe).values()}
    cells = set()
    for _, row in judged[judged["dataset"] == dataset].iterrows():
        head = heads[row["metric"]]
        cells |= {(positions[i], head) for i in row["winners"] if i in positions}
    return cells


def format_criterion(metric: str, value: float) -> str:
    """A verdict value as text: FVU at 4 decimals, probe accuracy and dead units in percent."""
    if metric in ("probe_accuracy", "probe_sparsemax_accuracy", "dead_fraction"):
        return _pm(value, _NAN, ".1f" if metric == "dead_fraction" else ".2f", 100.0, " %")
    return _pm(value, _NAN, ".4f")


def verdict_display(judged: pd.DataFrame, dataset: str) -> pd.DataFrame:
    """The verdict of one dataset as a text table: band, criterion, best, runner-up, margin."""
    rows = []
    for _, row in judged[judged["dataset"] == dataset].iterrows():
        metric = row["metric"]
        margin = "–"
        if _finite(row["margin"]):
            # a difference of percentages is in points
            margin = format_criterion(metric, row["margin"]).replace(" %", " points")
            if row["clear"] is True or row["clear"] is False:
                margin += " (beyond seed std)" if row["clear"] else " (within seed std)"
        rows.append({
            "L0 band": row["band"], "criterion": row["criterion"], "best": row["winner"],
            "value": format_criterion(metric, row["score"]),
            "runner-up": row["runner_up"] or "–",
            "runner-up value": format_criterion(metric, row["runner_up_score"]),
            "margin": margin,
        })
    return pd.DataFrame(rows, columns=["L0 band", "criterion", "best", "value", "runner-up",
                                       "runner-up value", "margin"])


def headline(summary: pd.DataFrame) -> pd.DataFrame:
    """The best setting of every model per dataset and band of :data:`HEADLINE_BANDS`.

    Within a band (by mean L0) each model keeps its configuration with the lowest mean FVU at
    L0 (for a code without exact zeros that is the FVU it has at the sparsity its L0 states, so
    it is ranked on the same terms). Returns the rows of ``summary`` kept, with a ``band``
    column, ordered by dataset, band and the models' order in ``summary``; a model without a
    configuration in a band has no row there.
    """
    if summary.empty:
        return summary.assign(band=pd.Series(dtype=str))
    bands = summary["l0_mean_mean"].map(l0_band)
    keep = []
    for dataset in dict.fromkeys(summary["dataset"]):
        for lo, hi in HEADLINE_BANDS:
            label = _band_label(lo, hi)
            part = summary[(summary["dataset"] == dataset) & (bands == label)]
            for model in dict.fromkeys(part["model"]):
                rows = part[part["model"] == model]
                fvu = pd.to_numeric(rows["fvu_at_l0_mean"], errors="coerce")
                best = fvu.idxmin() if fvu.notna().any() else rows.index[0]
                keep.append((best, label))
    out = summary.loc[[i for i, _ in keep]].copy()
    out.insert(0, "band", [label for _, label in keep])
    return out


# heading -> (metric, number format, scale); means over seeds
_HEADLINE_CELLS = {
    "L0": ("l0_mean", ".1f", 1.0),
    "FVU at L0": ("fvu_at_l0", ".4f", 1.0),
    "FVU": ("fvu", ".4f", 1.0),
    "support FVU": ("support_fvu", ".4f", 1.0),
    "dead %": ("dead_fraction", ".1f", 100.0),
    "adaptivity": ("adaptivity", ".2f", 1.0),
    "probe acc. %": ("probe_accuracy", ".2f", 100.0),
    "sparsemax probe %": ("probe_sparsemax_accuracy", ".2f", 100.0),
    "probe classes": ("probe_sparsemax_classes", ".2f", 1.0),
}


def headline_display(summary: pd.DataFrame, dataset: str) -> pd.DataFrame:
    """:func:`headline` of one dataset as text: one row per band and model, seed means."""
    part = headline(summary)
    part = part[part["dataset"] == dataset]
    rows = []
    for _, row in part.iterrows():
        cells = {"L0 band": row["band"], "model": row["model"],
                 "λ / k": config_label(row["param"], row["value"]),
                 "seeds": str(int(row["n_seeds"]))}
        for head, (metric, fmt, scale) in _HEADLINE_CELLS.items():
            cells[head] = _pm(row[f"{metric}_mean"], _NAN, fmt, scale)
        rows.append(cells)
    return pd.DataFrame(rows, columns=["L0 band", "model", "λ / k", "seeds", *_HEADLINE_CELLS])


# --------------------------------------------------------------------------- text tables


def config_label(param: str, value: float) -> str:
    """'λ = 0.01' or 'k = 32'."""
    return f"{'λ' if param == 'lambda' else param} = {value:g}"


def _finite(x: object) -> bool:
    return isinstance(x, int | float | np.number) and math.isfinite(float(x))


def _pm(mean: float, std: float, fmt: str, scale: float = 1.0, unit: str = "") -> str:
    """'mean ± std unit'; '–' for a missing mean, no '±' part without a measured spread."""
    if not _finite(mean):
        return "–"
    text = format(scale * mean, fmt)
    if _finite(std):
        text += f" ± {format(scale * std, fmt)}"
    return text + unit


def _signed(x: float, fmt: str, scale: float = 1.0, unit: str = "") -> str:
    return "–" if not _finite(x) else format(scale * x, "+" + fmt) + unit


# column heading -> (metric, number format, scale, unit)
_SUMMARY_CELLS = {
    "MSE": ("mse", ".4g", 1.0, ""),
    "FVU": ("fvu", ".4f", 1.0, ""),
    "FVU at L0": ("fvu_at_l0", ".4f", 1.0, ""),
    "L0 mean": ("l0_mean", ".1f", 1.0, ""),
    "L0 std": ("l0_std", ".1f", 1.0, ""),
    "dead %": ("dead_fraction", ".1f", 100.0, ""),
    "dense %": ("dense_fraction", ".1f", 100.0, ""),
    "probe acc. %": ("probe_accuracy", ".2f", 100.0, ""),
    "sparsemax probe %": ("probe_sparsemax_accuracy", ".2f", 100.0, ""),
    "probe classes": ("probe_sparsemax_classes", ".2f", 1.0, ""),
    "recon bias": ("recon_bias", ".3f", 1.0, ""),
    "support FVU": ("support_fvu", ".4f", 1.0, ""),
    "adaptive gain": ("adaptive_gain", ".4f", 1.0, ""),
    "adaptivity": ("adaptivity", ".2f", 1.0, ""),
    "train time": ("wall_time_s", ".0f", 1.0, " s"),
}


def summary_display(summary: pd.DataFrame, dataset: str,
                    raw_probe: float | Mapping[str, float] | None = None) -> pd.DataFrame:
    """The per-configuration table of one dataset as text (mean ± std over seeds).

    A last row "raw pixels" holds the raw-pixel probes when ``raw_probe`` is given: a mapping
    from summary metric (``probe_accuracy``, ``probe_sparsemax_accuracy``,
    ``probe_sparsemax_classes``) to its value, or one number, the softmax probe's accuracy.
    """
    part = summary[summary["dataset"] == dataset]
    rows = []
    for _, row in part.iterrows():
        cells = {"model": row["model"], "λ / k": config_label(row["param"], row["value"]),
                 "seeds": str(int(row["n_seeds"]))}
        for head, (metric, fmt, scale, unit) in _SUMMARY_CELLS.items():
            cells[head] = _pm(row[f"{metric}_mean"], row[f"{metric}_std"], fmt, scale, unit)
        rows.append(cells)
    raw = {"probe_accuracy": raw_probe} if not isinstance(raw_probe, Mapping) else raw_probe
    raw = {k: v for k, v in (raw or {}).items() if _finite(v)}
    if raw:
        cells = dict.fromkeys(["model", "λ / k", "seeds", *_SUMMARY_CELLS], "–")
        cells["model"] = "raw pixels"
        for head, (metric, fmt, scale, unit) in _SUMMARY_CELLS.items():
            if metric in raw:
                cells[head] = _pm(raw[metric], _NAN, fmt, scale, unit)
        rows.append(cells)
    return pd.DataFrame(rows, columns=["model", "λ / k", "seeds", *_SUMMARY_CELLS])


def kl_display(matched: pd.DataFrame, dataset: str) -> pd.DataFrame:
    """The "vs KL-SAE" table of one dataset as text."""
    part = matched[matched["dataset"] == dataset]
    rows = []
    for _, row in part.iterrows():
        has_kl = _finite(row["kl_l0"])
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
    numeric = [bool(body) and all(_is_number_text(r[i]) or r[i] == "–" for r in body)
               for i in range(len(heads))]
    for r, row in enumerate(body):
        for i, head in enumerate(heads):
            if (r, head) in best:
                row[i] = f"**{row[i]}**"
    lines = ["| " + " | ".join(heads) + " |",
             "|" + "|".join("---:" if n else "---" for n in numeric) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in body]
    return "\n".join(lines)


def to_html(table: pd.DataFrame, best: set[tuple[int, str]] = frozenset()):
    """An HTML ``<table>`` (:func:`sae.pages.table`: escaped text; number cells get class
    ``num``; cells of ``best``, (row position, column heading), are marked ``best``)."""
    from sae import pages

    heads = [str(c) for c in table.columns]
    marked = {(r, heads.index(head)) for r, head in best if head in heads}
    return pages.table(heads, table.itertuples(index=False),
                       cell_class=lambda _, text: "num" if _is_number_text(text) else None,
                       best=marked)
