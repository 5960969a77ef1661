"""python -m sae.compare: train a grid of SAEs, analyse each run, compare them in tables and plots.

    python -m sae.compare experiments/quick.yaml [--out DIR] [--jobs N] [--dry-run]
                                                 [--publish DIR]

Sweep file (YAML)::

    description: free text shown at the top of the comparison     (optional)
    datasets: [mnist, fashion-mnist]      # or one name
    seeds: [0, 1, 2]                      # training seeds (a list of integers >= 0)
    common:                               # sae.run settings for every run (optional)
      hidden: 512
      epochs: 8
    models:                               # name -> entry; the order is the tables' order
      l1:
        lambda: [0.003, 0.01, 0.03]       # the grid: λ for every model but topk ...
      topk:
        k: [16, 32, 64]                   # ... and k for topk
      kl:
        lambda: [0.01, 0.1, 1.0]
        rho: 0.05                         # any other key: a per-model override of `common`
      entmax-anneal:                      # a name that is not a model needs `model:`
        model: entmax
        alpha_mode: anneal
        lambda: [0.01]

Settings are ``sae.run`` flag names without the dashes (``max_steps`` or ``max-steps``; ``lambda``
for ``--lambda``); ``true``/``false`` turn switches such as ``no_figures`` on or off, ``null`` means
sae.run's default. ``dataset``, ``seed`` and ``model`` come from the sweep's structure, and
``out``, ``resume``, ``overwrite`` and ``config`` belong to the runner, so none of them may appear
in ``common``. Only the grid key takes a list (``devices`` may be a list of GPU ids); a missing
grid key gives one run at the value of ``common`` or sae.run's default. Every combination is
checked with sae.run's own parser before anything starts; bad input is one ``error:`` line on
stderr and exit code 2.

Sweep folder (default ``sweeps/<sweep file stem>``)::

    sweep.yaml                 the sweep file as last run
    runs/<dataset>/<model>/<lambda0.01 | k32>/seed<s>/
                               a sae.run folder, plus analysis.json and test_l0.npy
    logs/<same path>.log       each run's console output (appended on every attempt)
    raw_probe.json             raw-pixel probe accuracy per dataset and data split (cached)
    results.csv                one row per finished run (columns: sae.tables.RESULT_COLUMNS)
    comparison.md              mean ± std over seeds per configuration, "vs KL-SAE", raw pixels
    comparison.html            the same tables and the plots, one self-contained page
    fvu_vs_l0.png, probe_vs_l0.png, l0_distributions.png, class_l0.png, l0_ink_correlation.png

``--publish DIR`` copies everything above but ``runs/``, ``logs/`` and ``raw_probe.json`` to DIR
(the committed ``figures/compare/<preset>/`` folders are made this way). DIR must be new, empty
or an earlier publication; a folder holding anything else is refused before any work.

Each run trains through ``python -m sae.run ... --out <run folder>`` in a subprocess. A run with
``metrics.json`` is finished and never trained again (nor deleted); one with a checkpoint but no
``metrics.json`` continues with ``--resume``; one killed before its first checkpoint (only
``config.yaml``) starts again with ``--overwrite``. So a killed sweep, started again with the same
command, picks up where it stopped; a resumed run keeps the settings of its own config.yaml. To
change a finished configuration, use a new ``--out`` (or move its run folders away). Runs no
longer in the sweep file are left alone and left out of the tables. ``--jobs N`` trains N runs at
a time, splitting the CPU threads between them (``OMP_NUM_THREADS``), or giving each one GPU
(``CUDA_VISIBLE_DEVICES``) when GPUs are visible and its accelerator is ``gpu``, ``cuda`` or
``auto`` (with ``--jobs 1`` a run sees every GPU, for ``devices: 2`` and DDP). Ctrl-C stops the
sweep: the running trainings get SIGINT and keep their last checkpoint; no new ones start.

Analysis of a finished run (cached in ``analysis.json`` next to the run's ``metrics.json``) loads
``checkpoints/last.ckpt``, encodes the run's own training and test images, and records the linear
probe's test accuracy (``sae.metrics.linear_probe``: train-set codes -> test-set codes), the mean
L0 of each class on the test set, and the Pearson correlation between a test input's L0 and its
ink (sum of pixels; undefined, stored as null, when L0 or ink is constant). The per-sample test L0
is saved as ``test_l0.npy``. Exit status: 0 when every run finished, 1 when some failed (the
tables then cover the finished ones), 2 for bad input, 130 when interrupted.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from sae.run import EXIT_USAGE, UsageError, build_parser

ANALYSIS_VERSION = 1
TOP_KEYS = ("description", "datasets", "seeds", "common", "models")
RUNNER_KEYS = {"out", "resume", "overwrite", "config"}  # the runner sets these
STRUCTURE_KEYS = {"dataset", "seed", "model"}  # the sweep's structure sets these
LIST_KEYS = {"devices"}  # settings whose value may be a list
FIGURE_FILES = {
    "fvu_vs_l0.png": "Reconstruction vs sparsity: FVU against mean L0 per model; hollow points: "
                     "the KL-SAE's FVU when only the units its L0 counts reconstruct; the "
                     "dashed grey line is the Pareto frontier of FVU at L0 over all "
                     "configurations.",
    "probe_vs_l0.png": "Linear-probe test accuracy of the codes against mean L0; the dashed "
                       "line is the same probe on raw pixels.",
    "l0_distributions.png": "Distribution of the number of active units per test input.",
    "class_l0.png": "Mean L0 per class, relative to each configuration's mean.",
    "l0_ink_correlation.png": "Correlation between a test input's L0 and its ink: whether the "
                              "number of active units adapts to the input.",
}


LEGEND = ("Cells are mean ± std over seeds (sample std; none with one seed). MSE and FVU "
          "(fraction of variance unexplained) on the test set; FVU at L0: the FVU when only the "
          "units counted in L0 reconstruct (differs from FVU only for the KL-SAE, whose sigmoid "
          "units below the firing threshold still reconstruct); L0: active units per test input; "
          "dead: units that never fire on the test set; probe: linear classifier trained on "
          "train-set codes, scored on test-set codes; train time: wall-clock seconds of "
          "training.")


def grid_key(kind: str) -> str:
    """What a model's grid sweeps: k for topk (it has no penalty), λ for the others."""
    return "k" if kind == "topk" else "lambda"


