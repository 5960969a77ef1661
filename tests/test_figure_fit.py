"""Every figure's title fits inside it, and a far outlier no longer stretches a sweep's axis.

Titles are checked through matplotlib's public API: the figure is rendered as it leaves for a
page (:func:`sae.figures.figure_to_png_bytes`), then the title's bounding box, measured by the
figure's renderer, must lie inside the figure's. A run's figures get the run's dataset, model,
data and epoch as a first line (sae.training.callbacks), the longest titles drawn.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.text import Text

from sae import figures
from sae.figures.common import robust_limits
from sae.sweep import plots

HEADER = ("fashion-mnist · batchtopk-ste k=32 · 4,096 units · validation set (5,000 images) · "
          "epoch 120, step 1,234,567")


def title_box(fig):
    """The rendered title's bounding box and the figure's, in pixels."""
    figures.figure_to_png_bytes(fig)
    text = fig.get_suptitle()
    title = next(t for t in fig.get_children() if isinstance(t, Text) and t.get_text() == text)
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    return title.get_window_extent(canvas.get_renderer()), fig.bbox


def run_figures():
    rng = np.random.default_rng(0)
    freq = rng.random(512) ** 4
    freq[:40] = 0
    class_freq = rng.random((10, 512)) * freq
    l0 = rng.integers(1, 60, 500)
    labels = rng.integers(0, 10, 500)
    atoms = rng.normal(size=(784, 512))
    classes = [str(c) for c in range(10)]
    return {"feature_density": figures.feature_density_histogram(freq),
            "activation_frequency": figures.activation_frequency_curve(freq),
            "class_unit_heatmap": figures.class_unit_heatmap(class_freq, classes),
            "sparsity_histogram": figures.sparsity_histogram(l0, labels, classes),
            "decoder_atoms": figures.decoder_atoms(atoms, freq, n=16)}


@pytest.mark.parametrize("header", [None, HEADER])
def test_every_run_figure_title_lies_inside_the_figure(header):
    for kind, fig in run_figures().items():
        if header:  # as a run's figures are titled
            fig.suptitle(f"{header}\n{fig.get_suptitle()}")
        box, frame = title_box(fig)
        assert frame.x0 <= box.x0 and box.x1 <= frame.x1, (kind, box, frame)
        assert frame.y0 <= box.y0 and box.y1 <= frame.y1, (kind, box, frame)
        assert fig.get_suptitle().replace("\n", " ").split() == \
            (f"{header}\n" if header else "").split() + fig.get_suptitle().split()[
                len(header.split()) if header else 0:]


def test_a_title_is_wrapped_not_cut_and_keeps_every_word():
    fig = figures.feature_density_histogram(np.full(64, 0.1))
    fig.suptitle(f"{HEADER}\n{fig.get_suptitle()}")
    box, frame = title_box(fig)
    assert box.width <= frame.width
    words = fig.get_suptitle().split()
    assert words[:len(HEADER.split())] == HEADER.split()
    assert fig.get_suptitle().count("\n") >= 2  # the long first line became two


def summary_with(outliers: list[float]) -> pd.DataFrame:
    rows = []
    for m, model in enumerate(["l1", "topk", "sparsemax", "entmax"]):
        for i, l0 in enumerate([5.0, 12.0, 30.0]):
            rows.append({"dataset": "mnist", "model": model, "kind": model,
                         "param": "k" if model == "topk" else "lambda", "value": 0.1 / (i + 1),
                         "l0_mean_mean": l0 + m, "l0_mean_std": 0.5,
                         "fvu_mean": 0.3 / (i + 1) + 0.01 * m, "fvu_std": 0.01,
                         "fvu_at_l0_mean": 0.3 / (i + 1) + 0.01 * m, "fvu_at_l0_std": 0.01,
                         "n_seeds": 2})
    for j, fvu in enumerate(outliers):
        row = rows[3 * j + 2 * (j % 2)]  # the sparsest setting of one model, the densest of another
        row["fvu_mean"] = row["fvu_at_l0_mean"] = fvu
    return pd.DataFrame(rows)


def test_an_outlier_is_an_arrow_at_the_edge_and_the_others_fill_the_axis():
    fig = plots.fvu_l0_pareto(summary_with([1.31, 2.49]))
    figures.figure_to_png_bytes(fig)
    ax = next(a for a in fig.axes if a.get_label() == "main:mnist")
    bottom, top = ax.get_ylim()
    assert top < 0.5  # not stretched to 2.49: the other points span 0.1-0.33
    notes = {t.get_text(): t for t in ax.texts}
    arrows = [t for t in ax.texts if getattr(t, "arrow_patch", None) is not None]
    values = [t for t in ax.texts if t.get_gid() == "outside-value"]
    assert sorted(t.get_text() for t in values) == ["l1 1.31", "topk 2.49"]
    assert len(arrows) == 2 and all(t.xy[1] == 1.0 for t in arrows)  # at the top edge
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    for t in values:  # each written value lies inside the figure
        box = t.get_window_extent(canvas.get_renderer())
        assert fig.bbox.x0 <= box.x0 and box.x1 <= fig.bbox.x1
    assert "2 beyond the axis: arrows, values written" in notes


def test_no_outlier_leaves_the_axis_to_scale_itself():
    fig = plots.fvu_l0_pareto(summary_with([]))
    ax = next(a for a in fig.axes if a.get_label() == "main:mnist")
    assert not [t for t in ax.texts if t.get_gid() == "outside-value"]
    assert ax.get_ylim()[1] >= 0.33


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(-1e3, 1e3), min_size=5, max_size=40),
       st.lists(st.floats(1e4, 1e6), min_size=1, max_size=3))
def test_robust_limits_hold_every_ordinary_value_and_leave_far_ones_out(values, far):
    data = np.array(values + far)
    q1, q3 = np.percentile(data, [25, 75])
    iqr = q3 - q1
    limits = robust_limits(data)
    outside = (data < q1 - 3 * iqr) | (data > q3 + 3 * iqr)
    if iqr <= 0 or not outside.any():
        assert limits is None
        return
    lo, hi = limits
    assert lo <= data[~outside].min() and data[~outside].max() <= hi  # every ordinary value in
    assert ((data < lo) | (data > hi))[outside].all()  # every far one out


def test_robust_limits_leave_few_points_alone():
    assert robust_limits([0.1, 0.2, 5.0, 0.15]) is None  # four points: no quartiles to trust
    assert robust_limits([0.1, 0.2, 0.3, 0.25, 0.15]) is None  # no outlier
