"""Figures of a sweep: runs compared by model, sparsity and seed (DataFrame in, Figure out).

The comparison figures take the seed summary of :mod:`sae.sweep.aggregate` (one row per
configuration, i.e. dataset x model x lambda-or-k, with ``<metric>_mean`` / ``<metric>_std`` over
seeds) or long-form frames of per-sample values, and draw one panel per dataset, in the style of
:mod:`sae.figures` (which knows nothing of sweeps). A model looks the same in every figure and
every preset: colour, marker and line style come from its name
(:func:`sae.figures.common.model_style`), never from the other models present, and no two
models of a figure share a colour (:func:`sae.figures.common.model_styles`). Titles say what
the error bars are only as far as the seeds allow (:func:`sae.figures.common.seeds_note`), and
are wrapped to the figure's width.
"""

from __future__ import annotations

import math
import textwrap

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

from sae.figures.common import (
    empty_note,
    l0_edges,
    mark_outside,
    model_styles,
    robust_limits,
    seeds_note,
    styled,
)
from sae.figures.labels import place_labels
from sae.sweep.aggregate import PROBE_METRICS, config_label, exact_zeros

__all__ = ["class_l0_heatmap", "fvu_l0_pareto", "l0_distributions", "l0_ink_correlation",
           "probe_vs_l0", "truth_vs_l0"]


def _styles(frame: pd.DataFrame) -> dict[str, dict[str, object]]:
    """Model name -> its style (:func:`model_styles`: its own, the figure's colours told
    apart)."""
    kinds = frame["kind"] if "kind" in frame else pd.Series([None] * len(frame), dtype=object)
    by_model = dict(zip(frame["model"], kinds, strict=True))
    return model_styles(list(by_model), [k if isinstance(k, str) else None
                                         for k in by_model.values()])


def _title(fig: Figure, text: str) -> None:
    """The figure's title, wrapped to lines that fit its width (the paper style's suptitle is
    about 12.5 points, a character about 0.58 of that wide)."""
    width_pt = fig.get_size_inches()[0] * 72 - 24
    chars = max(int(width_pt / (0.58 * 12.5)), 20)
    fig.suptitle("\n".join(textwrap.fill(line, chars) for line in text.split("\n")))


def _figure_legend(fig: Figure, axes: list[Axes]) -> None:
    """One legend for the whole figure, outside the axes on the right, where it hides no point
    and no label; each label once (a model drawn in two panels is one entry)."""
    entries: dict[str, object] = {}
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            entries.setdefault(label, handle)
    if entries:
        fig.legend(list(entries.values()), list(entries), loc="outside right center",
                   fontsize="small")


def _seeds_note(frame: pd.DataFrame) -> str:
    """:func:`seeds_note` of a summary's configurations (``n_seeds``; without that column, a
    configuration with a measured L0 spread counts as two seeds or more)."""
    if "n_seeds" in frame:
        return seeds_note(pd.to_numeric(frame["n_seeds"], errors="coerce"))
    spread = pd.to_numeric(frame.get("l0_mean_std", pd.Series(dtype=float)), errors="coerce")
    return seeds_note(np.where(spread.notna(), 2, 1))


def _value_label(param: str, value: float) -> str:
    """A point's setting, tight: 'λ=0.01', 'k=32', or 'own L0' for a model with neither."""
    return config_label(param, value).replace(" = ", "=")


def _nan_to_zero(values: pd.Series) -> np.ndarray:
    """Error-bar lengths: a single seed has no measured spread (NaN), drawn as no bar."""
    return np.nan_to_num(pd.to_numeric(values, errors="coerce").to_numpy(float), nan=0.0)


def _dataset_axes(n: int, width: float = 5.6, height: float = 4.3) -> tuple[Figure, list[Axes]]:
    """A figure with one axes per dataset, side by side (at least one axes)."""
    # 2.6 inches on the right hold the legend (outside the axes)
    fig = Figure(figsize=(width * max(n, 1) + 2.6, height), layout="constrained")
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