# --------------------------------------------------------------------------- the sweep file


@dataclass(frozen=True)
class ModelEntry:
    name: str  # the sweep's name, used in paths and tables
    kind: str  # the sae.run model
    grid: tuple[float, ...] | None  # None: one run at the inherited value
    settings: dict  # per-model overrides (dest -> value)


@dataclass(frozen=True)
class Sweep:
    path: Path
    text: str
    description: str
    datasets: tuple[str, ...]
    seeds: tuple[int, ...]
    common: dict
    models: tuple[ModelEntry, ...]


@dataclass
class Run:
    """One combination of the sweep: what to train and where."""

    dataset: str
    model: str
    kind: str
    param: str  # "lambda" or "k"
    value: float
    seed: int
    argv: list[str]  # sae.run flags, --out excluded
    settings: dict = field(repr=False)  # the resolved sae.run settings

    @property
    def rel(self) -> Path:
        return (Path("runs") / self.dataset / self.model / f"{self.param}{self.value:g}"
                / f"seed{self.seed}")


def _dest(key: object, where: str) -> str:
    """A settings key as the sae.run parser's dest, or a UsageError naming ``where``."""
    if not isinstance(key, str):
        raise UsageError(f"{where}: setting names must be text, got {key!r}")
    return "lam" if key == "lambda" else key.replace("-", "_")


def _settings(mapping: object, where: str, known: set[str], extra: set[str] = frozenset(),
              lists: set[str] = frozenset()) -> dict:
    """Check a mapping of sae.run settings; return it keyed by parser dest.

    ``extra`` names further keys accepted as they are, ``lists`` settings that may be lists.
    """
    if mapping is None:
        return {}
    if not isinstance(mapping, dict):
        raise UsageError(f"{where} must be a mapping of sae.run settings")
    out: dict = {}
    for key, value in mapping.items():
        dest = _dest(key, where)
        if dest in extra:
            out[dest] = value
            continue
        if dest in RUNNER_KEYS | STRUCTURE_KEYS:
            raise UsageError(f"{where}: {key!r} cannot be set here (the sweep sets it)")
        if dest not in known:
            raise UsageError(f"{where}: unknown setting {key!r} (see python -m sae.run --help)")
        if dest in out:
            raise UsageError(f"{where}: {key!r} is given twice")
        if isinstance(value, list) and dest not in LIST_KEYS | lists:
            raise UsageError(f"{where}: {key!r} takes one value, not a list (only the grid "
                             "key, lambda or k for topk, is a list)")
        if isinstance(value, dict):
            raise UsageError(f"{where}: {key!r} takes a value, not a mapping")
        out[dest] = value
    return out


def _grid(values: object, where: str) -> tuple[float, ...]:
    values = values if isinstance(values, list) else [values]
    if not values or not all(isinstance(v, int | float) and not isinstance(v, bool)
                             for v in values):
        raise UsageError(f"{where} must be a number or a non-empty list of numbers")
    names = [f"{v:g}" for v in values]
    if len(set(names)) != len(names):
        raise UsageError(f"{where} repeats a value: {values}")
    return tuple(values)


def _model_entry(name: object, entry: object, known: set[str], path: Path) -> ModelEntry:
    from sae.config import MODELS

    where = f"{path}: models.{name}"
    if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", name):
        raise UsageError(f"model name {name!r} must be letters, digits, '-', '_' or '.'")
    settings = _settings(entry, where, known, extra={"model"}, lists={"lam", "k"})
    kind = settings.pop("model", name)
    if kind not in MODELS:
        raise UsageError(f"{where}: unknown model {kind!r}; choose from {', '.join(MODELS)} "
                         "(or give `model:`)")
    key = "lam" if grid_key(kind) == "lambda" else "k"
    other = {"lam": "k", "k": "lam"}[key]
    if isinstance(settings.get(other), list):
        raise UsageError(f"{where}: {kind} sweeps {grid_key(kind)}, so "
                         f"{'lambda' if other == 'lam' else 'k'} takes one value")
    grid = _grid(settings.pop(key), f"{where}.{grid_key(kind)}") if key in settings else None
    return ModelEntry(name, kind, grid, settings)


