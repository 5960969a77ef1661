"""Figures of a sweep: runs compared by model, sparsity and seed (DataFrame in, Figure out).

The comparison figures take the tables of :mod:`sae.sweep.tables` (one row per configuration,
i.e. dataset x model x lambda-or-k, with ``<metric>_mean`` / ``<metric>_std`` over seeds) or
long-form frames of per-sample values, and draw one panel per dataset. A model keeps its colour in
every comparison figure: colours follow the order in which models first appear in the frame.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import pandas as pd
import seaborn as sns
from matplotlib.axes import Axes
from matplotlib.colors import Normalize
from matplotlib.figure import Figure
from matplotlib.ticker import (
    FuncFormatter,
    LogLocator,
    MaxNLocator,
    NullFormatter,
    PercentFormatter,
)

from sae.figures.common import empty_note, l0_edges, styled

__all__ = ["class_l0_heatmap", "fvu_l0_pareto", "l0_distributions", "l0_ink_correlation",
           "probe_vs_l0"]


def _model_colours(models: Sequence[str]) -> dict[str, str]:
    """Model name -> colour, by order of first appearance (the sweep file's order)."""
    return {m: f"C{i % 10}" for i, m in enumerate(dict.fromkeys(models))}


def _value_label(param: str, value: float) -> str:
    return f"{'λ' if param == 'lambda' else param}={value:g}"


def _nan_to_zero(values: pd.Series) -> np.ndarray:
    """Error-bar lengths: a single seed has no measured spread (NaN), drawn as no bar."""
    return np.nan_to_num(pd.to_numeric(values, errors="coerce").to_numpy(float), nan=0.0)


def _dataset_axes(n: int, width: float = 5.6, height: float = 4.3) -> tuple[Figure, list[Axes]]:
    """A figure with one axes per dataset, side by side (at least one axes)."""
    fig = Figure(figsize=(width * max(n, 1) + 1.8, height), layout="constrained")
    return fig, list(np.ravel(fig.subplots(1, max(n, 1), squeeze=False)))


def _pareto_front(l0: np.ndarray, err: np.ndarray) -> np.ndarray:
    """Indices of points no other point beats on both L0 and error (lower is better), by L0."""
    order = np.lexsort((err, l0))
    front, best = [], np.inf
    for i in order:
        if err[i] < best:
            front.append(i)
            best = err[i]
    return np.asarray(front, dtype=int)


def _metric_vs_l0(ax: Axes, part: pd.DataFrame, metric: str, colours: dict[str, str]) -> None:
    """Per model: mean metric against mean L0 with seed error bars, points joined along L0."""
    for model, rows in part.groupby("model", sort=False):
        rows = rows.sort_values("l0_mean_mean")
        ax.errorbar(rows["l0_mean_mean"], rows[f"{metric}_mean"],
                    xerr=_nan_to_zero(rows["l0_mean_std"]),
                    yerr=_nan_to_zero(rows[f"{metric}_std"]), color=colours[model], marker="o",
                    ms=4, lw=1.2, capsize=2, label=str(model))
        for _, r in rows.iterrows():
            ax.annotate(_value_label(r["param"], r["value"]), (r["l0_mean_mean"],
                        r[f"{metric}_mean"]), xytext=(3, 3), textcoords="offset points",
                        fontsize="xx-small", color=colours[model])
    if (part["l0_mean_mean"] > 0).all():  # log L0 spreads 1..H evenly; 0 has no logarithm
        ax.set_xscale("log")
        # plain numbers (2, 5, 10, 20, ...) read better than 2 x 10^0 for counts of units
        ax.xaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.xaxis.set_minor_formatter(NullFormatter())


def _l0_panels(summary: pd.DataFrame, metric: str, title: str, ylabel: str):
    """A figure with one panel per dataset of ``summary``, mean L0 on x and ``ylabel`` on y.

    Returns the figure and ``(axes, dataset, rows)`` per panel, rows being the configurations of
    that dataset with a finite mean L0 and ``<metric>_mean``. With no dataset at all, the one
    panel says so and the list is empty.
    """
    data = summary.dropna(subset=["l0_mean_mean", f"{metric}_mean"])
    datasets = list(dict.fromkeys(summary["dataset"]))
    fig, axes = _dataset_axes(len(datasets))
    fig.suptitle(title)
    if not datasets:
        empty_note(axes[0], "no finished runs")
    panels = []
    for ax, dataset in zip(axes, datasets, strict=False):
        ax.set(title=str(dataset), xlabel="mean L0 (active units per input)", ylabel=ylabel)
        panels.append((ax, dataset, data[data["dataset"] == dataset]))
    return fig, panels


def _fvu_at_l0_lines(ax: Axes, part: pd.DataFrame, colours: dict[str, str]) -> None:
    """Dashed, hollow-marker lines of ``fvu_at_l0`` for models where it differs from ``fvu``.

    Only units that L0 counts reconstruct in ``fvu_at_l0``; models with exact zeros have the
    same value, while a KL-SAE's sub-threshold sigmoid units also reconstruct in ``fvu``.
    """
    if "fvu_at_l0_mean" not in part:
        return
    for model, rows in part.groupby("model", sort=False):
        rows = rows.dropna(subset=["fvu_at_l0_mean"]).sort_values("l0_mean_mean")
        gap = (rows["fvu_at_l0_mean"] - rows["fvu_mean"]).abs()
        if rows.empty or not (gap > 1e-6).any():
            continue
        ax.errorbar(rows["l0_mean_mean"], rows["fvu_at_l0_mean"],
                    yerr=_nan_to_zero(rows["fvu_at_l0_std"]), color=colours[model], marker="o",
                    mfc="white", ms=4, lw=1.0, ls="--", capsize=2,
                    label=f"{model}: only units counted in L0")


@styled
def fvu_l0_pareto(summary: pd.DataFrame) -> Figure:
    """Reconstruction against sparsity: mean FVU over mean L0, one line per model.

    Args:
        summary: one row per configuration with columns ``dataset``, ``model``, ``param``,
            ``value``, ``l0_mean_mean``, ``l0_mean_std``, ``fvu_mean``, ``fvu_std`` (means and
            standard deviations over seeds; NaN std = one seed, drawn without a bar).

    One panel per dataset. Each point is labelled with its λ or k. L0 is on a log axis when every
    mean L0 is positive. With ``fvu_at_l0_mean`` (and ``_std``) columns, a model whose FVU
    changes when only the units counted in L0 reconstruct (the KL-SAE) also gets a dashed line
    of hollow points at that FVU. The dashed grey line is the Pareto frontier over all
    configurations (no other configuration has both fewer active units and lower FVU), taken
    over FVU at L0 where given: a KL-SAE's plain FVU also relies on units its L0 leaves out.
    """
    fig, panels = _l0_panels(
        summary, "fvu", "Reconstruction vs sparsity (mean ± std over seeds; lower left is better)",
        "FVU (fraction of variance unexplained)")
    colours = _model_colours(list(summary["model"]))
    for ax, _, part in panels:
        if part.empty:
            empty_note(ax, "no finished runs")
            continue
        _metric_vs_l0(ax, part, "fvu", colours)
        _fvu_at_l0_lines(ax, part, colours)
        # The frontier is over FVU at the stated L0: a KL-SAE's plain FVU also uses units that
        # its L0 does not count, so it would claim a sparsity it does not have.
        fair = (part["fvu_at_l0_mean"].fillna(part["fvu_mean"]) if "fvu_at_l0_mean" in part
                else part["fvu_mean"]).to_numpy(float)
        order = _pareto_front(part["l0_mean_mean"].to_numpy(float), fair)
        ax.plot(part["l0_mean_mean"].to_numpy(float)[order], fair[order], color="0.4", ls="--",
                lw=1.0, drawstyle="steps-post", zorder=0, label="Pareto frontier (FVU at L0)")
        ax.legend(fontsize="small")
    return fig


@styled
def probe_vs_l0(summary: pd.DataFrame, raw_probe: dict[str, float] | None = None) -> Figure:
    """Linear-probe test accuracy of the codes against mean L0, one line per model.

    Args:
        summary: one row per configuration with columns ``dataset``, ``model``, ``param``,
            ``value``, ``l0_mean_mean``, ``l0_mean_std``, ``probe_accuracy_mean``,
            ``probe_accuracy_std``.
        raw_probe: dataset -> probe accuracy on raw pixels, drawn as a dashed horizontal line.
    """
    raw_probe = raw_probe or {}
    fig, panels = _l0_panels(
        summary, "probe_accuracy",
        "Linear-probe accuracy of the codes vs sparsity (mean ± std over seeds)",
        "probe test accuracy")
    colours = _model_colours(list(summary["model"]))
    for ax, dataset, part in panels:
        if dataset in raw_probe and math.isfinite(raw_probe[dataset]):
            ax.axhline(raw_probe[dataset], color="0.3", ls="--", lw=1.0,
                       label=f"raw pixels ({100 * raw_probe[dataset]:.1f}%)")
        if part.empty:
            empty_note(ax, "no probe results")
            continue
        _metric_vs_l0(ax, part, "probe_accuracy", colours)
        ax.yaxis.set_major_formatter(PercentFormatter(1.0))
        ax.legend(fontsize="small")
    return fig


@styled
def l0_distributions(l0: pd.DataFrame) -> Figure:
    """Per-sample L0 distributions: one panel per dataset and model, one outline per λ or k.

    Args:
        l0: long form, one row per test sample and run, with columns ``dataset``, ``model``,
            ``config`` (the λ or k as text) and ``l0``; seeds of a configuration are pooled.

    Each outline is the fraction of test inputs per L0 bin. TopK's is a spike at k (or just
    below, when some of the k largest pre-activations are not positive).
    """
    panels = list(dict.fromkeys(zip(l0["dataset"], l0["model"], strict=True)))
    if not panels:
        fig = Figure(figsize=(6.0, 3.0), layout="constrained")
        fig.suptitle("L0 distributions")
        empty_note(fig.add_subplot(), "no per-sample L0 available")
        return fig
    datasets = list(dict.fromkeys(d for d, _ in panels))
    models = list(dict.fromkeys(m for _, m in panels))
    fig = Figure(figsize=(3.4 * len(models) + 1.0, 2.8 * len(datasets) + 0.8),
                 layout="constrained")
    grid = fig.subplots(len(datasets), len(models), squeeze=False)
    for i, dataset in enumerate(datasets):
        for j, model in enumerate(models):
            ax = grid[i, j]
            part = l0[(l0["dataset"] == dataset) & (l0["model"] == model)]
            ax.set_title(f"{dataset} · {model}", fontsize="small")
            if part.empty:
                empty_note(ax, "no runs")
                continue
            values = part["l0"].to_numpy(float)
            edges, _ = l0_edges(values, max_bins=60)
            configs = list(dict.fromkeys(part["config"]))
            shades = sns.color_palette("viridis", len(configs))
            for config, shade in zip(configs, shades, strict=True):
                v = values[(part["config"] == config).to_numpy()]
                counts, _ = np.histogram(v, bins=edges)
                ax.stairs(counts / max(v.size, 1), edges, color=shade, lw=1.4,
                          label=f"{config} (mean {v.mean():.3g})")
            ax.legend(fontsize="xx-small")
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    fig.supxlabel("L0 (active units per test input)")
    fig.supylabel("fraction of test inputs")
    fig.suptitle("L0 distributions per model (test set, seeds pooled)")
    return fig


@styled
def class_l0_heatmap(per_class: pd.DataFrame) -> Figure:
    """Mean L0 per class for every configuration, relative to the configuration's mean.

    Args:
        per_class: long form with columns ``dataset``, ``model``, ``config``, ``class`` (name)
            and ``l0`` (mean L0 of that class's test inputs, averaged over seeds).

    One heatmap per dataset: rows are configurations, columns classes. The colour is the class
    mean divided by the mean over classes of that row (1 = average; diverging around 1), so
    classes that need more units stand out whatever the overall sparsity; cells print the
    absolute mean L0.
    """
    datasets = list(dict.fromkeys(per_class["dataset"]))
    n_rows = max([per_class[per_class["dataset"] == d][["model", "config"]].drop_duplicates()
                  .shape[0] for d in datasets] or [1])
    fig = Figure(figsize=(8.5, (0.32 * n_rows + 1.6) * max(len(datasets), 1) + 0.6),
                 layout="constrained")
    fig.suptitle("Mean L0 per class (colour: relative to the row's mean over classes)")
    if not datasets:
        empty_note(fig.add_subplot(), "no per-class L0 available")
        return fig
    axes = np.ravel(fig.subplots(len(datasets), 1, squeeze=False))
    cmap = sns.color_palette("vlag", as_cmap=True)
    im = None
    for ax, dataset in zip(axes, datasets, strict=True):
        part = per_class[per_class["dataset"] == dataset].copy()
        part["row"] = part["model"].astype(str) + " " + part["config"].astype(str)
        table = part.pivot_table(index="row", columns="class", values="l0", sort=False)
        ratio = table.div(table.mean(axis=1).replace(0, np.nan), axis=0)
        spread = float(np.nanmax(np.abs(ratio.to_numpy() - 1))) if ratio.size else 0.0
        spread = spread if math.isfinite(spread) and spread > 0 else 0.5
        im = ax.imshow(ratio.to_numpy(float), aspect="auto", cmap=cmap,
                       norm=Normalize(1 - spread, 1 + spread))
        ax.grid(False)
        ax.set_xticks(np.arange(table.shape[1]), [str(c) for c in table.columns], rotation=30,
                      ha="right", rotation_mode="anchor")
        ax.set_yticks(np.arange(table.shape[0]), list(table.index))
        if table.size <= 400:  # numbers stay legible up to about 40 rows of 10 classes
            for (r, c), v in np.ndenumerate(table.to_numpy(float)):
                if math.isfinite(v):
                    ax.text(c, r, f"{v:.3g}", ha="center", va="center", fontsize="xx-small")
        ax.set_title(str(dataset))
    fig.colorbar(im, ax=list(axes), shrink=0.8, label="class mean L0 / row mean")
    return fig


@styled
def l0_ink_correlation(results: pd.DataFrame) -> Figure:
    """Pearson correlation between a test input's L0 and its ink, per configuration.

    Args:
        results: one row per run with columns ``dataset``, ``model``, ``config`` and
            ``l0_ink_corr`` (NaN when L0 was constant over the test set, as for a TopK whose k
            largest pre-activations are always positive).

    Bars are means over seeds, dots single seeds. A model whose number of active units adapts to
    the input (more ink, more strokes to draw) shows a clearly positive correlation; TopK cannot,
    by construction, and an undefined correlation is marked as such.
    """
    datasets = list(dict.fromkeys(results["dataset"]))
    n_configs = max([results[results["dataset"] == d][["model", "config"]].drop_duplicates()
                     .shape[0] for d in datasets] or [1])
    fig = Figure(figsize=(max(7.0, 0.45 * n_configs + 2.0), 3.6 * max(len(datasets), 1) + 0.5),
                 layout="constrained")
    fig.suptitle("Does L0 follow the ink? corr(L0, Σ pixels) over test inputs")
    if not datasets:
        empty_note(fig.add_subplot(), "no finished runs")
        return fig
    colours = _model_colours(list(results["model"]))
    axes = np.ravel(fig.subplots(len(datasets), 1, squeeze=False))
    for ax, dataset in zip(axes, datasets, strict=True):
        part = results[results["dataset"] == dataset]
        keys = list(dict.fromkeys(zip(part["model"], part["config"], strict=True)))
        for x, (model, config) in enumerate(keys):
            r = pd.to_numeric(part[(part["model"] == model) & (part["config"] == config)]
                              ["l0_ink_corr"], errors="coerce").to_numpy(float)
            finite = r[np.isfinite(r)]
            if finite.size == 0:
                ax.text(x, 0.02, "undefined:\nconstant L0", ha="center", va="bottom",
                        fontsize="xx-small", rotation=90, color="0.35")
                continue
            ax.bar(x, finite.mean(), color=colours[model], alpha=0.75, width=0.7)
            ax.scatter(np.full(finite.size, x), finite, color="k", s=8, zorder=3)
        ax.set_xticks(np.arange(len(keys)), [f"{m} {c}" for m, c in keys], rotation=40,
                      ha="right", rotation_mode="anchor", fontsize="small")
        ax.axhline(0, color="0.3", lw=0.8)
        ax.set(ylim=(-1, 1), ylabel="Pearson r", title=str(dataset))
    return fig
