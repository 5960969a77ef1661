"""Figures of one run: what the SAE learned, from validation statistics (numpy in, Figure out).

Drawn by the figure callback during training (``figures/<kind>/epoch_<E>.png``) and shown in the
run's report: sparsity histogram, sorted unit firing frequencies, class × unit heatmap, feature
density, decoder atoms and reconstructions.

Vocabulary used in titles and labels:

- *firing frequency* of a unit: the fraction of inputs on which its code value is non-zero;
- *dead* unit: firing frequency exactly 0 over the evaluated inputs;
- *L0* of an input: how many units are non-zero in its code.

Inputs are assumed finite. The degenerate cases a young or collapsed SAE produces (every unit
dead, L0 = 0 everywhere, a single unit, a single class, classes without samples, all-zero arrays)
give a figure that says so instead of raising.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import matplotlib as mpl
import numpy as np
import seaborn as sns
from matplotlib.axes import Axes
from matplotlib.colors import PowerNorm
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.ticker import FuncFormatter, MaxNLocator

from sae.figures.common import (
    drop_unused,
    empty_note,
    grid_shape,
    l0_edges,
    styled,
    tile_centre,
    tile_mosaic,
)

__all__ = ["ATOM_GAP", "FREQ_FLOOR", "activation_frequency_curve", "class_unit_heatmap",
           "class_selectivity", "decoder_atoms", "feature_density_histogram", "reconstructions",
           "sparsity_histogram"]

ATOM_GAP = 2  # pixels between decoder-atom tiles

_DEAD_COLOUR = "#d62728"  # red: outside viridis, so a dead unit never looks like a rare one
_DENSE_THRESHOLD = 0.5  # matches metrics.dense_fraction: fires on more than half of the inputs


# --------------------------------------------------------------------------- small helpers


def _tile_shape(d: int, image_shape: Sequence[int]) -> tuple[int, int]:
    """A 2-D shape for a vector of length ``d``: ``image_shape`` if it fits, else a fallback.

    Falling back (to a square when ``d`` is a perfect square, else a 1 x d strip) keeps MLP
    decoders or non-image data plottable instead of raising.
    """
    h, w = (int(s) for s in image_shape)
    if h * w == d:
        return h, w
    side = math.isqrt(d)
    return (side, side) if side * side == d else (1, max(d, 1))


def _percent(f: float) -> str:
    """Firing frequency as a short percentage: 0.5 -> '50%', 0.00012 -> '0.012%'."""
    if f <= 0:
        return "dead"
    pct = 100 * f
    return f"{pct:.0f}%" if pct >= 10 else f"{pct:.2g}%"


def _image_axes(ax: Axes) -> None:
    """Strip ticks and grid from an axes that shows an image tile."""
    ax.set_xticks([])
    ax.set_yticks([])
    ax.grid(False)



# --------------------------------------------------------------------------- sparsity histogram


def _l0_panel(
    ax: Axes, l0: np.ndarray, edges: np.ndarray, name: str, colour: str, overall: np.ndarray | None
) -> None:
    """One facet: fraction of samples per L0 bin, the mean as a dashed line.

    ``overall`` (all samples, ``[N]``), when given, is drawn as a grey outline for reference.
    """
    if overall is not None and overall.size:
        ref, _ = np.histogram(overall, bins=edges)
        ax.stairs(ref / overall.size, edges, color="0.45", lw=1.0)
    if l0.size == 0:
        ax.set_title(f"{name}\nn = 0")
        ax.text(0.5, 0.5, "no samples", ha="center", va="center", transform=ax.transAxes)
        return
    counts, _ = np.histogram(l0, bins=edges)
    ax.stairs(counts / l0.size, edges, fill=True, color=colour, alpha=0.75)
    mean = float(l0.mean())
    ax.axvline(mean, color="k", ls="--", lw=1.0)
    ax.set_title(f"{name}\nn = {l0.size:,}, mean L0 = {mean:.3g}")


@styled
def sparsity_histogram(
    l0: np.ndarray, labels: np.ndarray | None = None, class_names: list[str] | None = None
) -> Figure:
    """Histogram of per-sample L0, overall and (with ``labels``) one facet per class.

    Args:
        l0: ``[N]`` number of active units of each input.
        labels: ``[N]`` integer class of each input, or None for the overall histogram only
            (as for a single class: data without labels).
        class_names: ``[C]`` names of classes ``0..C-1``; classes without samples still get a
            facet (marked "no samples") so facets line up across runs.

    Returns:
        A figure with ``1`` axes, or ``1 + C`` axes (overall first) when labels are given; the
        class facets overlay the overall distribution in grey for comparison.
    """
    l0 = np.asarray(l0).ravel()
    edges, width = l0_edges(l0)
    xlabel = "L0 (active units per input)" + (f", bins of {width}" if width > 1 else "")
    if labels is not None and len(set(range(len(class_names or []))) |
                                  {int(c) for c in np.unique(labels)}) < 2:
        labels = None  # one class (data without labels): its facet would repeat the overall
    if labels is None:
        fig = Figure(figsize=(6.0, 3.8), layout="constrained")
        ax = fig.add_subplot()
        _l0_panel(ax, l0, edges, "all samples", "C0", None)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set(xlabel=xlabel, ylabel="fraction of samples")
        fig.suptitle("Sparsity: active units per input")
        return fig

    labels = np.asarray(labels).ravel()
    classes = sorted(set(range(len(class_names or []))) | {int(c) for c in np.unique(labels)})
    names = [
        class_names[c] if class_names is not None and 0 <= c < len(class_names) else f"class {c}"
        for c in classes
    ]
    rows, cols = grid_shape(1 + len(classes), max_cols=4)
    fig = Figure(figsize=(3.3 * cols, 2.5 * rows + 0.5), layout="constrained")
    axes = drop_unused(fig, fig.subplots(rows, cols, sharex=True, sharey=True, squeeze=False),
                        1 + len(classes))
    # Small multiples share one colour: the facet title names the class, and the grey outline
    # of the overall distribution is the common reference.
    _l0_panel(axes[0], l0, edges, "all samples", "0.45", None)
    for i, (c, name) in enumerate(zip(classes, names, strict=True)):
        _l0_panel(axes[i + 1], l0[labels == c], edges, str(name), "C0", l0)
    handles = [Patch(color="C0", alpha=0.75, label="this class"),
               Line2D([], [], color="0.45", lw=1.0, label="all samples"),
               Line2D([], [], color="k", ls="--", lw=1.0, label="mean")]
    fig.legend(handles=handles, loc="outside right upper", frameon=False)
    for ax in axes:
        # few ticks: a narrow facet of a wide L0 range otherwise runs its labels together
        ax.xaxis.set_major_locator(MaxNLocator(integer=True, nbins=4))
        ax.tick_params(labelbottom=True)
    fig.supxlabel(xlabel)
    fig.supylabel("fraction of samples in panel")
    fig.suptitle("Sparsity per class: active units per input")
    return fig


# --------------------------------------------------------------------------- unit frequency curve

FREQ_FLOOR = 1e-4  # fixed bottom of every frequency axis: one firing in 10 000 inputs


@styled
def activation_frequency_curve(freq: np.ndarray, floor: float = FREQ_FLOOR) -> Figure:
    """Per-unit firing frequency ``[H]`` sorted from busiest to rarest, on a log scale.

    x is the unit's rank as a share of all units (0–100 %), y its firing frequency on a fixed
    log axis from ``floor`` to 1, so two runs' figures compare point for point, whatever their
    width or sparsity. Dead units (frequency 0, no logarithm) are drawn as a red segment on the
    floor and counted in the legend; frequencies between 0 and ``floor`` sit on the floor. The
    dense threshold (firing on more than half of the inputs) is a dashed line, and the share of
    units above it is in the legend.
    """
    freq = np.asarray(freq, dtype=float).ravel()
    h = freq.size
    fig = Figure(figsize=(6.4, 4.2), layout="constrained")
    ax = fig.add_subplot()
    dead = int((freq <= 0).sum())
    dense = int((freq > _DENSE_THRESHOLD).sum())
    share = 100 * dead / h if h else 0.0
    fig.suptitle(f"Unit firing frequency: {h:,} units, {dead:,} dead ({share:.1f}%)")
    ax.set(yscale="log", ylim=(floor, 1.0), xlim=(0, 100),
           xlabel="units, busiest first (% of all units)",
           ylabel="firing frequency (fraction of inputs, log scale)")
    if h == 0:
        empty_note(ax, "no units")
        return fig
    ranked = np.sort(freq)[::-1]
    x = 100 * (np.arange(h) + 0.5) / h
    alive = ranked > 0
    ax.plot(x[alive], np.clip(ranked[alive], floor, 1.0), color="C0", lw=1.6,
            label=f"live units: {h - dead:,}")
    if dead:
        ax.plot(x[~alive], np.full(dead, floor), color=_DEAD_COLOUR, lw=5,
                solid_capstyle="butt", label=f"dead units (frequency 0): {dead:,}")
    ax.axhline(_DENSE_THRESHOLD, color="0.3", ls="--", lw=1.0,
               label=f"dense threshold (50% of inputs): {dense:,} above")
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}%"))
    ax.legend(loc="lower left", fontsize="small")
    return fig


# --------------------------------------------------------------------------- class x unit heatmap


def class_selectivity(class_freq: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Preferred class ``[H]`` and selectivity ``[H]`` of each unit from ``[C, H]`` per-class
    firing frequencies: :func:`sae.metrics.class_selectivity` (the feature browser's
    definition), on numpy arrays."""
    # torch: the figures import without it
    import torch

    from sae.metrics import class_selectivity as selectivity_of  # torch

    class_freq = np.atleast_2d(np.asarray(class_freq, dtype=float))
    preferred, selectivity = selectivity_of(torch.from_numpy(class_freq))
    return preferred.numpy(), selectivity.numpy()


