"""Tests for sae.pages.features (statistics, page, CLI) and sae.figures.embedding, without a
browser."""

from __future__ import annotations

import base64
import io
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays
from matplotlib.figure import Figure
from PIL import Image

from sae.figures.embedding import embed_codes, embed_many, embedding_figure
from sae.pages.features import feature_stats, render_features_page
from sae.pages.features.stats import attributions, band_examples, nearest_units, probe_weights

REPO = Path(__file__).resolve().parents[1]


def stats_of(codes, labels, threshold=0.0, n_classes=None, n_top=4, atoms=None, x=None,
             **kwargs):
    codes = np.asarray(codes, dtype=np.float32)
    n, h = codes.shape
    x = np.zeros((n, 4), np.float32) if x is None else x
    atoms = np.ones((x.shape[1], h), np.float32) if atoms is None else atoms
    return feature_stats(codes, np.asarray(labels), x, atoms, threshold, n_top=n_top,
                         n_classes=n_classes, **kwargs)


# --------------------------------------------------------------------------- feature_stats


def test_selectivity_one_class_only_is_1_all_classes_equally_is_0():
    labels = np.repeat(np.arange(4), 5)  # 4 classes x 5 inputs
    codes = np.zeros((20, 3), np.float32)
    codes[labels == 2, 0] = 1.0  # fires on class 2 only
    codes[:, 1] = 0.5  # fires on everything
    s = stats_of(codes, labels)
    assert s["selectivity"][0] == pytest.approx(1.0)
    assert s["preferred_class"][0] == 2
    np.testing.assert_allclose(s["class_dist"][0], [0, 0, 1, 0])
    assert s["selectivity"][1] == pytest.approx(0.0, abs=1e-6)
    np.testing.assert_allclose(s["class_dist"][1], 0.25)
    assert np.isnan(s["selectivity"][2]) and s["preferred_class"][2] == -1  # dead


def test_selectivity_weighs_classes_equally():
    """Firing on the same share of every class is 0, however many inputs each class has."""
    labels = np.array([0] * 8 + [1] * 2)
    codes = np.zeros((10, 1), np.float32)
    codes[[0, 1, 2, 3, 8], 0] = 1.0  # half of class 0, half of class 1
    s = stats_of(codes, labels)
    assert s["selectivity"][0] == pytest.approx(0.0, abs=1e-6)
    np.testing.assert_allclose(s["class_rate"][0], [0.5, 0.5])


def test_selectivity_in_between_and_with_absent_classes():
    labels = np.repeat(np.arange(3), 4)
    codes = np.zeros((12, 1), np.float32)
    codes[[0, 1, 4], 0] = 1.0  # rates 0.5, 0.25, 0 -> p = (2/3, 1/3, 0)
    s = stats_of(codes, labels, n_classes=5)  # classes 3 and 4 have no inputs
    p = np.array([2 / 3, 1 / 3])
    expected = 1 + (p * np.log(p)).sum() / np.log(3)
    assert s["selectivity"][0] == pytest.approx(expected, rel=1e-5)
    assert s["class_dist"].shape == (1, 5)


def test_dead_and_dense_flags_frequency_and_activation_summaries():
    codes = np.array([[0, 1, 0.0, 2], [0, 1, 0.2, 0], [0, 0, 0.0, 0]], np.float32)
    s = stats_of(codes, [0, 1, 0])
    assert s["dead"].tolist() == [True, False, False, False]
    assert s["dense"].tolist() == [False, True, False, False]  # 2/3 > 0.5; 1/3 is not
    np.testing.assert_allclose(s["frequency"], [0, 2 / 3, 1 / 3, 1 / 3])
    assert s["fire_count"].tolist() == [0, 2, 1, 1]
    np.testing.assert_allclose(s["mean_activation"], [0, 1, 0.2, 2], rtol=1e-6)
    np.testing.assert_allclose(s["max_activation"], [0, 1, 0.2, 2], rtol=1e-6)
    assert (s["top_index"][0] == -1).all() and (s["hist_counts"][0] == 0).all()
    assert np.isnan(s["atom_cosine"][0])


