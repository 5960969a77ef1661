"""Labels beside a figure's points that overlap no other label, line or marker.

A comparison figure names each point with its λ or k. Labels go where they hide nothing: a greedy
placement in axes fractions, measured from the drawn texts once the figure's layout is final,
with no package beyond matplotlib. :func:`place_labels` is the entry point.
"""

from __future__ import annotations

import numpy as np
from matplotlib.axes import Axes
from matplotlib.collections import LineCollection
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

__all__ = ["label_axes", "line_points", "place_labels"]


# offsets (points) tried in turn for a point's λ / k label: beside the point first, then a
# little above and below it; the first whose box is free wins (further away, a label would
# seem to name another point, so it is left out instead, unless it must be shown: a k)
_LABEL_OFFSETS = ((5, 4), (5, -11), (-5, 4), (-5, -11), (5, 12), (5, -19), (-5, 12), (-5, -19),
                  (0, 8), (0, -15))
# a label that must be shown and finds none of those free is moved further out, onto rings
# around its point (distances in points, 16 directions each), joined to it by a thin line
_LEADER_RINGS = (20, 28, 38, 50, 64, 80)
_MARKER_SIZE = 5.0  # points: the markers of the lines (a label keeps off them too)


def line_points(ax: Axes, step: float = 0.01) -> np.ndarray:
    """Points along every line drawn in ``ax`` (its data lines, error bars and caps, the Pareto
    steps, the labels' leader lines), in axes fractions, about ``step`` apart: what a label
    must not cover."""
    frac = ax.transAxes.inverted()
    paths = []  # (xy, transform to display)
    for line in ax.get_lines():
        xy = np.column_stack([np.asarray(line.get_xdata(), float),
                              np.asarray(line.get_ydata(), float)])
        if line.get_drawstyle() == "steps-post" and len(xy) > 1:  # the corners of the steps
            corners = np.column_stack([xy[1:, 0], xy[:-1, 1]])
            xy = np.insert(xy, np.arange(1, len(xy)), corners, axis=0)
        paths.append((xy, line.get_transform()))
    for collection in ax.collections:  # the error bars
        if isinstance(collection, LineCollection):
            paths += [(np.asarray(seg, float), collection.get_transform())
                      for seg in collection.get_segments()]
    out = []
    for xy, transform in paths:
        xy = xy[np.isfinite(xy).all(1)] if len(xy) else xy
        if len(xy) == 0:
            continue
        f = frac.transform(transform.transform(xy))
        out.append(f)
        for a, b in zip(f[:-1], f[1:], strict=True):
            n = int(np.hypot(*(b - a)) / step)
            if n > 1:
                out.append(a + np.linspace(0, 1, n)[:, None] * (b - a))
    return np.concatenate(out) if out else np.zeros((0, 2))


def place_labels(fig: Figure, pending: list[tuple[Axes, list]]) -> None:
    """Label the points of each (axes, points) in ``pending`` (:func:`label_axes`), once the
    figure's layout is final (the legend outside drawn): one layout for all the axes, since
    labels placed inside one axes do not move the others."""
    pending = [(ax, points) for ax, points in pending if points]
    if not pending:
        return
    for ax, _ in pending:
        ax.autoscale_view()
    fig.draw_without_rendering()  # the layout: the axes' final size, the renderer's fonts
    for ax, points in pending:
        label_axes(ax, points)


def label_axes(ax: Axes, points: list[tuple]) -> None:
    """Label points ``(x, y, text, colour, rank)`` where no label overlaps another label, a
    line or a marker.

    Simple greedy placement in axes-fraction coordinates (no extra package), in order of
    ``rank`` (0: a label that must be shown, a fixed budget's k; 1: the ends of a line; 2: the
    points between), so that when a crowded label finds no free place it is a middle λ that is
    left out (the legend and the table still name every setting). Each label takes the first
    offset of :data:`_LABEL_OFFSETS` whose box overlaps no box placed before it, holds no point
    of a line, error bar or marker of the axes (:func:`line_points`, the box widened by a
    marker's radius) and stays inside the axes; a label of rank 0 or 1 that finds none goes
    further out (:data:`_LEADER_RINGS`) with a thin line to its point that crosses no label
    (later labels keep off it), and one of rank 0, failing that too, to the nearest place that
    overlaps no other label. The boxes are the drawn texts' own extents, measured once the
    figure's layout has given the axes their final size (an estimate from the text's length
    and the axes' size before layout let labels of crowded points overlap).
    The figure's layout must be done (:func:`place_labels`).
    """
    placer = _LabelPlacer(ax)
    for x, y, text, colour, rank in sorted(points, key=lambda p: p[4]):
        placer.place(x, y, text, colour, rank)


