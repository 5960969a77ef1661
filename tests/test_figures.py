"""sae.figures (run figures, training curves, shared helpers): panels, tiles, degenerate input."""

from __future__ import annotations

import matplotlib as mpl
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import pytest
from matplotlib.figure import Figure

from sae import figures as F
from sae.figures import common
from sae.figures.run import ATOM_GAP

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
SHAPE = (8, 8)  # small tiles keep rendering cheap; D = 64
D = SHAPE[0] * SHAPE[1]


def image_axes(fig: Figure) -> list:
    """Axes that show an image (tiles, heatmaps), excluding colour bars."""
    return [ax for ax in fig.axes if ax.images]


def all_text(fig: Figure) -> str:
    """Every title, label and text of a figure, joined (for content checks)."""
    return " ".join(t.get_text() for t in fig.findobj(mpl.text.Text))


def render(fig: Figure) -> bytes:
    """Draw the figure (layout, norms and tickers run only at draw time)."""
    data = F.figure_to_png_bytes(fig, dpi=30)
    assert data.startswith(PNG_SIGNATURE)
    return data


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(0)


@pytest.fixture
def freq(rng) -> np.ndarray:
    f = 10 ** rng.uniform(-4, -0.2, 50)
    f[[3, 7, 11]] = 0.0
    return f


# --------------------------------------------------------------------------- sparsity histogram


def test_sparsity_histogram_overall(rng):
    l0 = rng.poisson(6, 300)
    fig = F.sparsity_histogram(l0)
    assert len(fig.axes) == 1
    assert fig.get_suptitle()
    assert f"mean L0 = {l0.mean():.3g}" in fig.axes[0].get_title()
    render(fig)


def test_sparsity_histogram_facets_per_class(rng):
    labels = rng.integers(0, 3, 300)
    fig = F.sparsity_histogram(rng.poisson(6, 300), labels, ["zero", "one", "two"])
    assert len(fig.axes) == 4  # overall + 3 classes, unused grid cells removed
    titles = [ax.get_title() for ax in fig.axes]
    assert titles[0].startswith("all samples")
    assert [t.split("\n")[0] for t in titles[1:]] == ["zero", "one", "two"]
    render(fig)


def test_sparsity_histogram_empty_class_gets_a_facet(rng):
    labels = rng.integers(0, 2, 100)  # class 2 has no samples
    fig = F.sparsity_histogram(rng.poisson(3, 100), labels, ["a", "b", "c"])
    assert len(fig.axes) == 4
    assert "n = 0" in fig.axes[3].get_title()
    assert "no samples" in all_text(fig)
    render(fig)


def test_sparsity_histogram_wide_codes_use_integer_bins_of_several_units():
    edges, width = common.l0_edges(np.array([0, 1000]))
    assert width > 1
    assert np.allclose(np.diff(edges), width)
    assert np.allclose(edges + 0.5, np.round(edges + 0.5))  # edges sit on half-integers


# --------------------------------------------------------------------------- frequency curve


def test_activation_frequency_curve_is_sorted_on_a_fixed_scale_with_dead_units_marked(freq):
    fig = F.activation_frequency_curve(freq)
    (ax,) = fig.axes
    assert ax.get_yscale() == "log"
    assert ax.get_ylim() == pytest.approx((F.FREQ_FLOOR, 1.0))  # fixed: runs compare 1:1
    assert ax.get_xlim() == pytest.approx((0, 100))  # rank as a share of the units
    live, dead = ax.get_lines()[0], ax.get_lines()[1]
    y = live.get_ydata()
    assert len(y) == 47 and np.all(np.diff(y) <= 0)  # busiest first
    assert np.allclose(y, np.sort(freq[freq > 0])[::-1].clip(F.FREQ_FLOOR))
    assert len(dead.get_xdata()) == 3 and np.all(dead.get_ydata() == F.FREQ_FLOOR)
    assert np.all(dead.get_xdata() > live.get_xdata().max())  # dead units come last
    legend = " ".join(t.get_text() for t in ax.get_legend().get_texts())
    assert "dead units (frequency 0): 3" in legend and "dense threshold" in legend
    assert "3 dead" in fig.get_suptitle()
    render(fig)