def test_threshold_is_strict_and_nan_never_fires():
    """Sigmoid-style codes: only values above the threshold fire (as metrics.active)."""
    codes = np.array([[0.05], [0.1], [0.3], [np.nan], [0.9]], np.float32)
    s = stats_of(codes, [0, 0, 1, 1, 1], threshold=0.1)
    assert s["fire_count"][0] == 2
    assert s["top_index"][0].tolist() == [4, 2, -1, -1]
    np.testing.assert_allclose(s["top_activation"][0], [0.9, 0.3, 0, 0], rtol=1e-6)
    assert s["top_label"][0].tolist() == [1, 1, -1, -1]
    np.testing.assert_allclose(s["hist_edges"][0][[0, -1]], [0.1, 0.9], rtol=1e-6)
    assert s["hist_counts"][0].sum() == 2


sparse_codes = arrays(
    np.float32, st.tuples(st.integers(1, 40), st.integers(1, 6)),
    elements=st.one_of(st.just(0.0), st.floats(0, 10, width=32)))


@settings(max_examples=60, deadline=None)
@given(codes=sparse_codes, n_top=st.integers(1, 8), seed=st.integers(0, 2**16))
def test_top_inputs_are_the_top_and_histograms_count_every_firing(codes, n_top, seed):
    n, h = codes.shape
    labels = np.random.default_rng(seed).integers(0, 3, n)
    s = stats_of(codes, labels, n_classes=3, n_top=n_top)
    for j in range(h):
        fired = np.sort(codes[codes[:, j] > 0, j])[::-1]
        k = min(n_top, len(fired))
        idx, act = s["top_index"][j], s["top_activation"][j]
        np.testing.assert_array_equal(act[:k], fired[:k])  # the k largest, in order
        np.testing.assert_array_equal(codes[idx[:k], j], act[:k])  # and they belong to idx
        assert len(set(idx[:k].tolist())) == k
        assert (idx[k:] == -1).all() and (act[k:] == 0).all()
        np.testing.assert_array_equal(s["top_label"][j][:k], labels[idx[:k]])
        assert s["hist_counts"][j].sum() == s["fire_count"][j] == len(fired)
        if len(fired):
            edges = s["hist_edges"][j]
            assert edges[0] == 0 and edges[-1] == pytest.approx(fired[0])
            counts, _ = np.histogram(fired, bins=edges)
            # np.histogram's bins are [a, b) except the last; ours are (a, b]: differ only at edges
            assert abs(counts - s["hist_counts"][j]).sum() <= 2 * np.isin(fired, edges).sum()
        sel = s["selectivity"][j]
        undefined = not len(fired) or len(np.unique(labels)) < 2  # dead, or nothing to select
        assert np.isnan(sel) if undefined else 0 <= sel <= 1


def test_atom_cosine_is_1_when_the_atom_draws_its_top_inputs():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(30, 6)).astype(np.float32)
    codes = np.zeros((30, 2), np.float32)
    codes[:3, 0] = [3, 2, 1]  # unit 0's top inputs are rows 0-2
    codes[5:8, 1] = 1
    atoms = np.zeros((6, 2), np.float32)
    atoms[:, 0] = 2.0 * (x[:3].mean(0) - x.mean(0))
    atoms[:, 1] = -(x[5:8].mean(0) - x.mean(0))
    s = feature_stats(codes, np.zeros(30, int), x, atoms, n_top=3)
    np.testing.assert_allclose(s["atom_cosine"], [1.0, -1.0], rtol=1e-5)
    np.testing.assert_allclose(s["atoms"], atoms.T)


