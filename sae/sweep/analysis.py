"""Analysis of finished runs, and the frames the comparison is drawn from.

:func:`analyse_run` loads a finished run's ``checkpoints/last.ckpt``, encodes the run's own
training and test images and records (in ``analysis.json``, cached until ``metrics.json``
changes or :data:`ANALYSIS_VERSION` moves on):

- the linear probe's test accuracy (``sae.metrics.linear_probe``: train-set codes -> test-set
  codes), under both probe losses: softmax (cross-entropy) and sparsemax (the Fenchel–Young loss
  paired with sparsemax), with the mean number of classes the sparsemax probe leaves nonzero;
- the mean L0 of each class on the test set;
- the Pearson correlation between a test input's L0 and its ink (sum of pixels; undefined,
  stored as null, when L0 or ink is constant).

The per-sample test L0 is saved as ``test_l0.npy``. :func:`raw_probes` fits the same probe on raw
pixels once per data split (cached in ``raw_probe.json``), and :func:`collect` gathers the
finished runs into the frames that the tables and plots take.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from sae.sweep.spec import Run
from sae.system.io import atomic_file, read_text, write_json
from sae.training.convergence import final_validation, last_epoch_change, read_validation
from sae.training.runfolder import RunFolder

__all__ = ["ANALYSIS_VERSION", "DataCache", "analyse_run", "analysis_is_current", "collect",
           "pearson", "raw_by_dataset", "raw_probes", "read_json", "run_metrics"]

ANALYSIS_VERSION = 5  # 2: dynamic-sparsity measures (support_fvu, adaptive_gain, adaptivity)
#                      3: the sparsemax-loss probe beside the softmax one
#                      4: probes solved to the default tolerance of linear_probes (1e-4)
#                      5: adaptivity with the energy held fixed, and its energy baseline
# the dynamic-sparsity measures a results row takes from the analysis
DYNAMIC_RESULTS = ("support_fvu", "support_fvu_const", "adaptive_gain", "adaptivity",
                   "adaptivity_partial", "adaptivity_energy")
SPLIT_KEYS = ("dataset", "data", "val_size", "limit_train", "limit_test")  # naming a data split


class DataCache:
    """The data splits of recent runs, so that runs sharing a split load it once."""

    def __init__(self, keep: int = 2):
        self.keep, self.items = keep, {}

    def get(self, settings: dict):
        """The set-up data module of a run's settings (dataset or data file, folder, split
        sizes): ``sae.data.matrixdata.data_module``."""
        from sae.data.modules import data_module  # torch and Lightning: only to read a split

        key = tuple(settings.get(k) for k in ("dataset", "data", "data_dir", "val_size",
                                              "limit_train", "limit_test"))
        if key not in self.items:
            dm = data_module(settings)
            dm.setup()
            self.items[key] = dm
            while len(self.items) > self.keep:
                self.items.pop(next(iter(self.items)))
        return self.items[key]


def read_json(path: Path, kind: type = dict):
    """The JSON value in ``path`` if it is a ``kind`` (regular file, no link followed, bounded
    size); None when it is missing, damaged or of another shape: a derived file that is
    None is recomputed."""
    try:
        value = json.loads(read_text(path))
    except (OSError, ValueError, RecursionError):
        return None
    return value if isinstance(value, kind) else None


def run_metrics(folder: Path) -> dict | None:
    """A finished run's ``metrics.json``; None when it is damaged (not a JSON object)."""
    return RunFolder(folder).metrics()


def pearson(a, b) -> float | None:
    """Pearson correlation of two 1-d arrays; None when either is constant (undefined)."""
    import numpy as np  # not at sae.compare's start

    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    a, b = a - a.mean(), b - b.mean()
    denom = float(np.sqrt((a * a).sum() * (b * b).sum()))
    return float((a * b).sum() / denom) if denom > 0 else None


def _load_l0(folder: Path):
    """The cached per-input test L0 (``test_l0.npy``; plain numbers only, no pickles; a
    regular file whose header matches its size, at most 64 MiB: NpyError, a ValueError)."""
    from sae.data.npyfile import read_array  # numpy: not at sae.compare's start

    return read_array(folder / "test_l0.npy", limit=64 << 20)


def analysis_is_current(folder: Path) -> bool:
    """Whether ``analysis.json`` and ``test_l0.npy`` exist, are of this version and are newer
    than the run's ``metrics.json``."""
    path = folder / "analysis.json"
    if not path.is_file() or not (folder / "test_l0.npy").is_file():
        return False
    cached = read_json(path)  # a damaged cache is recomputed, not trusted
    if cached is None or not _analysis_shape(cached):
        return False
    try:
        _load_l0(folder)
        return cached.get("version") == ANALYSIS_VERSION and \
            path.stat().st_mtime >= (folder / "metrics.json").stat().st_mtime
    except (OSError, ValueError, EOFError):
        return False