def _top_list(data: dict, key: str, kind: type, path: Path) -> tuple:
    values = data.get(key)
    if isinstance(values, kind) and not isinstance(values, bool):
        values = [values] if kind is str else values
    if not isinstance(values, list) or not values:
        example = "[mnist, fashion-mnist]" if kind is str else "[0, 1, 2]"
        raise UsageError(f"{path}: `{key}` must be a non-empty list, e.g. {key}: {example}")
    for v in values:
        if not isinstance(v, kind) or isinstance(v, bool) or (kind is int and v < 0):
            raise UsageError(f"{path}: `{key}` holds {v!r}; expected "
                             f"{'names' if kind is str else 'integers >= 0'}")
    if len(set(values)) != len(values):
        raise UsageError(f"{path}: `{key}` repeats a value")
    return tuple(values)


def load_sweep(path: str | Path) -> Sweep:
    """Read and check a sweep file's structure (values are checked by :func:`plan`)."""
    from sae.run import DATASET_CHOICES

    path = Path(path)
    if not path.is_file():
        raise UsageError(f"sweep file {path} does not exist")
    text = path.read_text(encoding="utf-8")
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise UsageError(f"sweep file {path} is not valid YAML ({str(e).splitlines()[0]})") \
            from None
    if not isinstance(data, dict):
        raise UsageError(f"sweep file {path} must hold a mapping with {', '.join(TOP_KEYS[1:])}")
    unknown = [k for k in data if k not in TOP_KEYS]
    if unknown:
        raise UsageError(f"{path}: unknown key {unknown[0]!r}; expected {', '.join(TOP_KEYS)}")
    datasets = _top_list(data, "datasets", str, path)
    for d in datasets:
        if d not in DATASET_CHOICES:
            raise UsageError(f"{path}: unknown dataset {d!r}; choose from "
                             f"{', '.join(DATASET_CHOICES)}")
    seeds = _top_list(data, "seeds", int, path)
    known = {a.dest for a in build_parser(suppress=True)._actions} - {"help"}
    common = _settings(data.get("common"), f"{path}: common", known)
    models = data.get("models")
    if not isinstance(models, dict) or not models:
        raise UsageError(f"{path}: `models` must map model names to their settings and grid")
    entries = tuple(_model_entry(name, entry, known, path) for name, entry in models.items())
    return Sweep(path, text, str(data.get("description") or ""), datasets, seeds, common,
                 entries)


def to_flags(settings: dict) -> list[str]:
    """sae.run flags for settings keyed by parser dest (None = sae.run's default: left out)."""
    actions = {a.dest: a for a in build_parser(suppress=True)._actions}
    flags: list[str] = []
    for dest, value in settings.items():
        flag = "--lambda" if dest == "lam" else "--" + dest.replace("_", "-")
        if actions[dest].nargs == 0:  # a switch
            if not isinstance(value, bool):
                raise UsageError(f"{dest} is a switch: give true or false, not {value!r}")
            flags += [flag] if value else []
        elif value is not None:
            flags += [flag, ",".join(map(str, value)) if isinstance(value, list) else str(value)]
    return flags


def plan(sweep: Sweep) -> list[Run]:
    """Every combination, checked with sae.run's own parser and model validation."""
    from sae.run import check_settings, model_config, resolve_settings

    runs = []
    for dataset in sweep.datasets:
        for entry in sweep.models:
            where = f"{sweep.path}: models.{entry.name}"
            if entry.name != entry.kind:
                where += f" ({entry.kind})"
            for value in entry.grid or (None,):
                for seed in sweep.seeds:
                    settings = {**sweep.common, **entry.settings}
                    if value is not None:
                        settings["lam" if grid_key(entry.kind) == "lambda" else "k"] = value
                    try:
                        argv = ["--model", entry.kind, "--dataset", dataset, "--seed", str(seed),
                                *to_flags(settings)]
                        args = resolve_settings([*argv, "--out", "."])
                        model_config(args)
                        check_settings(args)
                    except UsageError as e:
                        raise UsageError(f"{where}: {e}") from None
                    param = grid_key(entry.kind)
                    runs.append(Run(dataset, entry.name, entry.kind, param,
                                    args.lam if param == "lambda" else args.k, seed, argv,
                                    vars(args)))
    paths = [r.rel for r in runs]
    if len(set(paths)) != len(paths):
        raise UsageError(f"{sweep.path}: two combinations share a run folder")
    return runs


# --------------------------------------------------------------------------- run folders


def run_state(folder: Path) -> str:
    """done (metrics.json), resume (checkpoint), restart (config.yaml only), new, or foreign."""
    if (folder / "metrics.json").is_file():
        return "done"
    if (folder / "checkpoints" / "last.ckpt").is_file() and (folder / "config.yaml").is_file():
        return "resume"
    if (folder / "config.yaml").is_file():
        return "restart"
    if not folder.exists() or (folder.is_dir() and not any(folder.iterdir())):
        return "new"
    return "foreign"  # something else lives there: never touched