@settings(max_examples=60, deadline=None)
@given(codes=sparse_codes, n_bands=st.integers(1, 4), per_band=st.integers(1, 5))
def test_band_examples_come_from_their_quantile_band(codes, n_bands, per_band):
    """Band b holds inputs whose firing rank (strongest first) lies in the b-th equal-count
    slice of the unit's firings, strongest first, distinct, each the middle of its share."""
    fires = codes > 0
    index, act, low, high = band_examples(codes, fires, n_bands, per_band)
    for j in range(codes.shape[1]):
        fired = np.sort(codes[fires[:, j], j])[::-1]
        m = len(fired)
        for b in range(n_bands):
            lo, hi = b * m // n_bands, (b + 1) * m // n_bands
            k = min(per_band, hi - lo)
            picked = index[j, b]
            assert (picked[k:] == -1).all() and (act[j, b, k:] == 0).all()
            if k == 0:
                assert np.isnan(low[j, b]) and np.isnan(high[j, b])
                continue
            assert len(set(picked[:k].tolist())) == k and fires[picked[:k], j].all()
            np.testing.assert_array_equal(codes[picked[:k], j], act[j, b, :k])
            assert high[j, b] == fired[lo] and low[j, b] == fired[hi - 1]
            assert (act[j, b, :k] <= fired[lo]).all() and (act[j, b, :k] >= fired[hi - 1]).all()
            assert (np.diff(act[j, b, :k]) <= 0).all()  # strongest first
            ranks = lo + (2 * np.arange(k) + 1) * (hi - lo) // (2 * k)  # middles of k shares
            np.testing.assert_array_equal(act[j, b, :k], fired[ranks])


def test_band_examples_spread_over_a_band():
    codes = np.arange(1, 31, dtype=np.float32)[:, None]  # 30 firings: 30 (strongest) ... 1
    index, act, low, high = band_examples(codes, codes > 0, n_bands=3, per_band=2)
    np.testing.assert_array_equal(act[0], [[28, 23], [18, 13], [8, 3]])
    np.testing.assert_array_equal(high[0], [30, 20, 10])
    np.testing.assert_array_equal(low[0], [21, 11, 1])
    np.testing.assert_array_equal(index[0], act[0] - 1)


def test_nearest_units_by_decoder_cosine():
    atoms = np.array([[1, 0, 0], [0.9, 0.1, 0], [0, 1, 0], [-1, 0, 0], [0, 0, 0]], np.float32)
    index, cosine = nearest_units(atoms, k=2)
    assert index.shape == cosine.shape == (5, 2)
    assert index[0].tolist() == [1, 2] or index[0].tolist() == [1, 4]
    assert cosine[0, 0] == pytest.approx(0.9 / np.hypot(0.9, 0.1), rel=1e-6)
    assert index[3, 0] in (2, 4) and cosine[3, 0] == pytest.approx(0.0, abs=1e-6)
    assert (index != np.arange(5)[:, None]).all()  # never itself
    np.testing.assert_allclose(cosine[4], 0)  # a zero atom is at cosine 0 from all
    full, cos_full = nearest_units(atoms, k=10)
    assert full.shape == (5, 4) and (np.diff(cos_full, axis=1) <= 1e-7).all()
    assert nearest_units(atoms[:1])[0].shape == (1, 0)


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**16), h=st.integers(1, 5), e=st.integers(1, 4))
def test_attributions_sum_to_the_pre_activation(seed, h, e):
    """(x − b_dec) ⊙ w_j: its pixels sum to w_j · (x − b_dec); a pixel is positive where the
    input and the encoder row agree in sign; empty slots are zero."""
    rng = np.random.default_rng(seed)
    x, centre = rng.random((7, 6)).astype(np.float32), rng.random(6).astype(np.float32)
    encoder = rng.normal(size=(h, 6)).astype(np.float32)
    index = rng.integers(-1, 7, (h, e))
    attr = attributions(x - centre, encoder, index)
    assert attr.shape == (h, e, 6)
    for j in range(h):
        for s, i in enumerate(index[j]):
            if i < 0:
                assert (attr[j, s] == 0).all()
                continue
            pre = encoder[j] @ (x[i] - centre)
            assert attr[j, s].sum() == pytest.approx(pre, abs=1e-5)
            agree = np.sign(x[i] - centre) * np.sign(encoder[j])
            assert (np.sign(attr[j, s]) == agree).all()


