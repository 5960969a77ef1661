"""SAEs on any activation matrix through the command line (``--data``): bad input refused in one
line before any work, short real runs on generated matrices (with and without labels and texts),
what their run folders record and show, a resume that refuses other data, and a classifier's
layer dumped by ``python -m sae.layer`` and trained on through the CLI."""

from __future__ import annotations

import contextlib
import io
import json
import re
import shutil

import numpy as np
import pytest
from cli_helpers import assert_one_line_error, run_cli
from test_browser import driver  # noqa: F401 (the headless Chromium fixture)

from sae.data import matrix
from sae.runner import command as sae_run
from sae.system.process import RUN_DIR_ENV

TINY = ["--hidden", "16", "--max-steps", "40", "--batch-size", "64", "--val-size", "100",
        "--lambda", "0.01"]


def low_rank(n: int, d: int, seed: int = 0) -> np.ndarray:
    """Non-negative rows of rank 6 plus noise: something an SAE can learn in a few steps."""
    r = np.random.default_rng(seed)
    return np.maximum(r.normal(size=(n, 6)) @ r.normal(size=(6, d)), 0).astype(np.float32) + \
        r.normal(scale=0.01, size=(n, d)).astype(np.float32)


def main(argv) -> int:
    """``sae.runner.command.main`` in this process, leaving the environment as it was."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(RUN_DIR_ENV, "")
        mp.delenv(RUN_DIR_ENV)
        mp.setenv("OMP_NUM_THREADS", "1")
        mp.setenv("SAE_SESSION", "")
        mp.delenv("SAE_SESSION")
        return sae_run.main([str(a) for a in argv])


def error_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: "), err
    return err[0]


@pytest.fixture(scope="module")
def texts_data(tmp_path_factory):
    """A manifest with labels (3 classes) and a text per row, train and test split."""
    folder = tmp_path_factory.mktemp("texts")
    for split, n, seed in (("train", 900, 0), ("test", 200, 1)):
        x = low_rank(n, 24, seed)
        np.save(folder / f"{split}.npy", x)
        np.save(folder / f"{split}_labels.npy", (x[:, 0] > x[:, 1]).astype(np.int64)
                + (x[:, 2] > 1).astype(np.int64))
        (folder / f"{split}.txt").write_text(
            "".join(f"{split} token {i} <&>\n" for i in range(n)), encoding="utf-8")
    manifest = {"format": matrix.FORMAT, "name": "toy tokens",
                "class_names": ["low", "mid", "high"]}
    for split in ("train", "test"):
        manifest[split] = {"x": f"{split}.npy", "labels": f"{split}_labels.npy",
                           "texts": f"{split}.txt"}
    (folder / "data.json").write_text(json.dumps(manifest))
    return folder / "data.json"


@pytest.fixture(scope="module")
def texts_run(texts_data, tmp_path_factory):
    out = tmp_path_factory.mktemp("texts-run") / "run"
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert main(["--data", texts_data, "--dataset", "fashion-mnist", *TINY, "--out",
                     out]) == 0
    assert f"note: --dataset is ignored: the run trains on --data {texts_data}" in \
        printed.getvalue()
    return out


@pytest.fixture(scope="module")
def plain_run(tmp_path_factory):
    """An unlabelled .npy (no manifest): validation and test rows carved from it."""
    folder = tmp_path_factory.mktemp("plain")
    np.save(folder / "acts.npy", low_rank(700, 20).astype(np.float16))
    out = folder / "run"
    assert main(["--data", folder / "acts.npy", *TINY, "--model", "topk", "--k", "4",
                 "--out", out]) == 0
    return out


# ------------------------------------------------------------------------------- bad input


def _bad(kind: str, folder):
    x = low_rank(50, 8)
    if kind == "missing":
        return folder / "none.npy", "does not exist"
    if kind == "rank":
        np.save(folder / "x.npy", x.reshape(50, 2, 4))
        return folder / "x.npy", r"shape \(50, 2, 4\)"
    if kind == "dtype":
        np.save(folder / "x.npy", x.astype(np.int32))
        return folder / "x.npy", "int32 values"
    if kind in ("nan", "inf"):
        x[37, 3] = np.nan if kind == "nan" else -np.inf
        np.save(folder / "x.npy", x)
        return folder / "x.npy", "row 37 holds NaN or inf"
    np.save(folder / "x.npy", x)
    np.save(folder / "y.npy", np.zeros(49, np.int64))
    (folder / "m.json").write_text(json.dumps({"format": matrix.FORMAT,
                                               "train": {"x": "x.npy", "labels": "y.npy"}}))
    return folder / "m.json", r"labels of shape \(49,\); \(50,\) needed"


@pytest.mark.parametrize("kind", ["missing", "rank", "dtype", "nan", "inf", "labels"])
def test_bad_data_is_one_line_before_any_work(tmp_path, capsys, kind):
    path, message = _bad(kind, tmp_path)
    out = tmp_path / "run"
    # a split the 50 rows can hold: a split they cannot is refused first (from the header)
    assert main(["--data", path, *TINY, "--val-size", "10", "--out", out]) == 2
    line = error_line(capsys)
    assert line.startswith("error: --data: ") and re.search(message, line), line
    assert not out.exists()  # nothing written: no run folder


def test_too_few_rows_for_the_splits_is_refused_before_any_work(tmp_path, capsys):
    np.save(tmp_path / "x.npy", low_rank(150, 8))
    assert main(["--data", tmp_path / "x.npy", *TINY, "--out", tmp_path / "run"]) == 2
    assert "--val-size 100" in error_line(capsys)


@pytest.mark.slow
def test_bad_data_from_the_command_line(tmp_path, data_dir):
    """As a user calls it: a NaN row is one line and exit 2, and no run folder."""
    path, _ = _bad("nan", tmp_path)
    result = run_cli(["--data", path, *TINY, "--val-size", 10, "--out", tmp_path / "run"],
                     tmp_path, data_dir)
    assert_one_line_error(result)
    assert "row 37 holds NaN or inf" in result.stderr
    assert not (tmp_path / "run").exists()


# ------------------------------------------------------------------------------- real runs


@pytest.mark.slow
def test_an_unlabelled_matrix_trains_and_records_its_file(plain_run):
    metrics = json.loads((plain_run / "metrics.json").read_text())
    assert 0 <= metrics["fvu"] < 1 and metrics["dataset"] == "acts"
    assert metrics["adaptivity_m"] >= 1  # the PCA reference exists for D = 20
    record = json.loads((plain_run / "data.json").read_text())
    source = plain_run.parent / "acts.npy"
    assert record["train"]["shape"] == [700, 20] and record["train"]["dtype"] == "float16"
    assert record["train"]["sha256"] == matrix.file_sha256(source)
    figures = {p.name for p in (plain_run / "figures").iterdir()}
    assert "decoder_atoms" in figures and "reconstructions" not in figures  # no 28x28 pixels
    page = (plain_run / "features.html").read_text()
    assert "rows without labels" in page and "probe votes" not in page
    assert "<q>row " in page  # rows without images or texts are shown by their number
    assert "not drawn" in (plain_run / "report.html").read_text()


@pytest.mark.slow
def test_a_manifest_with_texts_shows_them_and_probes_its_labels(texts_run):
    page = (texts_run / "features.html").read_text()
    assert "<q>test token " in page and "&lt;&amp;&gt;" in page  # escaped
    assert "softmax linear probe" in page and "probe votes for" in page
    metrics = json.loads((texts_run / "metrics.json").read_text())
    assert metrics["dataset"] == "toy tokens"


def _snapshot(folder):
    return {str(p): p.stat().st_mtime_ns for p in folder.rglob("*")}


@pytest.mark.slow
def test_a_resume_refuses_other_data(texts_run, texts_data, tmp_path, capsys):
    before = _snapshot(texts_run)
    x = np.load(texts_data.parent / "train.npy")
    for name, other in (("same-d", x + 1e-3), ("other-d", np.hstack([x, x[:, :2]]))):
        folder = tmp_path / name
        folder.mkdir()
        for f in texts_data.parent.iterdir():
            shutil.copy(f, folder / f.name)
        np.save(folder / "train.npy", other)
        if name == "other-d":
            test = np.load(texts_data.parent / "test.npy")
            np.save(folder / "test.npy", np.hstack([test, test[:, :2]]))
        code = main(["--out", texts_run, "--resume", "--data", folder / "data.json",
                     "--max-steps", "60"])
        assert code == 2
        line = error_line(capsys)
        assert ("differs from the one the run was trained on" in line if name == "same-d"
                else "holds rows of 26 numbers; the run was trained on rows of 24" in line), line
    assert _snapshot(texts_run) == before  # nothing touched


# ------------------------------------------------------------------------------- a layer


@pytest.fixture(scope="module")
def layer_run(tmp_path_factory, data_dir):
    """python -m sae.layer (a few classifier steps) then python -m sae.run --data on it."""
    root = tmp_path_factory.mktemp("layer")
    made = run_cli(["--arch", "mlp", "--layer", "2", "--epochs", "1", "--limit-train", "1500",
                    "--out", root / "layer"], root, data_dir, module="sae.layer")
    assert made.returncode == 0, made.stderr
    manifest = json.loads((root / "layer" / "dataset.json").read_text())
    assert manifest["source"]["dim"] == 256 and manifest["images"] == {"dataset": "mnist"}
    # the images the rows index are found through --data-dir alone (no $SAE_DATA_DIR): the
    # manifest's check of the row indices looks where training does
    result = run_cli(["--data", root / "layer" / "dataset.json", "--model", "sparsemax",
                      "--lambda", "0.01", "--hidden", "32", "--max-steps", "60",
                      "--val-size", "300", "--limit-test", "400", "--out", root / "run",
                      "--data-dir", data_dir], root, "")
    assert result.returncode == 0, result.stderr
    return root / "run"


@pytest.mark.slow
def test_a_classifier_layer_trains_an_sae_through_the_cli(layer_run):
    metrics = json.loads((layer_run / "metrics.json").read_text())
    assert metrics["dataset"] == "mnist mlp layer 2" and 0 <= metrics["fvu"] < 1
    hparams = (layer_run / "tensorboard").rglob("events.out.tfevents.*")
    assert any(b"mnist mlp layer 2" in p.read_bytes() for p in hparams)  # not "mnist"
    assert json.loads((layer_run / "data.json").read_text())["train"]["shape"] == [1500, 256]
    page = (layer_run / "features.html").read_text()
    assert "<q>" not in page  # the source images are shown, not texts
    assert "softmax linear probe" in page
    assert "raw pixels" not in page  # its embedding has only the codes' panel


# ------------------------------------------------------------------------------- in a browser


@pytest.mark.slow
@pytest.mark.parametrize("which", ["texts", "images"])
def test_the_feature_browser_in_a_real_browser(request, which):
    from test_browser import open_page, severe_messages

    chrome = request.getfixturevalue("driver")
    run = request.getfixturevalue("texts_run" if which == "texts" else "layer_run")
    open_page(chrome, run / "features.html")
    assert severe_messages(chrome) == []
    units = chrome.execute_script("return document.querySelectorAll('section.unit').length")
    assert units == (16 if which == "texts" else 32)
    shown = chrome.execute_script("""
        var out = {texts: 0, tiles: 0, sheets: new Set()};
        document.querySelectorAll('.t q').forEach(function (q) {
          if (q.getBoundingClientRect().width > 0 && q.textContent) out.texts++; });
        document.querySelectorAll('.sa, .t i').forEach(function (e) {
          out.tiles++; out.sheets.add(getComputedStyle(e).backgroundImage.slice(0, 27)); });
        return [out.texts, out.tiles, Array.from(out.sheets)];""")
    texts, tiles, sheets = shown
    if which == "texts":
        assert texts > 0 and tiles == units  # only the atoms are sprites
    else:
        assert texts == 0 and tiles > units  # atoms and the source images
    assert sheets and all(s.startswith('url("data:image/png;base64') for s in sheets)
    # every sprite decodes
    widths = chrome.execute_async_script("""
        var done = arguments[arguments.length - 1];
        var urls = new Set();
        document.querySelectorAll('.sa, .t i').forEach(function (e) {
          urls.add(getComputedStyle(e).backgroundImage.slice(5, -2)); });
        Promise.all(Array.from(urls, function (url) {
          var img = new Image(); img.src = url;
          return img.decode().then(function () { return img.naturalWidth; },
                                   function () { return 0; }); })).then(done);""")
    assert widths and all(w > 0 for w in widths)


# ------------------------------------------------------------------------------- sweeps


def test_a_sweep_on_a_data_file_names_its_runs_after_it_and_refuses_changed_data(
        tmp_path, capsys):
    from sae.sweep import command as compare
    from sae.sweep.spec import load_sweep, plan

    np.save(tmp_path / "acts.npy", low_rank(600, 12))
    sweep = tmp_path / "s.yaml"
    sweep.write_text(f"seeds: [0]\ncommon: {{data: {tmp_path / 'acts.npy'}, hidden: 8}}\n"
                     "models:\n  l1: {lambda: [0.01, 0.1]}\n  topk: {k: 2}\n")
    runs = plan(load_sweep(sweep))
    assert {r.dataset for r in runs} == {"acts"} and len(runs) == 3
    assert all("--dataset" not in r.argv and r.settings["data"] for r in runs)
    # a started run whose record names other bytes: the sweep is refused before any work
    started = tmp_path / "out" / runs[0].rel
    started.mkdir(parents=True)
    (started / "config.yaml").write_text("{}\n")
    record = json.loads(json.dumps(matrix.describe(matrix.load_data(tmp_path / "acts.npy"))))
    record["train"]["sha256"] = "0" * 64
    (started / "data.json").write_text(json.dumps(record))
    assert compare.main([str(sweep), "--out", str(tmp_path / "out"), "--dry-run"]) == 2
    assert "was trained on other data" in error_line(capsys)
    # images and a data file side by side: each model's runs on its own data
    sweep.write_text(f"datasets: [mnist]\nseeds: [0]\nmodels:\n  l1: {{lambda: 0.01}}\n"
                     f"  topk: {{k: 2, data: {tmp_path / 'acts.npy'}}}\n")
    assert sorted((r.dataset, r.model) for r in plan(load_sweep(sweep))) == \
        [("acts", "topk"), ("mnist", "l1")]
