"""Tests for sae.features (statistics, page, CLI) and sae.figures.embedding, without a
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

from sae.features import feature_stats, render_features_page
from sae.figures.embedding import embed_codes, embedding_figure

REPO = Path(__file__).resolve().parents[1]


def stats_of(codes, labels, threshold=0.0, n_classes=None, n_top=4, atoms=None, x=None):
    codes = np.asarray(codes, dtype=np.float32)
    n, h = codes.shape
    x = np.zeros((n, 4), np.float32) if x is None else x
    atoms = np.ones((x.shape[1], h), np.float32) if atoms is None else atoms
    return feature_stats(codes, np.asarray(labels), x, atoms, threshold, n_top=n_top,
                         n_classes=n_classes)


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
    used = np.unique(s["top_index"][s["top_index"] >= 0])
    sheet = _sprite(page, ".t i")
    assert sheet.mode == "P"
    inputs = np.asarray(sheet.convert("L"), dtype=float)
    assert inputs.shape == (8, len(used) * 8)
    for slot, i in enumerate(used):  # ink-dark copies of the inputs (16 greys), in index order
        tile = inputs[:, slot * 8:(slot + 1) * 8]
        np.testing.assert_allclose(tile, 255 - images[i], atol=255 / 30 + 0.5)
    shown = np.minimum(s["fire_count"], 12).sum()
    assert page.count('<div class="t"') == shown
    assert page.count('class="sa"') == 7


def test_page_rejects_images_that_do_not_match_the_atoms(page_parts):
    s, images, _, _ = page_parts
    with pytest.raises(ValueError):
        render_features_page(s, images[:, :4, :4], "x")


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
    assert isinstance(fig, Figure)
    legend = fig.axes[0].get_legend()
    assert [t.get_text() for t in legend.get_texts()] == ["a", "b", "c"]
    small = embedding_figure(codes[:4], np.zeros(4, int))
    assert "too few" in " ".join(t.get_text() for t in small.axes[0].texts)
    with pytest.raises(ValueError):
        embedding_figure(codes, np.zeros(3, int))


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
    (png,) = (run / "figures" / "code_embedding").glob("epoch_*.png")
    assert png.read_bytes()[:4] == b"\x89PNG"
    out = tmp_path / "elsewhere.html"
    result = run_features([run, "--out", out, "--max-inputs", "100"], tmp_path, data_dir)
    assert result.returncode == 0, result.stderr
    assert "100 test inputs" in out.read_text()
