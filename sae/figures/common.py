"""What every figure of :mod:`sae.figures` shares: style, resolution, output, small helpers.

Every figure is built on ``matplotlib.figure.Figure`` directly, never through ``pyplot``: nothing
enters pyplot's global figure registry, no GUI backend is needed, and figures can be made from a
training callback without leaking memory. Nothing in the package shows or saves a figure except
:func:`save_png`; :func:`figure_to_png_bytes` and :func:`figure_to_rgb` serve the HTML pages and
TensorBoard.

Every model keeps one colour and marker in every figure (:func:`model_style`), fixed by its
kind and name, not by the other models a figure happens to hold.

Seaborn's look (``whitegrid`` style, ``paper`` context) is applied per figure through a temporary
``rc_context`` (:func:`styled`) rather than ``seaborn.set_theme``, so importing the package changes
no global state.
"""

from __future__ import annotations

import colorsys
import functools
import io
import math
import os
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import matplotlib as mpl
import matplotlib.colors as mcolors
import numpy as np
import seaborn as sns
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from sae.io import atomic_file

__all__ = ["DPI", "MODEL_STYLES", "drop_unused", "empty_note", "figure_to_png_bytes",
           "figure_to_rgb", "grid_shape", "l0_edges", "model_style", "save_png", "seeds_note",
           "styled", "tile_centre", "tile_mosaic"]

DPI = 150  # one resolution for every saved figure, so PNGs of different runs compare 1:1

_F = TypeVar("_F", bound=Callable[..., Figure])


# --------------------------------------------------------------------------- style and output


def styled(fn: _F) -> _F:
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
    try:
        with atomic_file(path) as fh:
            fig.savefig(fh, format="png", dpi=dpi)
    finally:
        fig.clear()
    return Path(path)


# --------------------------------------------------------------------------- model styles

# kind -> (colour, marker): one look per model kind in every figure, whatever else a figure
# shows. Colour-blind-safe hues of matplotlib's tab10; related mechanisms sit near each other
# (sparsemax / entmax warm, topk / batchtopk green-teal) and markers differ as well, so models
# stay apart in grey print.
MODEL_STYLES: dict[str, tuple[str, str]] = {
    "l1": ("#1f77b4", "o"),
    "kl": ("#7f7f7f", "s"),
    "sparsemax": ("#d62728", "D"),
    "entmax": ("#ff7f0e", "^"),
    "topk": ("#2ca02c", "v"),
    "batchtopk": ("#17becf", "P"),
    "jumprelu": ("#9467bd", "X"),
}

# the variants the published comparisons show, each a look of its own that no hash can bring
# near another's (colour, marker, line style)
NAMED_STYLES: dict[str, tuple[str, str, object]] = {
    "sparsemax-attention": ("#e377c2", "*", "-"),
    "sparsemax-batch": ("#8c564b", "s", "--"),
    "sparsemax-normalized": ("#ff9896", "d", ":"),
    "sparsemax-global": ("#7b0f12", "p", "-."),
    "jumprelu-shared": ("#c5b0d5", "h", "--"),
    "jumprelu-shared-gain": ("#4b2a75", "8", "-."),
    "batchtopk-ste": ("#0b6e78", "H", "--"),
}

# a variant of a kind (a sweep entry named 'sparsemax-learned'): its kind's hue made lighter or
# darker, with its own marker and line style, each picked from these by a hash of its name
_VARIANT_SHADES = (-0.3, -0.24, -0.18, -0.12, -0.06, 0.06, 0.12, 0.18, 0.24, 0.3)
_VARIANT_MARKERS = ("<", ">", "p", "h", "*", "d", "8", "H")
_VARIANT_LINES = ("--", "-.", ":", (0, (5, 1, 1, 1)))
# models of an unknown kind: neutral-ish colours unused by MODEL_STYLES
_OTHER_COLOURS = ("#8c564b", "#e377c2", "#bcbd22", "#393b79", "#637939", "#843c39")


