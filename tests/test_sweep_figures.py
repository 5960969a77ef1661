"""The comparison figures as a reader sees them: every model of a page its own colour (the same
on every page), and fvu_vs_l0.png's λ and k labels, measured in the drawn figure: none over
another, and every fixed budget's point with its k."""

from __future__ import annotations

import itertools
from pathlib import Path

import pandas as pd
import pytest
import yaml
from matplotlib.backends.backend_agg import FigureCanvasAgg

from sae.figures.common import (
    DISTINCT,
    MODEL_STYLES,
    NAMED_STYLES,
    colour_distance,
    model_style,
    model_styles,
)
from sae.sweep import aggregate, plots

REPO = Path(__file__).resolve().parents[1]
PRESETS = sorted((REPO / "experiments").glob("*.yaml"))
PUBLISHED = sorted((REPO / "figures" / "compare").glob("*/results.csv"))


def pages() -> dict[str, list[str]]:
    """The model names of each preset and of each published comparison."""
    out = {p.name: list(yaml.safe_load(p.read_text())["models"]) for p in PRESETS}
    out |= {f"{p.parent.name} (published)": list(dict.fromkeys(pd.read_csv(p)["model"]))
            for p in PUBLISHED}
    return out


def test_every_model_name_of_the_presets_has_a_look_of_its_own():
    names = sorted({n for models in pages().values() for n in models})
    assert len(names) > 20
    # every name is a kind or has its own look: none falls back on a hashed colour
    assert set(names) <= set(MODEL_STYLES) | set(NAMED_STYLES)
    colours = {n: model_style(n)["color"] for n in names}
    close = [(a, b, round(colour_distance(colours[a], colours[b]), 1))
             for a, b in itertools.combinations(names, 2)
             if colour_distance(colours[a], colours[b]) < DISTINCT]
    assert close == []  # sparsemax-own was a shade of sparsemax's red: 9.6 (CIE76)
    for page, models in pages().items():
        looks = model_styles(models)
        assert {n: s["color"] for n, s in looks.items()} == {n: colours[n] for n in models}
        for a, b in itertools.combinations(models, 2):  # on one page: further apart still
            assert colour_distance(colours[a], colours[b]) >= 17, (page, a, b)
        markers = [looks[n]["marker"] for n in models]
        assert len(set(markers)) == len(markers), page


def test_other_names_on_one_figure_are_told_apart_and_named_ones_never_move():
    names = ["sparsemax", "topk", *[f"mine-{i}" for i in range(8)]]
    looks = model_styles(names)
    assert looks["sparsemax"] == model_style("sparsemax")
    for a, b in itertools.combinations(names, 2):
        assert colour_distance(looks[a]["color"], looks[b]["color"]) >= DISTINCT, (a, b)
    assert model_styles(["mine-3"])["mine-3"] == model_style("mine-3")  # alone: its own


def text_boxes(fig):
    renderer = FigureCanvasAgg(fig).get_renderer()
    fig.draw(renderer)
    return renderer


@pytest.mark.slow
@pytest.mark.parametrize("results", PUBLISHED, ids=lambda p: p.parent.name)
def test_fvu_vs_l0_labels_never_overlap_and_every_k_is_shown(results):
    summary = aggregate.summarize_seeds(pd.read_csv(results))
    fig = plots.fvu_l0_pareto(summary)
    renderer = text_boxes(fig)
    for ax in fig.axes:
        labels = [t for t in ax.texts if t.get_text().startswith(("λ=", "k="))]
        boxes = [t.get_window_extent(renderer) for t in labels]
        inside = ax.get_window_extent(renderer)
        for box, label in zip(boxes, labels, strict=True):
            assert inside.x0 <= box.x0 and box.x1 <= inside.x1 + 0.5, label.get_text()
            assert inside.y0 <= box.y0 and box.y1 <= inside.y1 + 0.5, label.get_text()
        for (a, ta), (b, tb) in itertools.combinations(zip(boxes, labels, strict=True), 2):
            assert not a.overlaps(b), (ta.get_text(), tb.get_text())
        if not ax.get_label().startswith("main:"):
            continue
        part = summary[summary["dataset"] == ax.get_label()[len("main:"):]]
        fixed = part[(part["param"] == "k") & plots._exact(part)]
        shown = {(t.get_text(), round(t.xy[0], 9), round(t.xy[1], 9)) for t in labels}
        for _, row in fixed.iterrows():  # each TopK / BatchTopK point says its k
            assert (f"k={row['value']:g}", round(row["l0_mean_mean"], 9),
                    round(row["fvu_mean"], 9)) in shown, (row["model"], row["value"])