@styled
def class_unit_heatmap(
    class_freq: np.ndarray, class_names: list[str] | None = None, max_units: int = 128
) -> Figure:
    """Firing frequency of each unit within each class, units grouped by preferred class.

    Args:
        class_freq: ``[C, H]`` fraction of class ``c``'s inputs on which unit ``j`` fires.
        class_names: ``[C]`` row labels (missing ones fall back to the class index).
        max_units: show at most this many units: the most frequent ones (overall frequency =
            mean over classes; ties keep unit order).

    The shown units are ordered by preferred class (the class they fire for most), then by
    selectivity (:func:`class_selectivity`), most selective first, so each class's units form
    a block on the diagonal; thin lines separate the blocks. A strip above the heatmap shows
    each unit's selectivity. The colour scale is square-root so rare units remain visible next
    to busy ones and zero stays white.
    """
    class_freq = np.atleast_2d(np.asarray(class_freq, dtype=float))
    c, h = class_freq.shape
    k = min(max(int(max_units), 1), h)
    names = [
        class_names[i] if class_names is not None and i < len(class_names) else str(i)
        for i in range(c)
    ]
    width = min(max(6.0, 0.075 * k + 2.5), 16.0)
    fig = Figure(figsize=(width, 0.32 * max(c, 1) + 3.0), layout="constrained")
    fig.suptitle(f"Firing frequency per class: {k} most frequent of {h:,} units, "
                 "grouped by the class each fires in most often")
    if c == 0 or k == 0:
        empty_note(fig.add_subplot(), "no classes" if c == 0 else "no units")
        return fig
    frequent = np.argsort(-class_freq.mean(axis=0), kind="stable")[:k]
    preferred, selectivity = class_selectivity(class_freq[:, frequent])
    # preferred class first (dead units, -1, last), then most selective first
    order_in = np.lexsort((-np.nan_to_num(selectivity, nan=-1.0),
                           np.where(preferred < 0, c, preferred)))
    order = frequent[order_in]
    shown = class_freq[:, order]
    sel = selectivity[order_in]
    pref = preferred[order_in]

    strip, ax = fig.subplots(2, 1, sharex=True, gridspec_kw={"height_ratios": [1, 4.5]})
    strip.bar(np.arange(k), np.nan_to_num(sel), width=1.0, color="0.35")
    strip.set(ylim=(0, 1), ylabel="selectivity")
    strip.yaxis.set_major_locator(MaxNLocator(2))
    strip.grid(False)
    vmax = float(shown.max()) if shown.max() > 0 else 1.0
    cmap = sns.color_palette("rocket_r", as_cmap=True)
    im = ax.imshow(shown, aspect="auto", cmap=cmap, norm=PowerNorm(0.5, vmin=0, vmax=vmax))
    ax.grid(False)
    for boundary in np.flatnonzero(np.diff(pref)) + 0.5:
        for a in (ax, strip):
            a.axvline(boundary, color="0.5", lw=0.6)
    step = max(1, math.ceil(k / 40))  # about 40 readable unit labels at most
    ax.set_xticks(np.arange(0, k, step), [str(j) for j in order[::step]], rotation=90,
                  fontsize="x-small")
    ax.set_yticks(np.arange(c), names)
    ax.set(xlabel="unit index (grouped by the class of its highest firing rate, most "
                  "selective first)",
           ylabel="class")
    fig.colorbar(im, ax=[strip, ax], label="fraction of class inputs\n(square-root scale)")
    return fig


