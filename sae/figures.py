"""Pure plotting functions: numpy arrays in, a ``matplotlib.figure.Figure`` out.

Every figure is built on ``matplotlib.figure.Figure`` directly, never through ``pyplot``: nothing
enters pyplot's global figure registry, no GUI backend is needed, and figures can be made from a
training callback without leaking memory. Nothing here shows or saves a figure except
:func:`save_png`; :func:`figure_to_png_bytes` and :func:`figure_to_rgb` serve the report and
TensorBoard.

Seaborn's look (``whitegrid`` style, ``paper`` context) is applied per figure through a temporary
``rc_context`` rather than ``seaborn.set_theme``, so importing this module changes no global state.

Vocabulary used in titles and labels:

- *firing frequency* of a unit: the fraction of inputs on which its code value is non-zero;
- *dead* unit: firing frequency exactly 0 over the evaluated inputs;
- *L0* of an input: how many units are non-zero in its code.

Inputs are assumed finite. The degenerate cases a young or collapsed SAE produces (every unit
dead, L0 = 0 everywhere, a single unit, a single class, classes without samples, all-zero arrays)
give a figure that says so instead of raising.
"""

from __future__ import annotations

import functools
import io
import math
import os
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

import matplotlib as mpl
import numpy as np
import pandas as pd
import seaborn as sns
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import LogNorm, Normalize, PowerNorm
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.ticker import (
    FuncFormatter,
    LogLocator,
    MaxNLocator,
    NullFormatter,
    PercentFormatter,
)

__all__ = [
    "DPI",
    "activation_frequency_grid",
    "class_l0_heatmap",
    "class_unit_heatmap",
    "decoder_atoms",
    "feature_density_histogram",
    "figure_to_png_bytes",
    "figure_to_rgb",
    "fvu_l0_pareto",
    "l0_distributions",
    "l0_ink_correlation",
    "probe_vs_l0",
    "reconstructions",
    "save_png",
    "tile_mosaic",
    "sparsity_histogram",
    "training_curves",
]

ATOM_GAP = 2  # pixels between decoder-atom tiles
DPI = 150  # one resolution for every saved figure, so PNGs of different runs compare 1:1

_DEAD_COLOUR = "#d62728"  # red: outside viridis, so a dead unit never looks like a rare one
_PAD_COLOUR = "#ececec"  # grid cells that hold no unit
_TRAIN_COLOUR = "C0"
_VAL_COLOUR = "C1"
_DENSE_THRESHOLD = 0.5  # matches metrics.dense_fraction: fires on more than half of the inputs

_F = TypeVar("_F", bound=Callable[..., Figure])


# --------------------------------------------------------------------------- style and output


def _styled(fn: _F) -> _F:
    """Build the figure inside seaborn's paper style without touching global rcParams."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        rc = {**sns.axes_style("whitegrid"), **sns.plotting_context("paper", font_scale=1.15)}
        rc["image.interpolation"] = "nearest"  # pixels stay pixels in atoms and heatmaps
        with mpl.rc_context(rc):
            return fn(*args, **kwargs)

    return wrapper  # type: ignore[return-value]


def figure_to_png_bytes(fig: Figure, dpi: int = DPI) -> bytes:
    """Render ``fig`` to PNG bytes (the figure stays open)."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    return buf.getvalue()


def figure_to_rgb(fig: Figure, dpi: int = DPI) -> np.ndarray:
    """Render ``fig`` to an RGB array ``[height, width, 3]`` uint8 (TensorBoard ``HWC`` image)."""
    old_dpi = fig.dpi
    fig.set_dpi(dpi)
    try:
        canvas = FigureCanvasAgg(fig)
        canvas.draw()
        return np.asarray(canvas.buffer_rgba())[..., :3].copy()
    finally:
        fig.set_dpi(old_dpi)


