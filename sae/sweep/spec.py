"""The sweep file's schema: read a sweep YAML, check it, and expand it into runs.

:func:`load_sweep` checks the file's structure and names (datasets, seeds, models, setting
names); :func:`plan` expands it into one :class:`Run` per dataset × model × grid value (or target
L0) × seed and checks every combination's values with ``sae.run``'s own parser and model
validation, so a bad sweep fails before anything trains. :func:`check_budgets` refuses a sweep
whose models get unequal search budgets (training configurations per seed) unless the file
declares why (``unequal_budget``): a model given more settings to try would win by its search,
not its mechanism. The file format is documented in :mod:`sae.sweep.command`.

Everything that talks to ``sae.run``'s settings API (which settings exist, how a setting is
written as a flag, how one combination is resolved and validated) sits in one section below,
"sae.run's settings", so that it can follow changes of that API in one place.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from pathlib import Path

from sae.settings.cli import UsageError, check_mapping, load_yaml, run_config, shown, to_argv
from sae.settings.config import DATASETS, FIXED_BUDGET, MODELS, PROBE_LOSSES, RunConfig
from sae.settings.variants import NO_BUDGET

__all__ = ["MAX_RUNS", "RUNNER_KEYS", "RUN_PAGES_OFF", "STRUCTURE_KEYS", "TARGETS_WORD",
           "TOP_KEYS", "ModelEntry", "Run", "Sweep", "budget_text", "budgets", "check_budgets",
           "check_name", "grid_key", "load_sweep", "plan", "resolve_run"]

TOP_KEYS = ("description", "datasets", "seeds", "common", "models", "probe_loss", "targets",
            "unequal_budget")
RUNNER_KEYS = {"out", "resume", "overwrite", "config"}  # the runner sets these
STRUCTURE_KEYS = {"dataset", "seed", "model"}  # the sweep's structure sets these
# A sweep run writes no figures, feature browser or report while the sweep trains: for short runs
# they cost more than the training, and a reader opens few of them. ``python -m sae.report RUN``
# and ``python -m sae.features RUN`` build them later; ``common`` may switch them back on.
RUN_PAGES_OFF = {"no_figures": True, "no_features": True, "no_report": True}
# Runs in one sweep: the published presets have under 100; each is checked with sae.run's parser
# before anything starts (some 3 ms each), so this bounds that check to half a minute.
MAX_RUNS = 10_000
# ``target_l0: targets`` (in common or a model): one run aimed at each of the sweep's `targets`
TARGETS_WORD = "targets"
# a run aimed at a target L0 (sae.run --target-l0) sits in runs/.../target<L>/seed<s>
_FOLDER_PREFIX = {"target_l0": "target"}


def check_name(name: str, what: str) -> None:
    """Refuse a name that becomes one folder of a path but is not one plain folder name: empty,
    ``.`` or ``..`` (the folder itself or its parent), or holding a separator or NUL (a path
    of several folders, or an absolute one), or longer than file systems allow.

    Raises:
        UsageError: naming ``what`` (where the name comes from).
    """
    if name in ("", ".", "..") or any(c in name for c in "/\\\0") or \
            len(name.encode("utf-8", "surrogateescape")) > 255:
        raise UsageError(f"{what} {shown(name)} cannot be a folder name (it must be one plain "
                         "name: not empty, '.' or '..', no '/')")


def grid_key(kind: str) -> str:
    """What a model's grid sweeps: k for topk and batchtopk (no penalty), nothing ("none") for
    a model whose L0 is its own, λ for the others."""
    return "k" if kind in FIXED_BUDGET else "none" if kind in NO_BUDGET else "lambda"


def _grid_dest(kind: str) -> str | None:
    """The sae.run parser dest of a model's grid key (None: it has none)."""
    return {"lambda": "lam", "k": "k"}.get(grid_key(kind))


@dataclass(frozen=True)
class ModelEntry:
    """One entry of the sweep file's ``models`` mapping."""

    name: str  # the sweep's name, used in paths and tables
    kind: str  # the sae.run model
    grid: tuple[float, ...] | None  # None: one run at the inherited value
    settings: dict  # per-model overrides (dest -> value)
    # target L0s, one run aimed at each (sae.run --target-l0), instead of a grid; None: none
    targets: tuple[float, ...] | None = None

    @property
    def values(self) -> tuple:
        """What one seed's runs of this model sweep: its target L0s, its grid, or one run."""
        return self.targets or self.grid or (None,)