def test_activation_frequency_curves_of_two_runs_share_their_axes(rng):
    busy = F.activation_frequency_curve(rng.uniform(0.1, 0.9, 40))
    rare = F.activation_frequency_curve(10 ** rng.uniform(-3.5, -2, 300))
    assert busy.axes[0].get_ylim() == rare.axes[0].get_ylim()
    assert busy.axes[0].get_xlim() == rare.axes[0].get_xlim()


# --------------------------------------------------------------------------- class x unit heatmap


def heatmap_axes(fig: Figure):
    """(selectivity strip, heatmap) of a class x unit heatmap."""
    (heat,) = image_axes(fig)
    strip = next(ax for ax in fig.axes if ax.get_ylabel() == "selectivity")
    return strip, heat


def test_class_unit_heatmap_groups_units_by_preferred_class_then_selectivity():
    # 6 units, 3 classes: unit -> preferred class and how selective it is
    class_freq = np.array([
        # u0    u1    u2    u3    u4    u5
        [0.10, 0.60, 0.05, 0.30, 0.00, 0.20],  # class a
        [0.50, 0.10, 0.05, 0.30, 0.40, 0.20],  # class b
        [0.10, 0.10, 0.40, 0.25, 0.00, 0.21],  # class c
    ])
    fig = F.class_unit_heatmap(class_freq, ["a", "b", "c"])
    strip, ax = heatmap_axes(fig)
    order = [int(t.get_text()) for t in ax.get_xticklabels()]
    # class a: u1 (selective), then u3 (spread, prefers a by a hair); class b: u4 (only b)
    # before u0; class c: u2 then u5 (almost flat)
    assert order == [1, 3, 4, 0, 2, 5]
    preferred, selectivity = F.class_selectivity(class_freq)
    assert list(preferred) == [1, 0, 2, 0, 1, 2]
    assert selectivity[4] == pytest.approx(1.0) and selectivity[5] < 0.01
    heights = [p.get_height() for p in strip.patches]
    assert heights == pytest.approx(list(selectivity[order]))
    np.testing.assert_array_equal(ax.images[0].get_array(), class_freq[:, order])
    assert [t.get_text() for t in ax.get_yticklabels()] == ["a", "b", "c"]
    assert "class of its highest firing rate" in ax.get_xlabel()
    render(fig)


def test_class_unit_heatmap_keeps_the_most_frequent_units():
    rng = np.random.default_rng(1)
    class_freq = rng.uniform(0, 0.2, (3, 20))
    class_freq[:, 13] = 0.9
    fig = F.class_unit_heatmap(class_freq, ["a", "b", "c"], max_units=5)
    _, ax = heatmap_axes(fig)
    assert ax.images[0].get_array().shape == (3, 5)
    shown = {int(t.get_text()) for t in ax.get_xticklabels()}
    assert shown == set(np.argsort(-class_freq.mean(0), kind="stable")[:5])
    render(fig)


def test_class_unit_heatmap_keeps_all_units_when_few():
    fig = F.class_unit_heatmap(np.full((2, 4), 0.25))
    assert image_axes(fig)[0].images[0].get_array().shape == (2, 4)


# --------------------------------------------------------------------------- feature density


def test_feature_density_counts_dead_units(freq):
    fig = F.feature_density_histogram(freq)
    assert len(fig.axes) == 1
    assert "3 dead" in fig.get_suptitle()
    legend = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert any("dead" in t and "3" in t for t in legend)
    assert any("live units: 47" in t for t in legend)
    render(fig)


# --------------------------------------------------------------------------- decoder atoms


def mosaic_of(fig: Figure) -> np.ndarray:
    """The one image of a tile figure, with gaps (masked or NaN) as NaN."""
    (ax,) = image_axes(fig)
    return np.ma.filled(np.ma.masked_invalid(ax.images[0].get_array()).astype(float), np.nan)


