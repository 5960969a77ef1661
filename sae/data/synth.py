"""python -m sae.synth: activation data whose features are known, to test what an SAE recovers.

Real data cannot say whether an input's number of active units varies *correctly*: nobody knows
how many features an MNIST digit has. Here every row is built from a known dictionary, so each
row's true features, and their number, are recorded beside it::

    python -m sae.synth --out synth/d64-f256
    python -m sae.run --data synth/d64-f256/dataset.json --model sparsemax --hidden 512

The generator (:func:`generate`, numpy only, reproducible from ``seed``):

- F feature directions d_f in R^D, independent Gaussian vectors scaled to unit length
  (``features.npy``, [F, D]); F > D, so they are in superposition;
- a heavy-tailed firing frequency: feature f is drawn with weight ∝ rank_f^(−``frequency_decay``)
  (Zipf-like, ranks in a random order), so a few features fire often and most rarely;
- correlated pairs: a share ``pair_share`` of the features come in pairs, and when one of a
  pair fires its partner joins with probability ``pair_prob``;
- a per-row latent complexity c_n ~ LogNormal(0, ``complexity_sigma``), and K_n = 1 +
  Poisson(μ c_n / E[c]) features drawn without replacement by weight (plus the partners that
  join), μ set so that the mean true L0 is about ``mean_l0``: K_n ranges from 1 to several
  times the mean, and follows the row's complexity, not its own noise;
- positive heavy-tailed values a_nf ~ LogNormal(0, ``value_sigma``) on the active features,
  x_n = Σ_f a_nf d_f + ε_n, ε_n ~ N(0, σ² I) with σ = ``noise`` × the signal's RMS per
  dimension.

A row's energy grows with its number of features (the values add up), as in any additive model:
an L0 that follows energy alone tracks the true L0 to a degree, and the measures report that
baseline beside each model's (``gt_l0_energy``).

Written as an activation manifest (:mod:`sae.data.matrix`): ``train.npy`` and ``test.npy`` (float32
rows), ``features.npy``, and per split ``<split>_active.npy``, the true supports as bits
(``numpy.packbits`` along each row: [N, ceil(F / 8)] uint8), named in ``dataset.json`` under
``truth`` and each split's ``active``. A run on such data scores its decoder and codes against
them (:mod:`sae.metrics.truth`). OUT must be new or empty: nothing is overwritten.
"""

from __future__ import annotations

import math
import sys
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import numpy as np

from sae.data.layer import write_dataset
from sae.data.matrix import FORMAT

__all__ = ["GroundTruthData", "SynthConfig", "generate", "main", "manifest", "write"]