def _ends_first(n: int) -> list[int]:
    """Indices 0..n-1 with both ends first: labels of a line's extremes are never dropped."""
    return list(dict.fromkeys([0, n - 1, *range(1, n - 1)])) if n else []


def _metric_vs_l0(ax: Axes, part: pd.DataFrame, metric: str,
                  styles: dict[str, dict[str, object]], ls: object = None, hollow: bool = False,
                  suffix: str = "") -> list:
    """Per model: mean metric against mean L0 with seed error bars, points joined along L0.

    Each model is drawn in its style (``styles``; ``ls`` overrides its line style). Returns the
    points to label with their λ or k, ``(x, y, text, colour, rank)``: rank 0 for a fixed
    budget's k (always shown), 1 for a line's ends, 2 between (for :func:`place_labels`, once
    every line of the axes is drawn).
    """
    labels = []
    for model, rows in part.groupby("model", sort=False):
        rows = rows.sort_values("l0_mean_mean")
        style = styles[model]
        colour = style["color"]
        ax.errorbar(rows["l0_mean_mean"], rows[f"{metric}_mean"],
                    xerr=_nan_to_zero(rows["l0_mean_std"]),
                    yerr=_nan_to_zero(rows[f"{metric}_std"]), color=colour,
                    marker=style["marker"], ms=5, lw=1.2, capsize=2,
                    ls=style["ls"] if ls is None else ls, mfc="white" if hollow else colour,
                    label=f"{model}{suffix}")
        records = rows.reset_index(drop=True)
        ends = {0, len(records) - 1}
        labels += [(records.loc[i, "l0_mean_mean"], records.loc[i, f"{metric}_mean"],
                    _value_label(records.loc[i, "param"], records.loc[i, "value"]), colour,
                    0 if records.loc[i, "param"] == "k" else 1 if i in ends else 2)
                   for i in _ends_first(len(records))]
    _log_l0_axis(ax, part)
    return labels


def _log_l0_axis(ax: Axes, part: pd.DataFrame) -> None:
    """Log L0 axis (1..H spread evenly) with plain tick numbers, when every mean L0 is > 0."""
    if len(part) and (part["l0_mean_mean"] > 0).all():
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
    _title(fig, f"{title}\n({_seeds_note(data)})")
    if not datasets:
        empty_note(axes[0], "no finished runs")
    panels = []
    for ax, dataset in zip(axes, datasets, strict=False):
        ax.set(title=str(dataset), xlabel="mean L0 (active units per input)", ylabel=ylabel)
        panels.append((ax, dataset, data[data["dataset"] == dataset]))
    return fig, panels


def _exact(part: pd.DataFrame) -> np.ndarray:
    """Rows whose code has exact zeros (FVU at L0 = FVU); all rows when FVU at L0 is absent."""
    if "fvu_at_l0_mean" not in part:
        return np.ones(len(part), dtype=bool)
    return exact_zeros(part).to_numpy(bool)


def _clip_outliers(ax: Axes, part: pd.DataFrame, metric: str,
                   styles: dict[str, dict[str, object]], labels: list) -> list:
    """Keep far outliers of ``<metric>_mean`` from stretching the y axis of ``ax``
    (:func:`sae.figures.common.robust_limits`: Tukey's far-out fence, 3 IQR beyond the
    quartiles): the axis holds the other points, each outlier is an arrow at the edge with its
    value (:func:`sae.figures.common.mark_outside`). Returns ``labels`` without the outliers'."""
    y = part[f"{metric}_mean"].to_numpy(float)
    limits = robust_limits(y, part.get(f"{metric}_std"))
    if limits is None:
        return labels
    mark_outside(ax, part["l0_mean_mean"].to_numpy(float), y,
                 [styles[m]["color"] for m in part["model"]], limits, names=part["model"])
    return [label for label in labels if limits[0] <= label[1] <= limits[1]]


