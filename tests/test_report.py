"""Tests for sae.pages.report: a synthetic run folder in, one self-contained report.html out."""

from __future__ import annotations

import base64
import html
import io
import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from matplotlib.figure import Figure
from PIL import Image

from sae import figures
from sae.pages import report
from sae.pages.html import palette_png
from sae.training.runfolder import RunFolderError

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
REPO = Path(__file__).resolve().parents[1]

CONFIG = """\
model: sparsemax
lambda: 0.01
dataset: mnist
hidden: 512
optim:
  lr: 0.00125
  betas: [0.9, 0.999]
comment: "<script>alert(1)</script> & co"
"""
METRICS = {"mse": 0.0123456, "fvu": 0.2345678, "l0_mean": 12.5, "l0_std": 3.25,
           "dead_fraction": 0.0234, "dense_fraction": 0.0, "recon_bias": 0.9712,
           "wall_time_s": 3725.2}
# everything sae.run writes to metrics.json (sae.training.evaluate's metrics and the run's facts)
FULL_METRICS = {**METRICS, "explained_variance": 0.7654, "n_samples": 10000.0,
                "n_units": 512.0, "fvu_at_l0": 0.2345678, "support_fvu": 0.2, "adaptivity_m": 12.0,
                "support_fvu_const": 0.21, "adaptive_gain": 0.01, "adaptivity": 0.3,
                "n_inputs": 2000.0, "steps": 2150, "epochs": 10, "model": "sparsemax",
                "lam": 0.01, "dataset": "mnist", "seed": 3, "hidden": 512, "fire_threshold": 0.0}


def tiny_png(text: str) -> bytes:
    """A small distinct PNG per call (the text changes the pixels)."""
    fig = Figure(figsize=(1.2, 0.6))
    fig.text(0.1, 0.4, text)
    return figures.figure_to_png_bytes(fig, dpi=40)