def test_feature_stats_quantises_attributions_per_unit():
    rng = np.random.default_rng(0)
    x = rng.random((40, 4)).astype(np.float32)
    codes = np.maximum(rng.normal(size=(40, 3)), 0).astype(np.float32)
    codes[:, 2] = 0  # dead: no attributions
    encoder = rng.normal(size=(3, 4)).astype(np.float32)
    centre = x.mean(0)
    s = stats_of(codes, np.arange(40) % 2, x=x, atoms=np.ones((4, 3), np.float32), n_top=3,
                 encoder=encoder, centre=centre)
    assert s["top_attribution"].shape == (3, 3, 4) and s["top_attribution"].dtype == np.int8
    assert s["band_attribution"].shape == (3, 3, 3, 4)
    for j in range(2):
        i = s["top_index"][j, 0]
        exact = (x[i] - centre) * encoder[j]
        np.testing.assert_allclose(s["top_attribution"][j, 0] / 127 * s["attribution_scale"][j],
                                   exact, atol=s["attribution_scale"][j] / 127)
        assert np.abs(s["top_attribution"][j]).max() <= 127
    assert (s["top_attribution"][2] == 0).all() and s["attribution_scale"][2] == 0


def test_rare_units_do_not_rank_on_selectivity():
    labels = np.arange(100) % 2
    codes = np.zeros((100, 2), np.float32)
    codes[labels == 0, 0] = 1.0  # 50 firings, all class 0
    codes[[0, 2, 4], 1] = 1.0  # 3 firings, all class 0: as selective, but by chance
    s = stats_of(codes, labels, n_classes=2)
    assert s["selectivity"].tolist() == pytest.approx([1.0, 1.0])
    assert s["ranked"].tolist() == [True, False] and int(s["min_firings"]) == 20
    assert stats_of(codes, labels, n_classes=2, min_firings=3)["ranked"].all()
    page = render_features_page(s, np.zeros((100, 2, 2), np.uint8), "rare")
    rows = dict(re.findall(r'<tr data-j="(\d+)"[^>]*data-sel="([^"]*)"', page))
    assert rows == {"0": "1.0000", "1": ""}  # the rare unit's selectivity sorts last
    assert "rare</td>" in page and "at least 20 test inputs" in page


def test_probe_weights_vote_for_the_class_a_unit_fires_on_and_score_held_out_codes():
    rng = np.random.default_rng(0)
    labels = np.arange(600) % 3
    codes = (rng.random((600, 4)) * 0.1).astype(np.float32)
    codes[labels == 1, 0] += 2.0  # unit 0 marks class 1
    codes[labels == 2, 1] += 2.0  # unit 1 marks class 2
    train, test = slice(0, 300), slice(300, 600)
    weights, accuracy = probe_weights(codes[train], labels[train], codes[test], labels[test], 3)
    assert weights.shape == (4, 3)
    assert weights[0].argmax() == 1 and weights[1].argmax() == 2
    assert accuracy > 0.95
    # scored on the test codes, not on those it was fitted on: test labels it cannot predict
    # (shuffled) bring its accuracy to chance, whatever the fit
    shuffled = rng.permutation(labels[test])
    _, chance = probe_weights(codes[train], labels[train], codes[test], shuffled, 3)
    assert chance < 0.5


@pytest.mark.parametrize("bad", [
    dict(codes=np.zeros((0, 3))), dict(labels=np.zeros(4, int)), dict(atoms=np.zeros((4, 2))),
    dict(labels=np.full(5, 7), n_classes=3), dict(n_top=0)])
def test_bad_shapes_raise(bad):
    args = dict(codes=np.zeros((5, 3)), labels=np.zeros(5, int), x=np.zeros((5, 4)),
                atoms=np.zeros((4, 3)))
    args.update(bad)
    with pytest.raises(ValueError):
        feature_stats(**args)


# --------------------------------------------------------------------------- page


@pytest.fixture(scope="module")
def page_parts():
    """A small synthetic SAE: 7 units on 8x8 images, unit 5 dead, unit 6 dense."""
    rng = np.random.default_rng(1)
    n, h, side = 60, 7, 8
    images = rng.integers(0, 256, (n, side, side), dtype=np.uint8)
    labels = np.arange(n) % 3
    codes = np.where(rng.random((n, h)) < 0.2, rng.random((n, h)), 0).astype(np.float32)
    codes[:, 5] = 0
    codes[:, 6] = 0.5 + rng.random(n)
    atoms = rng.normal(size=(side * side, h)).astype(np.float32)
    s = feature_stats(codes, labels, images.reshape(n, -1) / 255.0, atoms, n_top=12)
    names = ["zero", "<script>alert('x')</script>", "a & b"]
    page = render_features_page(s, images, "run <1>", names, subtitle="sparsemax on test",
                                embedding_png=_png((10, 12)))
    return s, images, page, names


