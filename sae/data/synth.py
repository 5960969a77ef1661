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
them (:mod:`sae.metrics.truth`). OUT must be new or empty: nothing is overwritten (what a
run killed with SIGKILL left, its temporary files and outputs without ``dataset.json``, counts as
empty: the same command simply runs again).

Memory does not grow with the number of rows or of features: rows are drawn :data:`CHUNK` at a
time (the random stream's unit, so a seed gives the same data however it is written), each draw
over the features made in blocks of rows whose temporaries fit :data:`BUDGET`, and the command
(:func:`stream`) writes each chunk to its files (rows, and supports as packed bits) before the
next; the noise's scale, which needs every training row, is summed from the file as numpy sums
in memory. Every file is a temporary until all are complete, then renamed, ``dataset.json``
last. Ctrl-C or SIGTERM (even when started in the background, where a shell ignores SIGINT) is
one line and exit 130 or 143, and a failure to write one line and exit 1: what the command
wrote is removed, and OUT too if it made it.
"""

from __future__ import annotations

import math
import os
import signal
import sys
import tempfile
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import numpy as np

from sae.data.layer import write_dataset
from sae.data.matrix import FORMAT
from sae.system.io import outermost_new, remove_made_folders, write_json
from sae.system.process import STOPS, interrupted, raise_terminated, signals_held

__all__ = ["BUDGET", "CHUNK", "GroundTruthData", "SynthConfig", "generate", "main", "manifest",
           "stream", "write"]

# how each row's number of features K is drawn (then K features by their firing weights):
# latent: K = 1 + Poisson(base · c / E[c]) with c a log-normal latent complexity (σ
#   --complexity-sigma), over-dispersed (variance / mean 5.9 at the defaults), so a row's
#   energy predicts its K; fixed: K = round(--mean-l0) for every row (variance 0); independent:
#   each feature fires on its own with probability min(1, mean_l0 · w_f), as in SAELens'
#   synthetic benchmarks (K Poisson-binomial, variance / mean below 1)
COUNTS = ("latent", "fixed", "independent")
CHUNK = 4096  # rows drawn together: the unit of the random stream, kept so a seed's data stays
BUDGET = 256 * 2**20  # bytes that the temporaries of one block of rows may take
# bytes of temporaries per (row, feature) of a block: the Gumbel keys, their negation and sort
# order (8 bytes each), the support mask; then the values and their masked copy (8 bytes each)
DRAW_BYTES = 40
ROW_BYTES = 16  # per (row, dimension): a float64 product or noise, and float32 copies
FILE_LIMIT = 8 * 10**9  # bytes of files one dataset may take
SUM_PIECE = 2**20  # elements of the training rows read at a time to sum their squares


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
    # how many features a row has (COUNTS): the axis that decides whether energy predicts it
    counts: str = "latent"
    hierarchy: float = 0.0  # share of the features that are children: active only with a parent

    # (low, high) of each number: the generator's sizes stay within what a laptop holds
    BOUNDS = {"dim": (2, 4096), "features": (2, 16384), "train": (100, 10_000_000),
              "test": (10, 1_000_000), "mean_l0": (1.0, 256.0), "complexity_sigma": (0.0, 3.0),
              "frequency_decay": (0.0, 3.0), "pair_share": (0.0, 1.0), "pair_prob": (0.0, 1.0),
              "value_sigma": (0.0, 3.0), "noise": (0.0, 10.0), "seed": (0, 2**32 - 1),
              "hierarchy": (0.0, 0.9)}
    CHOICES = {"counts": COUNTS}

    def check(self) -> None:
        """ValueError (one line) for a value out of :attr:`BOUNDS` or files that do not fit."""
        for name, choices in self.CHOICES.items():
            if getattr(self, name) not in choices:
                raise ValueError(f"--{name} must be one of {', '.join(choices)}, got "
                                 f"{getattr(self, name)!r:.40}")
        for f in fields(self):
            if f.name in self.CHOICES:
                continue
            low, high = self.BOUNDS[f.name]
            value = getattr(self, f.name)
            if not (isinstance(value, int | float) and math.isfinite(value)
                    and low <= value <= high):
                raise ValueError(f"--{f.name.replace('_', '-')} must be in [{low}, {high}], "
                                 f"got {value}")
        if self.counts == "fixed" and (self.pair_share > 0 or self.hierarchy > 0):
            raise ValueError("--counts fixed gives every row round(--mean-l0) features: it "
                             "needs --pair-share 0 and --hierarchy 0 (pairs and children add or "
                             "remove features)")
        if self.mean_l0 > self.features / 4:
            raise ValueError(f"--mean-l0 {self.mean_l0:g} is more than a quarter of the "
                             f"{self.features} features: rows would not be sparse")
        if self.file_bytes() > FILE_LIMIT:
            raise ValueError(f"--train, --test, --dim and --features make "
                             f"{self.file_bytes() / 1e9:.1f} GB of files, more than "
                             f"{FILE_LIMIT / 1e9:.0f} GB")

    def file_bytes(self) -> int:
        """The bytes of the dataset's arrays: float32 rows, their supports as packed bits and
        the float32 dictionary."""
        return ((self.train + self.test) * (4 * self.dim + (self.features + 7) // 8)
                + 4 * self.features * self.dim)


AXES = {"counts": "latent", "hierarchy": 0.0}  # settings added with their defaults


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


@dataclass(frozen=True)
class _Dictionary:
    """What every row is drawn from: the directions, the firing weights and the pairs."""

    directions: np.ndarray  # [F, D] float64, unit rows
    log_w: np.ndarray  # [F] log firing weights
    paired: np.ndarray  # [F] bool: the features with a partner
    partner_of: np.ndarray  # the partner of each paired feature, in order
    base: float  # the Poisson part of K's mean
    mean_c: float  # E[c], the mean latent complexity
    parent: np.ndarray  # [F] the parent of each child feature, −1 for the others


def _dictionary(cfg: SynthConfig, rng: np.random.Generator) -> _Dictionary:
    directions = rng.standard_normal((cfg.features, cfg.dim))
    directions /= np.linalg.norm(directions, axis=1, keepdims=True)
    weights, partner = _weights(cfg, rng), _partners(cfg, rng)
    paired = partner >= 0
    # the partners that join add about K · pair_prob · (weight of paired features) features
    extra = cfg.pair_prob * float(weights[paired].sum())
    parent = _parents(cfg, rng)
    return _Dictionary(directions, np.log(weights), paired, partner[np.flatnonzero(paired)],
                       base=max(cfg.mean_l0 / (1.0 + extra) - 1.0, 0.0),
                       mean_c=math.exp(cfg.complexity_sigma ** 2 / 2), parent=parent)


def _parents(cfg: SynthConfig, rng: np.random.Generator) -> np.ndarray:
    """parent[f]: the feature that must be active for child f to be, or −1. A ``hierarchy``
    share of the features are children, each of a parent drawn among the others (no draws
    from the random stream without a hierarchy, so the default data stay as they were)."""
    parent = np.full(cfg.features, -1, dtype=np.int64)
    n_children = int(round(cfg.hierarchy * cfg.features))
    if n_children == 0:
        return parent
    order = rng.permutation(cfg.features)
    children, roots = order[:n_children], order[n_children:]
    parent[children] = roots[rng.integers(0, len(roots), n_children)]
    return parent


def _blocks(m: int, cfg: SynthConfig, budget: int) -> list[tuple[int, int]]:
    """The blocks of m rows whose temporaries fit ``budget`` bytes (at least one row each)."""
    rows = max(1, min(m, budget // (DRAW_BYTES * cfg.features + ROW_BYTES * cfg.dim)))
    return [(lo, min(lo + rows, m)) for lo in range(0, m, rows)]


def _chunk(m: int, cfg: SynthConfig, d: _Dictionary, rng: np.random.Generator,
           budget: int = BUDGET) -> tuple[np.ndarray, np.ndarray]:
    """m rows (at most :data:`CHUNK`, without noise) [m, D] float32 and their supports [m, F]
    bool. Each draw over the features is made a block of rows at a time (:func:`_blocks`), in
    the order one draw of all m rows takes from the random stream, so the rows are the same
    whatever the budget."""
    f = cfg.features
    blocks = _blocks(m, cfg, budget)
    active = np.zeros((m, f), dtype=bool)
    if cfg.counts == "independent":  # each feature on its own, at min(1, mean_l0 · w_f)
        p = np.minimum(1.0, cfg.mean_l0 * np.exp(d.log_w))
        for lo, hi in blocks:
            active[lo:hi] = rng.random((hi - lo, f)) < p
    else:
        if cfg.counts == "fixed":
            k = np.full(m, min(max(int(round(cfg.mean_l0)), 1), f))
        else:
            c = rng.lognormal(0.0, cfg.complexity_sigma, m)
            k = np.minimum(1 + rng.poisson(d.base * c / d.mean_c), f)
        for lo, hi in blocks:  # k draws without replacement by weight: the k largest log w + Gumbel
            order = np.argsort(-(d.log_w + rng.gumbel(size=(hi - lo, f))), axis=1)
            take = np.arange(f)[None, :] < k[lo:hi, None]
            active[lo + np.repeat(np.arange(hi - lo), take.sum(1)), order[take]] = True
            del order, take
    for lo, hi in blocks:  # the partners that join
        joins = active[lo:hi, d.paired] & (rng.random((hi - lo, len(d.partner_of)))
                                           < cfg.pair_prob)
        rows, cols = np.nonzero(joins)
        active[lo + rows, d.partner_of[cols]] = True
    children = np.flatnonzero(d.parent >= 0)
    if len(children):  # a child without its parent is dropped
        active[:, children] &= active[:, d.parent[children]]
    x = np.empty((m, cfg.dim), dtype=np.float32)
    for lo, hi in blocks:
        values = np.where(active[lo:hi], rng.lognormal(0.0, cfg.value_sigma, (hi - lo, f)), 0.0)
        x[lo:hi] = values @ d.directions
        del values
    return x, active


def _sum_squares(read, lo: int, hi: int) -> float:
    """Σ x² in float64 over elements [lo, hi) of a float32 array, ``read(lo, hi)`` giving a
    piece: split into halves as numpy's pairwise summation splits one sum over the whole (at
    a multiple of 8), down to pieces of at most :data:`SUM_PIECE` that numpy sums itself, so
    the result is ``np.sum(np.square(x, dtype=np.float64))`` bit for bit, one piece in memory."""
    n = hi - lo
    if n <= SUM_PIECE:
        return np.add.reduce(np.square(read(lo, hi), dtype=np.float64))
    half = n // 2 - (n // 2) % 8
    return _sum_squares(read, lo, lo + half) + _sum_squares(read, lo + half, hi)


def _noise_scale(cfg: SynthConfig, read, elements: int) -> float:
    """σ: ``noise`` × the clean training rows' RMS per dimension."""
    return cfg.noise * math.sqrt(float(_sum_squares(read, 0, elements) / elements))