def write_history(path: Path) -> None:
    """A sparse CSVLogger-like metrics.csv: train rows every 5 steps, val rows per epoch."""
    rows = [{"step": s, "epoch": s // 100, "train/loss": 1 / (1 + s), "train/lambda": s * 1e-4,
             "train/l0": 30 - s / 10} for s in range(0, 200, 5)]
    rows += [{"step": s, "epoch": s // 100, "val/loss": 0.1, "val/fvu": 0.3, "val/l0": 12.0}
             for s in (99, 199)]
    pd.DataFrame(rows).to_csv(path, index=False)


@pytest.fixture(scope="module")
def pngs() -> dict[str, bytes]:
    return {name: tiny_png(name) for name in ("atoms-2", "atoms-10", "atoms-9", "density", "x")}


@pytest.fixture
def run_dir(tmp_path, pngs) -> Path:
    run = tmp_path / "sparsemax-l0.01"
    run.mkdir()
    (run / "config.yaml").write_text(CONFIG)
    (run / "metrics.json").write_text(json.dumps(METRICS))
    write_history(run / "metrics.csv")
    atoms = run / "figures" / "decoder_atoms"
    atoms.mkdir(parents=True)
    # 10 must beat 9 and 2: numeric, not lexicographic, order.
    for epoch in (2, 10, 9):
        (atoms / f"epoch_{epoch}.png").write_bytes(pngs[f"atoms-{epoch}"])
    (run / "figures" / "feature_density").mkdir()
    (run / "figures" / "feature_density" / "epoch_0.png").write_bytes(pngs["density"])
    (run / "figures" / "aaa_extra").mkdir()
    (run / "figures" / "aaa_extra" / "epoch_1.png").write_bytes(pngs["x"])
    (run / "checkpoints").mkdir()
    (run / "checkpoints" / "last.ckpt").write_bytes(b"not a png")
    return run


def b64(data: bytes) -> str:
    """How the page embeds a PNG: as its palette version where that is lossless."""
    return base64.b64encode(palette_png(data)).decode("ascii")


def assert_self_contained(page: str) -> None:
    """Every image inline as a PNG data URI; nothing fetched, nothing executed."""
    lowered = page.lower()
    for needle in ("http://", "https://", "<script", "<link", "<iframe", "@import", "url("):
        assert needle not in lowered, needle
    srcs = re.findall(r'\bsrc\s*=\s*"([^"]*)"', page, flags=re.IGNORECASE)
    assert len(srcs) == page.lower().count("<img")
    for src in srcs:
        assert src.startswith("data:image/png;base64,")
        assert base64.b64decode(src.split(",", 1)[1], validate=True).startswith(PNG_SIGNATURE)
    assert not re.search(r"\bhref\s*=\s*\"(?!#)", page)  # only in-page anchors


def test_report_contents(run_dir, pngs):
    out = report.write_report(run_dir)
    assert out == run_dir / "report.html"
    page = out.read_text(encoding="utf-8")
    assert_self_contained(page)
    assert page.count("<img") == 1 + 3  # training curves + three figure kinds
    # title names the run, model and dataset
    assert "<h1>sparsemax-l0.01</h1>" in page and "sparsemax on mnist" in page
    # config values, including nested and list ones, as written
    for text in ("0.01", "512", "optim.lr", "0.00125", "[0.9, 0.999]"):
        assert text in page
    # metrics at 4 significant digits, fractions also in percent, durations readable
    for text in ("0.01235", "0.2346 (23.46 %)", "12.5", "0.0234 (2.34 %)", "0.9712",
                 "1 h 02 min"):
        assert text in page
    # text from files is escaped
    assert "&lt;script&gt;alert(1)&lt;/script&gt; &amp; co" in page
    assert "No metrics.json" not in page


def test_latest_epoch_and_kind_order(run_dir, pngs):
    latest = report.latest_figures(run_dir)
    assert [(kind, epoch) for kind, epoch, _ in latest] == [
        ("decoder_atoms", 10), ("feature_density", 0), ("aaa_extra", 1)]
    page = report.write_report(run_dir).read_text(encoding="utf-8")
    assert b64(pngs["atoms-10"]) in page
    assert b64(pngs["atoms-9"]) not in page and b64(pngs["atoms-2"]) not in page
    # known kinds first in their fixed order, unknown kinds after them
    positions = [page.index(b64(pngs[k])) for k in ("atoms-10", "density", "x")]
    assert positions == sorted(positions)


def test_test_set_figure_is_named_apart_from_the_epochs(run_dir, pngs):
    """The code embedding, drawn from the test set after training, is ``test_set.png``: the
    report shows it (over an older run's ``epoch_<E>.png``) as the test set's, not an epoch's."""
    kind = run_dir / "figures" / "code_embedding"
    kind.mkdir()
    (kind / "epoch_10.png").write_bytes(pngs["atoms-2"])
    (kind / report.TEST_SET_PNG).write_bytes(pngs["atoms-9"])
    latest = {k: (e, p.name) for k, e, p in report.latest_figures(run_dir)}
    assert latest["code_embedding"] == (None, "test_set.png")
    page = report.write_report(run_dir).read_text(encoding="utf-8")
    assert b64(pngs["atoms-9"]) in page and b64(pngs["atoms-2"]) not in page
    assert "The test set after training (figures/code_embedding/test_set.png)" in page


def test_interrupted_run_without_metrics_or_figures(tmp_path):
    run = tmp_path / "interrupted"
    run.mkdir()
    (run / "config.yaml").write_text(CONFIG)
    write_history(run / "metrics.csv")
    page = report.write_report(run).read_text(encoding="utf-8")
    assert_self_contained(page)
    assert "No metrics.json" in page
    assert "No figures yet" in page
    assert page.count("<img") == 1  # the training curves are still drawn


def test_bare_run_states_every_missing_part(tmp_path):
    run = tmp_path / "bare"
    run.mkdir()
    (run / "config.yaml").write_text("model: topk\n")
    (run / "figures" / "decoder_atoms").mkdir(parents=True)  # a kind folder, still empty
    page = report.write_report(run).read_text(encoding="utf-8")
    assert_self_contained(page)
    for text in ("No metrics.json", "No metrics.csv", "No figures yet", "topk"):
        assert text in page
    assert "<img" not in page


def test_unreadable_parts_are_stated_not_raised(run_dir):
    (run_dir / "metrics.json").write_text("{not json")
    (run_dir / "metrics.csv").write_text("")
    (run_dir / "figures" / "feature_density" / "epoch_0.png").write_bytes(b"junk")
    page = report.write_report(run_dir).read_text(encoding="utf-8")
    assert "metrics.json could not be read" in page
    assert "metrics.csv could not be read" in page
    assert "is not a PNG file" in page


def test_metric_formatting():
    assert report.format_metric("test/dead_fraction", 0.5) == "0.5 (50 %)"
    assert report.format_metric("mse", 1.23456e-5) == "1.235e-05"
    assert report.format_metric("steps", 123456.0) == "123,456"
    assert report.format_metric("wall_time_s", 125.0) == "125 (2 min 05 s)"
    assert report.format_metric("fvu", float("nan")) == "nan"
    assert report.format_metric("note", "ok") == "ok"
    assert report.format_metric("flag", True) == "true"


def test_write_report_rejects_non_run_folders(tmp_path):
    with pytest.raises(RunFolderError, match="not found"):
        report.write_report(tmp_path / "missing")
    with pytest.raises(RunFolderError, match="config.yaml"):
        report.write_report(tmp_path)


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "sae.report", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=120)