def _png(shape) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(np.zeros(shape, np.uint8)).save(buf, format="PNG")
    return buf.getvalue()


def test_embedding_caption_names_the_pixel_panel_only_where_there_is_one(page_parts):
    s, images, page, names = page_parts
    caption = re.compile(r"<figcaption>(.*?)</figcaption>", re.S)
    assert "raw pixels" in caption.search(page.split('id="embedding-figure"')[1])[1]
    codes_only = render_features_page(s, images, "run", names, embedding_png=_png((10, 12)),
                                      embedding_beside_pixels=False)
    text = caption.search(codes_only.split('id="embedding-figure"')[1])[1]
    assert "pixels" not in text and "t-SNE" in text


def test_page_has_every_unit_anchor_and_lists_dead_units(page_parts):
    s, _, page, _ = page_parts
    for j in range(7):
        assert len(re.findall(f'id="unit-{j}"', page)) == 1
        assert f'href="#unit-{j}"' in page
    assert len(re.findall(r'<tr data-j="\d+"', page)) == 7  # index rows, one per unit
    dead_card = re.search(r'<section class="unit" id="unit-5".*?</section>', page, re.S)[0]
    assert "dead" in dead_card and "Never fires" in dead_card
    assert 'data-j="5" ' in page and 'data-state="dead"' in page
    assert 'data-state="dense"' in page
    assert "1 dead" in page and "1 dense" in page


def test_page_is_self_contained_and_escapes_text(page_parts):
    _, _, page, _ = page_parts
    assert "http://" not in page and "https://" not in page
    assert not re.search(r'(src|href)="(?!#|data:)', page)  # only anchors and inline data
    assert page.count("<script>") == 1  # the page's own script; the class name is escaped
    assert "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;" in page
    assert "a &amp; b" in page and "run &lt;1&gt;" in page


def _sprite(page: str, selector: str) -> Image.Image:
    data = re.search(re.escape(selector) + r"\{[^}]*base64,([A-Za-z0-9+/=]+)\)", page)[1]
    return Image.open(io.BytesIO(base64.b64decode(data)))


def test_sprites_hold_every_atom_and_every_shown_input(page_parts):
    s, images, page, _ = page_parts
    atoms = _sprite(page, ".sa")
    assert atoms.mode == "P" and atoms.size == (7 * 8, 8)  # 7 tiles in one row
    shown = np.concatenate([s["top_index"].ravel(), s["band_index"].ravel()])
    used = np.unique(shown[shown >= 0])
    sheet = _sprite(page, ".t i")
    assert sheet.mode == "P"
    inputs = np.asarray(sheet.convert("L"), dtype=float)
    assert inputs.shape == (8, len(used) * 8)
    for slot, i in enumerate(used):  # ink-dark copies of the inputs (16 greys), in index order
        tile = inputs[:, slot * 8:(slot + 1) * 8]
        np.testing.assert_allclose(tile, 255 - images[i], atol=255 / 30 + 0.5)
    tiles = (s["top_index"] >= 0).sum() + (s["band_index"] >= 0).sum()
    assert page.count('<div class="t"') == tiles
    assert page.count('class="sa"') == 7


def test_page_draws_attributions_histogram_axes_nearest_units_and_the_report_link():
    rng = np.random.default_rng(2)
    n, h, side = 80, 6, 4
    images = rng.random((n, side, side)).astype(np.float32)
    codes = np.where(rng.random((n, h)) < 0.5, rng.random((n, h)), 0).astype(np.float32)
    x = images.reshape(n, -1)
    s = feature_stats(codes, np.arange(n) % 2, x, rng.normal(size=(side * side, h)), n_top=3,
                      encoder=rng.normal(size=(h, side * side)), centre=x.mean(0))
    page = render_features_page(s, images, "attr", report=("report.html", False))
    tiles = (s["top_index"] >= 0).sum() + (s["band_index"] >= 0).sum()
    assert page.count('<i class="a"') == tiles  # one attribution per shown input
    sheet = _sprite(page, ".t i.a")
    assert sheet.size[0] * sheet.size[1] >= tiles * side * side
    assert page.count(">activation</text>") == page.count(">count</text>") == h
    for j in range(h):
        card = re.search(f'<section class="unit" id="unit-{j}".*?</section>', page, re.S)[0]
        near = re.findall(r'class="near" href="#unit-(\d+)"', card)
        assert near == [str(k) for k in s["nearest_index"][j]] and str(j) not in near
    assert '<a id="report-link" href="report.html">' in page
    assert "python -m sae.report RUN" in page  # the report does not exist yet: say how
    assert "only the strongest" not in page  # a small page draws every attribution
    assert 'id="report-link"' not in render_features_page(s, images, "attr")


