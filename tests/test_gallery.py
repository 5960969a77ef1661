"""python -m sae.gallery over finished runs: figures copied, metrics tabled, comparisons linked."""

import json
import re
import sys
from pathlib import Path

from sae import gallery

PNG = b"\x89PNG\r\n\x1a\n" + b"0" * 16


def finished_run(folder, lam=0.01):
    (folder / "metrics.json").parent.mkdir(parents=True)
    (folder / "metrics.json").write_text(json.dumps({
        "lam": lam, "mse": 0.01, "fvu": 0.125, "fvu_at_l0": 0.125, "l0_mean": 30.0,
        "l0_std": 5.0, "dead_fraction": 0.01, "dense_fraction": 0.0, "wall_time_s": 60.0}))
    for kind in gallery.KINDS:
        (folder / "figures" / kind).mkdir(parents=True)
        for epoch in (2, 10):  # the latest epoch is the one copied
            (folder / "figures" / kind / f"epoch_{epoch}.png").write_bytes(PNG + bytes([epoch]))


def test_gallery_of_finished_runs_links_the_comparisons(tmp_path, capsys):
    runs, out = tmp_path / "runs", tmp_path / "figures" / "gallery"
    for dataset in gallery.DATASETS:
        for model in gallery.MODELS:
            finished_run(runs / f"{dataset}-{model}")
    for preset in ("mnist", "wide"):
        (tmp_path / "figures" / "compare" / preset).mkdir(parents=True)
        (tmp_path / "figures" / "compare" / preset / "comparison.md").write_text("x")
    assert gallery.main(["--out", str(out), "--runs", str(runs)]) == 0  # nothing is trained
    copied = out / "mnist-sparsemax-decoder_atoms.png"
    assert copied.read_bytes() == PNG + bytes([10])
    readme = (out / "README.md").read_text()
    assert readme.count("| 0.125 |") == len(gallery.DATASETS) * len(gallery.MODELS)
    assert ("Comparisons: [mnist](../compare/mnist/comparison.md) · "
            "[wide](../compare/wide/comparison.md)") in readme


def test_gallery_index_page_shows_the_copied_figures(tmp_path):
    """index.html (what the comparison pages link to) shows every copied figure from its file
    beside it and names every run, fixed-budget models with their k."""
    runs, out = tmp_path / "runs", tmp_path / "figures" / "gallery"
    for dataset in gallery.DATASETS:
        for model in gallery.MODELS:
            finished_run(runs / f"{dataset}-{model}")
    assert {"topk", "batchtopk", "jumprelu"} <= set(gallery.MODELS)
    assert gallery.main(["--out", str(out), "--runs", str(runs)]) == 0
    page = (out / "index.html").read_text()
    shown = re.findall(r'<img src="([^"]+)"', page)
    assert len(shown) == len(gallery.DATASETS) * len(gallery.MODELS) * len(gallery.KINDS)
    assert all((out / name).is_file() for name in shown)
    assert "k = 32" in page and "λ = 0.01" in page


def test_a_run_to_train_is_announced_with_the_interpreter_that_trains_it(tmp_path, monkeypatch,
                                                                      capsys):
    calls = []

    def train(cmd):  # stands in for the training process: writes a finished run
        calls.append(cmd)
        finished_run(Path(cmd[cmd.index("--out") + 1]))
        return 0

    monkeypatch.setattr(gallery, "train", train)
    gallery.ensure_run(tmp_path / "mnist-l1", "mnist", "l1", 0.01, 10, [])
    assert calls[0][:3] == [sys.executable, "-m", "sae.run"]
    line = capsys.readouterr().out.strip()
    assert line.startswith(f"$ {Path(sys.executable).name} -m sae.run --model l1"), line