class _LabelPlacer:
    """The greedy placement of :func:`label_axes` on one axes: the boxes placed so far and the
    points no label may hold (lines, markers, leader lines), in axes fractions."""

    def __init__(self, ax: Axes):
        self.ax = ax
        self.frac = ax.transAxes.inverted()  # display -> axes fraction
        self.per_point = ax.figure.dpi / 72  # display units per point
        self.pad = 0.5 * self.per_point  # half a point to spare between labels
        self.clear = (_MARKER_SIZE / 2 + 0.5) * self.per_point  # from a line, a marker's radius
        self.obstacles = line_points(ax)
        self.placed: list[tuple[float, float, float, float]] = []
        # the markers' centres in display units: a leader line passing one would seem to name it
        self.markers = np.concatenate([line.get_transform().transform(line.get_xydata())
                                       for line in ax.get_lines()
                                       if line.get_marker() not in (None, "", "None", " ")]
                                      or [np.zeros((0, 2))])
        self.far = [(r * np.cos(a), r * np.sin(a)) for r in _LEADER_RINGS
                    for a in np.deg2rad(np.arange(45, 405, 22.5))]

    def box(self, label, margin: float) -> tuple[float, float, float, float]:
        (x0, y0), (x1, y1) = self.frac.transform(
            label.get_window_extent().padded(margin).get_points())
        return x0, y0, x1, y1

    def fits(self, label, lines: bool = True) -> bool:
        x0, y0, x1, y1 = self.box(label, self.pad)
        if not (0 <= x0 and 0 <= y0 and x1 <= 1 and y1 <= 1) or any(
                x0 < b[2] and b[0] < x1 and y0 < b[3] and b[1] < y1 for b in self.placed):
            return False
        x0, y0, x1, y1 = self.box(label, self.clear)
        o = self.obstacles
        return not lines or not ((o[:, 0] > x0) & (o[:, 0] < x1)
                                 & (o[:, 1] > y0) & (o[:, 1] < y1)).any()

    def leader_line(self, label, x: float, y: float) -> np.ndarray:
        """Points along the line from the label's edge to the marker's edge (axes
        fractions), about a point apart."""
        extent = label.get_window_extent().padded(self.pad)
        centre = np.array([extent.x0 + extent.x1, extent.y0 + extent.y1]) / 2
        way = self.ax.transData.transform((x, y)) - centre  # display units
        half = np.array([extent.width, extent.height]) / 2
        start = centre + way * min(half / np.maximum(np.abs(way), 1e-9))
        end = centre + way * (1 - self.clear / max(float(np.hypot(*way)), 1e-9))
        n = max(2, int(np.hypot(*(end - start)) / self.per_point))
        return self.frac.transform(start + np.linspace(0, 1, n)[:, None] * (end - start))

    def crosses_a_label(self, line: np.ndarray, x: float, y: float) -> bool:
        if any(((line[:, 0] > b[0]) & (line[:, 0] < b[2]) & (line[:, 1] > b[1])
                & (line[:, 1] < b[3])).any() for b in self.placed):
            return True
        own = self.ax.transData.transform((x, y))
        others = self.markers[np.hypot(*(self.markers - own).T) > 1.0]
        shown = self.ax.transAxes.transform(line)
        near = np.hypot(shown[:, None, 0] - others[None, :, 0],
                        shown[:, None, 1] - others[None, :, 1])
        return bool((near < 2 * self.clear).any())

    def first_fit(self, x: float, y: float, text: str, colour, rank: int):
        """(label, whether it has a leader line) at the first place that fits, or None."""
        tries = [(dx, dy, False) for dx, dy in _LABEL_OFFSETS]
        if rank <= 1:  # a k, or a line's end: further out, with a line to its point
            tries += [(dx, dy, True) for dx, dy in self.far]
        for lines in ((True, False) if rank == 0 else (True,)):
            for dx, dy, leader in tries:
                label = self.ax.annotate(
                    text, (x, y), xytext=(dx, dy), textcoords="offset points",
                    ha="center" if leader or dx == 0 else "right" if dx < 0 else "left",
                    va="center" if leader else "bottom", fontsize="xx-small", color=colour)
                if self.fits(label, lines) and not (leader and self.crosses_a_label(
                        self.leader_line(label, x, y), x, y)):
                    return label, leader
                label.remove()
        return None

    def place(self, x: float, y: float, text: str, colour, rank: int) -> None:
        chosen = self.first_fit(x, y, text, colour, rank)
        if chosen is None:
            return
        label, leader = chosen
        self.placed.append(self.box(label, self.pad))
        if leader:  # a thin line from the label to its point, which later labels keep off
            line = self.leader_line(label, x, y)
            self.ax.add_line(Line2D(line[[0, -1], 0], line[[0, -1], 1],
                                    transform=self.ax.transAxes, color=colour, lw=0.6,
                                    alpha=0.8))
            self.obstacles = np.concatenate([self.obstacles, line])