def test_atoms_of_another_size_than_the_images_get_their_own_grid(page_parts):
    """Activations shown by their source images: the atoms (D = 64 here) are drawn on their
    own grid; attributions, which are per pixel, would not match and are refused."""
    s, images, _, _ = page_parts
    page = render_features_page(s, images[:, :4, :5], "x")
    atom_rule = re.search(r"\.sa\{width:(\d+)px;height:(\d+)px", page)
    assert atom_rule and (int(atom_rule[1]), int(atom_rule[2])) == (8 * 3, 8 * 3)
    assert re.search(r"\.t i\{width:10px;height:8px", page)  # the 4x5 inputs at 2x
    with_attributions = dict(s, top_attribution=np.zeros((7, 12, 64), np.int8))
    with pytest.raises(ValueError):
        render_features_page(with_attributions, images[:, :4, :4], "x")


# --------------------------------------------------------------------------- embedding


def test_embedding_is_seeded_and_subsampled():
    rng = np.random.default_rng(0)
    codes = np.maximum(rng.normal(size=(300, 20)), 0).astype(np.float32)
    a, ia = embed_codes(codes, max_points=120, seed=3)
    b, ib = embed_codes(codes, max_points=120, seed=3)
    assert a.shape == (120, 2) and np.all(np.diff(ia) > 0)
    np.testing.assert_array_equal(ia, ib)
    np.testing.assert_allclose(a, b)


def test_embedding_separates_separable_classes():
    """Two well-separated clusters of codes stay separated: nearest neighbours share a class."""
    rng = np.random.default_rng(0)
    labels = np.repeat([0, 1], 100)
    codes = np.zeros((200, 30), np.float32)
    codes[labels == 0, :10] = rng.random((100, 10))
    codes[labels == 1, 15:25] = rng.random((100, 10))
    points, index = embed_codes(codes, seed=0)
    d = ((points[:, None] - points[None]) ** 2).sum(-1)
    np.fill_diagonal(d, np.inf)
    assert (labels[index][d.argmin(1)] == labels[index]).mean() > 0.95


def test_embedding_figure_legend_and_degenerate_input():
    rng = np.random.default_rng(0)
    codes = rng.random((80, 12)).astype(np.float32)
    fig = embedding_figure(codes, np.arange(80) % 3, ["a", "b", "c"])
    assert isinstance(fig, Figure) and len(fig.axes) == 1
    (legend,) = fig.legends
    assert [t.get_text() for t in legend.get_texts()] == ["a", "b", "c"]
    small = embedding_figure(codes[:4], np.zeros(4, int))
    assert "too few" in " ".join(t.get_text() for t in small.axes[0].texts)
    with pytest.raises(ValueError):
        embedding_figure(codes, np.zeros(3, int))
    with pytest.raises(ValueError):
        embedding_figure(codes, np.zeros(80, int), pixels=codes[:40])


