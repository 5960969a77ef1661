"""What every figure of :mod:`sae.figures` shares: style, resolution, output, small helpers.

Every figure is built on ``matplotlib.figure.Figure`` directly, never through ``pyplot``: nothing
enters pyplot's global figure registry, no GUI backend is needed, and figures can be made from a
training callback without leaking memory. Nothing in the package shows or saves a figure except
:func:`save_png`; :func:`figure_to_png_bytes` and :func:`figure_to_rgb` serve the HTML pages and
TensorBoard.

Seaborn's look (``whitegrid`` style, ``paper`` context) is applied per figure through a temporary
``rc_context`` (:func:`styled`) rather than ``seaborn.set_theme``, so importing the package changes
no global state.
"""

from __future__ import annotations

import functools
import io
import math
import os
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import matplotlib as mpl
import numpy as np
import seaborn as sns
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from sae.io import atomic_file

__all__ = ["DPI", "drop_unused", "empty_note", "figure_to_png_bytes", "figure_to_rgb",
           "grid_shape", "l0_edges", "palette_png", "save_png", "styled", "tile_centre",
           "tile_mosaic"]

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


# --------------------------------------------------------------------------- page embedding


def palette_encode(rgb: np.ndarray, colours: int = 256, max_mean_error: float = 1.0,
                   max_error: int = 12) -> bytes | None:
    """An RGB image ``[H, W, 3]`` uint8 as a palette PNG of at most ``colours`` colours, or None
    where the palette would not be faithful (see :func:`palette_png` for the bounds)."""
    from PIL import Image

    rgb = np.ascontiguousarray(rgb)
    image = Image.fromarray(rgb)
    exact = image.getcolors(maxcolors=colours) is not None
    quantised = image.quantize(colors=colours, method=Image.Quantize.MEDIANCUT,
                               dither=Image.Dither.NONE)
    if not exact:
        error = np.abs(np.asarray(quantised.convert("RGB"), dtype=np.int16)
                       - rgb.astype(np.int16))
        if error.mean() > max_mean_error or np.quantile(error.max(-1), 0.99) > max_error:
            return None
    buf = io.BytesIO()
    quantised.save(buf, format="PNG", optimize=False, compress_level=9)
    return buf.getvalue()


def palette_png(png: bytes, colours: int = 256, max_mean_error: float = 1.0,
                max_error: int = 12) -> bytes:
    """``png`` re-encoded with an adaptive palette of at most ``colours`` colours, if faithful.

    Figures are mostly flat colours and anti-aliased edges, so a palette PNG (one byte per
    pixel instead of three or four) is about half the size and, for a page that embeds a dozen
    figures as base64, halves its weight. Faithful means: the image has no transparency, and
    either it already has at most ``colours`` colours (then the palette is exact), or the
    quantised image differs from the original by at most ``max_mean_error`` grey levels (of 255)
    on average over pixels and channels and by at most ``max_error`` at 99 % of the pixels (the
    rest are single anti-aliased edge pixels of a rare shade, a few dozen levels off at most).
    Otherwise, or when the palette version is not smaller or ``png`` cannot be decoded, the
    original bytes come back unchanged. A palette PNG comes back as it is, at once: figures
    written by :func:`palette_encode` cost a page nothing more.
    """
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(io.BytesIO(png)) as image:
            image.load()
            if image.mode == "P":
                return png
            rgba = np.asarray(image.convert("RGBA"))
    except (OSError, ValueError, UnidentifiedImageError, Image.DecompressionBombError):
        return png
    if (rgba[..., 3] != 255).any():  # transparency: keep the original
        return png
    out = palette_encode(rgba[..., :3], colours, max_mean_error, max_error)
    return out if out is not None and len(out) < len(png) else png
