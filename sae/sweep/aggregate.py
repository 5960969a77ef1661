"""A sweep's runs gathered and averaged: pure functions, DataFrame in, DataFrame out.

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
  units its ``fvu`` uses, and ``fvu_at_l0`` is the fair number to set beside the others' L0
  (:func:`exact_zeros` says which configurations have them).

The sweep's plots (:mod:`sae.sweep.plots`), the verdict at equal L0 (:mod:`sae.sweep.matching`)
and the text tables (:mod:`sae.sweep.display`) all read these frames.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

import numpy as np
import pandas as pd

from sae.settings.metric_defs import METRIC, METRICS, summary_metrics

__all__ = ["CONFIG_KEYS", "PROBE_METRICS", "RESULT_COLUMNS", "SUMMARY_METRICS", "config_label",
           "exact_zeros", "is_finite_number", "match_kl", "results_frame", "summarize_seeds"]

# A configuration: model is the sweep's name for the entry, kind the sae.run model behind it,
# param "lambda" or "k" (what the entry sweeps) and value its value.
CONFIG_KEYS = ["dataset", "model", "kind", "param", "value"]

# what a run's row says of it besides its metrics: from metrics.json (the run's size, λ, the
# λ a --target-l0 run held at its end, the firing threshold of sigmoid codes, its length) and
# analysis.json (the checkpoint analysed)
RUN_FACTS = ["hidden", "lam", "lambda_held", "fire_threshold", "steps", "epochs",
             "checkpoint_step"]

# every registered metric (sae.settings.metric_defs): a metric computed for a run is never left
# out of its row
RESULT_COLUMNS = [*CONFIG_KEYS, "seed", *RUN_FACTS, *(m.name for m in METRICS),
                  "run"]  # run folder, relative to the sweep folder

SUMMARY_METRICS = list(summary_metrics())

# probe loss -> (summary metric of its test accuracy, heading in the summary table)
PROBE_METRICS = {loss: (name, METRIC[name].label) for loss, name in
                 (("softmax", "probe_accuracy"), ("sparsemax", "probe_sparsemax_accuracy"))}


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


def exact_zeros(summary: pd.DataFrame) -> pd.Series:
    """Per configuration: does its code have exact zeros, i.e. is its FVU at L0 its FVU?

    Models with exact zeros reconstruct from only the units L0 counts, so both numbers are one;
    a KL-SAE's sigmoid units below the firing threshold still reconstruct, so its FVU at L0 is
    larger. A missing FVU at L0 counts as not shown to be exact.
    """
    at_l0 = pd.to_numeric(summary["fvu_at_l0_mean"], errors="coerce")
    plain = pd.to_numeric(summary["fvu_mean"], errors="coerce")
    return ((at_l0 - plain).abs() <= _EXACT_TOL).fillna(False).astype(bool)


def config_label(param: str, value: float) -> str:
    """'λ = 0.01', 'k = 32' or 'target L0 = 16' (a run aimed at an L0 by ``--target-l0``);
    'own L0' for a model with neither."""
    if param == "none":
        return "own L0"
    name = {"lambda": "λ", "target_l0": "target L0"}.get(param, param)
    return f"{name} = {value:g}"


def is_finite_number(x: object) -> bool:
    """A number (not text, not None) that is finite: a cell that has a value to show."""
    return isinstance(x, int | float | np.number) and math.isfinite(float(x))


_BOOLS = {"True": 1.0, "False": 0.0}  # booleans as a results.csv read back holds them