@dataclass(frozen=True)
class Sweep:
    """A checked sweep file: its text (kept for the record) and its parts."""

    path: Path
    text: str
    description: str
    datasets: tuple[str, ...]
    seeds: tuple[int, ...]
    common: dict
    models: tuple[ModelEntry, ...]
    probe_loss: str = "softmax"  # the probe the verdict and probe plot judge (both are tabled)
    # the mean L0s at which models are compared (headline and verdict); None: 16, 32 (and 64)
    targets: tuple[float, ...] | None = None
    # why the models' search budgets differ, as the file declares it (None: they must not)
    unequal_budget: str | None = None


@dataclass
class Run:
    """One combination of the sweep: what to train and where."""

    dataset: str
    model: str
    kind: str
    param: str  # "lambda", "k", "target_l0" (a run aimed at an L0) or "none" (its L0 is its own)
    value: float  # the λ, k or target L0
    seed: int
    argv: list[str]  # sae.run flags, --out excluded
    config: RunConfig = field(repr=False)  # the resolved sae.run settings

    @property
    def settings(self) -> dict:
        """The resolved settings, flat (``{field name: value}``, as a config.yaml holds them)."""
        return self.config.settings()

    @property
    def rel(self) -> Path:
        """The run folder, relative to the sweep folder."""
        prefix = _FOLDER_PREFIX.get(self.param, self.param)
        return (Path("runs") / self.dataset / self.model / f"{prefix}{self.value:g}"
                / f"seed{self.seed}")


# --------------------------------------------------------------------------- sae.run's settings


def resolve_run(argv: list[str]) -> RunConfig:
    """sae.run's resolved settings for ``argv`` (no --out), checked as sae.run checks them.

    Raises:
        UsageError: a value sae.run would refuse.
    """
    return run_config([*argv, "--out", "."])


# --------------------------------------------------------------------------- the sweep file


def _settings(mapping: object, where: str, lists: frozenset = frozenset()) -> dict:
    """A mapping of sae.run settings, checked (``sae.settings.cli``), keyed by field name.

    ``lists`` names settings that may hold a list (a model's grid).
    """
    if isinstance(mapping, dict):
        for key in mapping:
            if isinstance(key, str) and key.replace("-", "_") in RUNNER_KEYS | STRUCTURE_KEYS:
                raise UsageError(f"{where}: {shown(key)} cannot be set here (the sweep sets it)")
    try:
        return check_mapping(mapping, where, lists=lists)
    except UsageError as e:
        if "takes one value" in str(e):
            raise UsageError(f"{e} (only the grid key, lambda or k for topk, and target_l0 "
                             "are lists)") from None
        raise


def _grid(values: object, where: str) -> tuple[float, ...]:
    """A grid as a tuple of distinct numbers (one number is a grid of one)."""
    values = values if isinstance(values, list) else [values]
    if not values or not all(isinstance(v, int | float) and not isinstance(v, bool)
                             for v in values):
        raise UsageError(f"{where} must be a number or a non-empty list of numbers")
    names = [f"{v:g}" for v in values]
    if len(set(names)) != len(names):
        raise UsageError(f"{where} repeats a value: {shown(values)}")
    return tuple(values)


def _named_targets(mapping: object, where: str, targets: tuple[float, ...] | None) -> object:
    """``mapping`` with ``target_l0: targets`` replaced by the sweep's own ``targets``."""
    if not isinstance(mapping, dict):
        return mapping
    out = dict(mapping)
    for key, value in mapping.items():
        if isinstance(key, str) and key.replace("-", "_") == "target_l0" and \
                value == TARGETS_WORD:
            if targets is None:
                raise UsageError(f"{where}: `{key}: {TARGETS_WORD}` needs the sweep's "
                                 "`targets`, e.g. targets: [16, 32]")
            out[key] = [int(t) if float(t).is_integer() else t for t in targets]
    return out