@styled
def fvu_l0_pareto(summary: pd.DataFrame) -> Figure:
    """Reconstruction against sparsity: mean FVU over mean L0, one line per model.

    Args:
        summary: one row per configuration with columns ``dataset``, ``model``, ``param``,
            ``value``, ``l0_mean_mean``, ``l0_mean_std``, ``fvu_mean``, ``fvu_std`` and,
            optionally, ``fvu_at_l0_mean`` / ``_std`` (means and standard deviations over seeds;
            NaN std = one seed, drawn without a bar).

    One column per dataset. The main axes (top; ``Axes.get_label()`` ``"main:<dataset>"``) show
    only configurations whose L0 means what it says, codes with exact zeros (FVU at L0 = FVU),
    with their Pareto frontier (dashed grey: no other configuration has both fewer active units
    and lower FVU). A code without exact zeros (the KL-SAE) would sit lowest there with an FVU
    that also uses units its L0 does not count, so it gets its own small axes below
    (``"loose:<dataset>"``): solid, its FVU; dashed with hollow points, its FVU at L0. Points are
    labelled with their λ or k where the label has room (line ends always). L0 is on a log axis
    when every mean L0 is positive. A far outlier of the main axes (an FVU more than 3 IQR above
    the upper quartile, :func:`sae.figures.common.robust_limits`) does not stretch them: it is
    an arrow at the top edge with its model and FVU written.
    """
    data = summary.dropna(subset=["l0_mean_mean", "fvu_mean"])
    datasets = list(dict.fromkeys(summary["dataset"]))
    exact = _exact(data)
    has_loose = bool((~exact).any())
    n = max(len(datasets), 1)
    fig = Figure(figsize=(5.6 * n + 2.6, 6.6 if has_loose else 4.5), layout="constrained")
    grid = fig.subplots(2 if has_loose else 1, n, squeeze=False,
                        gridspec_kw={"height_ratios": [2.6, 1.0]} if has_loose else None)
    _title(fig, f"Reconstruction vs sparsity (lower left is better)\n({_seeds_note(data)})")
    if not datasets:
        empty_note(grid[0, 0], "no finished runs")
    styles = _styles(summary)
    pending = []  # (axes, its points to label)
    for j, dataset in enumerate(datasets):
        ax = grid[0, j]
        ax.set_label(f"main:{dataset}")
        ax.set(title=f"{dataset}: codes with exact zeros", xlabel="mean L0 (active units per "
               "input)", ylabel="FVU (= FVU at L0)")
        in_data = (data["dataset"] == dataset).to_numpy()
        part = data[in_data & exact]
        if part.empty:
            empty_note(ax, "no finished runs with exact zeros")
        else:
            labels = _metric_vs_l0(ax, part, "fvu", styles)
            l0, err = part["l0_mean_mean"].to_numpy(float), part["fvu_mean"].to_numpy(float)
            order = _pareto_front(l0, err)
            ax.plot(l0[order], err[order], color="0.4", ls="--", lw=1.0,
                    drawstyle="steps-post", zorder=0, label="Pareto frontier")
            pending.append((ax, _clip_outliers(ax, part, "fvu", styles, labels)))
        if not has_loose:
            continue
        inset = grid[1, j]
        inset.set_label(f"loose:{dataset}")
        loose = data[in_data & ~exact]
        inset.set(title="no exact zeros (KL-SAE): its L0 leaves out units that reconstruct",
                  xlabel="mean L0", ylabel="FVU")
        inset.title.set_fontsize("small")
        if loose.empty:
            empty_note(inset, "none in this dataset")
            continue
        # one L0 scale for both panels of a dataset: the same x, the same place
        inset.sharex(ax)
        labels = _metric_vs_l0(inset, loose, "fvu", styles, suffix=": FVU")
        loose_at_l0 = loose.assign(fvu_mean=loose["fvu_at_l0_mean"],
                                   fvu_std=loose.get("fvu_at_l0_std", np.nan))
        _metric_vs_l0(inset, loose_at_l0, "fvu", styles, ls="--", hollow=True,
                      suffix=": FVU at L0")
        _log_l0_axis(inset, data[in_data])
        pending.append((inset, labels))
    _figure_legend(fig, list(grid.ravel()))
    place_labels(fig, pending)  # once the legend has taken its width
    return fig