@pytest.mark.slow
def test_cli_success(run_dir):
    result = run_cli(str(run_dir))
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == str(run_dir / "report.html")
    assert (run_dir / "report.html").read_text(encoding="utf-8").startswith("<!DOCTYPE html>")
    assert not [p for p in run_dir.iterdir() if p.name.endswith(".tmp")]  # atomic write cleaned up


@pytest.mark.parametrize("case", ["missing", "no-config", "no-argument"])
def test_cli_errors_are_one_line(tmp_path, case):
    args = {"missing": [str(tmp_path / "nope")], "no-config": [str(tmp_path)],
            "no-argument": []}[case]
    result = run_cli(*args)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ")
    assert "Traceback" not in result.stderr
    assert result.stdout == ""


def section(page: str, anchor: str) -> str:
    """The HTML of one <h2> section of a page."""
    start = page.index(f'<h2 id="{anchor}">')
    end = page.find("<h2 ", start + 1)
    return page[start:end if end >= 0 else len(page)]


def metric_rows(page: str) -> dict[str, tuple[str, str]]:
    """The report's metrics table: name -> (value, definition), as the page shows them."""
    rows = re.findall(r'<tr><td data-label="metric">([a-z_0-9]+)</td>'
                      r'<td class="num" data-label="value">([^<]*)</td>'
                      r'<td class="note" data-label="definition">([^<]*)</td></tr>', page)
    return {name: (html.unescape(value), html.unescape(note)) for name, value, note in rows}


@pytest.mark.slow
def test_every_metric_a_run_can_write_is_defined_from_the_registry(run_dir):
    """Every number sae.run can put in metrics.json (the measures of sae.metrics, on data with
    known features too, the validation's and its convergence, a variant's extra) is shown with
    its registry definition; a value a short run could not measure is '–'."""
    from sae.metrics import DYNAMIC_KEYS, GROUND_TRUTH_KEYS, SUMMARY_KEYS
    from sae.settings.metric_defs import METRIC
    from sae.training.convergence import final_validation, last_epoch_change

    measured = [*SUMMARY_KEYS, *DYNAMIC_KEYS, *GROUND_TRUTH_KEYS, "fvu_at_l0",
                "val_gt_l0_spearman", *final_validation([]), *last_epoch_change([]),
                "wall_time_s", "alpha"]
    written = {**dict.fromkeys(measured, 0.5), "val_fvu_change": None, "converged": None,
               **{k: FULL_METRICS[k] for k in report._RUN_FACTS if k in FULL_METRICS}}
    (run_dir / "metrics.json").write_text(json.dumps(written))
    rows = metric_rows(report.render_report(run_dir))
    assert set(rows) == set(measured)
    for name, (_, note) in rows.items():
        assert note == METRIC[name].definition, name
    assert rows["val_fvu_change"][0] == rows["converged"][0] == "–"


def test_headline_settings_apart_and_every_metric_defined(run_dir):
    (run_dir / "metrics.json").write_text(json.dumps(FULL_METRICS))
    (run_dir / "config.yaml").write_text(CONFIG + "val_size: 5000\n")
    page = report.write_report(run_dir).read_text(encoding="utf-8")
    head = page[:page.index("<nav>")]
    assert "FVU 0.2346 · L0 12.5 ± 3.2 active units per input · 2.3 % dead units" in head
    metrics = section(page, "metrics")
    run_part, metric_part = metrics.split("<h3>Metrics</h3>")
    for setting in ("sparsemax", "mnist", ">3<", "firing threshold"):  # the run's facts ...
        assert setting in run_part
    rows = metric_rows(metric_part)
    names = set(rows)
    assert not names & {"model", "lam", "seed", "dataset", "hidden"}  # ... are not metrics
    assert names == set(FULL_METRICS) - {"model", "lam", "seed", "dataset", "hidden", "steps",
                                         "epochs", "fire_threshold"}
    assert all(note.strip() for _, note in rows.values())  # every metric has its definition
    assert "test set (n = 10,000 images)" in metrics
    figures_part = section(page, "figures")
    assert "validation set (n = 5,000 images)" in figures_part.replace("5000", "5,000")


