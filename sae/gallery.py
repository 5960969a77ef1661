"""python -m sae.gallery: the curated figure gallery of figures/gallery/.

Trains (or reuses) one default run per dataset × model through ``python -m sae.run`` and copies
its final decoder atoms, sorted firing frequencies, class × unit heatmap and sparsity histogram
into ``--out``, with a README.md table of the runs' test metrics, the command that made it and
links to the published comparisons in ``--out``/../compare/.
Every figure names its dataset, model and λ in its title (the figure callback writes them), and
the firing-frequency figures share one fixed log axis, so the same height means the same
frequency side by side.

    python -m sae.gallery --out figures/gallery --runs runs/gallery
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path

from sae.io import copy_file, write_text

DATASETS = ("mnist", "fashion-mnist")
MODELS = ("sparsemax", "kl", "l1")
KINDS = ("decoder_atoms", "activation_frequency", "class_unit_heatmap", "sparsity_histogram")


def latest_png(run: Path, kind: str) -> Path | None:
    pngs = list((run / "figures" / kind).glob("epoch_*.png"))
    epoch = lambda p: int(re.findall(r"\d+", p.stem)[-1])  # noqa: E731
    return max(pngs, key=epoch) if pngs else None


def ensure_run(run: Path, dataset: str, model: str, lam: float, epochs: int,
               extra: list[str]) -> dict:
    """Train the run unless it already finished; return its metrics.json."""
    if not (run / "metrics.json").is_file():
        cmd = [sys.executable, "-m", "sae.run", "--model", model, "--lambda", str(lam),
               "--dataset", dataset, "--epochs", str(epochs), "--out", str(run), *extra]
        if run.exists():  # an interrupted run continues where it stopped
            cmd.append("--resume")
        print("$", " ".join(cmd[1:]), flush=True)
        subprocess.run(cmd, check=True)
    return json.loads((run / "metrics.json").read_text())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sae.gallery", description=__doc__)
    parser.add_argument("--out", default="figures/gallery")
    parser.add_argument("--runs", default="runs/gallery")
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--lambda", dest="lam", type=float, default=0.01)
    args, extra = parser.parse_known_args(argv)
    out, runs = Path(args.out), Path(args.runs)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for dataset in DATASETS:
        for model in MODELS:
            run = runs / f"{dataset}-{model}"
            try:
                m = ensure_run(run, dataset, model, args.lam, args.epochs, extra)
            except subprocess.CalledProcessError as e:
                print(f"error: run {run} failed ({e.returncode})", file=sys.stderr)
                return 1
            for kind in KINDS:
                png = latest_png(run, kind)
                if png is not None:
                    copy_file(png, out / f"{dataset}-{model}-{kind}.png")
            rows.append(f"| {dataset} | {model} | {m['lam']:g} | {m['mse']:.4f} | "
                        f"{m['fvu']:.3f} | {m.get('fvu_at_l0', float('nan')):.3f} | "
                        f"{m['l0_mean']:.1f} ± {m['l0_std']:.1f} | "
                        f"{100 * m['dead_fraction']:.1f} | {100 * m['dense_fraction']:.1f} | "
                        f"{m['wall_time_s']:.0f} |")
    command = " ".join(["python -m sae.gallery", *(argv if argv is not None else sys.argv[1:])])
    lines = [
        "# Gallery", "",
        f"Made by `{command}` ({args.epochs} epochs, λ = {args.lam:g}, 512 units, seed 0,"
        " default settings otherwise). Test-set metrics (10 000 images):", "",
        "| dataset | model | λ | mse | fvu | fvu at L0 | L0 (mean ± std) | dead % | dense % "
        "| train s |",
        "|---|---|---|---|---|---|---|---|---|---|", *rows, "",
        "fvu at L0: the reconstruction from only the units counted in L0. It equals fvu except "
        "for the KL-SAE, whose sigmoid units below the firing threshold (0.1) still add to the "
        "reconstruction.", "",
        "Files: `<dataset>-<model>-<kind>.png` for kind in " + ", ".join(KINDS) + ". Each "
        "image's title names its dataset, model and λ; the activation_frequency figures share "
        "one fixed log scale (10⁻⁴ to 1), so they compare side by side.", ""]
    compare = sorted((out.parent / "compare").glob("*/comparison.md"))
    if compare:  # the published comparisons beside the gallery
        lines += ["Comparisons: " + " · ".join(
            f"[{p.parent.name}](../compare/{p.parent.name}/comparison.md)" for p in compare), ""]
    write_text(out / "README.md", "\n".join(lines))
    print(f"gallery written to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