def _model_entry(name: object, entry: object, path: Path, targets: tuple[float, ...] | None,
                 aims: tuple[float, ...] | None) -> ModelEntry:
    """One model entry, checked: its grid, or the target L0s it aims at (its own, else those of
    ``common``: ``aims``), never both; ``targets`` are the sweep's own."""
    # the name is a folder name in the sweep: short enough for any file system
    if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}", name):
        raise UsageError(f"{path}: model name {shown(name)} must be 1 to 64 letters, digits, "
                         "'-', '_' or '.'")
    where = f"{path}: models.{name}"
    entry = dict(entry) if isinstance(entry, dict) else entry
    kind = entry.pop("model", name) if isinstance(entry, dict) else name
    settings = _settings(_named_targets(entry, where, targets), where,
                         lists=frozenset({"lam", "k", "target_l0"}))
    if kind not in MODELS:
        raise UsageError(f"{where}: unknown model {shown(kind)}; choose from {', '.join(MODELS)} "
                         "(or give `model:`)")
    own = "target_l0" in settings
    if own:  # its own, or null: no target, whatever common says
        aims = None if settings["target_l0"] is None else \
            _grid(settings["target_l0"], f"{where}.target_l0")
        del settings["target_l0"]
    key = _grid_dest(kind)
    if key is None:
        if any(isinstance(settings.get(k), list) for k in ("lam", "k")):
            raise UsageError(f"{where}: {kind} has no λ or k to sweep (its L0 is its own): "
                             "give no grid")
        if own and aims is not None:
            raise UsageError(f"{where}: {kind} has no λ or k to aim at a target L0 (its L0 is "
                             "its own): give no target_l0")
        return ModelEntry(name, kind, None, settings)  # common's targets: not for it
    other = {"lam": "k", "k": "lam"}[key]
    if isinstance(settings.get(other), list):
        raise UsageError(f"{where}: {kind} sweeps {grid_key(kind)}, so "
                         f"{'lambda' if other == 'lam' else 'k'} takes one value")
    # a λ model's one λ is where its λ starts; a topk's k is its target
    if aims is not None and (isinstance(settings.get(key), list) or
                             (key == "k" and key in settings)):
        origin = "" if own else " (target_l0 from common; target_l0: null keeps the grid)"
        raise UsageError(f"{where}: give either a {grid_key(kind)} grid or target_l0 values, "
                         f"not both{origin}")
    grid = _grid(settings.pop(key), f"{where}.{grid_key(kind)}") \
        if key in settings and aims is None else None
    return ModelEntry(name, kind, grid, settings, aims)


def _top_list(data: dict, key: str, kind: type, path: Path) -> tuple:
    values = data.get(key)
    if isinstance(values, kind) and not isinstance(values, bool):
        values = [values] if kind is str else values
    if not isinstance(values, list) or not values:
        example = "[mnist, fashion-mnist]" if kind is str else "[0, 1, 2]"
        raise UsageError(f"{path}: `{key}` must be a non-empty list, e.g. {key}: {example}")
    for v in values:
        if not isinstance(v, kind) or isinstance(v, bool) or (kind is int and v < 0):
            raise UsageError(f"{path}: `{key}` holds {shown(v)}; expected "
                             f"{'names' if kind is str else 'integers >= 0'}")
    if len(set(values)) != len(values):
        raise UsageError(f"{path}: `{key}` repeats a value")
    return tuple(values)


