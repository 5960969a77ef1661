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
- :func:`at_l0` sets every model at the same mean L0 by interpolating its own curve between the
  two settings that bracket the target (linear in log L0; nothing extrapolated); the verdict's
  FVU criterion and :func:`headline` (every model at L0 16 and 32, the one-table answer the
  README quotes) use it;
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
    "BAND_TARGETS",
    "HEADLINE_TARGETS",
    "L0_BANDS",
    "L0_TOLERANCE",
    "MATCHED_METRICS",
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
    "matched_label",
    "at_l0",
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
    # how much validation FVU and L0 moved in the last epoch (sae.convergence)
    "val_fvu_change", "val_l0_change", "converged",
    "run",  # run folder, relative to the sweep folder
]

SUMMARY_METRICS = ["mse", "fvu", "fvu_at_l0", "l0_mean", "l0_std", "dead_fraction",
                   "dense_fraction",
                   "probe_accuracy", "probe_sparsemax_accuracy", "probe_sparsemax_classes",
                   "l0_ink_corr", "recon_bias", "support_fvu", "adaptive_gain",
                   "adaptivity", "wall_time_s", "converged"]

# L0 bands (lower, upper]: configurations are only compared with others of similar sparsity
L0_BANDS: tuple[tuple[float, float], ...] = ((0.0, 20.0), (20.0, 50.0), (50.0, math.inf))

# the L0 at which each band's models are compared on FVU (interpolated on each model's curve)
BAND_TARGETS: tuple[float, ...] = (16.0, 32.0, 64.0)

# the targets of the headline table: sparse (16 active units) and moderate (32)
HEADLINE_TARGETS: tuple[float, ...] = BAND_TARGETS[:2]

# a setting whose mean L0 is within this share of a target is taken as it is, not interpolated
# (BatchTopK's inference threshold lands its L0 near, not at, k)
L0_TOLERANCE = 0.05

# metrics interpolated to a target L0 (linear in log L0 between the two nearest settings)
MATCHED_METRICS = ["fvu_at_l0", "fvu", "support_fvu", "dead_fraction", "adaptivity",
                   "probe_accuracy", "probe_sparsemax_accuracy", "probe_sparsemax_classes"]

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
        if metric not in data:
            data[metric] = _NAN
            continue
        column = data[metric].map(lambda v: _BOOLS.get(v, v) if isinstance(v, str) else v)
        data[metric] = pd.to_numeric(column.astype(object), errors="coerce")
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


# --------------------------------------------------------------------------- at equal L0


