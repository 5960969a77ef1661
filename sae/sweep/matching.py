"""Models set side by side at the same sparsity, and the verdict: pure functions on a sweep's
runs (:func:`sae.sweep.aggregate.results_frame`, one row per run).

Settings with different λ (or k) land at different mean L0, and every criterion moves with L0
(FVU falls steeply, probe accuracy rises, dead units change), so comparing configurations as
they fell would reward the less sparse one. Here every model is set at common target L0s
instead, and the choice is made on validation data while only test metrics are reported:

- :func:`at_l0` places each run by its validation mean L0 and, per seed, interpolates the
  model's own curve between the two settings that bracket the target (linear in log L0;
  nothing extrapolated), or takes the setting within :data:`L0_TOLERANCE` of it as it is (so a
  run aimed at the target, a sweep's ``target_l0``, that landed within it has its cell); the
  row is the mean and sample std over seeds of the interpolated test metrics;
- :func:`verdict` names, per dataset and L0 band (:data:`L0_BANDS`), the best model on each
  criterion of :func:`criteria` (outcomes first: FVU at L0 and the adaptive gain), every one
  judged at the band's target L0 (:data:`BAND_TARGETS`) on those curves; only models with
  exact zeros compete on FVU at L0, since a KL-SAE's FVU at its stated L0 is not the FVU it
  reports;
- :func:`headline` is every model at L0 16 and 32, the one-table answer the results quote.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

import numpy as np
import pandas as pd

from sae.settings.metric_defs import METRIC, TABLES, TRUTH
from sae.sweep.aggregate import (
    _EXACT_TOL,
    CONFIG_KEYS,
    PROBE_METRICS,
    config_label,
    is_finite_number,
)

__all__ = ["BAND_TARGETS", "CRITERIA", "GROUND_TRUTH_METRICS", "HEADLINE_TARGETS", "L0_BANDS",
           "L0_TOLERANCE", "MATCHED_METRICS", "at_l0", "bands", "choice_l0", "criteria",
           "headline",
           "l0_band", "matched_label", "verdict"]

# L0 bands (lower, upper]: configurations are only compared with others of similar sparsity
L0_BANDS: tuple[tuple[float, float], ...] = ((0.0, 20.0), (20.0, 50.0), (50.0, math.inf))

# the L0 at which each band's models are compared on FVU (interpolated on each model's curve)
BAND_TARGETS: tuple[float, ...] = (16.0, 32.0, 64.0)

# the targets of the headline table: sparse (16 active units) and moderate (32)
HEADLINE_TARGETS: tuple[float, ...] = BAND_TARGETS[:2]

# a setting whose mean L0 is within this share of a target is taken as it is, not interpolated
# (BatchTopK's inference threshold lands its L0 near, not at, k; a run trained with
# --target-l0 lands near, not at, its target)
L0_TOLERANCE = 0.05

# metrics interpolated to a target L0 (linear in log L0 between the two nearest settings), and
# those of them that exist only on data whose features are known (sae.settings.metric_defs)
MATCHED_METRICS = list(TABLES["matched"])
GROUND_TRUTH_METRICS = list(TRUTH)


def criteria(probe_loss: str = "softmax") -> dict[str, tuple[str, str, str]]:
    """criterion -> (summary metric, "min" or "max" is best, heading in the summary table),
    outcomes first: FVU at L0, the adaptive gain, on data with known features their recovery
    and the tracking of each input's true L0, then the probe trained with ``probe_loss`` and
    dead units. A criterion without values on a page (the ground-truth ones on images) is not
    judged there."""
    names = {"FVU at L0": "fvu_at_l0", "adaptive gain": "adaptive_gain",
             "feature recovery": "gt_recovery", "L0 tracks true L0": "gt_l0_spearman",
             "probe accuracy": PROBE_METRICS[probe_loss][0], "dead units": "dead_fraction"}
    return {criterion: (name, "min" if METRIC[name].better == "lower" else "max",
                        METRIC[name].label) for criterion, name in names.items()}


CRITERIA = criteria()

_NAN = float("nan")


def choice_l0(results: pd.DataFrame) -> tuple[pd.Series, bool]:
    """The mean L0 each run is placed by, and whether it is the validation split's.

    Settings are chosen on validation data and only reported on the test set: a run's place on
    its model's curve (which settings bracket a target L0, and the interpolation weight) is its
    last validation mean L0 (``val_l0``). A results table of an earlier version has no
    validation L0; its test L0 (``l0_mean``) stands in, and the pages say so.
    """
    val = pd.to_numeric(results.get("val_l0", pd.Series(_NAN, index=results.index)),
                        errors="coerce")
    test = pd.to_numeric(results["l0_mean"], errors="coerce")
    on_val = bool(len(results)) and bool(np.isfinite(val).all())
    return (val if on_val else test), on_val


def _exact(rows: pd.DataFrame) -> bool:
    """Whether every run of ``rows`` has exact zeros (its FVU at L0 is its FVU)."""
    at, plain = (pd.to_numeric(rows[c], errors="coerce") for c in ("fvu_at_l0", "fvu"))
    return bool(((at - plain).abs() <= _EXACT_TOL).all())


def _seed_point(runs: pd.DataFrame, target: float) -> dict | None:
    """One seed's runs of a model (a ``_place`` column: the L0 they are placed by) at
    ``target``: the run within :data:`L0_TOLERANCE` of it, taken as it is, or the two that
    bracket it, interpolated linearly in log L0; None when the seed does not reach it."""
    runs = runs.sort_values("_place", kind="stable")
    near = runs[(runs["_place"] - target).abs() <= L0_TOLERANCE * target]
    if len(near):
        lo = hi = near.loc[(near["_place"] - target).abs().idxmin()]
        w = 0.0
    else:
        below, above = runs[runs["_place"] < target], runs[runs["_place"] > target]
        if below.empty or above.empty:
            return None
        lo, hi = below.iloc[-1], above.iloc[0]
        w = math.log(target / lo["_place"]) / math.log(hi["_place"] / lo["_place"])
    out = {"values": {float(lo["value"]), float(hi["value"])}, "runs": [lo, hi]}
    for metric in ["l0_mean", *MATCHED_METRICS]:
        a, b = (pd.to_numeric(pd.Series([r.get(metric, _NAN)]), errors="coerce")[0]
                for r in (lo, hi))
        if metric == "l0_mean" and w and a > 0 and b > 0:  # the L0 it stands for, on the
            out[metric] = math.exp(math.log(a) + w * (math.log(b) - math.log(a)))  # test set
        else:
            out[metric] = float(a + w * (b - a)) if w else float(a)
    return out


def at_l0(results: pd.DataFrame, targets: Iterable[float] = BAND_TARGETS) -> pd.DataFrame:
    """Each model's metrics at the same mean L0: interpolated per seed on its own curve.

    Settings with different λ (or k) land at different mean L0, and FVU falls steeply with L0,
    so models are compared at common target L0s instead. For each dataset, model, target t and
    seed, the seed's runs are placed by their validation mean L0 (:func:`choice_l0`); the run
    within :data:`L0_TOLERANCE` (5 %) of t is taken as it is, otherwise the two runs that
    bracket t are interpolated linearly in log L0, weight
    ``w = log(t / L0_lo) / log(L0_hi / L0_lo)``, for every metric of :data:`MATCHED_METRICS`
    (test metrics, and the validation FVU). A seed whose runs do not reach t on both sides is
    left out (nothing is extrapolated); a model with no such seed has no row. The row is the
    mean over the seeds that reach t, with their sample std (ddof = 1; NaN with one seed).

    Args:
        results: one row per run (:func:`sae.sweep.aggregate.results_frame`).
        targets: the target L0s.

    Returns:
        One row per (dataset, target, model) reached: ``dataset``, ``target``, ``model``,
        ``l0`` (the test mean L0 the row stands for, a mean over seeds), ``kind``, ``param``,
        ``lo_value`` / ``hi_value`` (the smallest and largest setting used by any seed; equal
        when every seed took the same run as it is), ``n_seeds`` (seeds that reach t) and
        ``n_missing`` (seeds that do not), ``exact_zeros``, ``on_validation`` (placed by
        validation L0, else by test L0) and every metric of :data:`MATCHED_METRICS` with
        its std over seeds (``<metric>_std``). Ordered by dataset, target, then the models'
        order.
    """
    columns = ["dataset", "target", "model", "l0", "kind", "param", "lo_value", "hi_value",
               "n_seeds", "n_missing", "exact_zeros", "on_validation"] + \
        [f"{m}{s}" for m in MATCHED_METRICS for s in ("", "_std")]
    rows = []
    if results.empty:
        return pd.DataFrame(rows, columns=columns)
    place, on_val = choice_l0(results)
    data = results.assign(_place=place)
    data = data[np.isfinite(data["_place"]) & (data["_place"] > 0)]
    for dataset in dict.fromkeys(results["dataset"]):
        for target in targets:
            for model in dict.fromkeys(results.loc[results["dataset"] == dataset, "model"]):
                part = data[(data["dataset"] == dataset) & (data["model"] == model)]
                seeds = list(dict.fromkeys(part["seed"]))
                points = [p for p in (_seed_point(part[part["seed"] == s], target)
                                      for s in seeds) if p is not None]
                if not points:
                    continue
                values = sorted(set().union(*(p["values"] for p in points)))
                used = pd.DataFrame([r for p in points for r in p["runs"]])
                first = part.iloc[0]
                out = {"dataset": dataset, "target": float(target), "model": model,
                       "l0": float(np.mean([p["l0_mean"] for p in points])),
                       "kind": first["kind"], "param": first["param"],
                       "lo_value": values[-1] if first["param"] == "lambda" else values[0],
                       "hi_value": values[0] if first["param"] == "lambda" else values[-1],
                       "n_seeds": len(points), "n_missing": len(seeds) - len(points),
                       "exact_zeros": _exact(used), "on_validation": on_val}
                for metric in MATCHED_METRICS:
                    v = pd.Series([p[metric] for p in points], dtype=float)
                    out[metric] = float(v.mean()) if v.notna().any() else _NAN
                    out[f"{metric}_std"] = float(v.std()) if v.notna().sum() > 1 else _NAN
                rows.append(out)
    return pd.DataFrame(rows, columns=columns)


def matched_label(row: Mapping) -> str:
    """'λ = 0.03 … 0.01' (the two settings interpolated) or 'k = 16' (one taken as it is)."""
    first = config_label(row["param"], row["lo_value"])
    return first if row["lo_value"] == row["hi_value"] else f"{first} … {row['hi_value']:g}"


# --------------------------------------------------------------------------- verdict


def _band_label(lo: float, hi: float) -> str:
    if lo <= 0:
        return f"L0 ≤ {hi:.3g}"
    return f"L0 > {lo:.3g}" if math.isinf(hi) else f"{lo:.3g} < L0 ≤ {hi:.3g}"


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


def bands(targets: Iterable[float] | None = None) -> list[tuple[float, float, float]]:
    """(lower, upper, target) of each L0 band: :data:`L0_BANDS` with :data:`BAND_TARGETS`, or
    one band per target of a sweep's own ``targets``, bounded by the geometric means of
    neighbouring targets."""
    if targets is None:
        return [(lo, hi, t) for (lo, hi), t in zip(L0_BANDS, BAND_TARGETS, strict=True)]
    ts = sorted(float(t) for t in targets)
    edges = [0.0, *(math.sqrt(a * b) for a, b in zip(ts, ts[1:], strict=False)), math.inf]
    return [(edges[i], edges[i + 1], t) for i, t in enumerate(ts)]


def verdict(results: pd.DataFrame, probe_loss: str = "softmax",
            targets: Iterable[float] | None = None) -> pd.DataFrame:
    """The best model per dataset, L0 band and criterion, every criterion at equal L0.

    For each dataset and each band of :data:`L0_BANDS` holding at least one configuration (by
    its mean validation L0, :func:`choice_l0`), the models are compared at the band's target L0
    in :data:`BAND_TARGETS` (16, 32, 64) on their own curves, interpolated per seed
    (:func:`at_l0`), on every criterion of :func:`criteria` that has values: FVU at L0 (lowest
    wins), the adaptive gain, on data with known features their recovery and how well L0
    tracks each input's true number of features, probe accuracy (the probe trained with
    ``probe_loss``) and dead units (fewest wins). A setting at L0 48 would beat one at L0 31 in
    the same band only by being less sparse, so no criterion compares settings as they fell.
    Only models with exact zeros compete on FVU at L0; the others are named in ``excluded``. A
    model whose settings do not reach the target on both sides is not compared (nothing is
    extrapolated). Equal means (a tie, e.g. 0 % dead) all win. A sweep's own ``targets``
    replace the bands by one band per target (:func:`bands`).

    Returns:
        One row per (dataset, band, criterion) with candidates: ``target`` (the L0 compared
        at), ``n_candidates``, ``winners`` (the configurations, ``(model, value)``, of winners
        that every seed took as they are, within :data:`L0_TOLERANCE` of the target;
        interpolated winners have no single configuration), ``models`` (the winning models'
        names), ``winner`` (text: model, L0 and the λ or k it stands for, ties joined by ", "),
        ``score`` / ``score_std`` (the winner's mean and seed std), ``runner_up`` and
        ``runner_up_score`` (the best non-winner, '' and NaN when none), ``margin`` (absolute
        gap to it), ``clear`` (the margin exceeds both seed stds; NaN when not measurable) and
        ``excluded`` (left out, as text). Bands follow :data:`L0_BANDS`, datasets their order
        in ``results``.
    """
    rows = []
    if results.empty:
        return pd.DataFrame(rows, columns=_VERDICT_COLUMNS)
    place, _ = choice_l0(results)
    config_l0 = results.assign(_place=place).groupby(CONFIG_KEYS, sort=False, dropna=False)[
        "_place"].mean().reset_index()
    chosen = bands(targets)
    matched = at_l0(results, [t for _, _, t in chosen])
    for dataset in dict.fromkeys(results["dataset"]):
        for lo, hi, target in chosen:
            band = _band_label(lo, hi)
            inside = (config_l0["_place"] <= hi) & ((config_l0["_place"] > lo) | (lo <= 0))
            if not ((config_l0["dataset"] == dataset) & inside).any():
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
    # a winner every seed took as it is (not interpolated) has a cell in the summary table
    taken = [(r["model"], r["lo_value"]) for _, r in tied.iterrows()
             if r["lo_value"] == r["hi_value"]]
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


def headline(results: pd.DataFrame, targets: Iterable[float] | None = None) -> pd.DataFrame:
    """Every model at the L0s of :data:`HEADLINE_TARGETS` (16 and 32 active units), or at a
    sweep's own ``targets``: :func:`at_l0` there, the one-table answer the results quote."""
    return at_l0(results, HEADLINE_TARGETS if targets is None else targets)