def _analysis_shape(a: dict) -> bool:
    """Whether a cached analysis has the fields the tables read, of the right kinds."""
    names, means = a.get("class_names"), a.get("class_l0_mean")
    return isinstance(names, list) and isinstance(means, list) and len(names) == len(means) \
        and all(isinstance(n, str) for n in names) \
        and all(m is None or isinstance(m, int | float) for m in means)


def _dynamic(folder: Path, model, dm, test_codes) -> dict:
    """The dynamic-sparsity measures: the run's own (metrics.json, computed by the same function
    on the same final model at the end of training) or, for a run of an earlier version that
    lacks them, computed here."""
    # torch: only when a run is analysed
    from sae.metrics import DYNAMIC_KEYS
    from sae.training.evaluate import dynamic_measures  # likewise

    measured = run_metrics(folder) or {}
    if all(k in measured for k in DYNAMIC_KEYS):
        return {k: measured[k] for k in DYNAMIC_KEYS}
    return dynamic_measures(model, dm.test_x, test_codes, dm.train_pca())


def analyse_run(folder: Path, data: DataCache) -> dict:
    """Probe, per-class L0 and L0–ink correlation of a finished run (cached in analysis.json)."""
    if analysis_is_current(folder):
        return read_json(folder / "analysis.json")
    # numpy, torch and Lightning: only for a run without a current analysis
    import numpy as np
    import torch  # likewise

    from sae import metrics  # likewise
    from sae.models import encode_codes  # likewise
    from sae.training.checkpoints import model_from_checkpoint, read_checkpoint  # likewise

    run = RunFolder(folder)
    settings = run.settings()
    state = read_checkpoint(run.checkpoint)
    model = model_from_checkpoint(state)
    dm = data.get(settings)
    train_codes, test_codes = encode_codes(model, dm.train_x), encode_codes(model, dm.test_x)
    probe, sparse_probe = _probes(train_codes, dm, test_codes)
    test_l0 = metrics.l0(test_codes, model.fire_threshold).to(torch.int32).numpy()
    labels = dm.test_y.numpy()
    class_l0 = [float(test_l0[labels == c].mean()) if (labels == c).any() else None
                for c in range(len(dm.class_names))]
    result = {
        "version": ANALYSIS_VERSION,
        "probe_accuracy": probe.test_accuracy,
        "probe_train_accuracy": probe.train_accuracy,
        "probe_iterations": probe.n_iter,
        "probe_sparsemax_accuracy": sparse_probe.test_accuracy,
        "probe_sparsemax_train_accuracy": sparse_probe.train_accuracy,
        "probe_sparsemax_classes": sparse_probe.test_support,
        "l0_ink_corr": pearson(test_l0, metrics.ink(dm.test_x).numpy()),
        "l0_mean": float(test_l0.mean()) if test_l0.size else None,
        "class_names": list(dm.class_names),
        "class_l0_mean": class_l0,
        "fire_threshold": float(model.fire_threshold),
        # last.ckpt is written at the last validation, which can precede the final step
        "checkpoint_step": int(state.get("global_step", -1)),
        "n_train": len(dm.train_x),
        "n_test": len(dm.test_x),
        **_dynamic(folder, model, dm, test_codes),
    }
    if probe is _NoProbe:
        result["probe_note"] = "the data have no labels: no probe was fitted"
    with atomic_file(folder / "test_l0.npy") as fh:
        np.save(fh, test_l0)
    write_json(folder / "analysis.json", result)
    return result


class _NoProbe:
    """The probe results of data without labels: none (null in the tables, said in a note)."""

    test_accuracy = train_accuracy = n_iter = test_support = None


def _probes(train_features, dm, test_features):
    """(softmax, sparsemax) linear probes of features of the run's splits; none without labels."""
    from sae import metrics  # torch: only when probes are fitted

    if not getattr(dm, "has_labels", True):
        return _NoProbe, _NoProbe
    probes = metrics.linear_probes(_tensor(train_features), dm.train_y,
                                   _tensor(test_features), dm.test_y, seed=0)
    return probes["softmax"], probes["sparsemax"]


def _tensor(x):
    """Rows as one tensor (a memory-mapped training split is read whole for the raw probe)."""
    import torch  # only when probes are fitted

    return x if isinstance(x, torch.Tensor) else x[:]