def model_style(name: str, kind: str | None = None) -> dict[str, object]:
    """Colour, marker and line style of a model in every figure: ``{"color", "marker", "ls"}``.

    A function of the model's own name (and kind) only, never of which other models a figure
    holds, so a model looks the same in every comparison and preset. ``kind`` is the ``sae.run``
    model behind a sweep entry; when it is not given, the name is taken as the kind, or the part
    before its first ``-`` (``sparsemax-learned`` -> ``sparsemax``). A model named as its kind
    gets the kind's style of :data:`MODEL_STYLES` with a solid line; any other name (a variant)
    gets its kind's hue shaded lighter or darker, another marker and a broken line, chosen by a
    stable hash of the name (CRC-32, the same in every process), except the variants of
    :data:`NAMED_STYLES`, which the published comparisons show and which each have a look of
    their own. An unknown kind gets a colour of its own, also by hash.
    """
    name = str(name)
    if name in NAMED_STYLES:
        colour, marker, ls = NAMED_STYLES[name]
        return {"color": colour, "marker": marker, "ls": ls}
    if kind is None or str(kind) not in MODEL_STYLES:
        kind = name if name in MODEL_STYLES else name.split("-")[0]
    kind = str(kind)
    def pick(options: tuple, salt: str):
        # one independent hash per property, so two names sharing a shade rarely share more
        return options[zlib.crc32(f"{salt}:{name}".encode()) % len(options)]

    if kind not in MODEL_STYLES:
        return {"color": pick(_OTHER_COLOURS, "colour"), "marker": pick(_VARIANT_MARKERS, "marker"),
                "ls": "-"}
    colour, marker = MODEL_STYLES[kind]
    if name == kind:
        return {"color": colour, "marker": marker, "ls": "-"}
    h, lightness, sat = colorsys.rgb_to_hls(*mcolors.to_rgb(colour))
    lightness = min(max(lightness + pick(_VARIANT_SHADES, "shade"), 0.15), 0.85)
    return {"color": mcolors.to_hex(colorsys.hls_to_rgb(h, lightness, sat)),
            "marker": pick(_VARIANT_MARKERS, "marker"), "ls": pick(_VARIANT_LINES, "line")}


def seeds_note(n_seeds) -> str:
    """What a figure's error bars are, as the seed counts behind it allow: 'mean ± std over
    seeds' only when every point has at least two seeds; 'one seed: no error bars' when none
    has; otherwise which points have bars."""
    counts = [int(n) for n in n_seeds if n == n]  # NaN (unknown) left out
    if counts and min(counts) >= 2:
        return "mean ± std over seeds"
    if not counts or max(counts) <= 1:
        return "one seed per point: no error bars"
    return "mean ± std over seeds where a point has ≥ 2; one seed: no bar"


# --------------------------------------------------------------------------- small helpers


def grid_shape(n: int, max_cols: int | None = None) -> tuple[int, int]:
    """Rows and columns of a near-square grid holding ``n`` cells (at least 1 x 1)."""
    n = max(int(n), 1)
    cols = math.ceil(math.sqrt(n))
    if max_cols is not None:
        cols = min(cols, max_cols)
    return math.ceil(n / cols), cols


def empty_note(ax: Axes, text: str) -> None:
    """Write ``text`` in the middle of an axes that has nothing to plot."""
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, color="0.35")
    ax.set_xticks([])
    ax.set_yticks([])


def drop_unused(fig: Figure, axes: np.ndarray, used: int) -> list[Axes]:
    """Remove grid axes beyond the first ``used`` so axis counts equal panel counts."""
    flat = list(np.ravel(axes))
    for ax in flat[used:]:
        fig.delaxes(ax)
    return flat[:used]


def l0_edges(values: np.ndarray, max_bins: int = 100) -> tuple[np.ndarray, int]:
    """Integer-aligned bin edges for L0 values ``[N]`` and the bin width in units.

    Bins are one unit wide (centred on integers) up to about ``max_bins`` bins; wider codes get
    bins of a whole number of units so the bars stay readable.
    """
    # At least 0..4 on the axis, so a collapsed code (L0 = 0 everywhere) is a narrow bar at 0
    # with integer ticks rather than one bar filling the axes.
    top = max(int(np.nanmax(values)) if values.size else 0, 4)
    width = max(1, math.ceil((top + 1) / max_bins))
    edges = np.arange(-0.5, top + width + 0.5, width, dtype=float)
    return edges, width


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


def tile_centre(i: int, cols: int, shape: tuple[int, int], gap: int, band: int):
    """Data coordinates (x, y) of the centre of tile ``i``'s label band in a ``tile_mosaic``."""
    h, w = shape
    y0 = (i // cols) * (band + h + gap)
    return (i % cols) * (w + gap) + (w - 1) / 2, y0 + (band - 1) / 2