def train_command(run: Run, folder: Path, state: str) -> list[str]:
    base = [sys.executable, "-m", "sae.run"]
    if state == "resume":  # the run's own config.yaml holds its settings
        return [*base, "--out", str(folder), "--resume"]
    extra = ["--overwrite"] if state == "restart" else []
    return [*base, *run.argv, "--out", str(folder), *extra]


def uses_gpu(run: Run) -> bool:
    """Whether the run trains on a GPU when one is visible (auto picks one when present)."""
    return str(run.settings.get("accelerator", "auto")).lower() in ("gpu", "cuda", "auto")


def visible_gpus() -> list[str]:
    """GPU ids the runs may use: $CUDA_VISIBLE_DEVICES when set, else every CUDA device."""
    if os.environ.get("CUDA_VISIBLE_DEVICES") is not None:
        return [g for g in os.environ["CUDA_VISIBLE_DEVICES"].split(",") if g]
    import torch

    return [str(i) for i in range(torch.cuda.device_count())]


def total_threads() -> int:
    """The CPU threads to share: $OMP_NUM_THREADS when set, else the usable cores."""
    try:
        return max(1, int(os.environ["OMP_NUM_THREADS"]))
    except (KeyError, ValueError):
        return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else \
            (os.cpu_count() or 1)


def job_env(slot: int, threads: int, gpu: str | None) -> dict[str, str]:
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    for name in ("SAE_RUN_DIR", "RANK", "LOCAL_RANK", "NODE_RANK", "WORLD_SIZE"):
        env.pop(name, None)  # a sweep started inside a run must not steer its children
    if gpu is not None:
        env["CUDA_VISIBLE_DEVICES"] = gpu
    return env


# --------------------------------------------------------------------------- analysis


class DataCache:
    """The data splits of recent runs, so that runs sharing a split load it once."""

    def __init__(self, keep: int = 2):
        self.keep, self.items = keep, {}

    def get(self, settings: dict):
        from sae.data import ImageDataModule

        key = tuple(settings.get(k) for k in ("dataset", "data_dir", "val_size", "limit_train",
                                              "limit_test"))
        if key not in self.items:
            dm = ImageDataModule(key[0], key[1], val_size=key[2], limit_train=key[3],
                                 limit_test=key[4])
            dm.setup()
            self.items[key] = dm
            while len(self.items) > self.keep:
                self.items.pop(next(iter(self.items)))
        return self.items[key]


def pearson(a, b) -> float | None:
    """Pearson correlation of two 1-d arrays; None when either is constant (undefined)."""
    import numpy as np

    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    a, b = a - a.mean(), b - b.mean()
    denom = float(np.sqrt((a * a).sum() * (b * b).sum()))
    return float((a * b).sum() / denom) if denom > 0 else None


def _write_json(path: Path, data: object) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data, indent=2))
    tmp.replace(path)


def analysis_is_current(folder: Path) -> bool:
    path = folder / "analysis.json"
    if not path.is_file() or not (folder / "test_l0.npy").is_file():
        return False
    try:
        version = json.loads(path.read_text()).get("version")
    except (OSError, ValueError, AttributeError):
        return False
    return version == ANALYSIS_VERSION and \
        path.stat().st_mtime >= (folder / "metrics.json").stat().st_mtime


def analyse_run(folder: Path, data: DataCache) -> dict:
    """Probe, per-class L0 and L0–ink correlation of a finished run (cached in analysis.json)."""
    if analysis_is_current(folder):
        return json.loads((folder / "analysis.json").read_text())
    import numpy as np
    import torch

    from sae import metrics
    from sae.models import encode_dataset, load_checkpoint

    settings = yaml.safe_load((folder / "config.yaml").read_text())
    ckpt = folder / "checkpoints" / "last.ckpt"
    model = load_checkpoint(ckpt)
    dm = data.get(settings)
    _, train_codes = encode_dataset(model, dm.train_x)
    _, test_codes = encode_dataset(model, dm.test_x)
    probe = metrics.linear_probe(train_codes, dm.train_y, test_codes, dm.test_y, seed=0)
    test_l0 = metrics.l0(test_codes, model.fire_threshold).to(torch.int32).numpy()
    labels = dm.test_y.numpy()
    class_l0 = [float(test_l0[labels == c].mean()) if (labels == c).any() else None
                for c in range(len(dm.class_names))]
    result = {
        "version": ANALYSIS_VERSION,
        "probe_accuracy": probe.test_accuracy,
        "probe_train_accuracy": probe.train_accuracy,
        "probe_iterations": probe.n_iter,
        "l0_ink_corr": pearson(test_l0, metrics.ink(dm.test_x).numpy()),
        "l0_mean": float(test_l0.mean()) if test_l0.size else None,
        "class_names": list(dm.class_names),
        "class_l0_mean": class_l0,
        "fire_threshold": float(model.fire_threshold),
        # last.ckpt is written at the last validation, which can precede the final step
        "checkpoint_step": int(torch.load(ckpt, map_location="cpu", weights_only=False)
                               .get("global_step", -1)),
        "n_train": len(dm.train_x),
        "n_test": len(dm.test_x),
    }
    np.save(folder / "test_l0.npy", test_l0)
    _write_json(folder / "analysis.json", result)
    return result