# --------------------------------------------------------------------------- feature density


@styled
def feature_density_histogram(freq: np.ndarray) -> Figure:
    """Histogram of log10 firing frequency ``[H]``, ten bins per decade.

    Dead units have no logarithm; they are drawn as a separate red bar labelled "dead" and
    counted in the title and legend rather than dropped silently. A dashed line marks the
    dense threshold (firing on more than half of the inputs).
    """
    freq = np.asarray(freq, dtype=float).ravel()
    h = freq.size
    alive = freq[freq > 0]
    dead = h - alive.size
    fig = Figure(figsize=(6.4, 4.0), layout="constrained")
    ax = fig.add_subplot()
    share = 100 * dead / h if h else 0.0
    fig.suptitle(f"Feature density: {h:,} units, {dead:,} dead ({share:.1f}%)")
    ax.set(xlabel="log10 firing frequency (fraction of inputs on which the unit fires)",
           ylabel="number of units")
    logs = np.log10(alive) if alive.size else np.array([-4.0])
    hi = max(0, math.ceil(float(logs.max())))
    lo = min(math.floor(float(logs.min())), hi - 1)
    counts, edges = np.histogram(np.log10(alive), bins=np.linspace(lo, hi, 10 * (hi - lo) + 1))
    ax.stairs(counts, edges, fill=True, color="C0", alpha=0.8,
              label=f"live units: {alive.size:,}")
    # log10(0) does not exist, so dead units get a bar of their own left of the axis range,
    # with its own tick, rather than vanishing from the histogram.
    # its distance from the first decade grows with the decades shown, so that the "dead" tick
    # label keeps clear of the first decade's on a crowded axis
    dead_x = lo - 0.6 - 0.06 * (hi - lo)
    ax.bar(dead_x, dead, width=0.4 * max(1.0, (hi - lo) / 8), color=_DEAD_COLOUR,
           label=f"dead units (frequency 0): {dead:,}")
    ticks = list(range(lo, hi + 1))
    ax.set_xticks([dead_x, *ticks], ["dead", *(str(t) for t in ticks)])
    ax.axvline(np.log10(_DENSE_THRESHOLD), color="0.3", ls="--", lw=1.0,
               label="dense threshold (fires on 50% of inputs)")
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylim(bottom=0, top=max(1, counts.max(initial=0), dead) * 1.25)  # room for the legend
    ax.legend(loc="upper left", fontsize="small")
    return fig