@pytest.mark.slow
def test_pixel_embedding_beside_the_codes_embeds_the_same_inputs():
    rng = np.random.default_rng(1)
    codes, pixels = rng.random((120, 12)), rng.random((120, 3, 4))
    (code_points, code_index), (pixel_points, pixel_index) = embed_many([codes, pixels], 50)
    assert np.array_equal(code_index, pixel_index)  # the same inputs in both panels
    alone, index = embed_codes(pixels.reshape(120, -1), 50)
    # bit for bit: the threads run under one thread limit, whichever finishes first
    assert np.array_equal(index, pixel_index) and np.array_equal(alone, pixel_points)
    wide = rng.random((300, 80))  # reduced by PCA first, which runs under the limit too
    runs = [embed_many([wide, wide[:, ::-1]], 200) for _ in range(3)]
    assert all(np.array_equal(r[i][0], runs[0][i][0]) for r in runs for i in (0, 1))
    assert np.array_equal(runs[0][0][0], embed_codes(wide, 200)[0])
    assert not np.allclose(code_points, pixel_points)
    fig = embedding_figure(codes, np.arange(120) % 3, pixels=pixels, max_points=50)
    assert [ax.get_title() for ax in fig.axes] == ["the SAE's codes",
                                                   "the same inputs' raw pixels"]
    in_class_0 = int((code_index % 3 == 0).sum())  # label i % 3 for input i
    assert [len(ax.collections[0].get_offsets()) for ax in fig.axes] == [in_class_0] * 2


# --------------------------------------------------------------------------- CLI


def run_features(args, cwd, data_dir=None):
    env = dict(os.environ, SAE_OFFLINE="1")
    if data_dir is not None:
        env["SAE_DATA_DIR"] = str(data_dir)
    return subprocess.run([sys.executable, "-m", "sae.features", *map(str, args)], cwd=cwd,
                          env=env, capture_output=True, text=True, timeout=300)


def assert_one_line_error(result, *words):
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    for word in words:
        assert word in lines[0]


@pytest.mark.slow
def test_cli_errors_are_one_line(tmp_path):
    assert_one_line_error(run_features([tmp_path / "nope"], tmp_path), "not found")
    (tmp_path / "plain").mkdir()
    assert_one_line_error(run_features([tmp_path / "plain"], tmp_path), "no config.yaml")
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text("dataset: mnist\n")
    assert_one_line_error(run_features([run], tmp_path), "no checkpoint", "last.ckpt")
    assert_one_line_error(run_features([run, "--out", tmp_path / "x" / "f.html"], tmp_path),
                          "does not exist")
    assert_one_line_error(run_features([run, "--bogus"], tmp_path))
    assert not (run / "features.html").exists()


@pytest.mark.slow
def test_cli_builds_the_page_of_a_trained_run(tmp_path, data_dir):
    env = dict(os.environ, SAE_DATA_DIR=str(data_dir), SAE_OFFLINE="1", OMP_NUM_THREADS="1")
    run = tmp_path / "run"
    train = subprocess.run(
        [sys.executable, "-m", "sae.run", "--model", "topk", "--k", "4", "--hidden", "24",
         "--max-steps", "20", "--limit-train", "512", "--val-size", "256", "--limit-test",
         "300", "--no-figures", "--no-report", "--out", run],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert train.returncode == 0, train.stderr
    result = run_features([run], tmp_path, data_dir)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == str(run / "features.html")
    page = (run / "features.html").read_text()
    assert all(f'id="unit-{j}"' in page for j in range(24))
    assert "300 test inputs" in page  # the run's limit_test
    assert "fitted on the codes of 512 training inputs" in page  # the run's limit_train
    # the embedding has a name of its own, not a validation epoch's
    (png,) = (run / "figures" / "code_embedding").iterdir()
    assert png.name == "test_set.png" and png.read_bytes()[:4] == b"\x89PNG"
    first = (run / "features.html").read_bytes(), png.read_bytes()
    # the same run gives the same page and figure, byte for byte (its embedding's two t-SNEs
    # run in two threads)
    again = run_features([run], tmp_path, data_dir)
    assert again.returncode == 0, again.stderr
    assert ((run / "features.html").read_bytes(), png.read_bytes()) == first
    # ... so the report still draws the validation figures of a run that has none
    report = subprocess.run([sys.executable, "-m", "sae.report", run], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=300)
    assert report.returncode == 0, report.stderr
    assert list((run / "figures" / "decoder_atoms").glob("epoch_*.png"))
    assert "figures/code_embedding/test_set.png" in (run / "report.html").read_text()
    out = tmp_path / "elsewhere.html"
    result = run_features([run, "--out", out, "--max-inputs", "100"], tmp_path, data_dir)
    assert result.returncode == 0, result.stderr
    assert "100 test inputs" in out.read_text()