def at_l0(summary: pd.DataFrame, targets: Iterable[float] = BAND_TARGETS) -> pd.DataFrame:
    """Each model's metrics at the same mean L0: interpolated on its own curve.

    Settings with different λ (or k) land at different mean L0, and FVU falls steeply with L0,
    so models are compared at common target L0s instead: for each dataset, model and target t,
    the model's settings are sorted by mean L0; the setting nearest t is taken as it is when it
    lies within :data:`L0_TOLERANCE` (5 %) of t,
    otherwise the two settings that bracket t are interpolated linearly in log L0, weight
    ``w = log(t / L0_lo) / log(L0_hi / L0_lo)``, for every metric of :data:`MATCHED_METRICS`
    (seed means). A model whose settings do not reach t on both sides has no row: nothing is
    extrapolated.

    Returns:
        One row per (dataset, target, model) reached: ``dataset``, ``target``, ``model``,
        ``l0`` (the mean L0 the row stands for: the target, or the setting's own when taken as
        it is), ``lo_index`` / ``hi_index`` (the ``summary`` rows used), ``kind``, ``param``,
        ``lo_value`` / ``hi_value`` (their settings; equal when one was taken as it is),
        ``lo_l0`` / ``hi_l0``, ``exact_zeros`` and every metric of
        :data:`MATCHED_METRICS` with its seed std (``<metric>_std``, interpolated alike).
        Ordered by dataset, target, then the models' order.
    """
    columns = ["dataset", "target", "model", "l0", "lo_index", "hi_index", "kind", "param",
               "lo_value",
               "hi_value", "lo_l0",
               "hi_l0", "exact_zeros"] + [f"{m}{s}" for m in MATCHED_METRICS for s in ("", "_std")]
    rows = []
    if summary.empty:
        return pd.DataFrame(rows, columns=columns)
    exact = exact_zeros(summary)
    l0 = pd.to_numeric(summary["l0_mean_mean"], errors="coerce")
    for dataset in dict.fromkeys(summary["dataset"]):
        for target in targets:
            for model in dict.fromkeys(summary.loc[summary["dataset"] == dataset, "model"]):
                part = summary[(summary["dataset"] == dataset) & (summary["model"] == model)
                               & np.isfinite(l0) & (l0 > 0)]
                part = part.assign(_l0=l0[part.index]).sort_values("_l0", kind="stable")
                near = part[(part["_l0"] - target).abs() <= L0_TOLERANCE * target]
                if len(near):
                    lo = hi = near.loc[(near["_l0"] - target).abs().idxmin()]
                    w = 0.0
                else:
                    below, above = part[part["_l0"] < target], part[part["_l0"] > target]
                    if below.empty or above.empty:
                        continue
                    lo, hi = below.iloc[-1], above.iloc[0]
                    w = math.log(target / lo["_l0"]) / math.log(hi["_l0"] / lo["_l0"])
                out = {"dataset": dataset, "target": float(target), "model": model,
                       "l0": float(lo["_l0"]) if lo.name == hi.name else float(target),
                       "lo_index": lo.name, "hi_index": hi.name,
                       "kind": lo["kind"], "param": lo["param"], "lo_value": lo["value"],
                       "hi_value": hi["value"], "lo_l0": lo["_l0"], "hi_l0": hi["_l0"],
                       "exact_zeros": bool(exact[lo.name] and exact[hi.name])}
                for metric in MATCHED_METRICS:
                    for stat, name in (("mean", metric), ("std", f"{metric}_std")):
                        a = pd.to_numeric(pd.Series([lo[f"{metric}_{stat}"],
                                                     hi[f"{metric}_{stat}"]]), errors="coerce")
                        out[name] = float(a[0] + w * (a[1] - a[0])) if w else float(a[0])
                rows.append(out)
    return pd.DataFrame(rows, columns=columns)


def matched_label(row: Mapping) -> str:
    """'λ = 0.03 … 0.01' (the two settings interpolated) or 'k = 16' (one taken as it is)."""
    first = config_label(row["param"], row["lo_value"])
    return first if row["lo_value"] == row["hi_value"] else f"{first} … {row['hi_value']:g}"


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


_VERDICT_COLUMNS = ["dataset", "band", "criterion", "metric", "n_candidates", "winners", "models",
                    "winner", "score", "score_std", "runner_up", "runner_up_score", "margin",
                    "clear", "excluded"]