@pytest.mark.parametrize(("model", "shown", "hidden"), [
    ("kl", {"rho", "lambda"}, {"alpha", "k", "jumprelu_bandwidth", "values"}),
    ("topk", {"k"}, {"rho", "lambda", "alpha"}),
    ("entmax", {"alpha", "alpha_mode", "lambda"}, {"rho", "k"}),
])
def test_config_shows_the_settings_of_its_model_and_all_on_request(tmp_path, model, shown,
                                                                     hidden):
    run = tmp_path / model
    run.mkdir()
    every = {"model": model, "lambda": 0.01, "k": 32, "rho": 0.05, "alpha": 1.5,
             "alpha_mode": "learn", "values": "shrunk", "jumprelu_bandwidth": 0.001,
             "hidden": 512, "arch": "linear", "mlp_width": 512}
    (run / "config.yaml").write_text("".join(f"{k}: {v}\n" for k, v in every.items()))
    config = section(report.write_report(run).read_text(encoding="utf-8"), "config")
    short, full = config.split("<details>")
    keys = set(re.findall(r"<tr><td>([a-z_]+)</td>", short))
    assert shown <= keys and not keys & hidden and "mlp_width" not in keys
    assert set(re.findall(r"<tr><td>([a-z_]+)</td>", full)) == set(every)
    assert f"Show all {len(every)} settings" in full


def test_tables_scroll_in_their_own_box_and_figures_open_full_size(run_dir):
    page = report.write_report(run_dir).read_text(encoding="utf-8")
    tables = re.findall(r"<table[ >]", page)
    assert len(tables) == len(re.findall(r'<div class="scroll"><table[ >]', page)) >= 2
    assert page.count('<table class="stack">') == 1  # the metrics: a list of rows on a phone
    assert page.count('<label class="zoom"') == page.count("<img") == 4
    assert ".scroll { overflow: auto" in page


@pytest.mark.slow
def test_pages_embed_palette_pngs_only_where_lossless(tmp_path):
    """A figure of few colours becomes a smaller palette PNG with every pixel exact; one with
    more colours than a palette holds (a colour bar's gradient) stays RGB, never banded."""
    rng = np.random.default_rng(0)
    flat = figures.sparsity_histogram(rng.integers(0, 30, 500))
    png = figures.figure_to_png_bytes(flat)
    original = np.asarray(Image.open(io.BytesIO(png)).convert("RGB"), dtype=int)
    small = palette_png(png)
    if len(np.unique(original.reshape(-1, 3), axis=0)) <= 256:
        assert Image.open(io.BytesIO(small)).mode == "P" and len(small) < len(png)
        again = np.asarray(Image.open(io.BytesIO(small)).convert("RGB"), dtype=int)
        np.testing.assert_array_equal(original, again)
    else:
        assert small == png
    heat = figures.figure_to_png_bytes(
        figures.class_unit_heatmap(rng.uniform(0, 0.5, (10, 64))))
    assert len(np.unique(np.asarray(Image.open(io.BytesIO(heat)).convert("RGB")).reshape(-1, 3),
                         axis=0)) > 256
    assert palette_png(heat) == heat  # a colour bar's gradient keeps every shade
    few = Image.fromarray(rng.integers(0, 4, (64, 64, 3), dtype=np.uint8) * 60)
    buf = io.BytesIO()
    few.save(buf, format="PNG")
    exact = palette_png(buf.getvalue())
    assert Image.open(io.BytesIO(exact)).mode == "P"
    np.testing.assert_array_equal(np.asarray(Image.open(io.BytesIO(exact)).convert("RGB")),
                                  np.asarray(few))
    noise = Image.fromarray(rng.integers(0, 256, (64, 64, 3), dtype=np.uint8))
    buf = io.BytesIO()
    noise.save(buf, format="PNG")
    assert palette_png(buf.getvalue()) == buf.getvalue()  # 4096 colours: lossy, kept
    assert palette_png(b"not a png") == b"not a png"