def _noise_blocks(n: int, cfg: SynthConfig, budget: int) -> list[tuple[int, int]]:
    rows = max(1, min(n, budget // (ROW_BYTES * cfg.dim)))
    return [(lo, min(lo + rows, n)) for lo in range(0, n, rows)]


def _sizes(n: int) -> list[int]:
    return [min(CHUNK, n - start) for start in range(0, n, CHUNK)]


def generate(cfg: SynthConfig, budget: int = BUDGET) -> GroundTruthData:
    """Rows whose features are known (see the module docstring), in memory; the same ``cfg``
    gives the same arrays, and the same as :func:`stream` writes."""
    cfg.check()
    rng = np.random.default_rng(cfg.seed)
    d = _dictionary(cfg, rng)
    splits = []
    for n in (cfg.train, cfg.test):
        parts = [_chunk(m, cfg, d, rng, budget) for m in _sizes(n)]
        splits.append((np.concatenate([x for x, _ in parts]),
                       np.concatenate([a for _, a in parts])))
        del parts
    (train_x, train_active), (test_x, test_active) = splits
    flat = train_x.reshape(-1)
    sigma = _noise_scale(cfg, lambda lo, hi: flat[lo:hi], flat.size)
    if sigma > 0:
        for x in (train_x, test_x):
            for lo, hi in _noise_blocks(len(x), cfg, budget):
                x[lo:hi] += rng.normal(0.0, sigma, (hi - lo, cfg.dim)).astype(np.float32)
    return GroundTruthData(d.directions.astype(np.float32), train_x, test_x, train_active,
                           test_active)


# the settings of a world's data (not its size, dimension or seed, which the name has anyway)
WORLD_AXES = ("mean_l0", "complexity_sigma", "frequency_decay", "pair_share", "pair_prob",
              "value_sigma", "noise", "counts", "hierarchy")


def world_name(cfg: SynthConfig) -> str:
    """The data set's name: ``synthetic d64 f256 seed 0`` for the default world, with each
    setting off its default named before the seed (``… value-sigma 1.5 counts fixed seed 0``),
    so that the worlds of a suite have runs folders and tables of their own."""
    default = SynthConfig()
    axes = [f"{k.replace('_', '-')} {v:g}" if isinstance(v, float) else f"{k} {v}"
            for k in WORLD_AXES if (v := getattr(cfg, k)) != getattr(default, k)]
    return " ".join([f"synthetic d{cfg.dim} f{cfg.features}", *axes, f"seed {cfg.seed}"])


def _manifest(cfg: SynthConfig, true_l0: dict, command: str) -> dict:
    return {
        "format": FORMAT,
        "name": world_name(cfg),
        "train": {"x": "train.npy", "active": "train_active.npy"},
        "test": {"x": "test.npy", "active": "test_active.npy"},
        "truth": {"features": "features.npy"},
        # the axes appear once set off their defaults: a dataset.json of the default world
        # stays byte for byte what it was
        "source": {"command": command, **{k: v for k, v in asdict(cfg).items()
                                          if k not in AXES or v != AXES[k]},
                   "true_l0_mean": {k: round(v, 4) for k, v in true_l0.items()}},
    }


def manifest(cfg: SynthConfig, data: GroundTruthData, command: str) -> dict:
    """The ``dataset.json`` of generated data: its files, truth, settings and true L0."""
    return _manifest(cfg, {split: float(a.sum(1).mean()) for split, a in
                           (("train", data.train_active), ("test", data.test_active))}, command)


def write(out: Path, cfg: SynthConfig, data: GroundTruthData, command: str) -> None:
    """Every array as ``<name>.npy`` and ``dataset.json`` last (a folder with it is complete)."""
    out.mkdir(parents=True, exist_ok=True)
    parts = {"train": data.train_x, "test": data.test_x, "features": data.features,
             "train_active": np.packbits(data.train_active, axis=1),
             "test_active": np.packbits(data.test_active, axis=1)}
    write_dataset(out, parts, manifest(cfg, data, command))


class _NpyFile:
    """An .npy array written a block of rows at a time into a temporary file beside its name
    (as :func:`sae.system.io.atomic_file` names one), read back and rewritten in place, and
    renamed to its name by :meth:`commit`; :meth:`discard` removes it."""

    def __init__(self, folder: Path, name: str, shape: tuple[int, int], dtype) -> None:
        self.path, self.dtype, self.width = folder / name, np.dtype(dtype), shape[1]
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{name}-", suffix=".tmp")
        self.tmp, self.fh = Path(tmp), os.fdopen(fd, "w+b")
        np.lib.format.write_array_header_1_0(self.fh, {
            "descr": np.lib.format.dtype_to_descr(self.dtype), "fortran_order": False,
            "shape": shape})
        self.start = self.fh.tell()

    def append(self, rows: np.ndarray) -> None:
        self.fh.write(np.ascontiguousarray(rows, dtype=self.dtype).tobytes())

    def _seek(self, element: int) -> None:
        self.fh.seek(self.start + element * self.dtype.itemsize)

    def elements(self, lo: int, hi: int) -> np.ndarray:
        """Elements [lo, hi) of the array in C order."""
        self._seek(lo)
        return np.frombuffer(self.fh.read((hi - lo) * self.dtype.itemsize), dtype=self.dtype)

    def rows(self, lo: int, hi: int) -> np.ndarray:
        return self.elements(lo * self.width, hi * self.width).reshape(hi - lo, -1)

    def put_rows(self, lo: int, rows: np.ndarray) -> None:
        self._seek(lo * self.width)
        self.append(rows)

    def commit(self) -> None:
        self.fh.flush()
        os.fsync(self.fh.fileno())
        self.fh.close()
        os.chmod(self.tmp, 0o644)
        os.replace(self.tmp, self.path)

    def discard(self) -> None:
        self.fh.close()
        self.tmp.unlink(missing_ok=True)


def _draw_split(n: int, cfg: SynthConfig, d: _Dictionary, rng: np.random.Generator,
                x_file: _NpyFile, active_file: _NpyFile, budget: int) -> np.ndarray:
    """n rows, without noise, written a chunk at a time; returns each row's true L0."""
    l0 = []
    for m in _sizes(n):
        x, active = _chunk(m, cfg, d, rng, budget)
        x_file.append(x)
        active_file.append(np.packbits(active, axis=1))
        l0.append(active.sum(1))
        del x, active
    return np.concatenate(l0)


def stream(out: Path, cfg: SynthConfig, command: str, budget: int = BUDGET) -> np.ndarray:
    """Write the dataset of ``cfg`` into the folder ``out``, the same arrays as
    :func:`generate` and :func:`write` would, a chunk of rows at a time (memory bounded by
    ``budget``, whatever the number of rows); returns the test rows' true L0. Every file is a
    temporary until all are complete; on any exception they are removed."""
    cfg.check()
    rng = np.random.default_rng(cfg.seed)
    d = _dictionary(cfg, rng)
    packed = (cfg.features + 7) // 8
    files: list[_NpyFile] = []
    try:
        l0 = {}
        for split, n in (("train", cfg.train), ("test", cfg.test)):
            files += [_NpyFile(out, f"{split}.npy", (n, cfg.dim), np.float32),
                      _NpyFile(out, f"{split}_active.npy", (n, packed), np.uint8)]
            l0[split] = _draw_split(n, cfg, d, rng, files[-2], files[-1], budget)
        train, test = files[0], files[2]
        sigma = _noise_scale(cfg, train.elements, cfg.train * cfg.dim)
        for file, n in ((train, cfg.train), (test, cfg.test)):
            for lo, hi in _noise_blocks(n, cfg, budget) if sigma > 0 else ():
                noise = rng.normal(0.0, sigma, (hi - lo, cfg.dim)).astype(np.float32)
                file.put_rows(lo, file.rows(lo, hi) + noise)
        files.append(_NpyFile(out, "features.npy", (cfg.features, cfg.dim), np.float32))
        files[-1].append(d.directions)
        true_l0 = {split: float(counts.sum()) / len(counts) for split, counts in l0.items()}
        with signals_held():  # all files or none: a stop now is raised once they are named
            for file in files:
                file.commit()
            write_json(out / "dataset.json", _manifest(cfg, true_l0, command))
        return l0["test"]
    except BaseException:
        for file in files:
            file.discard()
        raise


def _parser():
    from sae.settings.cli import OneLineParser, path_arg  # yaml: for the command only

    parser = OneLineParser(prog="python -m sae.synth",
                           description="Write activation data built from a known dictionary, "
                                       "with each row's true features (OUT/dataset.json).")
    for f in fields(SynthConfig):
        flag = f"--{f.name.replace('_', '-')}"
        if f.name in SynthConfig.CHOICES:
            parser.add_argument(flag, choices=SynthConfig.CHOICES[f.name], default=f.default,
                                help=f"(default {f.default})")
            continue
        low, high = SynthConfig.BOUNDS[f.name]
        parser.add_argument(flag, type=type(f.default),
                            default=f.default, help=f"in [{low}, {high}] (default {f.default})")
    parser.add_argument("--out", type=path_arg, required=True,
                        help="new or empty folder for the dataset")
    return parser


WRITTEN = ("train.npy", "test.npy", "train_active.npy", "test_active.npy", "features.npy",
           "dataset.json")  # what the command writes in OUT


def _check(argv: list[str]) -> tuple[Path, SynthConfig]:
    """``--out`` and the settings, checked (UsageError or ValueError: one line)."""
    from sae.settings.cli import UsageError  # yaml: for the command only

    args = vars(_parser().parse_args(argv))
    out = args.pop("out")
    cfg = SynthConfig(**args)
    cfg.check()
    if out.is_symlink() or (out.exists() and (not out.is_dir() or _foreign(out))):
        raise UsageError(f"--out {out} exists and is not an empty folder; choose a new one "
                         "(nothing is overwritten)")
    return out, cfg


def _left_by_a_kill(folder: Path, name: str) -> bool:
    """Whether ``name`` in ``folder`` is what a run killed with SIGKILL leaves: a temporary file
    of one of its outputs (``.train.npy-<random>.tmp``) or an output renamed before the
    dataset was complete (``dataset.json``, renamed last, is absent)."""
    if (folder / "dataset.json").exists() or (folder / name).is_symlink() \
            or not (folder / name).is_file():
        return False
    return name in WRITTEN or any(name.startswith(f".{w}-") and name.endswith(".tmp")
                                  for w in WRITTEN)


def _foreign(out: Path) -> bool:
    """Whether ``out`` holds anything but what a killed earlier run of the command left."""
    return any(not _left_by_a_kill(out, entry.name) for entry in out.iterdir())


def _remove_killed(out: Path) -> None:
    """Remove what a killed earlier run left in ``out`` (the same command then simply works)."""
    if out.is_dir():
        for entry in list(out.iterdir()):
            if _left_by_a_kill(out, entry.name):
                entry.unlink()


def _undo(out: Path, made: Path | None) -> None:
    """Remove what the command wrote in ``out`` (it was empty or new) and, while empty, ``out``
    and the parents it made (``made``: the outermost)."""
    for name in WRITTEN:
        (out / name).unlink(missing_ok=True)
    remove_made_folders(out, made)


def main(argv: list[str] | None = None) -> int:
    from sae.settings.cli import UsageError  # yaml: for the command only

    # Ctrl-C always interrupts, even when started from a script that ignores SIGINT for its
    # background jobs; SIGTERM stops it the same way (as every command)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, raise_terminated)
    argv = sys.argv[1:] if argv is None else argv
    try:
        out, cfg = _check(argv)
    except (UsageError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except STOPS as e:
        return interrupted(e)
    print(f"dataset folder: {out}", flush=True)
    made = None
    try:
        with signals_held():  # the folders made are known before a stop can undo them
            made = outermost_new(out)
            _remove_killed(out)
            out.mkdir(parents=True, exist_ok=True)
        l0 = stream(out, cfg, "python -m sae.synth " + " ".join(argv))
    except STOPS as e:
        if (out / "dataset.json").is_file():  # stopped just as the dataset was complete
            return interrupted(e, "the dataset was complete and is kept")
        _undo(out, made)
        return interrupted(e, "nothing was kept")
    except OSError as e:
        _undo(out, made)
        print(f"error: cannot write {out}: {' '.join(str(e).split())[:300]}", file=sys.stderr)
        return 1
    print(f"{cfg.train} train and {cfg.test} test rows of {cfg.dim} numbers from {cfg.features} "
          f"features; true L0 per test row: mean {l0.mean():.2f}, median {np.median(l0):g}, "
          f"range {l0.min()}–{l0.max()}")
    print(f"dataset: {out / 'dataset.json'}")
    print(f"next: python -m sae.run --data {out / 'dataset.json'} --hidden {2 * cfg.features}")
    return 0


def as_command() -> None:
    """Run as ``python -m sae.synth``: exit with :func:`main`'s code."""
    sys.exit(main())