def verdict(summary: pd.DataFrame, probe_loss: str = "softmax") -> pd.DataFrame:
    """The best model per dataset, L0 band and criterion, from the seed means.

    For each dataset and each band of :data:`L0_BANDS` holding at least one configuration (by
    its mean L0):

    - FVU at L0 is compared at the same L0, the band's target in :data:`BAND_TARGETS` (16, 32,
      64), on each model's interpolated curve (:func:`at_l0`): a setting at L0 48 would beat one
      at L0 31 in the same band only by being less sparse. Only models with exact zeros
      (:func:`exact_zeros`) compete; the others are named in ``excluded``; a model whose
      settings do not reach the target on both sides is not compared.
    - probe accuracy (the probe trained with ``probe_loss``) and dead units: the configurations
      of the band compete, highest accuracy and fewest dead units winning.

    Equal means (a tie, e.g. 0 % dead) all win.

    Returns:
        One row per (dataset, band, criterion) with candidates: ``n_candidates``, ``winners``
        (list of ``summary`` index labels; for FVU at L0 only winners taken as they are, not
        interpolated),
        ``models`` (the winning models' names), ``winner`` (text: model and λ or k, ties
        joined by ", "), ``score`` / ``score_std`` (the winner's mean and seed std),
        ``runner_up`` and ``runner_up_score`` (the best non-winner, '' and NaN when none),
        ``margin`` (absolute gap to it), ``clear`` (the margin exceeds both seed stds; NaN when
        not measurable) and ``excluded`` (left out, as text). Bands follow :data:`L0_BANDS`,
        datasets their order in ``summary``.
    """
    rows = []
    if summary.empty:
        return pd.DataFrame(rows, columns=_VERDICT_COLUMNS)
    bands = summary["l0_mean_mean"].map(l0_band)
    matched = at_l0(summary)
    labels = [_band_label(lo, hi) for lo, hi in L0_BANDS]
    for dataset in dict.fromkeys(summary["dataset"]):
        for band, target in zip(labels, BAND_TARGETS, strict=True):
            in_band = summary[(summary["dataset"] == dataset) & (bands == band)]
            if in_band.empty:
                continue
            for criterion, (metric, better, _) in criteria(probe_loss).items():
                if metric == "fvu_at_l0":
                    at = matched[(matched["dataset"] == dataset) & (matched["target"] == target)
                                 & matched["fvu_at_l0"].notna()]
                    out = _matched_row(at, target)
                else:
                    out = _band_row(summary, in_band, metric, better)
                if out is not None:
                    rows.append({"dataset": dataset, "band": band, "criterion": criterion,
                                 "metric": metric, **out})
    return pd.DataFrame(rows, columns=_VERDICT_COLUMNS)


def _band_row(summary: pd.DataFrame, in_band: pd.DataFrame, metric: str, better: str
              ) -> dict | None:
    """The verdict on one criterion among the configurations of a band."""
    means = pd.to_numeric(in_band[f"{metric}_mean"], errors="coerce")
    scores = means[means.notna()]
    if scores.empty:
        return None
    best = scores.min() if better == "min" else scores.max()
    winners = list(scores.index[(scores - best).abs() <= 1e-12])
    others = scores.drop(winners)
    out = {"n_candidates": len(scores), "winners": winners,
           "models": [str(summary.loc[i, "model"]) for i in winners],
           "winner": ", ".join(_name(summary.loc[i]) for i in winners), "score": float(best),
           "score_std": float(summary.loc[winners[0], f"{metric}_std"]), "runner_up": "",
           "runner_up_score": _NAN, "margin": _NAN, "clear": _NAN, "excluded": ""}
    if len(others):
        second = others.idxmin() if better == "min" else others.idxmax()
        spread = [float(summary.loc[i, f"{metric}_std"]) for i in (winners[0], second)]
        out.update(runner_up=_name(summary.loc[second]),
                   runner_up_score=float(others[second]),
                   **_margin(float(best), float(others[second]), spread))
    return out


def _matched_row(at: pd.DataFrame, target: float) -> dict | None:
    """The verdict on FVU at L0 among the models' curves at one target L0 (rows of at_l0)."""
    excluded = [_matched_name(r, target) for _, r in at.iterrows() if not r["exact_zeros"]]
    at = at[at["exact_zeros"].astype(bool)]
    if at.empty:
        return None
    scores = at["fvu_at_l0"].astype(float)
    best = scores.min()
    tied = at[(scores - best).abs() <= 1e-12]
    others = at.drop(tied.index)
    # a winner taken as it is (not interpolated) has a cell in the summary table to mark
    taken = [r["lo_index"] for _, r in tied.iterrows() if r["lo_index"] == r["hi_index"]]
    out = {"n_candidates": len(at), "winners": taken, "models": [str(m) for m in tied["model"]],
           "winner": ", ".join(_matched_name(r, target) for _, r in tied.iterrows()),
           "score": float(best), "score_std": float(tied.iloc[0]["fvu_at_l0_std"]),
           "runner_up": "", "runner_up_score": _NAN, "margin": _NAN, "clear": _NAN,
           "excluded": ", ".join(excluded)}
    if len(others):
        second = others.loc[others["fvu_at_l0"].astype(float).idxmin()]
        out.update(runner_up=_matched_name(second, target),
                   runner_up_score=float(second["fvu_at_l0"]),
                   **_margin(float(best), float(second["fvu_at_l0"]),
                             [float(tied.iloc[0]["fvu_at_l0_std"]),
                              float(second["fvu_at_l0_std"])]))
    return out