def raw_probes(sweep_dir: Path, runs: list[Run], data: DataCache) -> list[dict]:
    """The raw-pixel probe of every dataset split in use, cached in raw_probe.json."""
    from sae import metrics

    path = sweep_dir / "raw_probe.json"
    cached = json.loads(path.read_text()) if path.is_file() else []
    keys = ("dataset", "val_size", "limit_train", "limit_test")
    have = {tuple(r.get(k) for k in keys): r for r in cached}
    for run in runs:
        key = tuple(run.settings.get(k) for k in keys)
        if key in have:
            continue
        dm = data.get(run.settings)
        probe = metrics.linear_probe(dm.train_x, dm.train_y, dm.test_x, dm.test_y, seed=0)
        have[key] = {**dict(zip(keys, key, strict=True)), "n_train": len(dm.train_x),
                     "n_test": len(dm.test_x), "test_accuracy": probe.test_accuracy,
                     "train_accuracy": probe.train_accuracy}
        _write_json(path, list(have.values()))
    return list(have.values())


# --------------------------------------------------------------------------- training


def _clock(seconds: float) -> str:
    m, s = divmod(int(seconds), 60)
    return f"{m // 60}:{m % 60:02d}:{s:02d}" if m >= 60 else f"{m}:{s:02d}"


def _last_line(path: Path) -> str:
    try:
        lines = [ln for ln in path.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return ""
    return lines[-1][:200] if lines else ""


class Trainer:
    """Runs ``sae.run`` subprocesses, N at a time, each in a numbered slot (thread share, GPU)."""

    def __init__(self, jobs: int, threads: int, gpus: list[str]):
        self.slots = list(range(jobs))
        # one GPU per slot only when runs share the machine; a lone run may use them all
        self.threads, self.gpus = threads, gpus if jobs > 1 else []
        self.lock = threading.Lock()
        self.live: set[subprocess.Popen] = set()
        self.stopping = False
        self.pool = ThreadPoolExecutor(max_workers=jobs)

    def _train(self, run: Run, command: list[str], log: Path) -> tuple[int | None, float]:
        """Exit code (None: not started, the sweep is stopping) and seconds taken."""
        with self.lock:
            slot = self.slots.pop(0)
        try:
            gpu = self.gpus[slot % len(self.gpus)] if uses_gpu(run) and self.gpus else None
            log.parent.mkdir(parents=True, exist_ok=True)
            start = time.perf_counter()
            with open(log, "a", encoding="utf-8") as fh:
                with self.lock:  # checked and registered together: stop() misses no process
                    if self.stopping:
                        return None, 0.0
                    fh.write(f"\n$ {' '.join(command)}\n")
                    fh.flush()
                    proc = subprocess.Popen(command, stdout=fh, stderr=subprocess.STDOUT,
                                            stdin=subprocess.DEVNULL,
                                            env=job_env(slot, self.threads, gpu))
                    self.live.add(proc)
                code = proc.wait()
                seconds = time.perf_counter() - start
                fh.write(f"# exit code {code} after {seconds:.1f} s\n")
                with self.lock:
                    self.live.discard(proc)
            return code, seconds
        finally:
            with self.lock:
                self.slots.append(slot)

    def submit(self, run: Run, command: list[str], log: Path) -> Future:
        return self.pool.submit(self._train, run, command, log)

    def stop(self) -> None:
        """Start no more runs, interrupt the running ones and wait for them to exit.

        SIGINT, like Ctrl-C in a terminal, lets sae.run stop cleanly with its last checkpoint
        intact, so the next invocation resumes it; a run that does not stop in 60 s is killed.
        """
        with self.lock:
            self.stopping = True
            procs = list(self.live)
        self.pool.shutdown(wait=False, cancel_futures=True)
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)
        for proc in procs:
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
        self.pool.shutdown(wait=True)


@dataclass
class Progress:
    total: int
    start: float = field(default_factory=time.perf_counter)
    finished: int = 0
    trained: int = 0
    skipped: int = 0
    failed: int = 0

    def line(self, run: Run, status: str, detail: str = "") -> str:
        self.finished += 1
        width = len(str(self.total))
        counts = (f"{self.trained} trained, {self.skipped} skipped, {self.failed} failed, "
                  f"{_clock(time.perf_counter() - self.start)} elapsed")
        text = f"[{self.finished:>{width}}/{self.total}] {run.rel.relative_to('runs')} {status}"
        return f"{text}{' · ' + detail if detail else ''} ({counts})"


def _metrics_note(folder: Path, analysis: dict | None) -> str:
    try:
        m = json.loads((folder / "metrics.json").read_text())
    except (OSError, ValueError):
        return ""
    note = f"fvu {m.get('fvu', float('nan')):.4g} · L0 {m.get('l0_mean', float('nan')):.3g}"
    if analysis and analysis.get("probe_accuracy") is not None:
        note += f" · probe {100 * analysis['probe_accuracy']:.1f}%"
    return note


