"""What every figure of :mod:`sae.figures` shares: style, resolution, output, small helpers.

Every figure is built on ``matplotlib.figure.Figure`` directly, never through ``pyplot``: nothing
enters pyplot's global figure registry, no GUI backend is needed, and figures can be made from a
training callback without leaking memory. Nothing in the package shows or saves a figure except
:func:`save_png`; :func:`figure_to_png_bytes` and :func:`figure_to_rgb` serve the HTML pages and
TensorBoard.

Every model keeps one colour and marker in every figure (:func:`model_style`), fixed by its
name, not by the other models a figure happens to hold, and the models of one figure have
colours told apart (:func:`model_styles`).

Seaborn's look (``whitegrid`` style, ``paper`` context) is applied per figure through a temporary
``rc_context`` (:func:`styled`) rather than ``seaborn.set_theme``, so importing the package changes
no global state.
"""

from __future__ import annotations

import functools
import io
import math
import os
import textwrap
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
from matplotlib.text import Text

from sae.system.io import atomic_file

__all__ = ["DISTINCT", "DPI", "MODEL_STYLES", "NAMED_STYLES", "colour_distance", "drop_unused",
           "empty_note", "figure_to_png_bytes", "figure_to_rgb", "fit_title", "grid_shape",
           "l0_edges", "mark_outside", "model_style", "model_styles",
           "robust_limits", "save_png", "seeds_note", "styled",
           "tile_centre", "tile_mosaic"]

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