def _margin(best: float, second: float, spread: list[float]) -> dict:
    margin = abs(second - best)
    return {"margin": margin,
            "clear": (margin > max(spread)) if all(map(_finite, spread)) else _NAN}


def _matched_name(row: Mapping, target: float) -> str:
    """'jumprelu at L0 16 (λ = 0.1 … 0.03)' (interpolated) or 'batchtopk at L0 15.8 (k = 16)'
    (a setting taken as it is): a model's curve at a target L0, as the verdict names it."""
    at = f"{target:g}" if row["lo_value"] != row["hi_value"] else f"{row['l0']:.1f}"
    return f"{row['model']} at L0 {at} ({matched_label(row)})"


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
    """Every model at the L0s of :data:`HEADLINE_TARGETS` (16 and 32 active units):
    :func:`at_l0` at those targets, the one-table answer the README quotes."""
    return at_l0(summary, HEADLINE_TARGETS)


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


_BOOLS = {"True": 1.0, "False": 0.0}  # booleans as a results.csv read back holds them


def _converged(mean: float, n_seeds: int) -> str:
    """'2/3': of a configuration's seeds, how many converged (mean of 0/1 over seeds)."""
    return f"{round(mean * n_seeds)}/{n_seeds}" if _finite(mean) else "–"


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
        cells["converged"] = _converged(row["converged_mean"], int(row["n_seeds"]))
        rows.append(cells)
    raw = {"probe_accuracy": raw_probe} if not isinstance(raw_probe, Mapping) else raw_probe
    raw = {k: v for k, v in (raw or {}).items() if _finite(v)}
    if raw:
        cells = dict.fromkeys(["model", "λ / k", "seeds", *_SUMMARY_CELLS, "converged"], "–")
        cells["model"] = "raw pixels"
        for head, (metric, fmt, scale, unit) in _SUMMARY_CELLS.items():
            if metric in raw:
                cells[head] = _pm(raw[metric], _NAN, fmt, scale, unit)
        rows.append(cells)
    return pd.DataFrame(rows, columns=["model", "λ / k", "seeds", *_SUMMARY_CELLS, "converged"])


# the headline's columns: the summary table's cells (same metrics and formats, interpolated seed
# means without ±) and what the values lose against the best values on the same supports
_HEADLINE_CELLS = {
    **{head: _SUMMARY_CELLS[head] for head in ("FVU at L0", "FVU", "support FVU")},
    "values lose": ("values_lose", ".4f", 1.0, ""),
    **{head: _SUMMARY_CELLS[head] for head in ("dead %", "adaptivity", "probe acc. %",
                                               "sparsemax probe %", "probe classes")},
}


def headline_display(summary: pd.DataFrame, dataset: str) -> pd.DataFrame:
    """:func:`headline` of one dataset as text: one row per target L0 and model, with the
    settings interpolated ("from") and ``values lose`` = FVU at L0 − support FVU, what the
    model's values lose against the best values on its own supports."""
    part = headline(summary)
    part = part[part["dataset"] == dataset].assign(
        values_lose=lambda f: f["fvu_at_l0"] - f["support_fvu"])
    rows = []
    for _, row in part.iterrows():
        cells = {"target": f"{row['target']:g}", "L0": f"{row['l0']:.1f}", "model": row["model"],
                 "from": matched_label(row)}
        for head, (metric, fmt, scale, unit) in _HEADLINE_CELLS.items():
            cells[head] = _pm(row[metric], _NAN, fmt, scale, unit)
        rows.append(cells)
    return pd.DataFrame(rows, columns=["target", "L0", "model", "from", *_HEADLINE_CELLS])


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