def run_sweep(sweep_dir: Path, runs: list[Run], jobs: int, gpus: list[str],
              say: Callable[[str], None]) -> tuple[dict[Path, dict], int]:
    """Train what is missing, analyse what is finished; returns (analyses, failures)."""
    import torch

    threads = max(1, total_threads() // jobs)
    torch.set_num_threads(threads)  # the analysis shares the cores with the trainings
    trainer, data = Trainer(jobs, threads, gpus), DataCache()
    progress, analyses = Progress(len(runs)), {}

    def analyse(run: Run, folder: Path) -> dict | None:
        try:
            analyses[folder] = analyse_run(folder, data)
        except Exception as e:  # a broken checkpoint must not cost the other runs' tables
            say(f"warning: analysis of {run.rel} failed: {type(e).__name__}: {e}")
            return None
        return analyses[folder]

    states = {id(run): run_state(sweep_dir / run.rel) for run in runs}
    pending = {}
    for run in runs:
        if states[id(run)] != "done":
            folder = sweep_dir / run.rel
            log = sweep_dir / "logs" / run.rel.relative_to("runs").with_suffix(".log")
            command = train_command(run, folder, states[id(run)])
            pending[trainer.submit(run, command, log)] = (run, log)
    try:
        for run in runs:  # finished before: analyse them while the trainings run
            folder = sweep_dir / run.rel
            if states[id(run)] == "done":
                progress.skipped += 1
                a = analyse(run, folder)
                say(progress.line(run, "skipped (finished)", _metrics_note(folder, a)))
        for future in _completed(pending):
            run, log = pending[future]
            folder = sweep_dir / run.rel
            code, seconds = future.result()
            if code == 0 and run_state(folder) == "done":
                progress.trained += 1
                a = analyse(run, folder)
                say(progress.line(run, f"trained in {seconds:.1f} s",
                                  _metrics_note(folder, a)))
            else:
                progress.failed += 1
                say(progress.line(run, f"FAILED (exit {code})",
                                  f"{_last_line(log)} [log: {log}]"))
    except KeyboardInterrupt:
        trainer.stop()
        raise
    trainer.pool.shutdown(wait=True)
    return analyses, progress.failed


def _completed(futures: dict[Future, object]):
    """Futures as they finish, woken at least once a second so Ctrl-C is seen promptly."""
    from concurrent.futures import FIRST_COMPLETED, wait

    left = set(futures)
    while left:
        done, left = wait(left, timeout=1.0, return_when=FIRST_COMPLETED)
        yield from done


# --------------------------------------------------------------------------- outputs


def collect(sweep_dir: Path, runs: list[Run], analyses: dict[Path, dict]):
    """results.csv rows, per-sample L0 and per-class L0 frames of the finished runs."""
    import numpy as np
    import pandas as pd

    from sae.tables import config_label, results_frame

    records, l0_parts, class_rows = [], [], []
    for run in runs:
        folder = sweep_dir / run.rel
        if run_state(folder) != "done":
            continue
        metrics = json.loads((folder / "metrics.json").read_text())
        a = analyses.get(folder, {})
        key = {"dataset": run.dataset, "model": run.model, "kind": run.kind,
               "param": run.param, "value": run.value}
        records.append({**metrics, **key, "seed": run.seed, "run": str(run.rel),
                        **{k: a.get(k) for k in ("probe_accuracy", "probe_train_accuracy",
                                                 "l0_ink_corr", "checkpoint_step")}})
        label = config_label(run.param, run.value)
        if a and (folder / "test_l0.npy").is_file():
            l0 = np.load(folder / "test_l0.npy")
            l0_parts.append(pd.DataFrame({"dataset": run.dataset, "model": run.model,
                                          "config": label, "l0": l0}))
            for name, mean in zip(a["class_names"], a["class_l0_mean"], strict=True):
                class_rows.append({"dataset": run.dataset, "model": run.model, "config": label,
                                   "seed": run.seed, "class": name,
                                   "l0": np.nan if mean is None else mean})
    results = results_frame(records)
    results["config"] = [config_label(p, v) for p, v in zip(results["param"], results["value"],
                                                             strict=True)]
    l0 = (pd.concat(l0_parts, ignore_index=True) if l0_parts
          else pd.DataFrame(columns=["dataset", "model", "config", "l0"]))
    per_class = pd.DataFrame(class_rows, columns=["dataset", "model", "config", "seed", "class",
                                                  "l0"])
    per_class = per_class.groupby(["dataset", "model", "config", "class"], sort=False,
                                  as_index=False)["l0"].mean()
    return results, l0, per_class


def _raw_by_dataset(raw: list[dict], runs: list[Run]) -> dict[str, float]:
    """Raw-pixel probe accuracy of each dataset, on the split its runs use (the first run's)."""
    out = {}
    for run in runs:
        if run.dataset in out:
            continue
        for r in raw:
            if all(r.get(k) == run.settings.get(k) for k in
                   ("dataset", "val_size", "limit_train", "limit_test")):
                out[run.dataset] = r["test_accuracy"]
    return out


def comparison_markdown(sweep: Sweep, summary, matched, raw: dict[str, float],
                        n_runs: int, n_done: int) -> str:
    from sae.tables import kl_display, summary_display, to_markdown

    parts = [f"# Comparison: {sweep.path.name}", ""]
    if sweep.description:
        parts += [sweep.description.strip(), ""]
    parts += [f"{n_done} of {n_runs} runs finished. {LEGEND}", ""]
    for dataset in sweep.datasets:
        if dataset not in set(summary["dataset"]):
            continue
        parts += [f"## {dataset}", "", to_markdown(summary_display(summary, dataset,
                                                                   raw.get(dataset))), ""]
        kl = kl_display(matched, dataset)
        parts += [f"### {dataset}: vs KL-SAE at the nearest mean L0", "",
                  "Δ FVU < 0 and Δ probe > 0 favour the model over the KL-SAE. Δ FVU at L0 "
                  "compares the KL-SAE at the sparsity its L0 states.", "",
                  to_markdown(kl) if len(kl) else "No non-KL configurations.", ""]
    return "\n".join(parts)


def comparison_html(sweep: Sweep, summary, matched, raw: dict[str, float], pngs: dict[str, bytes],
                    n_runs: int, n_done: int) -> str:
    import datetime as dt

    from sae.report import PAGE_CSS, esc, inline_png
    from sae.tables import kl_display, summary_display, to_html

    body = []
    for dataset in sweep.datasets:
        if dataset not in set(summary["dataset"]):
            continue
        kl = kl_display(matched, dataset)
        body += [f'<h2 id="{esc(dataset)}">{esc(dataset)}</h2>',
                 to_html(summary_display(summary, dataset, raw.get(dataset))),
                 "<h3>vs KL-SAE at the nearest mean L0</h3>",
                 "<p class=\"sub\">Δ FVU &lt; 0 and Δ probe &gt; 0 favour the model. Δ FVU at L0 "
                 "compares the KL-SAE at the sparsity its L0 states.</p>",
                 to_html(kl) if len(kl) else "<p>No non-KL configurations.</p>"]
    body.append('<h2 id="figures">Figures</h2>')
    for name, caption in FIGURE_FILES.items():
        if name in pngs:
            body.append(f"<figure>{inline_png(pngs[name], name)}<figcaption>{esc(caption)}"
                        "</figcaption></figure>")
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    title = f"Comparison: {sweep.path.name}"
    nav = "".join(f'<a href="#{esc(d)}">{esc(d)}</a>' for d in sweep.datasets)
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{esc(title)}</title>
<style>{PAGE_CSS}</style>
</head>
<body>
<h1>{esc(title)}</h1>
<p class="sub">{n_done} of {n_runs} runs finished · generated {esc(stamp)}</p>
{f"<p>{esc(sweep.description.strip())}</p>" if sweep.description.strip() else ""}
<p>{esc(LEGEND)}</p>
<nav>{nav}<a href="#figures">Figures</a><a href="#sweep">Sweep file</a></nav>
{''.join(body)}
<h2 id="sweep">Sweep file</h2>
<pre><code>{esc(sweep.text)}</code></pre>
</body>
</html>
"""


def write_outputs(sweep_dir: Path, sweep: Sweep, runs: list[Run],
                  analyses: dict[Path, dict]) -> list[Path]:
    """results.csv, comparison.md/html and the plots; returns the files written."""
    from sae import figures
    from sae.report import write_atomic
    from sae.tables import match_kl, summarize_seeds

    results, l0, per_class = collect(sweep_dir, runs, analyses)
    done = [r for r in runs if run_state(sweep_dir / r.rel) == "done"]
    raw = _raw_by_dataset(raw_probes(sweep_dir, done, DataCache()) if done else [], runs)
    summary = summarize_seeds(results)
    matched = match_kl(summary)
    written = []
    csv = sweep_dir / "results.csv"
    write_atomic(csv, results.drop(columns="config").to_csv(index=False))
    made = {
        "fvu_vs_l0.png": lambda: figures.fvu_l0_pareto(summary),
        "probe_vs_l0.png": lambda: figures.probe_vs_l0(summary, raw),
        "l0_distributions.png": lambda: figures.l0_distributions(l0),
        "class_l0.png": lambda: figures.class_l0_heatmap(per_class),
        "l0_ink_correlation.png": lambda: figures.l0_ink_correlation(results),
    }
    pngs = {}
    for name, make in made.items():
        fig = make()
        pngs[name] = figures.figure_to_png_bytes(fig)
        written.append(figures.save_png(fig, sweep_dir / name))
    n_done = len(results)
    md = sweep_dir / "comparison.md"
    write_atomic(md, comparison_markdown(sweep, summary, matched, raw, len(runs), n_done))
    page = sweep_dir / "comparison.html"
    write_atomic(page, comparison_html(sweep, summary, matched, raw, pngs, len(runs), n_done))
    return [csv, md, page, *written]


# --------------------------------------------------------------------------- CLI


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # type: ignore[override]
        raise UsageError(message)


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = _Parser(prog="python -m sae.compare",
                description="Train every combination of a sweep file through sae.run (skipping "
                            "finished runs, resuming interrupted ones), analyse them, and write "
                            "results.csv, comparison.md, comparison.html and plots.")
    p.add_argument("sweep", help="sweep file (YAML), e.g. experiments/quick.yaml")
    p.add_argument("--out", default=None, help="sweep folder (default: sweeps/<file stem>)")
    p.add_argument("--jobs", default="1", help="runs trained at the same time (default: 1)")
    p.add_argument("--dry-run", action="store_true",
                   help="check the file and show what would run; train nothing, write nothing")
    p.add_argument("--publish", default=None, metavar="DIR",
                   help="also copy the tables, plots, comparison.html and sweep.yaml (no run "
                        "folders) to DIR, e.g. figures/compare/mnist")
    args = p.parse_args(argv)
    if not args.jobs.isdigit() or int(args.jobs) < 1:
        raise UsageError(f"--jobs must be an integer >= 1, got {args.jobs!r}")
    args.jobs = int(args.jobs)
    args.out = Path(args.out) if args.out else Path("sweeps") / Path(args.sweep).stem
    args.publish = Path(args.publish) if args.publish else None
    return args


PUBLISHED = ("sweep.yaml", "results.csv", "comparison.md", "comparison.html", *FIGURE_FILES)


def check_publish_dir(folder: Path) -> None:
    """A --publish folder may be new, empty, or an earlier publication (only PUBLISHED files):
    anything else in it is the user's, and is never overwritten."""
    if folder.exists() and not folder.is_dir():
        raise UsageError(f"--publish {folder} exists and is not a folder")
    if folder.is_dir():
        other = sorted(p.name for p in folder.iterdir() if p.name not in PUBLISHED)
        if other:
            raise UsageError(f"--publish {folder} holds files that are not a sweep's outputs "
                             f"({other[0]}, ...); choose an empty or new folder")


def publish(sweep_dir: Path, folder: Path) -> list[Path]:
    """Copy the sweep's outputs (not its runs) to folder; returns the copies."""
    import shutil

    folder.mkdir(parents=True, exist_ok=True)
    copies = []
    for name in PUBLISHED:
        if (sweep_dir / name).is_file():
            copies.append(Path(shutil.copyfile(sweep_dir / name, folder / name)))
    return copies


def _check_folders(sweep_dir: Path, runs: list[Run], jobs: int, gpus: list[str]) -> None:
    if sweep_dir.exists() and not sweep_dir.is_dir():
        raise UsageError(f"--out {sweep_dir} exists and is not a folder")
    for run in runs:
        if run_state(sweep_dir / run.rel) == "foreign":
            raise UsageError(f"{sweep_dir / run.rel} exists but is not a run folder (no "
                             "config.yaml); move it away")
    multi = [r for r in runs if gpus and uses_gpu(r) and jobs > 1
             and str(r.settings.get("devices")) not in ("1", "auto")]
    if multi:
        raise UsageError("--jobs > 1 gives each GPU run one GPU; use --jobs 1 for runs with "
                         f"devices={multi[0].settings.get('devices')}")


def dry_run(sweep_dir: Path, runs: list[Run], say: Callable[[str], None]) -> None:
    states = {}
    for run in runs:
        state = run_state(sweep_dir / run.rel)
        states[state] = states.get(state, 0) + 1
        command = train_command(run, sweep_dir / run.rel, state)[1:]
        say(f"{state:<8} {run.rel}" + ("" if state == "done" else
                                        f"  $ python {' '.join(command)}"))
    counts = ", ".join(f"{n} {s}" for s, n in states.items())
    say(f"{len(runs)} runs ({counts}); nothing was trained (--dry-run)")


def _lock(sweep_dir: Path):
    """An exclusive lock on the sweep folder: two runners must not train the same runs."""
    handle = open(sweep_dir / ".lock", "w")  # noqa: SIM115 (held for the process lifetime)
    try:
        import fcntl

        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except ImportError:  # no fcntl (Windows): run unlocked
        pass
    except OSError:
        raise UsageError(f"another sweep is running in {sweep_dir}") from None
    return handle


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv

    def say(line: str) -> None:
        print(line, flush=True)

    try:
        args = parse_args(argv)
        sweep = load_sweep(args.sweep)
        runs = plan(sweep)
        gpus = visible_gpus() if any(uses_gpu(r) for r in runs) else []
        _check_folders(args.out, runs, args.jobs, gpus)
        if args.publish is not None:
            check_publish_dir(args.publish)
        if args.dry_run:
            dry_run(args.out, runs, say)
            return 0
        args.out.mkdir(parents=True, exist_ok=True)
        lock = _lock(args.out)
    except UsageError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_USAGE

    with lock:
        (args.out / "sweep.yaml").write_text(sweep.text, encoding="utf-8")
        threads = max(1, total_threads() // args.jobs)
        say(f"sweep {sweep.path.name}: {len(runs)} runs → {args.out} "
            f"({args.jobs} at a time, {threads} CPU thread{'s' * (threads > 1)} each)")
        try:
            analyses, failed = run_sweep(args.out, runs, args.jobs, gpus, say)
        except KeyboardInterrupt:
            print(f"interrupted; run the same command again to continue ({args.out})",
                  file=sys.stderr)
            return 130
        written = write_outputs(args.out, sweep, runs, analyses)
        say("wrote " + ", ".join(str(p.relative_to(args.out)) for p in written) +
            f" in {args.out}")
        if args.publish is not None:
            say(f"published {len(publish(args.out, args.publish))} files to {args.publish}")
    if failed:
        print(f"error: {failed} of {len(runs)} runs failed; see their logs in {args.out / 'logs'}",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