def load_sweep(path: str | Path) -> Sweep:
    """Read and check a sweep file's structure (values are checked by :func:`plan`)."""
    path = Path(path)
    try:
        data = load_yaml(path, "sweep file")
    except UsageError as e:  # values beyond the loader's bound: far more runs than a sweep holds
        if "holds more than" in str(e):
            raise UsageError(f"{e} (a sweep has at most {MAX_RUNS:,} runs)") from None
        raise
    text = path.read_text(encoding="utf-8")
    if not isinstance(data, dict):
        raise UsageError(f"sweep file {path} must hold a mapping with {', '.join(TOP_KEYS[1:])}")
    unknown = [k for k in data if k not in TOP_KEYS]
    if unknown:
        raise UsageError(f"{path}: unknown key {shown(unknown[0])}; expected {', '.join(TOP_KEYS)}")
    seeds = _top_list(data, "seeds", int, path)
    targets = _targets(data.get("targets"), path)
    # common `data` may list several files: every model runs on each (a suite of worlds)
    common = _settings(_named_targets(data.get("common"), f"{path}: common", targets),
                       f"{path}: common", lists=frozenset({"target_l0", "data"}))
    _check_data_list(common.get("data"), f"{path}: common.data")
    aims = common.pop("target_l0", None)
    aims = None if aims is None else _grid(aims, f"{path}: common.target_l0")
    models = data.get("models")
    if not isinstance(models, dict) or not models:
        raise UsageError(f"{path}: `models` must map model names to their settings and grid")
    entries = tuple(_model_entry(name, entry, path, targets, aims)
                    for name, entry in models.items())
    # runs on activations (`data:` in common or a model) are named after their data; images
    # runs need `datasets`
    on_data = [bool(common.get("data") or e.settings.get("data")) for e in entries]
    files = [data_files(e.settings) or data_files(common) for e in entries]
    datasets: tuple[str, ...] = ()
    if "datasets" in data or not all(on_data):
        datasets = _top_list(data, "datasets", str, path)
        for d in datasets:
            if d not in DATASETS:
                raise UsageError(f"{path}: unknown dataset {shown(d)}; choose from "
                                 f"{', '.join(DATASETS)}")
        if common.get("data"):
            raise UsageError(f"{path}: `datasets` and common `data` exclude each other (the "
                             "runs train on the data file)")
    datasets += tuple(dict.fromkeys(_data_name(f) for fs in files for f in fs))
    probe_loss = data.get("probe_loss", "softmax")
    if probe_loss not in PROBE_LOSSES:
        raise UsageError(f"{path}: `probe_loss` must be one of {', '.join(PROBE_LOSSES)}, "
                         f"not {shown(probe_loss)}")
    reason = data.get("unequal_budget")
    if reason is not None and (not isinstance(reason, str) or not reason.strip()):
        raise UsageError(f"{path}: `unequal_budget` must be the reason, as text, why the models' "
                         "search budgets differ")
    sweep = Sweep(path, text, str(data.get("description") or ""), datasets, seeds, common,
                  entries, probe_loss, targets, reason.strip() if reason else None)
    if sweep.unequal_budget:  # the page states it where it states the sweep's purpose
        said = f"Search budgets differ ({budget_text(sweep)}): {sweep.unequal_budget}"
        sweep = replace(sweep, description="\n\n".join(
            part for part in (sweep.description.strip(), said) if part))
    return sweep


def _targets(targets: object, path: Path) -> tuple[float, ...] | None:
    """The sweep's `targets`, checked and sorted (None: the comparisons' default ones)."""
    if targets is None:
        return None
    targets = _grid(targets, f"{path}: `targets`")
    if not 1 <= len(targets) <= 4 or min(targets) <= 0:
        raise UsageError(f"{path}: `targets` must be 1 to 4 positive mean L0s, e.g. "
                         "targets: [5, 10, 20]")
    return tuple(sorted(float(t) for t in targets))


def budgets(sweep: Sweep) -> dict[str, dict[str, int]]:
    """Each model's search budget: its training configurations per seed (its grid values or
    target L0s; no other setting takes a list), per group of models trained on the same data
    (``""``: the image datasets, else the ``data`` file). A model without a λ or k (its L0 is
    its own) has nothing to search and is left out."""
    groups: dict[str, dict[str, int]] = {}
    for entry in sweep.models:
        if entry.kind not in NO_BUDGET:
            data = " | ".join(data_files(entry.settings) or data_files(sweep.common))
            groups.setdefault(data, {})[entry.name] = len(entry.values)
    return groups


def budget_text(sweep: Sweep) -> str:
    """The models' budgets in words, e.g. 'training configurations per seed: l1, kl 3; topk 2'
    (each group of models on one data file after the other)."""
    parts = []
    for group in budgets(sweep).values():
        counts = sorted(set(group.values()), reverse=True)
        parts += [f"{', '.join(m for m, n in group.items() if n == c)} {c}" for c in counts]
    return "training configurations per seed: " + "; ".join(parts)


