"""sae.sweep's comparison plots: Pareto fronts, labels that do not collide, one look per model."""

import numpy as np
import pandas as pd
from sweep_helpers import summary

from sae import figures
from sae.figures import labels
from sae.sweep import aggregate, plots

# --------------------------------------------------------------------------- plots


def plot_frames():
    s = summary([
        ("mnist", "kl", "kl", "lambda", 0.1, 0, 0.3, 10, 0.9),
        ("mnist", "kl", "kl", "lambda", 0.1, 1, 0.32, 11, 0.91),
        ("mnist", "l1", "l1", "lambda", 0.01, 0, 0.2, 12, 0.95),
        ("mnist", "l1", "l1", "lambda", 0.1, 0, 0.4, 3, 0.85),
        ("fashion-mnist", "topk", "topk", "k", 8, 0, 0.25, 8, 0.8),
    ])
    rng = np.random.default_rng(0)
    l0 = pd.DataFrame({"dataset": "mnist", "model": np.repeat(["kl", "l1", "topk"], 50),
                       "config": "λ = 0.1", "l0": np.r_[rng.poisson(10, 100), np.full(50, 8)]})
    per_class = pd.DataFrame([{"dataset": "mnist", "model": m, "config": "λ = 0.1",
                               "class": str(c), "l0": 5.0 + c} for m in ("kl", "l1")
                              for c in range(10)])
    corr = pd.DataFrame({"dataset": "mnist", "model": ["kl", "kl", "topk"],
                         "config": ["λ = 0.1", "λ = 0.1", "k = 8"],
                         "l0_ink_corr": [0.5, 0.6, np.nan]})
    return s, l0, per_class, corr


def axes_labelled(fig, prefix: str) -> list:
    return [ax for ax in fig.axes if ax.get_label().startswith(prefix)]


def test_comparison_plots_render():
    s, l0, per_class, corr = plot_frames()
    made = [plots.fvu_l0_pareto(s), plots.probe_vs_l0(s, {"mnist": 0.926}),
            plots.l0_distributions(l0), plots.class_l0_heatmap(per_class),
            plots.l0_ink_correlation(corr)]
    assert len(made[1].axes) == 2
    assert len(made[2].axes) == 3  # one panel per dataset x model
    text = " ".join(t.get_text() for t in made[4].findobj(lambda o: hasattr(o, "get_text")))
    assert "undefined" in text  # TopK's constant L0
    for fig in made:
        assert figures.figure_to_png_bytes(fig, dpi=30).startswith(b"\x89PNG")


def test_fvu_plot_keeps_codes_without_exact_zeros_off_its_main_axes():
    s, *_ = plot_frames()
    fig = plots.fvu_l0_pareto(s)
    main = {ax.get_label(): ax for ax in axes_labelled(fig, "main:")}
    loose = {ax.get_label(): ax for ax in axes_labelled(fig, "loose:")}
    assert set(main) == {"main:mnist", "main:fashion-mnist"}
    assert set(loose) == {"loose:mnist", "loose:fashion-mnist"}
    ax = main["main:mnist"]
    legend = ax.get_legend_handles_labels()[1]  # the entries this axes gives the legend
    assert "l1" in legend and not any(label.startswith("kl") for label in legend)
    # no drawn point of the main axes is the KL-SAE's (FVU 0.31 or FVU at L0 0.81)
    ys = np.concatenate([np.asarray(line.get_ydata(), float) for line in ax.get_lines()])
    assert not np.isin(np.round(ys, 3), [0.31, 0.81]).any()
    assert ax.get_ylim()[1] < 0.5  # the KL-SAE's 0.81 does not stretch the axis
    front = next(ln for ln in ax.get_lines() if "Pareto" in ln.get_label())
    assert list(front.get_ydata()) == [0.4, 0.2]
    kl_panel = loose["loose:mnist"]
    kl_legend = kl_panel.get_legend_handles_labels()[1]
    assert kl_legend == ["kl: FVU", "kl: FVU at L0"] and "no exact zeros" in kl_panel.get_title()
    shown = [t.get_text() for t in fig.legends[0].get_texts()]  # one legend, outside the axes
    assert {"l1", "kl: FVU", "kl: FVU at L0", "Pareto frontier"} <= set(shown)
    # the KL-SAE's panel has the same L0 scale as the main one above it
    assert kl_panel.get_xscale() == ax.get_xscale() == "log"
    assert kl_panel.get_xlim() == ax.get_xlim()
    kl_ys = {round(float(y), 3) for line in kl_panel.get_lines() for y in line.get_ydata()}
    assert {0.31, 0.81} <= kl_ys
    assert "none" in " ".join(t.get_text() for t in loose["loose:fashion-mnist"].texts)
    # without any such code there is no second row
    exact_only = plots.fvu_l0_pareto(s[s["kind"] != "kl"])
    assert not axes_labelled(exact_only, "loose:")