def test_tile_mosaic_places_tiles_row_by_row_with_nan_gaps():
    tiles = np.arange(5 * 2 * 3, dtype=float).reshape(5, 2, 3)
    out = F.tile_mosaic(tiles, cols=2, gap=1, band=2)
    assert out.shape == (3 * (2 + 2 + 1) - 1, 2 * (3 + 1) - 1)
    for i, tile in enumerate(tiles):
        y, x = (i // 2) * 5 + 2, (i % 2) * 4
        assert np.array_equal(out[y:y + 2, x:x + 3], tile)
    assert np.isnan(out).sum() == out.size - tiles.size  # everything else is background
    assert np.array_equal(F.tile_mosaic(tiles[:1], cols=8), tiles[0])  # one tile, no padding


@pytest.mark.parametrize(("h", "n", "tiles"), [(30, 9, 9), (5, 64, 5), (1, 64, 1)])
def test_decoder_atoms_tile_count(rng, h, n, tiles):
    fig = F.decoder_atoms(rng.normal(size=(D, h)), rng.uniform(size=h), n=n, image_shape=SHAPE)
    labels = [t.get_text() for t in image_axes(fig)[0].texts]
    assert len(labels) == tiles and all(label.startswith("#") for label in labels)
    assert np.isfinite(mosaic_of(fig)).sum() == tiles * D
    assert fig.get_suptitle()
    render(fig)


def test_decoder_atoms_most_used_first_and_symmetric_scale(rng):
    dec = rng.normal(size=(D, 6))
    dec[:, 4] = 0.0  # an all-zero atom stays 0 (white), not NaN
    freq = np.array([0.1, 0.0, 0.5, 0.3, 0.2, 0.05])
    fig = F.decoder_atoms(dec, freq, n=4, image_shape=SHAPE)
    (ax,) = image_axes(fig)
    assert [t.get_text() for t in ax.texts] == ["#2: 50%", "#3: 30%", "#4: 20%", "#0: 10%"]
    assert ax.images[0].get_clim() == (-1, 1)
    # each tile is its atom divided by its own max |w|, laid out most frequent first
    expected = [dec[:, j] / (np.abs(dec[:, j]).max() or 1.0) for j in (2, 3, 4, 0)]
    cols = common.grid_shape(4)[1]
    mosaic = mosaic_of(fig)
    band = 3  # the label band of 8-pixel tiles: max(8 // 3, 3)
    layout = F.tile_mosaic(np.reshape(expected, (4, *SHAPE)), cols, gap=ATOM_GAP, band=band)
    assert layout.shape == mosaic.shape
    np.testing.assert_allclose(mosaic, layout)
    assert np.nanmax(np.abs(mosaic)) == pytest.approx(1.0)
    colour_bars = [a for a in fig.axes if not a.images]
    assert len(colour_bars) == 1 and "max |w|" in colour_bars[0].get_ylabel()


def test_decoder_atoms_odd_input_size_falls_back_to_a_strip(rng):
    fig = F.decoder_atoms(rng.normal(size=(10, 3)), np.ones(3), image_shape=(28, 28))
    mosaic = mosaic_of(fig)
    assert mosaic.shape[1] == 2 * (10 + ATOM_GAP) - ATOM_GAP  # 1 x 10 strips, 2 per row
    assert np.isfinite(mosaic).sum() == 30
    render(fig)


def test_decoder_atoms_rejects_mismatched_freq(rng):
    with pytest.raises(ValueError, match="freq"):
        F.decoder_atoms(rng.normal(size=(D, 4)), np.ones(3), image_shape=SHAPE)


# --------------------------------------------------------------------------- reconstructions


@pytest.mark.parametrize(("rows", "n", "pairs"), [(20, 16, 16), (3, 16, 3), (1, 1, 1)])
def test_reconstructions_pairs(rng, rows, n, pairs):
    x = rng.uniform(size=(rows, D))
    fig = F.reconstructions(x, x + 0.1, image_shape=SHAPE, n=n)
    (ax,) = image_axes(fig)
    assert np.isfinite(mosaic_of(fig)).sum() == 2 * pairs * D
    assert [t.get_text().split()[0] for t in ax.texts if "MSE" in t.get_text()] == ["MSE"] * pairs
    assert [t.get_text() for t in ax.texts if "MSE" not in t.get_text()][:2] == ["input",
                                                                                    "output"]
    assert fig.get_suptitle()
    render(fig)


def test_reconstructions_inputs_sit_above_outputs(rng):
    x = rng.uniform(size=(10, D))
    x_hat = rng.uniform(size=(10, D))
    fig = F.reconstructions(x, x_hat, image_shape=SHAPE)
    mosaic = mosaic_of(fig)
    band = 3  # the label band of 8-pixel tiles: max(8 // 3, 3)
    pitch = band + SHAPE[0] + 1
    # 8 pairs per row: row pair p holds inputs 8p.. in mosaic row 2p and outputs in row 2p + 1
    for i in range(10):
        y_in, y_out = (2 * (i // 8)) * pitch + band, (2 * (i // 8) + 1) * pitch + band
        x0 = (i % 8) * (SHAPE[1] + 1)
        np.testing.assert_array_equal(mosaic[y_in:y_in + 8, x0:x0 + 8], x[i].reshape(SHAPE))
        np.testing.assert_array_equal(mosaic[y_out:y_out + 8, x0:x0 + 8],
                                      x_hat[i].reshape(SHAPE))
    assert np.isfinite(mosaic).sum() == 2 * 10 * D  # the short second row is padded with NaN
    mse = [float(t.get_text().split()[1]) for t in image_axes(fig)[0].texts
           if "MSE" in t.get_text()]
    np.testing.assert_allclose(mse, ((x - x_hat) ** 2).mean(1), rtol=0.05)


def test_reconstructions_use_the_pixel_range_and_say_that_outputs_are_clipped(rng):
    x = rng.uniform(size=(4, D))
    x_hat = x * 1.8 - 0.3  # overshoots both ends
    fig = F.reconstructions(x, x_hat, image_shape=SHAPE, source="the first 4 validation inputs")
    im = image_axes(fig)[0].images[0]
    assert (im.norm.vmin, im.norm.vmax) == (0.0, 1.0)  # inputs are not washed out
    mosaic = mosaic_of(fig)
    assert np.nanmin(mosaic) >= 0 and np.nanmax(mosaic) <= 1  # outputs clipped for display
    assert "the first 4 validation inputs" in fig.get_suptitle()
    share = 100 * np.mean((x_hat < 0) | (x_hat > 1))
    assert f"clipped to 0..1 for display ({share:.1f}%" in all_text(fig)
    # MSE labels are of the unclipped outputs
    mse = [float(t.get_text().split()[1]) for t in image_axes(fig)[0].texts
           if "MSE" in t.get_text()]
    np.testing.assert_allclose(mse, ((x - x_hat) ** 2).mean(1), rtol=0.05)


# --------------------------------------------------------------------------- training curves


def history(n_steps: int = 300) -> pd.DataFrame:
    """A CSVLogger-like frame: train rows every step, val rows every 100 steps (sparse)."""
    rows = [{"step": s, "epoch": s // 100, "train/loss": 1 / (1 + s), "train/recon": 1 / (1 + s),
             "train/penalty": 3.0, "train/lambda": min(s / 50, 1) * 0.01,
             "train/l0": 20 - s / 30, "train/dead_fraction": 0.01} for s in range(n_steps)]
    rows += [{"step": s, "epoch": s // 100, "val/loss": 0.1, "val/fvu": 0.3, "val/mse": 0.02,
              "val/l0": 9.0, "val/dead_fraction": 0.02} for s in range(99, n_steps, 100)]
    return pd.DataFrame(rows)


@pytest.mark.slow
def test_training_curves_all_panels():
    fig = F.training_curves(history())
    titles = [ax.get_title() for ax in fig.axes]
    assert len(titles) == 7 and all(titles)
    assert titles[0] == "Total loss" and any("λ" in t for t in titles)
    loss = fig.axes[0]
    assert {line.get_label() for line in loss.get_lines()} >= {"val"}
    assert all(ax.get_xlabel() == "training step" for ax in fig.axes)
    render(fig)


@pytest.mark.slow
def test_training_curves_show_warm_up_from_zero_and_bound_dead_units():
    """λ_t's axis starts at 0 (the warm-up's rise shows even when the first logged λ_t is not
    0); one dead unit of 512 stays a small step on the dead-units axis, whose legend says where
    units were counted dead."""
    frame = history()
    frame["train/lambda"] = np.where(frame["step"] < 50, 0.0045 + frame["step"] * 1e-4, 0.01)
    frame["train/dead_fraction"] = np.where(frame["step"] % 2, 1 / 512, 0.0)
    fig = F.training_curves(frame)
    by_title = {ax.get_title(): ax for ax in fig.axes}
    lam = next(ax for t, ax in by_title.items() if "λ" in t)
    assert lam.get_yscale() == "linear" and lam.get_ylim()[0] == 0.0
    dead = next(ax for t, ax in by_title.items() if t.startswith("Dead"))
    assert dead.get_ylim()[0] == 0.0 and dead.get_ylim()[1] >= 0.05
    labels = [text.get_text() for text in dead.get_legend().get_texts()]
    assert any("validation set" in label for label in labels)
    render(fig)


@pytest.mark.slow
def test_training_curves_skips_unlogged_panels():
    frame = history()[["step", "epoch", "train/loss", "train/l0"]]
    fig = F.training_curves(frame)
    assert [ax.get_title() for ax in fig.axes] == ["Total loss", "Active units per input"]
    render(fig)


def test_training_curves_reads_sparse_rows_per_column():
    frame = history(250)
    fig = F.training_curves(frame)
    val_line = next(ln for ln in fig.axes[0].get_lines() if ln.get_label() == "val")
    assert list(val_line.get_xdata()) == [99, 199]


@pytest.mark.parametrize(
    "frame",
    [pd.DataFrame(), pd.DataFrame(columns=["step", "epoch", "train/loss"]),
     pd.DataFrame({"step": [0, 1], "epoch": [0, 0], "other": [1.0, 2.0]})],
    ids=["empty", "no-rows", "unknown-columns"],
)
def test_training_curves_without_data(frame):
    fig = F.training_curves(frame)
    assert len(fig.axes) == 1
    assert "no training metrics" in all_text(fig)
    render(fig)


# --------------------------------------------------------------------------- degenerate inputs

H = 9
EDGE_CASES = {
    "hist-l0-zero": lambda: F.sparsity_histogram(np.zeros(50, int)),
    "hist-l0-zero-classes": lambda: F.sparsity_histogram(np.zeros(50, int), np.zeros(50, int)),
    "hist-single-class": lambda: F.sparsity_histogram(np.arange(5), np.zeros(5, int), ["only"]),
    "hist-no-samples": lambda: F.sparsity_histogram(np.zeros(0, int)),
    "hist-no-samples-classes": lambda: F.sparsity_histogram(np.zeros(0), np.zeros(0), ["a"]),
    "freq-all-dead": lambda: F.activation_frequency_curve(np.zeros(H)),
    "freq-single-unit": lambda: F.activation_frequency_curve(np.array([0.3])),
    "freq-single-dead-unit": lambda: F.activation_frequency_curve(np.zeros(1)),
    "freq-constant": lambda: F.activation_frequency_curve(np.full(H, 0.5)),
    "freq-no-units": lambda: F.activation_frequency_curve(np.zeros(0)),
    "heat-all-zero": lambda: F.class_unit_heatmap(np.zeros((3, H))),
    "heat-empty-class-row": lambda: F.class_unit_heatmap(np.r_[np.ones((1, H)), np.zeros((1, H))]),
    "heat-single": lambda: F.class_unit_heatmap(np.array([[0.2]]), ["only"]),
    "heat-1d": lambda: F.class_unit_heatmap(np.full(H, 0.1)),
    "heat-no-classes": lambda: F.class_unit_heatmap(np.zeros((0, H))),
    "heat-max-units-0": lambda: F.class_unit_heatmap(np.ones((2, H)), max_units=0),
    "density-all-dead": lambda: F.feature_density_histogram(np.zeros(H)),
    "density-single-unit": lambda: F.feature_density_histogram(np.array([1.0])),
    "density-no-units": lambda: F.feature_density_histogram(np.zeros(0)),
    "atoms-all-zero": lambda: F.decoder_atoms(np.zeros((D, H)), np.zeros(H), image_shape=SHAPE),
    "atoms-single-unit": lambda: F.decoder_atoms(np.ones((D, 1)), np.zeros(1), image_shape=SHAPE),
    "atoms-no-units": lambda: F.decoder_atoms(np.zeros((D, 0)), np.zeros(0), image_shape=SHAPE),
    "recon-all-zero": lambda: F.reconstructions(np.zeros((2, D)), np.zeros((2, D)), SHAPE),
    "recon-no-samples": lambda: F.reconstructions(np.zeros((0, D)), np.zeros((0, D)), SHAPE),
}


@pytest.mark.parametrize("make", EDGE_CASES.values(), ids=EDGE_CASES.keys())
def test_degenerate_inputs_still_give_a_titled_figure(make):
    fig = make()
    assert isinstance(fig, Figure)
    assert fig.get_suptitle()
    render(fig)


def test_all_dead_is_stated():
    assert "9 dead (100.0%)" in F.activation_frequency_curve(np.zeros(H)).get_suptitle()
    assert "9 dead" in F.feature_density_histogram(np.zeros(H)).get_suptitle()
    atoms = F.decoder_atoms(np.zeros((D, H)), np.zeros(H), image_shape=SHAPE)
    assert [t.get_text() for t in image_axes(atoms)[0].texts] == [f"#{j}: dead" for j in range(H)]
    assert np.nansum(np.abs(mosaic_of(atoms))) == 0 and np.isfinite(mosaic_of(atoms)).sum() == H * D


# --------------------------------------------------------------------------- output helpers


def test_save_png_writes_a_png_and_creates_folders(tmp_path, freq):
    path = tmp_path / "figures" / "feature_density" / "epoch_3.png"
    out = F.save_png(F.feature_density_histogram(freq), path)
    assert out == path
    assert path.read_bytes().startswith(PNG_SIGNATURE)
    assert sorted(p.name for p in path.parent.iterdir()) == ["epoch_3.png"]  # no temp left


def test_figure_to_rgb_shape(freq):
    fig = F.feature_density_histogram(freq)
    dpi = fig.dpi
    rgb = F.figure_to_rgb(fig, dpi=20)
    w, h = fig.get_size_inches() * 20
    assert rgb.dtype == np.uint8 and rgb.shape == (round(h), round(w), 3)
    assert fig.dpi == dpi  # the figure's own dpi is restored


def test_no_global_state_leaks(rng, freq):
    before = dict(mpl.rcParams)
    figs_before = plt.get_fignums()
    F.sparsity_histogram(rng.poisson(4, 50), rng.integers(0, 2, 50))
    F.activation_frequency_curve(freq)
    F.decoder_atoms(rng.normal(size=(D, 4)), rng.uniform(size=4), image_shape=SHAPE)
    F.training_curves(history(20))
    assert plt.get_fignums() == figs_before  # nothing registered with pyplot
    assert dict(mpl.rcParams) == before  # seaborn style applied only while building


# --------------------------------------------------------------------------- model styles


def test_model_style_is_fixed_by_kind_and_name():
    from sae.figures.common import DISTINCT, MODEL_STYLES, colour_distance, model_style

    kinds = ["l1", "kl", "sparsemax", "entmax", "topk", "batchtopk", "jumprelu"]
    assert set(MODEL_STYLES) == set(kinds)
    looks = {k: (model_style(k)["color"], model_style(k)["marker"]) for k in kinds}
    assert len(set(looks.values())) == len(kinds)  # every kind its own colour and marker
    assert len({c for c, _ in looks.values()}) == len(kinds)
    for variant in ("sparsemax-previous", "sparsemax-learned", "sparsemax-normalized-ste",
                    "sparsemax-mine"):
        style = model_style(variant, "sparsemax")
        assert style == model_style(variant)  # the kind does not change it
        assert style == model_style(variant, "sparsemax")  # deterministic
        base = model_style("sparsemax")
        assert style["ls"] != "-"
        if variant != "sparsemax-mine":  # a named variant: a colour apart from its kind's
            assert colour_distance(style["color"], base["color"]) >= DISTINCT
    assert model_style("my-model")["color"] == model_style("my-model")["color"]


def test_seeds_note_claims_a_spread_only_with_two_seeds():
    from sae.figures.common import seeds_note

    assert seeds_note([3, 3, 2]) == "mean ± std over seeds"
    assert "one seed" in seeds_note([1, 1]) and "±" not in seeds_note([1, 1])
    assert "one seed" in seeds_note([1, 3]) and "≥ 2" in seeds_note([1, 3])