def raw_probes(sweep_dir: Path, runs: list[Run], data: DataCache) -> list[dict]:
    """The raw-pixel probe of every dataset split in use, cached in raw_probe.json."""

    path = sweep_dir / "raw_probe.json"
    cached = read_json(path, list) or []  # missing or damaged: recomputed
    have = {tuple(r.get(k) for k in SPLIT_KEYS): r for r in cached if isinstance(r, dict)
            and all(isinstance(r.get(k), str | int | type(None)) for k in SPLIT_KEYS)}
    for run in runs:
        key = tuple(run.settings.get(k) for k in SPLIT_KEYS)
        if key in have and "sparsemax_test_accuracy" in have[key]:
            continue
        dm = data.get(run.settings)
        shared = _shared_raw_probe(dm)
        if shared is None:
            probe, sparse_probe = _probes(dm.train_x, dm, dm.test_x)
            shared = {"n_train": len(dm.train_x), "n_test": len(dm.test_x),
                      "test_accuracy": probe.test_accuracy,
                      "train_accuracy": probe.train_accuracy,
                      "sparsemax_test_accuracy": sparse_probe.test_accuracy,
                      "sparsemax_classes": sparse_probe.test_support}
            _share_raw_probe(dm, shared)
        have[key] = {**dict(zip(SPLIT_KEYS, key, strict=True)), **shared}
        write_json(path, list(have.values()))
    return list(have.values())


# Raw-pixel probes depend on the data files and the split alone: every sweep on this machine
# shares them (in the data cache folder), so a sweep does not spend its last minute on them again.
_RAW_PROBE_VERSION = 3  # 2: the float64 L-BFGS-B probe solver; 3: its tolerance 1e-4


def _raw_probe_key(dm) -> str | None:
    if not dm.stamp:
        return None
    return json.dumps([_RAW_PROBE_VERSION, list(map(str, dm.stamp)), dm.val_size,
                       dm.split_seed, dm.limit_train, dm.limit_test])


def _raw_probe_file() -> Path:
    from sae.data.images import default_cache_dir  # torch: not at sae.compare's start

    return default_cache_dir() / "raw_probes.json"


def _shared_raw_probe(dm) -> dict | None:
    key = _raw_probe_key(dm)
    shared = read_json(_raw_probe_file(), dict) if key else None
    entry = (shared or {}).get(key)
    return entry if isinstance(entry, dict) and "sparsemax_test_accuracy" in entry else None


def _share_raw_probe(dm, entry: dict) -> None:
    key = _raw_probe_key(dm)
    if key is None:
        return
    shared = read_json(_raw_probe_file(), dict) or {}
    shared[key] = entry
    try:
        _raw_probe_file().parent.mkdir(parents=True, exist_ok=True)
        write_json(_raw_probe_file(), shared)
    except OSError:  # a read-only cache folder: the sweep's own raw_probe.json still has it
        pass


def raw_by_dataset(raw: list[dict], runs: list[Run]) -> dict[str, dict[str, float]]:
    """The raw-pixel probes of each dataset, on the split its runs use (the first run's).

    Returns dataset -> {summary metric: value} for the metrics a run's probes fill
    (``probe_accuracy``, and ``probe_sparsemax_accuracy`` / ``probe_sparsemax_classes`` where
    the cache holds them); values that are not finite numbers are left out.
    """
    names = {"test_accuracy": "probe_accuracy",
             "sparsemax_test_accuracy": "probe_sparsemax_accuracy",
             "sparsemax_classes": "probe_sparsemax_classes"}
    out = {}
    for run in runs:
        if run.dataset in out:
            continue
        for r in raw:
            if all(r.get(k) == run.settings.get(k) for k in SPLIT_KEYS):
                out[run.dataset] = {
                    name: float(r[key]) for key, name in names.items()
                    if isinstance(r.get(key), int | float) and math.isfinite(r[key])}
    return out


def collect(sweep_dir: Path, done: list[Run], analyses: dict[Path, dict]):
    """results.csv rows, per-sample L0 and per-class L0 frames of the finished runs ``done``.

    Returns:
        ``(results, l0, per_class)``: :func:`sae.sweep.aggregate.results_frame` plus a ``config``
        label column; one row per test sample and run (``dataset``, ``model``, ``config``,
        ``l0``); and the mean L0 per class over seeds (``dataset``, ``model``, ``config``,
        ``class``, ``l0``).
    """
    # numpy and pandas: not at sae.compare's start
    import numpy as np
    import pandas as pd  # likewise

    from sae.sweep.aggregate import config_label, results_frame  # likewise

    records, l0_parts, class_rows = [], [], []
    for run in done:
        folder = sweep_dir / run.rel
        metrics = run_metrics(folder)
        if metrics is None:  # damaged: reported by the runner, left out of the tables
            continue
        a = analyses.get(folder) or {}
        if not _analysis_shape(a):
            a = {}
        key = {"dataset": run.dataset, "model": run.model, "kind": run.kind,
               "param": run.param, "value": run.value}
        validation = read_validation(folder / "metrics.csv")
        records.append({**metrics, **key, "seed": run.seed, "run": str(run.rel),
                        **final_validation(validation), **last_epoch_change(validation),
                        **{k: a.get(k) for k in ("probe_accuracy", "probe_train_accuracy",
                                                 "probe_sparsemax_accuracy",
                                                 "probe_sparsemax_classes", "l0_ink_corr",
                                                 "checkpoint_step", *DYNAMIC_RESULTS)}})
        label = config_label(run.param, run.value)
        if a and (folder / "test_l0.npy").is_file():
            l0 = _load_l0(folder)
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