# --------------------------------------------------------------------------- image tiles


@styled
def decoder_atoms(
    decoder: np.ndarray,
    freq: np.ndarray,
    n: int = 64,
    image_shape: Sequence[int] = (28, 28),
) -> Figure:
    """Decoder columns as image tiles, most frequently firing units first.

    Args:
        decoder: ``[D, H]`` decoder weight; column ``j`` is what unit ``j`` adds to the image.
        freq: ``[H]`` firing frequency of each unit (orders the tiles, titles them).
        n: show ``min(n, H)`` tiles.
        image_shape: ``(height, width)`` with ``height * width == D``; other ``D`` fall back
            to a square or a strip.

    Each tile uses a diverging colormap centred at 0 and its own symmetric range
    ``[-max|w|, +max|w|]``: atoms differ in norm, and a shared range would blank the weak ones.
    """
    decoder = np.asarray(decoder, dtype=float)
    decoder = decoder.reshape(-1, 1) if decoder.ndim == 1 else decoder
    freq = np.asarray(freq, dtype=float).ravel()
    d, h = decoder.shape
    if freq.size != h:
        raise ValueError(f"freq has {freq.size} entries but the decoder has {h} units")
    k = min(max(int(n), 0), h)
    shape = _tile_shape(d, image_shape)
    order = np.argsort(-freq, kind="stable")[:k]
    rows, cols = grid_shape(k)
    strip = shape[0] == 1
    band = 3 if strip else max(shape[0] // 3, 3)
    tile_w = 3.0 if strip else 1.15
    fig = Figure(figsize=(max(cols * tile_w + 1.4, 4.0), rows * (0.6 if strip else 1.3) + 0.9),
                 layout="constrained")
    fig.suptitle(f"Decoder atoms: {k} most frequently firing of {h:,} units")
    ax = fig.add_subplot()
    if k == 0:
        empty_note(ax, "no units")
        return fig
    atoms = decoder[:, order].T
    scale = np.abs(atoms).max(1, keepdims=True)
    atoms = atoms / np.where(scale > 0, scale, 1.0)  # an all-zero atom stays white
    cmap = mpl.colormaps["RdBu_r"].with_extremes(bad="white")
    mosaic = tile_mosaic(atoms.reshape(k, *shape), cols, gap=ATOM_GAP, band=band)
    ax.imshow(mosaic, cmap=cmap, vmin=-1, vmax=1, aspect="equal")
    _image_axes(ax)
    ax.set_frame_on(False)
    for i, j in enumerate(order):
        ax.text(*tile_centre(i, cols, shape, ATOM_GAP, band), f"#{j}: {_percent(float(freq[j]))}",
                ha="center", va="center", fontsize="x-small")
    bar = fig.colorbar(ax.images[0], ax=ax, shrink=0.5, ticks=[-1, 0, 1])
    bar.ax.set_yticklabels(["−max|w|", "0", "+max|w|"])
    bar.set_label("decoder weight\n(each tile scaled to its own max |w|)")
    fig.supxlabel("tile title: unit index and firing frequency", fontsize="small")
    return fig


@styled
def reconstructions(
    x: np.ndarray, x_hat: np.ndarray, image_shape: Sequence[int] = (28, 28), n: int = 16,
    source: str = "inputs",
) -> Figure:
    """Inputs (top row) above their reconstructions (bottom row), on the pixels' own grey scale.

    Args:
        x: ``[N, D]`` inputs, pixel values in 0..1.
        x_hat: ``[N, D]`` reconstructions of the same inputs.
        image_shape: ``(height, width)`` with ``height * width == D``.
        n: show the first ``min(n, N)`` pairs; more than 8 pairs wrap into further row pairs
            (each input row directly above its output row) to keep the figure page-shaped.
        source: what the inputs are, for the title (e.g. "the first 16 validation inputs").

    The grey scale is the pixels' range, 0 (white) to 1 (black): a range stretched to the
    outputs' overshoot would wash the inputs out. Outputs are clipped to it for display (said
    under the figure, with the share of output pixels outside it); each reconstruction is
    labelled, just above it, with its own mean squared error (of the unclipped output).
    """
    x = np.atleast_2d(np.asarray(x, dtype=float))
    x_hat = np.atleast_2d(np.asarray(x_hat, dtype=float))
    if x.shape != x_hat.shape:
        raise ValueError(f"x {x.shape} and x_hat {x_hat.shape} differ in shape")
    k = min(max(int(n), 0), x.shape[0])
    shape = _tile_shape(x.shape[1], image_shape)
    cols = min(max(k, 1), 8)
    pairs = math.ceil(k / cols) if k else 1
    fig = Figure(figsize=(max(cols * 0.95 + 2.0, 5.5), pairs * 2.3 + 0.9), layout="constrained")
    fig.suptitle(f"Reconstructions of {source}: each input above its SAE output")
    ax = fig.add_subplot()
    if k == 0:
        empty_note(ax, "no samples")
        return fig
    outside = float(np.mean((x_hat[:k] < 0) | (x_hat[:k] > 1)))
    # Mosaic rows alternate inputs and outputs; padding cells (NaN) fill a short last row.
    pad = np.full((pairs * cols - k, x.shape[1]), np.nan)
    grid = np.concatenate([x[:k], pad]).reshape(pairs, cols, -1)
    grid_hat = np.concatenate([np.clip(x_hat[:k], 0.0, 1.0), pad]).reshape(pairs, cols, -1)
    tiles = np.stack([grid, grid_hat], 1).reshape(2 * pairs * cols, *shape)
    band = max(shape[0] // 3, 3)
    cmap = mpl.colormaps["gray_r"].with_extremes(bad="white")
    im = ax.imshow(tile_mosaic(tiles, cols, gap=1, band=band), cmap=cmap, vmin=0.0, vmax=1.0,
                   aspect="equal")
    _image_axes(ax)
    ax.set_frame_on(False)
    for i in range(k):
        cell = (2 * (i // cols) + 1) * cols + i % cols  # the output tile of pair i
        mse = float(np.mean((x[i] - x_hat[i]) ** 2))
        ax.text(*tile_centre(cell, cols, shape, 1, band), f"MSE {mse:.2g}",
                ha="center", va="center", fontsize="x-small")
    pitch = band + shape[0] + 1
    for r in range(2 * pairs):  # row names as text left of the mosaic: never clipped
        ax.text(-1.5, r * pitch + band + (shape[0] - 1) / 2, ("input", "output")[r % 2],
                ha="right", va="center", fontsize="small")
    fig.colorbar(im, ax=ax, shrink=0.7, label="pixel value (0 = white, 1 = black)")
    fig.supxlabel(f"outputs clipped to 0..1 for display ({100 * outside:.1f}% of their pixels "
                  "lie outside)", fontsize="small")
    return fig