def save_png(fig: Figure, path: str | os.PathLike[str], dpi: int = DPI) -> Path:
    """Save ``fig`` as a PNG at ``path`` (parent folders created) and release the figure.

    The file is written to a temporary name and renamed, so a reader (the report, TensorBoard)
    never sees half a PNG. The figure is cleared afterwards: callbacks make many figures and
    should not keep their artists alive.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}-", suffix=".png.tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            fig.savefig(fh, format="png", dpi=dpi)
        os.chmod(tmp, 0o644)  # mkstemp creates 0600; figures are meant to be shared
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    finally:
        fig.clear()
    return path


# --------------------------------------------------------------------------- small helpers


def _grid_shape(n: int, max_cols: int | None = None) -> tuple[int, int]:
    """Rows and columns of a near-square grid holding ``n`` cells (at least 1 x 1)."""
    n = max(int(n), 1)
    cols = math.ceil(math.sqrt(n))
    if max_cols is not None:
        cols = min(cols, max_cols)
    return math.ceil(n / cols), cols


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


def _empty_note(ax: Axes, text: str) -> None:
    """Write ``text`` in the middle of an axes that has nothing to plot."""
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, color="0.35")
    ax.set_xticks([])
    ax.set_yticks([])


def _drop_unused(fig: Figure, axes: np.ndarray, used: int) -> list[Axes]:
    """Remove grid axes beyond the first ``used`` so axis counts equal panel counts."""
    flat = list(np.ravel(axes))
    for ax in flat[used:]:
        fig.delaxes(ax)
    return flat[:used]


def tile_mosaic(tiles: np.ndarray, cols: int, gap: int = 1, band: int = 0) -> np.ndarray:
    """Lay ``[k, h, w]`` tiles out row by row, ``cols`` per row, as one NaN-padded image.

    Tile ``i`` sits at row ``i // cols``, column ``i % cols``; tiles are ``gap`` pixels apart and
    each has ``band`` empty rows above it (room for a label). The result has shape
    ``[rows * (band + h + gap) - gap, cols * (w + gap) - gap]``; every pixel outside a tile is
    NaN. One image with k tiles draws far faster than k axes with one tile each.
    """
    tiles = np.asarray(tiles, dtype=float)
    k, h, w = tiles.shape
    cols = max(min(int(cols), k), 1)
    rows = max(math.ceil(k / cols), 1)
    pitch_y, pitch_x = band + h + gap, w + gap
    out = np.full((rows * pitch_y - gap, cols * pitch_x - gap), np.nan)
    for i, tile in enumerate(tiles):
        y, x = (i // cols) * pitch_y + band, (i % cols) * pitch_x
        out[y:y + h, x:x + w] = tile
    return out


def _tile_centre(i: int, cols: int, shape: tuple[int, int], gap: int, band: int):
    """Data coordinates (x, y) of the centre of tile ``i``'s label band in a ``tile_mosaic``."""
    h, w = shape
    y0 = (i // cols) * (band + h + gap)
    return (i % cols) * (w + gap) + (w - 1) / 2, y0 + (band - 1) / 2


# --------------------------------------------------------------------------- sparsity histogram


def _l0_edges(l0: np.ndarray) -> tuple[np.ndarray, int]:
    """Integer-aligned bin edges for L0 values ``[N]`` and the bin width in units.

    Bins are one unit wide (centred on integers) up to ~100 bins; wider codes get bins of a
    whole number of units so the bars stay readable.
    """
    # At least 0..4 on the axis, so a collapsed code (L0 = 0 everywhere) is a narrow bar at 0
    # with integer ticks rather than one bar filling the axes.
    top = max(int(l0.max()) if l0.size else 0, 4)
    width = max(1, math.ceil((top + 1) / 100))
    edges = np.arange(-0.5, top + width + 0.5, width, dtype=float)
    return edges, width


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


@_styled
def sparsity_histogram(
    l0: np.ndarray, labels: np.ndarray | None = None, class_names: list[str] | None = None
) -> Figure:
    """Histogram of per-sample L0, overall and (with ``labels``) one facet per class.

    Args:
        l0: ``[N]`` number of active units of each input.
        labels: ``[N]`` integer class of each input, or None for the overall histogram only.
        class_names: ``[C]`` names of classes ``0..C-1``; classes without samples still get a
            facet (marked "no samples") so facets line up across runs.

    Returns:
        A figure with ``1`` axes, or ``1 + C`` axes (overall first) when labels are given; the
        class facets overlay the overall distribution in grey for comparison.
    """
    l0 = np.asarray(l0).ravel()
    edges, width = _l0_edges(l0)
    xlabel = "L0 (active units per input)" + (f", bins of {width}" if width > 1 else "")
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
    rows, cols = _grid_shape(1 + len(classes), max_cols=4)
    fig = Figure(figsize=(3.3 * cols, 2.5 * rows + 0.5), layout="constrained")
    axes = _drop_unused(fig, fig.subplots(rows, cols, sharex=True, sharey=True, squeeze=False),
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
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.tick_params(labelbottom=True)
    fig.supxlabel(xlabel)
    fig.supylabel("fraction of samples in panel")
    fig.suptitle("Sparsity per class: active units per input")
    return fig


# --------------------------------------------------------------------------- unit frequency grid


def _log_limits(freq: np.ndarray) -> tuple[float, float]:
    """Colour limits for a log scale over the positive frequencies (sane when none exist)."""
    alive = freq[freq > 0]
    if alive.size == 0:
        return 1e-4, 1.0
    lo, hi = float(alive.min()), float(alive.max())
    if lo == hi:  # one unit, or all units equally busy: give the scale a decade of room
        lo = hi / 10
    return lo, hi


@_styled
def activation_frequency_grid(freq: np.ndarray) -> Figure:
    """Per-unit firing frequency ``[H]`` as a near-square grid of cells, log colour scale.

    Unit ``j`` sits at row ``j // cols``, column ``j % cols``. Dead units (frequency 0) cannot
    be shown on a log scale, so they get their own colour (red, with a white cross) named in
    the legend; cells past the last unit are light grey.
    """
    freq = np.asarray(freq, dtype=float).ravel()
    h = freq.size
    rows, cols = _grid_shape(h)
    lo, hi = _log_limits(freq)
    # Dead units are set below vmin so the colormap paints them with its "under" colour;
    # padding is NaN so it takes the "bad" colour.
    cells = np.full(rows * cols, np.nan)
    cells[:h] = np.where(freq > 0, freq, lo / 10)
    cmap = mpl.colormaps["viridis"].with_extremes(under=_DEAD_COLOUR, bad=_PAD_COLOUR)

    fig = Figure(figsize=(6.4, 5.6), layout="constrained")
    ax = fig.add_subplot()
    im = ax.imshow(cells.reshape(rows, cols), cmap=cmap, norm=LogNorm(lo, hi))
    ax.grid(False)
    dead = np.flatnonzero(freq <= 0)
    if dead.size and cols <= 64:  # a cross adds a cue that does not rely on colour vision
        size = (0.5 * 330 / cols) ** 2
        ax.scatter(dead % cols, dead // cols, marker="x", s=size, c="white", lw=0.8)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True, nbins=8))
    ax.yaxis.set_major_locator(MaxNLocator(integer=True, nbins=8))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{int(round(v)) * cols}"))
    ax.set(xlabel="column (unit index = row start + column)", ylabel="row start (unit index)")
    fig.colorbar(im, ax=ax, label="firing frequency (fraction of inputs, log scale)")
    handles = [Patch(color=_DEAD_COLOUR, label=f"dead unit (never fired): {dead.size}")]
    if rows * cols > h:
        handles.append(Patch(facecolor=_PAD_COLOUR, edgecolor="0.6", label="no unit"))
    fig.legend(handles=handles, loc="outside lower center", ncols=len(handles), frameon=False)
    share = 100 * dead.size / h if h else 0.0
    fig.suptitle(f"Unit firing frequency: {h:,} units, {dead.size:,} dead ({share:.1f}%)")
    return fig


# --------------------------------------------------------------------------- class x unit heatmap


@_styled
def class_unit_heatmap(
    class_freq: np.ndarray, class_names: list[str] | None = None, max_units: int = 128
) -> Figure:
    """Firing frequency of each unit within each class, as a class x unit heatmap.

    Args:
        class_freq: ``[C, H]`` fraction of class ``c``'s inputs on which unit ``j`` fires.
        class_names: ``[C]`` row labels (missing ones fall back to the class index).
        max_units: show at most this many units: the most frequent ones.

    Units are ordered by overall frequency, most frequent first, where overall is the mean over
    classes (each class weighs the same, as the class sizes are not known here; ties keep unit
    order). The colour scale is square-root so rare units remain visible next to busy ones and
    zero stays white.
    """
    class_freq = np.atleast_2d(np.asarray(class_freq, dtype=float))
    c, h = class_freq.shape
    k = min(max(int(max_units), 1), h)
    order = np.argsort(-class_freq.mean(axis=0), kind="stable")[:k] if c else np.arange(k)
    shown = class_freq[:, order]
    names = [
        class_names[i] if class_names is not None and i < len(class_names) else str(i)
        for i in range(c)
    ]

    width = min(max(6.0, 0.075 * k + 2.5), 16.0)
    fig = Figure(figsize=(width, 0.32 * max(c, 1) + 2.2), layout="constrained")
    ax = fig.add_subplot()
    title = f"Firing frequency per class: {k} most frequent of {h:,} units"
    fig.suptitle(title)
    if c == 0 or k == 0:
        _empty_note(ax, "no classes" if c == 0 else "no units")
        return fig
    vmax = float(shown.max()) if shown.max() > 0 else 1.0
    cmap = sns.color_palette("rocket_r", as_cmap=True)
    im = ax.imshow(shown, aspect="auto", cmap=cmap, norm=PowerNorm(0.5, vmin=0, vmax=vmax))
    ax.grid(False)
    step = max(1, math.ceil(k / 40))  # about 40 readable unit labels at most
    ax.set_xticks(np.arange(0, k, step), [str(j) for j in order[::step]], rotation=90,
                  fontsize="x-small")
    ax.set_yticks(np.arange(c), names)
    ax.set(xlabel="unit index (ordered by overall firing frequency, most frequent first)",
           ylabel="class")
    fig.colorbar(im, ax=ax, label="fraction of class inputs\n(square-root scale)")
    return fig


# --------------------------------------------------------------------------- feature density


@_styled
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
    dead_x = lo - 0.6
    ax.bar(dead_x, dead, width=0.4, color=_DEAD_COLOUR, label=f"dead units (frequency 0): {dead:,}")
    ticks = list(range(lo, hi + 1))
    ax.set_xticks([dead_x, *ticks], ["dead", *(str(t) for t in ticks)])
    ax.axvline(np.log10(_DENSE_THRESHOLD), color="0.3", ls="--", lw=1.0,
               label="dense threshold (fires on 50% of inputs)")
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylim(bottom=0, top=max(1, counts.max(initial=0), dead) * 1.25)  # room for the legend
    ax.legend(loc="upper left", fontsize="small")
    return fig


# --------------------------------------------------------------------------- image tiles


@_styled
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
    rows, cols = _grid_shape(k)
    strip = shape[0] == 1
    band = 3 if strip else max(shape[0] // 3, 3)
    tile_w = 3.0 if strip else 1.15
    fig = Figure(figsize=(max(cols * tile_w + 1.4, 4.0), rows * (0.6 if strip else 1.3) + 0.9),
                 layout="constrained")
    fig.suptitle(f"Decoder atoms: {k} most frequently firing of {h:,} units")
    ax = fig.add_subplot()
    if k == 0:
        _empty_note(ax, "no units")
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
        ax.text(*_tile_centre(i, cols, shape, ATOM_GAP, band), f"#{j}: {_percent(float(freq[j]))}",
                ha="center", va="center", fontsize="x-small")
    bar = fig.colorbar(ax.images[0], ax=ax, shrink=0.5, ticks=[-1, 0, 1])
    bar.ax.set_yticklabels(["−max|w|", "0", "+max|w|"])
    bar.set_label("decoder weight\n(each tile scaled to its own max |w|)")
    fig.supxlabel("tile title: unit index and firing frequency", fontsize="small")
    return fig


@_styled
def reconstructions(
    x: np.ndarray, x_hat: np.ndarray, image_shape: Sequence[int] = (28, 28), n: int = 16
) -> Figure:
    """Inputs (top row) above their reconstructions (bottom row), shared grey scale.

    Args:
        x: ``[N, D]`` inputs.
        x_hat: ``[N, D]`` reconstructions of the same inputs.
        image_shape: ``(height, width)`` with ``height * width == D``.
        n: show the first ``min(n, N)`` pairs; more than 8 pairs wrap into further row pairs
            (each input row directly above its output row) to keep the figure page-shaped.

    Each reconstruction is labelled, just above it, with its own mean squared error.
    """
    x = np.atleast_2d(np.asarray(x, dtype=float))
    x_hat = np.atleast_2d(np.asarray(x_hat, dtype=float))
    if x.shape != x_hat.shape:
        raise ValueError(f"x {x.shape} and x_hat {x_hat.shape} differ in shape")
    k = min(max(int(n), 0), x.shape[0])
    shape = _tile_shape(x.shape[1], image_shape)
    cols = min(max(k, 1), 8)
    pairs = math.ceil(k / cols) if k else 1
    fig = Figure(figsize=(max(cols * 0.95 + 1.6, 5.5), pairs * 2.3 + 0.6), layout="constrained")
    fig.suptitle("Reconstructions: each input above its SAE output")
    ax = fig.add_subplot()
    if k == 0:
        _empty_note(ax, "no samples")
        return fig
    shown = np.concatenate([x[:k], x_hat[:k]])
    lo, hi = float(shown.min()), float(shown.max())
    hi = hi if hi > lo else lo + 1.0
    # Mosaic rows alternate inputs and outputs; padding cells (NaN) fill a short last row.
    pad = np.full((pairs * cols - k, x.shape[1]), np.nan)
    grid = np.concatenate([x[:k], pad]).reshape(pairs, cols, -1)
    grid_hat = np.concatenate([x_hat[:k], pad]).reshape(pairs, cols, -1)
    tiles = np.stack([grid, grid_hat], 1).reshape(2 * pairs * cols, *shape)
    band = max(shape[0] // 3, 3)
    cmap = mpl.colormaps["gray_r"].with_extremes(bad="white")
    im = ax.imshow(tile_mosaic(tiles, cols, gap=1, band=band), cmap=cmap, vmin=lo, vmax=hi,
                   aspect="equal")
    _image_axes(ax)
    ax.set_frame_on(False)
    for i in range(k):
        cell = (2 * (i // cols) + 1) * cols + i % cols  # the output tile of pair i
        mse = float(np.mean((x[i] - x_hat[i]) ** 2))
        ax.text(*_tile_centre(cell, cols, shape, 1, band), f"MSE {mse:.2g}",
                ha="center", va="center", fontsize="x-small")
    pitch = band + shape[0] + 1
    centres = [r * pitch + band + (shape[0] - 1) / 2 for r in range(2 * pairs)]
    ax.set_yticks(centres, ["input", "output"] * pairs)
    fig.colorbar(im, ax=ax, shrink=0.7, label="pixel value")
    return fig


# --------------------------------------------------------------------------- training curves

# (panel title, y label, ((column, legend label), ...)) in display order.
_CURVE_PANELS: tuple[tuple[str, str, tuple[tuple[str, str], ...]], ...] = (
    ("Total loss", "loss", (("train/loss", "train"), ("val/loss", "val"))),
    ("Reconstruction error", "mean squared error per pixel", (("val/mse", "val"),)),
    # train/recon is the loss's reconstruction term ‖x − x̂‖² / E‖x − x̄‖²: the batch FVU
    ("Fraction of variance unexplained", "FVU (0 = perfect)",
     (("train/recon", "train (batch)"), ("val/fvu", "val"))),
    ("Sparsity penalty term", "penalty", (("train/penalty", "train"),)),
    ("Penalty weight λ_t (warm-up)", "λ_t", (("train/lambda", "train"),)),
    ("Active units per input", "mean L0", (("train/l0", "train"), ("val/l0", "val"))),
    ("Dead units", "share of units", (("train/dead_fraction", "train"),
                                      ("val/dead_fraction", "val"))),
)


def _series(history: pd.DataFrame, column: str) -> pd.DataFrame:
    """The non-missing ``(x, y)`` pairs of one logged column, sorted by step.

    CSVLogger rows are sparse (train and val metrics land on different rows), so every
    column is read on its own.
    """
    if column not in history.columns:
        return pd.DataFrame({"x": [], "y": []})
    x = history["step"] if "step" in history.columns else pd.Series(history.index)
    frame = pd.DataFrame({
        "x": pd.to_numeric(x, errors="coerce").to_numpy(),
        "y": pd.to_numeric(history[column], errors="coerce").to_numpy(),
    })
    return frame.dropna().sort_values("x", kind="stable")


# Per-batch values that are noisy enough to need smoothing; lambda and dead fraction are not.
_NOISY = frozenset({"train/loss", "train/recon", "train/penalty", "train/l0"})


def _plot_series(ax: Axes, s: pd.DataFrame, label: str, column: str) -> None:
    """Draw one curve; long noisy train curves get a faint raw line under a rolling mean."""
    is_val = column.startswith("val/")
    colour = _VAL_COLOUR if is_val else _TRAIN_COLOUR
    if column not in _NOISY or len(s) < 200:
        ax.plot(s["x"], s["y"], color=colour, label=label, lw=1.4,
                marker="o" if is_val and len(s) <= 60 else None, ms=3)
        return
    window = max(5, len(s) // 50)
    ax.plot(s["x"], s["y"], color=colour, lw=0.6, alpha=0.3)
    smooth = s["y"].rolling(window, center=True, min_periods=1).mean()
    ax.plot(s["x"], smooth, color=colour, lw=1.4, label=f"{label} (smoothed)")


@_styled
def training_curves(history: pd.DataFrame) -> Figure:
    """Training and validation curves against the optimiser step.

    Args:
        history: Lightning CSVLogger ``metrics.csv`` as read by pandas: a ``step`` column and
            any subset of ``train/{loss,recon,penalty,lambda,l0,dead_fraction}`` and
            ``val/{loss,fvu,mse,l0,dead_fraction}``; rows are sparse (NaN where not logged).

    Returns:
        One axes per panel that has data (loss, reconstruction error, FVU, penalty, λ_t, L0,
        dead units); panels whose columns were never logged are left out. With nothing
        logged at all, a single axes says so.
    """
    panels = []
    for title, ylabel, columns in _CURVE_PANELS:
        series = [(_series(history, col), label, col) for col, label in columns]
        series = [s for s in series if len(s[0])]
        if series:
            panels.append((title, ylabel, series))
    if not panels:
        fig = Figure(figsize=(6.0, 3.0), layout="constrained")
        fig.suptitle("Training curves")
        _empty_note(fig.add_subplot(), "no training metrics logged yet")
        return fig

    cols = min(len(panels), 4 if len(panels) >= 7 else 3)
    rows = math.ceil(len(panels) / cols)
    fig = Figure(figsize=(4.2 * cols, 3.1 * rows + 0.5), layout="constrained")
    axes = _drop_unused(fig, fig.subplots(rows, cols, squeeze=False), len(panels))
    for ax, (title, ylabel, series) in zip(axes, panels, strict=True):
        for s, label, col in series:
            _plot_series(ax, s, label, col)
        ys = np.concatenate([s["y"].to_numpy() for s, _, _ in series])
        if title.startswith("Dead"):
            ax.yaxis.set_major_formatter(PercentFormatter(1.0))
            ax.set_ylim(bottom=0)
        elif ys.min() > 0 and ys.max() / ys.min() > 30:  # losses falling by decades
            ax.set_yscale("log")
        ax.set(title=title, ylabel=ylabel, xlabel="training step")
        ax.legend(fontsize="small")
    fig.suptitle("Training curves")
    return fig


# --------------------------------------------------------------------------- sweep comparison
#
# The comparison figures take the tables of ``sae.tables`` (one row per configuration, i.e.
# dataset x model x lambda-or-k, with ``<metric>_mean`` / ``<metric>_std`` over seeds) or long-form
# frames of per-sample values, and draw one panel per dataset. A model keeps its colour in every
# comparison figure: colours follow the order in which models first appear in the frame.


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
        _empty_note(axes[0], "no finished runs")
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


@_styled
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
            _empty_note(ax, "no finished runs")
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


@_styled
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
            _empty_note(ax, "no probe results")
            continue
        _metric_vs_l0(ax, part, "probe_accuracy", colours)
        ax.yaxis.set_major_formatter(PercentFormatter(1.0))
        ax.legend(fontsize="small")
    return fig


def _l0_bins(values: np.ndarray) -> np.ndarray:
    """Integer-centred bins up to ~60 bins, wider (whole units) for wide L0 ranges."""
    top = max(int(np.nanmax(values)) if values.size else 0, 4)
    width = max(1, math.ceil((top + 1) / 60))
    return np.arange(-0.5, top + width + 0.5, width, dtype=float)


@_styled
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
        _empty_note(fig.add_subplot(), "no per-sample L0 available")
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
                _empty_note(ax, "no runs")
                continue
            values = part["l0"].to_numpy(float)
            edges = _l0_bins(values)
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


@_styled
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
        _empty_note(fig.add_subplot(), "no per-class L0 available")
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


@_styled
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
        _empty_note(fig.add_subplot(), "no finished runs")
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