def test_point_labels_do_not_overlap():
    rows = [("mnist", m, m, "lambda", lam, 0, 0.2 + 0.001 * i, 20 + 0.3 * i, 0.9)
            for i, (m, lam) in enumerate([(m, lam) for m in ("l1", "sparsemax", "entmax")
                                          for lam in (0.003, 0.01, 0.03)])]
    fig = plots.fvu_l0_pareto(summary(rows))
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    renderer = FigureCanvasAgg(fig).get_renderer()
    fig.draw(renderer)
    boxes = [t.get_window_extent(renderer) for t in fig.axes[0].texts]
    assert len(boxes) >= 6  # at least each line's two ends are labelled
    for i, a in enumerate(boxes):
        for b in boxes[i + 1:]:
            assert not a.overlaps(b)


def test_point_labels_of_a_crowded_panel_do_not_overlap_once_the_legend_is_drawn():
    """Seven models bunched in one corner: the seed-0 (FVU, L0) of the MNIST MLP-layer preset,
    where labels placed for the axes' size before the layout (the legend outside then takes
    width from the axes) overlapped. The labels are measured in the final layout."""
    points = [
        ("l1", 0.002, 0.0105, 48.3),
        ("l1", 0.004, 0.0141, 31.9),
        ("l1", 0.008, 0.0233, 21.0),
        ("l1", 0.016, 0.0405, 11.9),
        ("sparsemax", 0.0002, 0.0086, 37.5),
        ("sparsemax", 0.0005, 0.0107, 25.1),
        ("sparsemax", 0.001, 0.0128, 18.3),
        ("sparsemax", 0.002, 0.0155, 13.3),
        ("entmax", 0.0005, 0.0074, 45.2),
        ("entmax", 0.001, 0.0089, 31.6),
        ("entmax", 0.0025, 0.0124, 20.2),
        ("entmax", 0.005, 0.0165, 14.4),
        ("topk", 16, 0.0145, 16.0),
        ("topk", 32, 0.0087, 32.0),
        ("batchtopk", 16, 0.0137, 16.1),
        ("batchtopk", 32, 0.0083, 31.9),
        ("jumprelu", 3e-05, 0.0176, 17.6),
        ("jumprelu", 0.0003, 0.0184, 17.5),
        ("jumprelu", 0.001, 0.0182, 16.6),
        ("jumprelu", 0.004, 0.0197, 14.7),
    ]
    kinds = {"topk": "k", "batchtopk": "k"}
    rows = [("mnist", m, m, kinds.get(m, "lambda"), v, 0, fvu, l0, 0.9)
            for m, v, fvu, l0 in points]
    fig = plots.fvu_l0_pareto(summary(rows))
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    renderer = FigureCanvasAgg(fig).get_renderer()
    fig.draw(renderer)
    boxes = [t.get_window_extent(renderer) for ax in fig.axes for t in ax.texts]
    assert len(boxes) >= 12  # each line's two ends at least, but the bunched ones
    for i, a in enumerate(boxes):
        for b in boxes[i + 1:]:
            assert not a.overlaps(b), (a, b)


def test_point_labels_cross_no_line():
    """A λ / k label is not drawn across a line: no point of any line of the axes lies in it."""
    rows = [("mnist", m, m, "lambda", lam, 0, fvu, l0, 0.9)
            for m, shift in (("l1", 0.0), ("sparsemax", 0.01), ("topk", 0.02))
            for lam, fvu, l0 in ((0.03, 0.3 + shift, 10), (0.01, 0.2 + shift, 20),
                                 (0.003, 0.1 + shift, 40))]
    fig = plots.fvu_l0_pareto(summary(rows))
    ax = fig.axes[0]
    assert len(ax.texts) >= 6
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    renderer = FigureCanvasAgg(fig).get_renderer()
    fig.draw(renderer)
    lines = labels.line_points(ax, step=0.002)
    frac = ax.transAxes.inverted()
    for text in ax.texts:
        (x0, y0), (x1, y1) = frac.transform(text.get_window_extent(renderer).get_points())
        inside = ((lines[:, 0] > x0) & (lines[:, 0] < x1) & (lines[:, 1] > y0)
                  & (lines[:, 1] < y1))
        assert not inside.any(), text.get_text()