@styled
def probe_vs_l0(summary: pd.DataFrame, raw_probe: dict[str, float] | None = None,
                probe_loss: str = "softmax") -> Figure:
    """Linear-probe test accuracy of the codes against mean L0, one line per model.

    Args:
        summary: one row per configuration with columns ``dataset``, ``model``, ``param``,
            ``value``, ``l0_mean_mean``, ``l0_mean_std`` and ``<metric>_mean`` /
            ``<metric>_std`` for the probe's metric (``probe_accuracy`` for the softmax probe,
            ``probe_sparsemax_accuracy`` for the sparsemax one).
        raw_probe: dataset -> the same probe's accuracy on the raw input, drawn as a dashed
            horizontal line.
        probe_loss: which probe: ``"softmax"`` or ``"sparsemax"``.
    """
    metric = PROBE_METRICS[probe_loss][0]
    raw_probe = raw_probe or {}
    fig, panels = _l0_panels(
        summary, metric, f"Linear-probe accuracy of the codes vs sparsity ({probe_loss} loss)",
        "probe test accuracy")
    styles = _styles(summary)
    pending = []  # (axes, its points to label)
    for ax, dataset, part in panels:
        if raw_probe.get(dataset) is not None and math.isfinite(raw_probe[dataset]):
            ax.axhline(raw_probe[dataset], color="0.3", ls="--", lw=1.0,
                       label=f"raw input ({100 * raw_probe[dataset]:.1f}%)")
        if part.empty:
            empty_note(ax, "no probe results")
            continue
        pending.append((ax, _metric_vs_l0(ax, part, metric, styles)))
        ax.yaxis.set_major_formatter(PercentFormatter(1.0))
    _figure_legend(fig, [ax for ax, _, _ in panels])
    place_labels(fig, pending)  # once the legend has taken its width
    return fig


@styled
def truth_vs_l0(summary: pd.DataFrame) -> Figure:
    """Against known features, by mean L0: feature recovery (left) and how each input's L0
    follows its true number of features, Spearman(L0, true L0) (right), one line per model.

    Args:
        summary: one row per configuration with ``dataset``, ``model``, ``param``, ``value``,
            ``l0_mean_mean`` / ``_std`` and ``gt_recovery``, ``gt_l0_spearman`` and
            ``gt_l0_energy`` as ``_mean`` / ``_std``.

    The dashed line on the right is what an L0 ranked by the input's energy alone would score
    (a property of the data): a mechanism below it follows the true L0 less than the energy
    does, which every shared threshold tracks for free.
    """
    data = summary.dropna(subset=["l0_mean_mean"])
    fig = Figure(figsize=(2 * 5.6 + 2.6, 4.3), layout="constrained")
    axes = list(np.ravel(fig.subplots(1, 2, squeeze=False)))
    _title(fig, f"Against the known features, by sparsity\n({_seeds_note(data)})")
    styles = _styles(summary)
    pending = []
    panels = (("gt_recovery", "feature recovery (best cosine > 0.9)"),
              ("gt_l0_spearman", "Spearman(L0, true L0) over test inputs"))
    for ax, (metric, ylabel) in zip(axes, panels, strict=True):
        part = data.dropna(subset=[f"{metric}_mean"]) if f"{metric}_mean" in data else data[:0]
        ax.set(xlabel="mean L0 (active units per input)", ylabel=ylabel)
        if part.empty:
            empty_note(ax, "no scores against known features")
            continue
        if metric == "gt_l0_spearman" and "gt_l0_energy_mean" in part:
            energy = part["gt_l0_energy_mean"].dropna()
            if len(energy):
                ax.axhline(float(energy.mean()), color="0.3", ls="--", lw=1.0,
                           label=f"L0 ranked by energy ({energy.mean():.3f})")
        pending.append((ax, _metric_vs_l0(ax, part, metric, styles)))
        if metric == "gt_recovery":
            ax.yaxis.set_major_formatter(PercentFormatter(1.0))
    _figure_legend(fig, axes)
    place_labels(fig, pending)  # once the legend has taken its width
    return fig