@dataclass(frozen=True)
class SynthConfig:
    """The generator's settings (each one a ``--flag`` of ``python -m sae.synth``)."""

    dim: int = 64  # D, the dimension of a row
    features: int = 256  # F, the true features
    train: int = 60_000  # training rows (the validation rows are carved from these)
    test: int = 10_000  # test rows
    mean_l0: float = 10.0  # about the mean number of true features per row
    complexity_sigma: float = 0.7  # spread of the log of each row's latent complexity
    frequency_decay: float = 0.7  # Zipf exponent of the features' firing weights
    pair_share: float = 0.2  # share of the features that come in correlated pairs
    pair_prob: float = 0.5  # chance that the partner of a drawn feature joins it
    value_sigma: float = 0.5  # spread of the log of the active values
    noise: float = 0.05  # noise RMS per dimension, relative to the signal's
    seed: int = 0

    # (low, high) of each number: the generator's sizes stay within what a laptop holds
    BOUNDS = {"dim": (2, 4096), "features": (2, 16384), "train": (100, 10_000_000),
              "test": (10, 1_000_000), "mean_l0": (1.0, 256.0), "complexity_sigma": (0.0, 3.0),
              "frequency_decay": (0.0, 3.0), "pair_share": (0.0, 1.0), "pair_prob": (0.0, 1.0),
              "value_sigma": (0.0, 3.0), "noise": (0.0, 10.0), "seed": (0, 2**32 - 1)}

    def check(self) -> None:
        """ValueError (one line) for a value out of :attr:`BOUNDS` or sizes that do not fit."""
        for f in fields(self):
            low, high = self.BOUNDS[f.name]
            value = getattr(self, f.name)
            if not (isinstance(value, int | float) and math.isfinite(value)
                    and low <= value <= high):
                raise ValueError(f"--{f.name.replace('_', '-')} must be in [{low}, {high}], "
                                 f"got {value}")
        if self.mean_l0 > self.features / 4:
            raise ValueError(f"--mean-l0 {self.mean_l0:g} is more than a quarter of the "
                             f"{self.features} features: rows would not be sparse")
        if (self.train + self.test) * max(self.dim, self.features // 8) > 2**31:
            raise ValueError("--train, --test and --dim (or --features) ask for more than 8 GB")


@dataclass
class GroundTruthData:
    """What :func:`generate` returns: rows, their true supports and the dictionary."""

    features: np.ndarray  # [F, D] float32, unit rows
    train_x: np.ndarray  # [N, D] float32
    test_x: np.ndarray
    train_active: np.ndarray  # [N, F] bool
    test_active: np.ndarray


def _weights(cfg: SynthConfig, rng: np.random.Generator) -> np.ndarray:
    """Each feature's firing weight (sums to 1): Zipf-like in ranks put in a random order."""
    ranks = rng.permutation(cfg.features) + 1.0
    w = ranks ** -cfg.frequency_decay
    return w / w.sum()


def _partners(cfg: SynthConfig, rng: np.random.Generator) -> np.ndarray:
    """partner[f]: the other feature of f's correlated pair, or −1."""
    partner = np.full(cfg.features, -1, dtype=np.int64)
    n_pairs = int(round(cfg.pair_share * cfg.features / 2))
    chosen = rng.permutation(cfg.features)[: 2 * n_pairs].reshape(n_pairs, 2)
    partner[chosen[:, 0]], partner[chosen[:, 1]] = chosen[:, 1], chosen[:, 0]
    return partner


def _rows(n: int, cfg: SynthConfig, directions: np.ndarray, weights: np.ndarray,
          partner: np.ndarray, rng: np.random.Generator,
          chunk: int = 4096) -> tuple[np.ndarray, np.ndarray]:
    """n rows (without noise) and their supports, ``chunk`` rows at a time."""
    paired = partner >= 0
    # the partners that join add about K · pair_prob · (weight of paired features) features
    extra = cfg.pair_prob * float(weights[paired].sum())
    base = max(cfg.mean_l0 / (1.0 + extra) - 1.0, 0.0)  # the Poisson part of K's mean
    mean_c = math.exp(cfg.complexity_sigma ** 2 / 2)
    log_w = np.log(weights)
    xs, actives = [], []
    for start in range(0, n, chunk):
        m = min(chunk, n - start)
        c = rng.lognormal(0.0, cfg.complexity_sigma, m)
        k = np.minimum(1 + rng.poisson(base * c / mean_c), cfg.features)
        # k draws without replacement by weight: the k largest of log w + Gumbel noise
        keys = log_w + rng.gumbel(size=(m, cfg.features))
        order = np.argsort(-keys, axis=1)
        active = np.zeros((m, cfg.features), dtype=bool)
        take = np.arange(cfg.features)[None, :] < k[:, None]
        active[np.repeat(np.arange(m), take.sum(1)), order[take]] = True
        joins = active[:, paired] & (rng.random((m, int(paired.sum()))) < cfg.pair_prob)
        rows, cols = np.nonzero(joins)
        active[rows, partner[np.flatnonzero(paired)[cols]]] = True
        values = np.where(active, rng.lognormal(0.0, cfg.value_sigma, (m, cfg.features)), 0.0)
        xs.append((values @ directions).astype(np.float32))
        actives.append(active)
    return np.concatenate(xs), np.concatenate(actives)


def generate(cfg: SynthConfig) -> GroundTruthData:
    """Rows whose features are known (see the module docstring); the same ``cfg`` gives the
    same arrays."""
    cfg.check()
    rng = np.random.default_rng(cfg.seed)
    directions = rng.standard_normal((cfg.features, cfg.dim))
    directions /= np.linalg.norm(directions, axis=1, keepdims=True)
    weights, partner = _weights(cfg, rng), _partners(cfg, rng)
    train_x, train_active = _rows(cfg.train, cfg, directions, weights, partner, rng)
    test_x, test_active = _rows(cfg.test, cfg, directions, weights, partner, rng)
    sigma = cfg.noise * math.sqrt(float(np.mean(np.square(train_x, dtype=np.float64))))
    for x in (train_x, test_x):
        x += rng.normal(0.0, sigma, x.shape).astype(np.float32) if sigma > 0 else 0
    return GroundTruthData(directions.astype(np.float32), train_x, test_x, train_active,
                           test_active)


def manifest(cfg: SynthConfig, data: GroundTruthData, command: str) -> dict:
    """The ``dataset.json`` of generated data: its files, truth, settings and true L0."""
    true_l0 = {split: float(a.sum(1).mean()) for split, a in
               (("train", data.train_active), ("test", data.test_active))}
    return {
        "format": FORMAT,
        "name": f"synthetic d{cfg.dim} f{cfg.features} seed {cfg.seed}",
        "train": {"x": "train.npy", "active": "train_active.npy"},
        "test": {"x": "test.npy", "active": "test_active.npy"},
        "truth": {"features": "features.npy"},
        "source": {"command": command, **asdict(cfg),
                   "true_l0_mean": {k: round(v, 4) for k, v in true_l0.items()}},
    }


def write(out: Path, cfg: SynthConfig, data: GroundTruthData, command: str) -> None:
    """Every array as ``<name>.npy`` and ``dataset.json`` last (a folder with it is complete)."""
    out.mkdir(parents=True, exist_ok=True)
    parts = {"train": data.train_x, "test": data.test_x, "features": data.features,
             "train_active": np.packbits(data.train_active, axis=1),
             "test_active": np.packbits(data.test_active, axis=1)}
    write_dataset(out, parts, manifest(cfg, data, command))


def _parser():
    from sae.settings.cli import OneLineParser, path_arg  # yaml: for the command only

    parser = OneLineParser(prog="python -m sae.synth",
                           description="Write activation data built from a known dictionary, "
                                       "with each row's true features (OUT/dataset.json).")
    for f in fields(SynthConfig):
        low, high = SynthConfig.BOUNDS[f.name]
        parser.add_argument(f"--{f.name.replace('_', '-')}", type=type(f.default),
                            default=f.default, help=f"in [{low}, {high}] (default {f.default})")
    parser.add_argument("--out", type=path_arg, required=True,
                        help="new or empty folder for the dataset")
    return parser


def main(argv: list[str] | None = None) -> int:
    from sae.settings.cli import UsageError  # yaml: for the command only

    argv = sys.argv[1:] if argv is None else argv
    try:
        args = vars(_parser().parse_args(argv))
        out = args.pop("out")
        cfg = SynthConfig(**args)
        cfg.check()
        if out.is_symlink() or (out.exists() and (not out.is_dir() or any(out.iterdir()))):
            raise UsageError(f"--out {out} exists and is not an empty folder; choose a new one "
                             "(nothing is overwritten)")
    except (UsageError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"dataset folder: {out}", flush=True)
    try:
        data = generate(cfg)
        write(out, cfg, data, "python -m sae.synth " + " ".join(argv))
    except KeyboardInterrupt:
        print("interrupted; nothing complete was written (no dataset.json)", file=sys.stderr)
        return 130
    except OSError as e:
        print(f"error: cannot write {out}: {e}", file=sys.stderr)
        return 1
    l0 = data.test_active.sum(1)
    print(f"{cfg.train} train and {cfg.test} test rows of {cfg.dim} numbers from {cfg.features} "
          f"features; true L0 per test row: mean {l0.mean():.2f}, median {np.median(l0):g}, "
          f"range {l0.min()}–{l0.max()}")
    print(f"dataset: {out / 'dataset.json'}")
    print(f"next: python -m sae.run --data {out / 'dataset.json'} --hidden {2 * cfg.features}")
    return 0


def as_command() -> None:
    """Run as ``python -m sae.synth``: exit with :func:`main`'s code."""
    sys.exit(main())