def test_a_model_looks_the_same_whatever_else_a_figure_holds():
    s, *_ = plot_frames()
    colour = {}
    for models in (["l1", "kl", "topk"], ["topk"], ["kl", "topk"]):
        fig = plots.probe_vs_l0(s[s["model"].isin(models)])
        for container in (c for ax in fig.axes for c in ax.containers):
            if container.get_label() == "topk":  # an error-bar plot: its data line first
                line = container.lines[0]
                colour.setdefault(len(models), (line.get_color(), line.get_marker()))
    assert len(set(colour.values())) == 1 and len(colour) == 3
    assert colour[1] == (figures.common.model_style("topk")["color"],
                         figures.common.model_style("topk")["marker"])


def suptitle(fig):
    """The figure's title as a text artist (found among its artists by its text)."""
    from matplotlib.text import Text

    return next(t for t in fig.findobj(Text) if t.get_text() == fig.get_suptitle())


def test_titles_fit_and_say_what_the_bars_are():
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    s, *_ = plot_frames()
    two = summary([("mnist", "l1", "l1", "lambda", lam, seed, 0.2 + 0.01 * seed, l0, 0.9)
                   for lam, l0 in ((0.01, 20), (0.03, 10)) for seed in (0, 1)])
    one = two[two["n_seeds"] > 0].assign(n_seeds=1, l0_mean_std=np.nan, fvu_std=np.nan,
                                         probe_accuracy_std=np.nan)
    for frame, wording in ((two, "mean ± std over seeds"), (one, "one seed")):
        for probe_loss in ("softmax", "sparsemax"):
            for fig in (plots.fvu_l0_pareto(frame),
                        plots.probe_vs_l0(frame, {"mnist": 0.9}, probe_loss)):
                title = fig.get_suptitle()
                assert wording in title
                assert ("mean ± std" in title) == (wording != "one seed")
                renderer = FigureCanvasAgg(fig).get_renderer()
                fig.draw(renderer)
                box = suptitle(fig).get_window_extent(renderer)
                assert box.x0 >= 0 and box.x1 <= fig.bbox.width  # the title is not cut off
                legend = fig.legends[0].get_window_extent(renderer)
                assert not box.overlaps(legend)
    single_plot = plots.l0_ink_correlation(pd.DataFrame({
        "dataset": ["mnist"] * 2, "model": ["l1", "topk"], "kind": ["l1", "topk"],
        "config": ["λ = 0.1", "k = 8"], "l0_ink_corr": [0.5, 0.2]}))
    renderer = FigureCanvasAgg(single_plot).get_renderer()
    single_plot.draw(renderer)
    tight = single_plot.get_tightbbox(renderer)
    title = suptitle(single_plot).get_window_extent(renderer)
    assert tight.x0 <= title.x0 and title.x1 <= single_plot.bbox.width


def test_comparison_plots_accept_empty_frames():
    empty = aggregate.summarize_seeds(aggregate.results_frame([]))
    for fig in (plots.fvu_l0_pareto(empty), plots.probe_vs_l0(empty),
                plots.l0_distributions(pd.DataFrame(columns=["dataset", "model", "config",
                                                                "l0"])),
                plots.class_l0_heatmap(pd.DataFrame(columns=["dataset", "model", "config",
                                                                "class", "l0"])),
                plots.l0_ink_correlation(pd.DataFrame(columns=["dataset", "model", "config",
                                                                  "l0_ink_corr"]))):
        assert figures.figure_to_png_bytes(fig, dpi=30).startswith(b"\x89PNG")


def test_pareto_front():
    l0 = np.array([5.0, 10, 20, 8, 30])
    err = np.array([0.5, 0.3, 0.1, 0.6, 0.2])
    assert list(plots._pareto_front(l0, err)) == [0, 1, 2]