@styled
def l0_distributions(l0: pd.DataFrame, max_cols: int = 3) -> Figure:
    """Per-sample L0 distributions: one panel per dataset and model, one outline per λ or k.

    Args:
        l0: long form, one row per test sample and run, with columns ``dataset``, ``model``,
            ``config`` (the λ or k as text) and ``l0``; seeds of a configuration are pooled.
        max_cols: panels per row; a dataset's models wrap onto further rows, and each dataset
            starts a new row (its name leads every panel title).

    Every panel shares one L0 axis (the same bins), so distributions compare across models;
    each keeps its own y scale, as TopK's spike at k would flatten every other outline. Each
    outline is the fraction of test inputs per L0 bin.
    """
    panels = list(dict.fromkeys(zip(l0["dataset"], l0["model"], strict=True)))
    if not panels:
        fig = Figure(figsize=(6.0, 3.0), layout="constrained")
        _title(fig, "L0 distributions")
        empty_note(fig.add_subplot(), "no per-sample L0 available")
        return fig
    datasets = list(dict.fromkeys(d for d, _ in panels))
    per_dataset = {d: [m for dd, m in panels if dd == d] for d in datasets}
    cols = min(max(int(max_cols), 1), max(len(m) for m in per_dataset.values()))
    slots = []  # (row, column, dataset, model)
    row = 0
    for dataset in datasets:
        for i, model in enumerate(per_dataset[dataset]):
            slots.append((row + i // cols, i % cols, dataset, model))
        row += math.ceil(len(per_dataset[dataset]) / cols)
    fig = Figure(figsize=(3.9 * cols + 0.9, 2.9 * row + 0.9), layout="constrained")
    grid = fig.subplots(row, cols, squeeze=False, sharex=True)
    edges, _ = l0_edges(l0["l0"].to_numpy(float), max_bins=60)
    used = set()
    for r, c, dataset, model in slots:
        ax = grid[r, c]
        used.add((r, c))
        part = l0[(l0["dataset"] == dataset) & (l0["model"] == model)]
        ax.set_title(f"{dataset} · {model}", fontsize="medium")
        values = part["l0"].to_numpy(float)
        configs = list(dict.fromkeys(part["config"]))
        shades = sns.color_palette("viridis", len(configs))
        for config, shade in zip(configs, shades, strict=True):
            v = values[(part["config"] == config).to_numpy()]
            counts, _ = np.histogram(v, bins=edges)
            ax.stairs(counts / max(v.size, 1), edges, color=shade, lw=1.4,
                      label=f"{config} (mean {v.mean():.3g})")
        ax.legend(fontsize="small", title="λ / k", title_fontsize="small")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True, nbins=6))
        ax.tick_params(labelbottom=True)
    for r in range(row):
        for c in range(cols):
            if (r, c) not in used:
                fig.delaxes(grid[r, c])
    fig.supxlabel("L0 (active units per test input; one scale for every panel)")
    fig.supylabel("fraction of test inputs")
    _title(fig, "L0 distributions per model (test set, seeds pooled)")
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
    _title(fig, "Mean L0 per class (colour: relative to the row's mean over classes)")
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
    _title(fig, "Does L0 follow the ink? corr(L0, Σᵢ xᵢ) over test inputs (bars: mean "
           "over seeds, dots: single seeds)")
    if not datasets:
        empty_note(fig.add_subplot(), "no finished runs")
        return fig
    styles = _styles(results)
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
            ax.bar(x, finite.mean(), color=styles[model]["color"], alpha=0.75, width=0.7)
            ax.scatter(np.full(finite.size, x), finite, color="k", s=8, zorder=3)
        ax.set_xticks(np.arange(len(keys)), [f"{m} {c}" for m, c in keys], rotation=40,
                      ha="right", rotation_mode="anchor", fontsize="small")
        ax.axhline(0, color="0.3", lw=0.8)
        # fixed limits: a last configuration with only a note (no bar) still gets its full
        # slot, so the note stays inside the axes
        ax.set(xlim=(-0.7, len(keys) - 0.3), ylim=(-1, 1), ylabel="Pearson r",
               title=str(dataset))
    return fig