def fit_title(fig: Figure, margin: float = 0.02) -> None:
    """Wrap the figure's title (``suptitle``) to lines that fit inside the figure, then, if one
    word is still too wide, shrink its font until it fits.

    Every figure leaves through :func:`figure_to_png_bytes`, :func:`figure_to_rgb` or
    :func:`save_png`, and each calls this first, so a title made longer after the figure was
    drawn (a run's figures get its dataset, model and epoch as a first line) is cut at neither
    end. Widths are measured, not estimated: each line is wrapped at the most characters
    whose text, drawn, is no wider than the figure less ``margin`` of its width on each side.
    """
    text = fig.get_suptitle()
    if not text:
        return
    title = next(t for t in fig.get_children() if isinstance(t, Text) and t.get_text() == text)
    canvas = fig.canvas if isinstance(fig.canvas, FigureCanvasAgg) else FigureCanvasAgg(fig)
    renderer = canvas.get_renderer()
    room = fig.bbox.width * (1 - 2 * margin)

    def width(lines: str) -> float:
        title.set_text(lines)
        return title.get_window_extent(renderer).width

    if width(text) <= room:
        return
    fitted = []
    for line in text.split("\n"):
        chars = len(line)
        while chars > 10 and width(textwrap.fill(line, chars, break_on_hyphens=False)) > room:
            chars -= max(1, chars // 20)
        fitted.append(textwrap.fill(line, chars, break_on_hyphens=False))
    size = title.get_fontsize()
    while width("\n".join(fitted)) > room and size > 5:
        size *= 0.9
        title.set_fontsize(size)
    title.set_ha("center")
    title.set_x(0.5)


def figure_to_png_bytes(fig: Figure, dpi: int = DPI) -> bytes:
    """Render ``fig`` to PNG bytes (the figure stays open; its title fitted: :func:`fit_title`)."""
    fit_title(fig)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    return buf.getvalue()


def figure_to_rgb(fig: Figure, dpi: int = DPI) -> np.ndarray:
    """Render ``fig`` to an RGB array ``[height, width, 3]`` uint8 (TensorBoard ``HWC`` image;
    its title fitted: :func:`fit_title`)."""
    fit_title(fig)
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
        fit_title(fig)
        with atomic_file(path) as fh:
            fig.savefig(fh, format="png", dpi=dpi)
    finally:
        fig.clear()
    return Path(path)


# --------------------------------------------------------------------------- model styles

# kind -> (colour, marker): one look per model kind in every figure, whatever else a figure
# shows: the hues of matplotlib's tab10, markers that differ too, so models stay apart in grey
# print.
MODEL_STYLES: dict[str, tuple[str, str]] = {
    "l1": ("#1f77b4", "o"),
    "kl": ("#7f7f7f", "s"),
    "sparsemax": ("#d62728", "D"),
    "entmax": ("#ff7f0e", "^"),
    "topk": ("#2ca02c", "v"),
    "batchtopk": ("#17becf", "P"),
    "jumprelu": ("#9467bd", "X"),
}

# every other model name of the presets (experiments/*.yaml) and the published comparisons, a
# look of its own (colour, marker, line style). The colours are at least 13 apart (CIEDE2000,
# :func:`colour_distance`) from every other name's here, the kinds' included, and at least 17
# from those of the models on the same page, whose markers differ too: a variant is no longer a
# shade of its kind's hue, which left sparsemax and its variants nearly the same red.
NAMED_STYLES: dict[str, tuple[str, str, object]] = {
    "sparsemax-attention": ("#000000", "*", "-"),
    "sparsemax-batch": ("#e7969c", "<", "--"),
    "sparsemax-normalized": ("#bcbd22", ">", "-."),
    "sparsemax-global": ("#beaed4", "p", "-."),
    "sparsemax-own": ("#e78ac3", "*", ":"),
    "sparsemax-previous": ("#8da0cb", "<", (0, (5, 1, 1, 1))),
    "sparsemax-threshold": ("#7b4173", "<", "--"),
    "sparsemax-learned": ("#843c39", "*", "-."),
    "sparsemax-ste": ("#637939", "p", ":"),
    "sparsemax-learned-ste": ("#bf5b17", "h", (0, (5, 1, 1, 1))),
    "sparsemax-normalized-ste": ("#7fc97f", "H", "--"),
    "sparsemax-power1.5": ("#e6ab02", "*", "-."),
    "sparsemax-power3": ("#1b9e77", "<", ":"),
    "jumprelu-shared": ("#393b79", "p", ":"),
    "jumprelu-shared-gain": ("#f0027f", "h", (0, (5, 1, 1, 1))),
    "batchtopk-ste": ("#8c6d31", "H", "--"),
}

# any other name: a colour of this palette picked by a hash of the name (when it is not too
# close to another model's on the same figure, :func:`model_styles`), a marker and a line style
_PALETTE = ("#8c564b", "#bcbd22", "#393b79", "#637939", "#843c39", "#7b4173", "#e7298a",
            "#1b9e77", "#d95f02", "#7570b3", "#66a61e", "#e6ab02", "#a6761d", "#666666",
            "#b15928", "#6a3d9a", "#1f78b4", "#33a02c", "#fb9a99", "#cab2d6", "#000000")
_VARIANT_MARKERS = ("<", ">", "p", "h", "*", "d", "8", "H")
_VARIANT_LINES = ("--", "-.", ":", (0, (5, 1, 1, 1)))
DISTINCT = 13.0  # CIEDE2000 below which two colours of one figure are too alike


def _lab(colour: str) -> np.ndarray:
    """CIELAB coordinates of an sRGB colour (D65 white)."""
    rgb = np.asarray(mcolors.to_rgb(colour))
    linear = np.where(rgb <= 0.04045, rgb / 12.92, ((rgb + 0.055) / 1.055) ** 2.4)
    xyz = np.array([[0.4124, 0.3576, 0.1805], [0.2126, 0.7152, 0.0722],
                    [0.0193, 0.1192, 0.9505]]) @ linear / np.array([0.95047, 1.0, 1.08883])
    f = np.where(xyz > 0.008856, np.cbrt(xyz), 7.787 * xyz + 16 / 116)
    return np.array([116 * f[1] - 16, 500 * (f[0] - f[1]), 200 * (f[1] - f[2])])


def colour_distance(a: str, b: str) -> float:
    """How different two colours look: their CIEDE2000 colour difference (Sharma, Wu & Dalal,
    2005); about 1 is a just noticeable difference, 10 and more an obvious one."""
    (l1, a1, b1), (l2, a2, b2) = _lab(a), _lab(b)
    c_mean = (np.hypot(a1, b1) + np.hypot(a2, b2)) / 2
    g = 0.5 * (1 - np.sqrt(c_mean ** 7 / (c_mean ** 7 + 25.0 ** 7)))
    a1, a2 = (1 + g) * a1, (1 + g) * a2
    c1, c2 = np.hypot(a1, b1), np.hypot(a2, b2)
    h1, h2 = np.degrees(np.arctan2(b1, a1)) % 360, np.degrees(np.arctan2(b2, a2)) % 360
    dh = 0.0 if c1 * c2 == 0 else (h2 - h1 + 180) % 360 - 180
    dl, dc, dhh = l2 - l1, c2 - c1, 2 * np.sqrt(c1 * c2) * np.sin(np.radians(dh / 2))
    l_mean, c_mean = (l1 + l2) / 2, (c1 + c2) / 2
    h_mean = h1 + h2 if c1 * c2 == 0 else (h1 + h2) / 2 if abs(h1 - h2) <= 180 else \
        (h1 + h2 + 360) / 2 if h1 + h2 < 360 else (h1 + h2 - 360) / 2
    t = (1 - 0.17 * np.cos(np.radians(h_mean - 30)) + 0.24 * np.cos(np.radians(2 * h_mean))
         + 0.32 * np.cos(np.radians(3 * h_mean + 6)) - 0.20 * np.cos(np.radians(4 * h_mean - 63)))
    sl = 1 + 0.015 * (l_mean - 50) ** 2 / np.sqrt(20 + (l_mean - 50) ** 2)
    sc, sh = 1 + 0.045 * c_mean, 1 + 0.015 * c_mean * t
    rt = (-2 * np.sqrt(c_mean ** 7 / (c_mean ** 7 + 25.0 ** 7))
          * np.sin(np.radians(60 * np.exp(-(((h_mean - 275) / 25) ** 2)))))
    return float(np.sqrt((dl / sl) ** 2 + (dc / sc) ** 2 + (dhh / sh) ** 2
                         + rt * (dc / sc) * (dhh / sh)))


def _pick(options: tuple, salt: str, name: str):
    # one independent hash per property (CRC-32: the same in every process)
    return options[zlib.crc32(f"{salt}:{name}".encode()) % len(options)]


def model_style(name: str, kind: str | None = None) -> dict[str, object]:
    """Colour, marker and line style of a model in every figure: ``{"color", "marker", "ls"}``.

    A function of the model's own name only, never of which other models a figure holds, so a
    model looks the same in every comparison and preset: a kind of :data:`MODEL_STYLES` its
    look with a solid line, a name of :data:`NAMED_STYLES` its own; any other name a colour,
    marker and broken line picked by a stable hash of the name (CRC-32, the same in every
    process), which :func:`model_styles` moves away from another model's colour on the same
    figure. ``kind`` (the ``sae.run`` model behind a sweep entry) is accepted for the callers
    that know it; the look does not depend on it.
    """
    name = str(name)
    if name in NAMED_STYLES:
        colour, marker, ls = NAMED_STYLES[name]
        return {"color": colour, "marker": marker, "ls": ls}
    if name in MODEL_STYLES:
        colour, marker = MODEL_STYLES[name]
        return {"color": colour, "marker": marker, "ls": "-"}
    return {"color": _pick(_PALETTE, "colour", name), "marker": _pick(_VARIANT_MARKERS,
                                                                      "marker", name),
            "ls": _pick(_VARIANT_LINES, "line", name)}


def model_styles(names, kinds=None) -> dict[str, dict[str, object]]:
    """:func:`model_style` of every model of one figure, every colour told apart: a name of
    :data:`MODEL_STYLES` or :data:`NAMED_STYLES` keeps its own look (they are far apart
    already), and a name of neither whose hashed colour is within :data:`DISTINCT` of a colour
    already on the figure takes the first colour of the palette that is not (the farthest one
    when none is), in the order of the names. ``kinds``: the ``sae.run`` model of each name."""
    names = list(dict.fromkeys(str(n) for n in names))
    kinds = dict(zip(names, kinds, strict=False)) if kinds is not None else {}
    styles = {n: model_style(n, kinds.get(n)) for n in names}
    fixed = [n for n in names if n in MODEL_STYLES or n in NAMED_STYLES]
    taken = [styles[n]["color"] for n in fixed]
    for name in (n for n in names if n not in fixed):
        def gap(colour: str) -> float:
            return min((colour_distance(colour, t) for t in taken), default=np.inf)

        colour = styles[name]["color"]
        if gap(colour) < DISTINCT:
            start = _PALETTE.index(colour)
            order = _PALETTE[start:] + _PALETTE[:start]
            colour = next((c for c in order if gap(c) >= DISTINCT), max(order, key=gap))
        styles[name] = {**styles[name], "color": colour}
        taken.append(colour)
    return styles


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


FENCE = 3.0  # Tukey's "far out" fence, in interquartile ranges beyond the quartiles


def robust_limits(values, spread=None, fence: float = FENCE,
                  min_points: int = 5) -> tuple[float, float] | None:
    """An axis range that holds every ordinary value and leaves far outliers out, or None when
    there is nothing to leave out (the axis then scales itself).

    The rule: with at least ``min_points`` finite values, quartiles Q1 and Q3 and IQR = Q3 − Q1,
    a value is an outlier when it lies more than ``fence`` × IQR beyond its quartile (Tukey's
    far-out fence: Q1 − 3 IQR, Q3 + 3 IQR). When there are outliers, the range is that of the
    other values widened by their error bars (``spread``, same length; NaN for none) and by
    8 % of its span on each side, but never past halfway to the nearest outlier; so one run at
    FVU 2.5 among runs of FVU 0.05–0.3 leaves them the whole axis instead of its bottom tenth.
    With fewer values, no spread (IQR 0) or no outlier, the answer is None: nothing is clipped.
    """
    v = np.asarray(values, dtype=float)
    e = np.zeros_like(v) if spread is None else np.nan_to_num(np.asarray(spread, float))
    ok = np.isfinite(v)
    if ok.sum() < min_points:
        return None
    q1, q3 = np.percentile(v[ok], [25, 75])
    iqr = q3 - q1
    inside = ok & (v >= q1 - fence * iqr) & (v <= q3 + fence * iqr)
    if iqr <= 0 or inside.sum() == ok.sum():
        return None
    lo, hi = float((v - e)[inside].min()), float((v + e)[inside].max())
    pad = 0.08 * (hi - lo) if hi > lo else 0.08 * abs(hi) or 1.0
    lo, hi = lo - pad, hi + pad
    # the padding never takes an outlier back in: the limit stops halfway to the nearest one
    below, above = v[ok & (v < q1 - fence * iqr)], v[ok & (v > q3 + fence * iqr)]
    if below.size:
        lo = max(lo, (float(v[inside].min()) + float(below.max())) / 2)
    if above.size:
        hi = min(hi, (float(v[inside].max()) + float(above.min())) / 2)
    return lo, hi


def mark_outside(ax: Axes, x, y, colours, limits: tuple[float, float], names=None,
                 fmt: str = ".3g") -> int:
    """Clip the y axis of ``ax`` to ``limits`` and draw each point beyond it as an arrow at the
    edge it passes, pointing out, with its value (and its name, of ``names``) written under it
    in its colour, so that no point is hidden and none stretches the axis. Returns how many
    points were beyond.

    The written values have the gid ``"outside-value"``. Near either side of the axes a value
    runs inwards; values of arrows close together stand one line apart, so none covers another.
    """
    ax.set_ylim(*limits)
    names = [None] * len(colours) if names is None else list(names)
    beyond = []
    for xi, yi, colour, name in zip(x, y, colours, names, strict=True):
        if np.isfinite(yi) and not limits[0] <= yi <= limits[1]:
            # where the arrow stands across the axes (0 left, 1 right)
            across = ax.transAxes.inverted().transform(ax.transData.transform((xi, limits[0])))
            beyond.append((float(across[0]), xi, yi, colour, name))
    renderer = (ax.figure.canvas if isinstance(ax.figure.canvas, FigureCanvasAgg)
                else FigureCanvasAgg(ax.figure)).get_renderer()
    placed: list = []  # the written values' boxes so far
    for across, xi, yi, colour, name in sorted(beyond, key=lambda b: b[0]):
        sign, edge = (-1, 1.0) if yi > limits[1] else (1, 0.0)
        at = {"xy": (xi, edge), "xycoords": ("data", "axes fraction"),
              "textcoords": "offset points", "annotation_clip": False}
        ax.annotate("", xytext=(0, sign * 22), **at,
                    arrowprops={"arrowstyle": "-|>", "color": colour, "lw": 1.2})
        label = ax.annotate(f"{name} {yi:{fmt}}" if name else f"{yi:{fmt}}",
                            xytext=(0, sign * 24), **at, color=colour,
                            fontsize="small", va="top" if sign < 0 else "bottom",
                            ha="left" if across < 0.2 else "right" if across > 0.8 else "center")
        label.set_gid("outside-value")
        for level in range(1, len(placed) + 1):  # one line further while it covers another
            box = label.get_window_extent(renderer)
            if not any(box.overlaps(other) for other in placed):
                break
            label.set_position((0, sign * (24 + 12 * level)))
        placed.append(label.get_window_extent(renderer))
    if beyond:
        ax.text(0.99, 0.99, f"{len(beyond)} beyond the axis: arrows, values written",
                transform=ax.transAxes, ha="right", va="top", fontsize="x-small",
                color="0.35")
    return len(beyond)


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
