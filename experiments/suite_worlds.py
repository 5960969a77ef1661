"""The worlds of the ground-truth suite (experiments/suite.yaml), three data seeds each.

    python experiments/suite_worlds.py [--out synth/suite] [--seeds 0 1 2]

Each world is ``python -m sae.synth``'s default world with one axis moved, the axes on which a
verdict from one world could turn: how each row's number of features is drawn (the default's
latent complexity, over-dispersed, which lets energy predict the count; a fixed number; SAELens's
independent firing), how heavy the active values' tails are, whether features come in
hierarchies, and how many features a row has. A claim names the worlds where it holds.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

WORLDS = {
    "base": [],                                         # latent counts, value sigma 0.5
    "heavy": ["--value-sigma", "1.5"],                  # heavy-tailed magnitudes
    "fixed": ["--counts", "fixed", "--pair-share", "0"],  # every row the same count
    "independent": ["--counts", "independent"],         # each feature fires on its own
    "hierarchy": ["--hierarchy", "0.5"],                # half the features need a parent
    "dense": ["--mean-l0", "20"],                       # twice the features per row
}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, default=Path("synth/suite"))
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    args = p.parse_args()
    for name, flags in WORLDS.items():
        for seed in args.seeds:
            folder = args.out / f"{name}-seed{seed}"
            if (folder / "dataset.json").is_file():
                continue  # made before: the same command makes the same files
            subprocess.run([sys.executable, "-m", "sae.synth", *flags, "--seed", str(seed),
                            "--out", str(folder)], check=True)


if __name__ == "__main__":
    main()
