"""python -m sae.gallery over finished runs: figures copied, metrics tabled, comparisons linked."""

import json
import re
import sys
from pathlib import Path

from sae.pages import gallery

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


def gallery_links(out: Path) -> tuple[set[str], set[str]]:
    """The comparison folders the gallery's README.md and index.html link."""
    readme = set(re.findall(r"\(\.\./compare/([^/]+)/comparison\.md\)",
                            (out / "README.md").read_text()))
    index = set(re.findall(r'href="\.\./compare/([^/]+)/comparison\.html"',
                           (out / "index.html").read_text()))
    return readme, index


def test_the_gallery_links_every_publication_also_those_published_after_it(tmp_path):
    """A comparison published after the gallery was made is linked by it too: publishing
    rewrites the gallery's comparisons line (and nothing else) to every published page."""
    from sae.sweep import command as compare

    runs, out = tmp_path / "runs", tmp_path / "figures" / "gallery"
    for dataset in gallery.DATASETS:
        for model in gallery.MODELS:
            finished_run(runs / f"{dataset}-{model}")
    published = tmp_path / "figures" / "compare"
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    for name in ("comparison.md", "comparison.html"):
        (sweep / name).write_text("<p>a page</p>")
    compare.publish(sweep, published / "mnist")
    assert gallery.main(["--out", str(out), "--runs", str(runs)]) == 0
    assert gallery_links(out) == ({"mnist"}, {"mnist"})
    before = {name: (out / name).read_text() for name in ("README.md", "index.html")}
    for preset in ("wide-40", "mnist-40"):
        compare.publish(sweep, published / preset)
    every = {p.parent.name for p in published.glob("*/comparison.html")}
    assert every == {"mnist", "wide-40", "mnist-40"}
    assert gallery_links(out) == (every, every)
    for name, text in before.items():  # only the comparisons line changed
        after = (out / name).read_text()
        assert [x for x in after.splitlines() if "compare/" not in x] == \
            [x for x in text.splitlines() if "compare/" not in x]
    # made again now, the gallery writes the same README
    relinked = (out / "README.md").read_text()
    assert gallery.main(["--out", str(out), "--runs", str(runs)]) == 0
    assert (out / "README.md").read_text() == relinked
