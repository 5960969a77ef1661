"""What a run's L0 follows: its input's difficulty, its energy, or its difficulty per energy.

    SAE_DATA_DIR=../shared/datasets python experiments/adaptivity_parts.py RUN [RUN ...]

For each finished run folder, on the whole test set (``adaptivity`` in metrics.json uses 2 000
evenly spaced test inputs, so it differs a little from the first column), the Spearman
correlation (``sae.metrics.adaptivity``) of each input's L0 with

- d = ``pca_residual`` onto the top round(mean L0) principal components of the training split:
  the difficulty that ``adaptivity`` uses;
- E = ‖x − x̄‖², the input's energy about the training mean (what a fixed threshold's L0 grows
  with: larger inputs give larger scores);
- d / E, the share of the input that the best fixed linear code of that size misses;

and, for the Sparsemax-SAE's energy temperature, the learned power γ of each group. A model whose
L0 follows d / E but not E (the normalized temperature's support ignores the scores' scale)
can follow d only as far as d / E does.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

from sae import metrics
from sae.models import encode_codes
from sae.sweep.analysis import DataCache
from sae.training.runfolder import RunFolder


def parts(folder: Path, data: DataCache) -> dict:
    """The correlations of one run (see the module docstring)."""
    run = RunFolder(folder)
    model = run.model()
    dm = data.get(run.settings())
    x = dm.test_x.flatten(1)
    l0 = metrics.l0(encode_codes(model, dm.test_x), model.fire_threshold).double()
    pca = dm.train_pca()
    m = min(math.floor(float(l0.mean()) + 0.5), x.shape[1])
    d = metrics.pca_residual(x, pca.basis[:, :m], pca.mean)
    energy = (x.double() - model.mean_image.cpu().flatten().double()).square().sum(1)
    gamma = getattr(model, "energy_exponent", None)
    return {"l0": float(l0.mean()), "d": metrics.adaptivity(l0, d),
            "E": metrics.adaptivity(l0, energy), "d/E": metrics.adaptivity(l0, d / energy),
            "gamma": None if gamma is None else [round(g, 2) for g in gamma.tolist()]}


def fmt(v: float | None) -> str:
    return "–" if v is None else f"{v:.2f}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("runs", nargs="+", type=Path, help="finished run folders")
    args = p.parse_args(argv)
    data = DataCache()
    print(f"{'run':60s} {'L0':>6s} {'ρ(L0,d)':>8s} {'ρ(L0,E)':>8s} {'ρ(L0,d/E)':>9s}  γ")
    for folder in args.runs:
        if not RunFolder(folder).checkpoint.is_file():
            print(f"error: {folder} has no checkpoints/last.ckpt", file=sys.stderr)
            return 2
        r = parts(folder, data)
        print(f"{str(folder)[-60:]:60s} {r['l0']:6.1f} {fmt(r['d']):>8s} {fmt(r['E']):>8s} "
              f"{fmt(r['d/E']):>9s}  {r['gamma'] if r['gamma'] is not None else '–'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