def check_budgets(sweep: Sweep) -> None:
    """Refuse a sweep that gives one model more training configurations per seed than another
    of the same data (:func:`budgets`), unless the file declares why (``unequal_budget``).

    Raises:
        UsageError: one line naming the models and their budgets.
    """
    if sweep.unequal_budget:
        return
    if any(len(set(group.values())) > 1 for group in budgets(sweep).values()):
        raise UsageError(f"{sweep.path}: the models' search budgets differ "
                         f"({budget_text(sweep)}); give each as many λ / k values or target "
                         "L0s, or say why in `unequal_budget: \"reason\"`")


def _check_size(sweep: Sweep) -> None:
    """Refuse a sweep of more than :data:`MAX_RUNS` runs from its counts, before any is built."""
    on_images = [d for d in sweep.datasets if d in DATASETS]
    count = 0
    for entry in sweep.models:
        files = data_files(entry.settings) or data_files(sweep.common)
        count += (len(files) or len(on_images)) * len(entry.values) * len(sweep.seeds)
    if count > MAX_RUNS:
        raise UsageError(f"{sweep.path}: the sweep has {count:,} runs; a sweep has at most "
                         f"{MAX_RUNS:,} (split it into several sweep files)")


def data_files(settings: dict) -> list[str]:
    """The data files ``settings`` name: none, one, or a list (common ``data`` of a suite)."""
    data = settings.get("data")
    return [] if not data else [str(f) for f in data] if isinstance(data, list) else [str(data)]


def _check_data_list(data, where: str) -> None:
    """A list of data files: non-empty, each file named once, and their data set names (the
    runs' folders) distinct."""
    if not isinstance(data, list):
        return
    if not data:
        raise UsageError(f"{where} must name at least one data file")
    names = [_data_name(str(f)) for f in data]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise UsageError(f"{where}: two files have the data set name {shown(twice[0])}; "
                         "give each world a manifest of its own name")


def _data_name(path: str) -> str:
    """The dataset name of runs on a data file: the manifest's name or the file's stem."""
    from sae.data.matrixdata import data_name  # torch and Lightning: only for runs on a data file

    return data_name(path)


def plan(sweep: Sweep) -> list[Run]:
    """Every combination, checked with sae.run's own parser and model validation.

    Raises:
        UsageError: a value sae.run would refuse, more than :data:`MAX_RUNS` runs (counted
            before any is checked), a data set name that is not a folder name, or two
            combinations in one run folder.
    """
    _check_size(sweep)
    runs = []
    for dataset in sweep.datasets:
        check_name(dataset, f"{sweep.path}: the runs' data set name")
        for entry in sweep.models:
            files = data_files(entry.settings) or data_files(sweep.common)
            data = next((f for f in files if _data_name(f) == dataset), None)
            if (data is None) if files else (dataset not in DATASETS):
                continue  # each model's runs: on each of its data files, or image dataset
            where = f"{sweep.path}: models.{entry.name}"
            if entry.name != entry.kind:
                where += f" ({entry.kind})"
            # a run aimed at a target L0: sae.run --target-l0 (topk and batchtopk: k = it)
            aimed = entry.targets is not None
            param = grid_key(entry.kind)
            param = "target_l0" if aimed and param == "lambda" else param
            for value in entry.values:
                for seed in sweep.seeds:
                    settings = {**RUN_PAGES_OFF, **sweep.common, **entry.settings}
                    if data:  # the one file of common's list this run trains on
                        settings["data"] = data
                    if aimed:  # a whole target reads as one in the command (16, not 16.0)
                        settings["target_l0"] = int(value) if float(value).is_integer() else value
                    elif value is not None:
                        settings[_grid_dest(entry.kind)] = value
                    try:
                        images = [] if data else ["--dataset", dataset]
                        argv = ["--model", entry.kind, *images, "--seed", str(seed),
                                *to_argv(settings)]
                        config = resolve_run(argv)
                    except UsageError as e:
                        raise UsageError(f"{where}: {e}") from None
                    runs.append(Run(dataset, entry.name, entry.kind, param,
                                    {"lambda": config.sae.lam, "k": config.sae.k,
                                     "target_l0": config.sae.target_l0}.get(param, 0),
                                    seed, argv, config))
    paths = [r.rel for r in runs]
    if len(set(paths)) != len(paths):
        raise UsageError(f"{sweep.path}: two combinations share a run folder")
    return runs
