"""Models set side by side at the same sparsity, and the verdict: pure functions on the
seed summary of :func:`sae.sweep.aggregate.summarize_seeds`.

Settings with different λ (or k) land at different mean L0, and every criterion moves with L0
(FVU falls steeply, probe accuracy rises, dead units change), so comparing configurations as
they fell would reward the less sparse one. Here every model is set at common target L0s
instead:

- :func:`at_l0` interpolates each model's own curve between the two settings that bracket the
  target (linear in log L0; nothing extrapolated), or takes the setting within
  :data:`L0_TOLERANCE` of it as it is;
- :func:`verdict` names, per dataset and L0 band (:data:`L0_BANDS`), the best model on each
  criterion of :func:`criteria` (FVU at L0, probe accuracy, dead units), every one judged at the
  band's target L0 (:data:`BAND_TARGETS`) on those curves; only models with exact zeros
  (:func:`sae.sweep.aggregate.exact_zeros`) compete on FVU at L0, since a KL-SAE's FVU at its
  stated L0 is not the FVU it reports;
- :func:`headline` is every model at L0 16 and 32, the one-table answer the README quotes.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

import numpy as np
import pandas as pd

from sae.metric_defs import METRIC
from sae.sweep.aggregate import PROBE_METRICS, config_label, exact_zeros, is_finite_number

__all__ = ["BAND_TARGETS", "CRITERIA", "HEADLINE_TARGETS", "L0_BANDS", "L0_TOLERANCE",
           "MATCHED_METRICS", "at_l0", "criteria", "headline", "l0_band", "matched_label",
           "verdict"]

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

def criteria(probe_loss: str = "softmax") -> dict[str, tuple[str, str, str]]:
    """criterion -> (summary metric, "min" or "max" is best, heading in the summary table);
    the probe criterion judges the probe trained with ``probe_loss``."""
    names = {"FVU at L0": "fvu_at_l0", "probe accuracy": PROBE_METRICS[probe_loss][0],
             "dead units": "dead_fraction"}
    return {criterion: (name, "min" if METRIC[name].better == "lower" else "max",
                        METRIC[name].label) for criterion, name in names.items()}


CRITERIA = criteria()

_NAN = float("nan")


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
    if not is_finite_number(l0):
        return None
    for lo, hi in L0_BANDS:
        if float(l0) <= hi and (float(l0) > lo or lo == L0_BANDS[0][0]):
            return _band_label(lo, hi)
    return None


_VERDICT_COLUMNS = ["dataset", "band", "target", "criterion", "metric", "n_candidates", "winners",
                    "models", "winner", "score", "score_std", "runner_up", "runner_up_score",
                    "margin", "clear", "excluded"]


def verdict(summary: pd.DataFrame, probe_loss: str = "softmax") -> pd.DataFrame:
    """The best model per dataset, L0 band and criterion, every criterion at equal L0.

    For each dataset and each band of :data:`L0_BANDS` holding at least one configuration (by
    its mean L0), the models are compared at the band's target L0 in :data:`BAND_TARGETS` (16,
    32, 64) on their own interpolated curves (:func:`at_l0`), on every criterion of
    :func:`criteria`: FVU at L0 (lowest wins), probe accuracy (the probe trained with
    ``probe_loss``; highest wins) and dead units (fewest wins). A setting at L0 48 would beat one
    at L0 31 in the same band only by being less sparse, so no criterion compares settings as
    they fell. Only models with exact zeros (:func:`exact_zeros`) compete on FVU at L0; the
    others are named in ``excluded``. A model whose settings do not reach the target on both
    sides is not compared (nothing is extrapolated). Equal means (a tie, e.g. 0 % dead) all win.

    Returns:
        One row per (dataset, band, criterion) with candidates: ``target`` (the L0 compared
        at), ``n_candidates``, ``winners`` (``summary`` index labels of winners taken as they
        are, within :data:`L0_TOLERANCE` of the target; interpolated winners have no single
        row), ``models`` (the winning models' names), ``winner`` (text: model, L0 and the λ or
        k it stands for, ties joined by ", "), ``score`` / ``score_std`` (the winner's mean and
        seed std), ``runner_up`` and ``runner_up_score`` (the best non-winner, '' and NaN when
        none), ``margin`` (absolute gap to it), ``clear`` (the margin exceeds both seed stds;
        NaN when not measurable) and ``excluded`` (left out, as text). Bands follow
        :data:`L0_BANDS`, datasets their order in ``summary``.
    """
    rows = []
    if summary.empty:
        return pd.DataFrame(rows, columns=_VERDICT_COLUMNS)
    bands = summary["l0_mean_mean"].map(l0_band)
    matched = at_l0(summary)
    labels = [_band_label(lo, hi) for lo, hi in L0_BANDS]
    for dataset in dict.fromkeys(summary["dataset"]):
        for band, target in zip(labels, BAND_TARGETS, strict=True):
            if not ((summary["dataset"] == dataset) & (bands == band)).any():
                continue
            at = matched[(matched["dataset"] == dataset) & (matched["target"] == target)]
            for criterion, (metric, better, _) in criteria(probe_loss).items():
                out = _matched_row(at[at[metric].notna()], target, metric, better,
                                   exact_only=metric == "fvu_at_l0")
                if out is not None:
                    rows.append({"dataset": dataset, "band": band, "target": target,
                                 "criterion": criterion, "metric": metric, **out})
    return pd.DataFrame(rows, columns=_VERDICT_COLUMNS)


def _matched_row(at: pd.DataFrame, target: float, metric: str, better: str,
                 exact_only: bool) -> dict | None:
    """The verdict on one criterion among the models' curves at one target L0 (rows of
    :func:`at_l0`); with ``exact_only`` only codes with exact zeros compete."""
    excluded = []
    if exact_only:
        excluded = [_matched_name(r, target) for _, r in at.iterrows() if not r["exact_zeros"]]
        at = at[at["exact_zeros"].astype(bool)]
    if at.empty:
        return None
    scores = at[metric].astype(float)
    best = scores.min() if better == "min" else scores.max()
    tied = at[(scores - best).abs() <= 1e-12]
    others = at.drop(tied.index)
    # a winner taken as it is (not interpolated) has a cell in the summary table to mark
    taken = [r["lo_index"] for _, r in tied.iterrows() if r["lo_index"] == r["hi_index"]]
    out = {"n_candidates": len(at), "winners": taken, "models": [str(m) for m in tied["model"]],
           "winner": ", ".join(_matched_name(r, target) for _, r in tied.iterrows()),
           "score": float(best), "score_std": float(tied.iloc[0][f"{metric}_std"]),
           "runner_up": "", "runner_up_score": _NAN, "margin": _NAN, "clear": _NAN,
           "excluded": ", ".join(excluded)}
    if len(others):
        other = others[metric].astype(float)
        second = others.loc[other.idxmin() if better == "min" else other.idxmax()]
        out.update(runner_up=_matched_name(second, target),
                   runner_up_score=float(second[metric]),
                   **_margin(float(best), float(second[metric]),
                             [float(tied.iloc[0][f"{metric}_std"]),
                              float(second[f"{metric}_std"])]))
    return out


def _margin(best: float, second: float, spread: list[float]) -> dict:
    margin = abs(second - best)
    return {"margin": margin,
            "clear": (margin > max(spread)) if all(map(is_finite_number, spread)) else _NAN}


def _matched_name(row: Mapping, target: float) -> str:
    """'jumprelu at L0 16 (λ = 0.1 … 0.03)' (interpolated) or 'batchtopk at L0 15.8 (k = 16)'
    (a setting taken as it is): a model's curve at a target L0, as the verdict names it."""
    at = f"{target:g}" if row["lo_value"] != row["hi_value"] else f"{row['l0']:.1f}"
    return f"{row['model']} at L0 {at} ({matched_label(row)})"


def headline(summary: pd.DataFrame) -> pd.DataFrame:
    """Every model at the L0s of :data:`HEADLINE_TARGETS` (16 and 32 active units):
    :func:`at_l0` at those targets, the one-table answer the README quotes."""
    return at_l0(summary, HEADLINE_TARGETS)
