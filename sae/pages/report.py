"""Run folder -> one self-contained ``report.html``.

Usage::

    python -m sae.report <run-folder>

The page holds the run's config, its final test metrics, training curves drawn from
``metrics.csv`` and the latest figure of each kind found under ``figures/<kind>/epoch_<E>.png``
(or ``figures/<kind>/test_set.png``, a figure of the test set after training: the code
embedding).
The page is rendered by :mod:`sae.pages.html`: images inline as base64 ``data:`` URIs, CSS inline,
no scripts and no external references, so it opens anywhere, offline, and can be mailed or archived
alone.

Parts a run does not have yet (no ``metrics.json`` after an interrupted run, no figures, no
``metrics.csv``) are stated on the page, and so are damaged ones (a ``config.yaml`` that is not a
mapping, a ``metrics.json`` that does not parse, a figure that is not a PNG); files are read
without following links, bounded in size. Only a missing folder or a folder without
``config.yaml`` (not a run folder) is an error. Ctrl-C or SIGTERM is one line and exit code 130
or 143; the page is written atomically, so no half-written ``report.html`` is left.
"""

from __future__ import annotations

import json
import math
import re
import signal
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from sae.data.rundata import changed_data, read_record
from sae.pages import html as pages
from sae.pages.formatting import config_value, format_metric, format_value
from sae.settings.cli import BY_KEY, OneLineParser, UsageError, load_yaml, path_arg
from sae.settings.metric_defs import METRICS
from sae.settings.variants import VARIANTS, Variant, models_using, uses_lambda
from sae.system.io import read_bytes, read_text, write_text
from sae.system.process import (
    EXIT_USAGE,
    STOPS,
    exit_now,
    importing,
    interrupted,
    interruptible,
    running_as,
)
from sae.training.runfolder import RunFolder, RunFolderError

__all__ = ["FIGURE_KINDS", "format_metric", "format_value", "headline",
           "latest_figures", "main", "relevant_settings", "render_report", "write_report"]

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"

# Display order of figure kinds; kinds not listed follow alphabetically.
FIGURE_KINDS = (
    "decoder_atoms",
    "reconstructions",
    "sparsity_histogram",
    "activation_frequency",
    "class_unit_heatmap",
    "feature_density",
    "code_embedding",
)

# kind -> (heading, what the reader is looking at)
_KIND_TEXT = {
    "code_embedding": (
        "Code embedding",
        "t-SNE of 1 000 test inputs' codes, coloured by class, beside the same inputs' raw "
        "pixels in a run on images: do the codes separate classes, better or worse than the "
        "pixels do?",
    ),
    "decoder_atoms": (
        "Decoder atoms",
        "Decoder columns drawn as images, most frequently firing units first; red is positive, "
        "blue negative, each tile scaled to its own largest absolute weight.",
    ),
    "reconstructions": (
        "Reconstructions",
        "The first 16 inputs of the validation set above their reconstructions, with each "
        "pair's MSE; grey scale 0 (white) to 1 (black), the pixels' range, outputs clipped to "
        "it for display.",
    ),
    "sparsity_histogram": (
        "Sparsity histogram",
        "Number of active units per input (L0), over all samples and per class.",
    ),
    "activation_frequency": (
        "Unit firing frequency",
        "Fraction of inputs on which each unit fires, busiest unit first, on a fixed log scale "
        "(10⁻⁴ to 1, the same in every run); dead units in red on the floor, the dense "
        "threshold dashed.",
    ),
    "class_unit_heatmap": (
        "Firing frequency per class",
        "How often each of the most frequent units fires within each class; units grouped by "
        "the class they fire for most, most selective first; the strip above shows each "
        "unit's selectivity (1 − entropy of its class distribution / log of the number of "
        "classes: 1 = one class only).",
    ),
    "feature_density": (
        "Feature density",
        "Histogram of log10 firing frequency; dead units counted in their own bar.",
    ),
}

# figures of the classes of the inputs: not shown for data without classes
_CLASS_KINDS = ("class_unit_heatmap",)
# captions for a run on rows of activations with classes, and on rows without classes
_ACTIVATIONS_TEXT = {
    "code_embedding": "t-SNE of 1 000 test inputs' codes, coloured by class: do the codes "
                      "separate the classes?",
    "decoder_atoms": "Decoder columns drawn as heatmaps of their D values, most frequently "
                     "firing units first; red is positive, blue negative, each tile scaled to "
                     "its own largest absolute weight.",
}
_UNLABELLED_TEXT = {
    **_ACTIVATIONS_TEXT,
    "code_embedding": "t-SNE of 1 000 test inputs' codes: the shape of the code space (the "
                      "rows have no labels to colour it by).",
    "sparsity_histogram": "Number of active units per input (L0) over the validation inputs.",
}

# Metric name (last path component, so "test/fvu" matches too) -> definition shown in the table
# (sae.settings.metric_defs, whence the documentation's metric tables too)
_METRIC_NOTES = {m.name: m.definition for m in METRICS}

# metrics.json entries that describe the run rather than measure it: shown as "Run", apart
# from the metrics (name -> label)
_RUN_FACTS = {"model": "model", "dataset": "dataset", "lam": "λ",
              "lambda_held": "λ held (--target-l0)", "seed": "seed",
              "hidden": "code units", "fire_threshold": "firing threshold", "steps": "steps",
              "epochs": "epochs"}

_EPOCH_PNG = re.compile(r"epoch_(\d+)\.png")
TEST_SET_PNG = "test_set.png"  # a figure of the test set after training, not of an epoch

# --------------------------------------------------------------------------- reading the run


def flatten(mapping: Mapping, prefix: str = "") -> dict[str, object]:
    """Nested mapping -> ``{"a.b.c": value}`` (leaf values kept as they are)."""
    flat: dict[str, object] = {}
    for key, value in mapping.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            flat.update(flatten(value, f"{name}."))
        else:
            flat[name] = value
    return flat


def _read_config(path: Path) -> tuple[dict[str, object], str | None]:
    """Flattened config and a problem description (None when it read cleanly).

    Read by the settings layer's YAML reader (safe, bounded: a crafted file costs no time or
    memory); any mapping is shown as it is.
    """
    try:
        data = load_yaml(path, "config file")
    except (OSError, UnicodeDecodeError, UsageError) as exc:
        return {}, f"config.yaml could not be read: {exc}"
    if data is None:
        return {}, "config.yaml is empty."
    if not isinstance(data, Mapping):
        return {}, f"config.yaml holds a {type(data).__name__}, not a mapping."
    return flatten(data), None


def _read_metrics(path: Path) -> tuple[dict[str, object], str | None]:
    """Flattened final metrics and a problem description (None when present and valid)."""
    if not path.is_file():
        return {}, ("No metrics.json: the run was interrupted or is still training, "
                    "so there are no final test metrics.")
    try:
        data = json.loads(read_text(path))
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as exc:  # nested too deep
        return {}, f"metrics.json could not be read: {' '.join(str(exc).split())[:200]}"
    if not isinstance(data, Mapping):
        return {}, f"metrics.json holds a {type(data).__name__}, not an object."
    return flatten(data), None


def _find_metrics_csv(run_dir: Path) -> Path | None:
    """``<run>/metrics.csv``, else the newest ``metrics.csv`` below the run (logger versions)."""
    root = run_dir / "metrics.csv"
    if root.is_file():
        return root
    found = [p for p in run_dir.glob("*/**/metrics.csv") if p.is_file()]
    return max(found, key=lambda p: p.stat().st_mtime) if found else None


def _latest_epoch_png(kind_dir: Path) -> tuple[int, Path] | None:
    """The ``epoch_<E>.png`` with the highest E in a folder (numeric, so 10 beats 9)."""
    best: tuple[int, Path] | None = None
    for path in kind_dir.iterdir():
        match = _EPOCH_PNG.fullmatch(path.name)
        if match and path.is_file() and (best is None or int(match[1]) > best[0]):
            best = (int(match[1]), path)
    return best


def latest_figures(run_dir: Path) -> list[tuple[str, int | None, Path]]:
    """``(kind, epoch, path)`` of the latest figure of each kind, in display order; epoch None
    for a figure of the test set after training (``test_set.png``, preferred to an epoch's)."""
    root = Path(run_dir) / "figures"
    if not root.is_dir():
        return []
    found = {}
    for kind_dir in root.iterdir():
        if not kind_dir.is_dir():
            continue
        test_set = kind_dir / TEST_SET_PNG
        latest = (None, test_set) if test_set.is_file() else _latest_epoch_png(kind_dir)
        if latest is not None:
            found[kind_dir.name] = latest
    known = [k for k in FIGURE_KINDS if k in found]
    order = known + sorted(k for k in found if k not in FIGURE_KINDS)
    return [(kind, *found[kind]) for kind in order]


# --------------------------------------------------------------------------- page sections


def _applies(key: str, v: Variant, config: dict[str, object]) -> bool:
    """Whether config.yaml key ``key`` matters for variant ``v`` (``sae.settings.variants``) in a
    run of settings ``config``: λ where it weighs a term, k and AuxK's aux_k for a fixed budget, a
    model-specific setting for its models."""
    name = BY_KEY[key].name if key in BY_KEY else key
    if name == "lam":
        return uses_lambda(v.name, {BY_KEY[k].name if k in BY_KEY else k: value
                                    for k, value in config.items()})
    if name in ("k", "aux_k"):
        return v.budget == "fixed"
    return not models_using(name) or name in v.settings


def relevant_settings(config: dict[str, object]) -> dict[str, object]:
    """The settings of ``config`` that matter for its model: another model's settings (rho
    for a non-KL run, alpha for a non-entmax run, k for a λ model, ...) and mlp_width for a
    linear run are left out."""
    model = config.get("model")
    keep = {}
    for key, value in config.items():
        if model in VARIANTS and not _applies(key, VARIANTS[model], config):
            continue
        if key == "mlp_width" and config.get("arch", "linear") != "mlp":
            continue
        keep[key] = value
    return keep


def _config_table(config: dict[str, object]):
    return pages.table(["setting", "value"], [(k, config_value(v)) for k, v in config.items()],
                       cell_class=lambda column, _: "num" if column == 1 else None)


def _config_section(config: dict[str, object], problem: str | None):
    if problem:
        return pages.missing(problem)
    short = relevant_settings(config)
    hidden = len(config) - len(short)
    note = pages.fragment('<p class="sub">{}</p>',
                          f"The settings that matter for this model ({hidden} of another "
                          "model's hidden; all of them below)." if hidden else
                          "Every setting of the run.")
    body = [note, _config_table(short)]
    if hidden:
        body.append(pages.fragment("<details><summary>{}</summary>{}</details>",
                                   f"Show all {len(config)} settings", _config_table(config)))
    return pages.join(body)


def _split_metrics(metrics: dict[str, object]) -> tuple[dict[str, object], dict[str, object]]:
    """metrics.json as (run facts, measured metrics)."""
    facts = {k: metrics[k] for k in _RUN_FACTS if k in metrics}  # in the order of _RUN_FACTS
    return facts, {k: v for k, v in metrics.items() if k not in _RUN_FACTS}


def _metrics_section(metrics: dict[str, object], problem: str | None, data: _Data):
    if problem:
        return pages.missing(problem)
    if not metrics:
        return pages.missing("metrics.json holds no metrics.")
    facts, measured = _split_metrics(metrics)
    n = measured.get("n_samples")
    where = (f"On the test set (n = {format_value(n)} {data.noun}), after training."
             if isinstance(n, int | float) else "On the test set, after training.")
    parts = [pages.fragment('<p class="sub">{}</p>', where)]
    if facts:
        parts += [pages.fragment("<h3>{}</h3>", "Run"),
                  pages.table(["setting", "value"],
                              [(_RUN_FACTS[k], format_value(v)) for k, v in facts.items()],
                              cell_class=lambda column, _: "num" if column == 1 else None)]
    if measured:
        # a value the run could not measure (a change over the last epoch of a one-epoch run)
        # is "–", its definition saying when that happens
        rows = [(name, "–" if value is None else format_metric(name, value),
                 _METRIC_NOTES.get(name.rsplit("/", 1)[-1], ""))
                for name, value in measured.items()]
        parts += [pages.fragment("<h3>{}</h3>", "Metrics"),
                  pages.table(["metric", "value", "definition"], rows,
                              cell_class=lambda column, _: (None, "num", "note")[column],
                              stack=True)]
    return pages.join(parts)


def headline(metrics: dict[str, object]) -> str | None:
    """'FVU 0.2615 (at L0: 0.4569) · L0 52.5 ± 6.3 per input · 0.0 % dead units': the line a
    reader wants first; None without those metrics."""
    def number(key: str) -> float | None:
        value = metrics.get(key)
        ok = isinstance(value, int | float) and not isinstance(value, bool)
        return float(value) if ok and math.isfinite(value) else None

    fvu, at_l0, l0, l0_std, dead = (number(k) for k in ("fvu", "fvu_at_l0", "l0_mean",
                                                        "l0_std", "dead_fraction"))
    parts = []
    if fvu is not None:
        extra = f" (at L0: {at_l0:.4f})" if at_l0 is not None and abs(at_l0 - fvu) > 1e-6 else ""
        parts.append(f"FVU {fvu:.4f}{extra}")
    if l0 is not None:
        parts.append(f"L0 {l0:.1f}" + (f" ± {l0_std:.1f}" if l0_std is not None else "")
                     + " active units per input")
    if dead is not None:
        parts.append(f"{100 * dead:.1f} % dead units")
    return " · ".join(parts) + " (test set)" if parts else None


def _curves_section(run_dir: Path):
    """Training curves drawn now from metrics.csv (so the report is current mid-training)."""
    path = _find_metrics_csv(run_dir)
    if path is None:
        return pages.missing("No metrics.csv: no training curves were logged.")
    # Imported here so that the CLI's argument and folder errors come back without the cost of
    # loading the plotting stack.
    import pandas as pd

    from sae import figures  # matplotlib, likewise

    try:
        history = pd.read_csv(path)
    except (OSError, ValueError) as exc:  # pandas' EmptyDataError and ParserError are ValueErrors
        return pages.missing(f"{path.relative_to(run_dir)} could not be read: {exc}")
    fig = figures.training_curves(history)
    png = figures.figure_to_png_bytes(fig)
    fig.clear()
    caption = pages.fragment("Drawn from <code>{}</code> ({} logged rows).",
                             path.relative_to(run_dir), f"{len(history):,}")
    return pages.figure(png, "training curves", caption)


def _figures_section(run_dir: Path, config: dict[str, object], data: _Data):
    latest = [(kind, epoch, path) for kind, epoch, path in latest_figures(run_dir)
              if data.labelled or kind not in _CLASS_KINDS]
    if not latest:
        return pages.missing("No figures yet: figures/<kind>/epoch_<E>.png holds nothing.")
    val = config.get("val_size")
    n = f" (n = {format_value(val)} {data.noun})" if isinstance(val, int) else ""
    parts = [pages.fragment('<p class="sub">{}</p>',
                            f"Drawn during training from the validation set{n}, a part of "
                            "the training split held out; the metrics above are on the test "
                            "set. The code embedding is of test inputs.")]
    if config.get("data"):
        parts.append(pages.fragment('<p class="sub">{}</p>', (
            f"Trained on rows of activations ({config['data']}): the decoder atoms are "
            "heatmaps of their D values (on a square or a strip); the inputs and their "
            "reconstructions are not drawn.")))
    for kind, epoch, path in latest:
        heading, caption = _KIND_TEXT.get(kind, (kind.replace("_", " ").capitalize(), ""))
        caption = _UNLABELLED_TEXT.get(kind, caption) if not data.labelled else \
            _ACTIVATIONS_TEXT.get(kind, caption) if not data.images else caption
        try:
            png = read_bytes(path)
        except OSError as exc:
            parts.append(pages.fragment("<h3>{}</h3>{}", heading,
                                        pages.missing(f"{path.name}: {exc}")))
            continue
        if not png.startswith(PNG_SIGNATURE):
            body = pages.missing(f"figures/{kind}/{path.name} is not a PNG file.")
        else:
            when = "The test set after training" if epoch is None else f"Epoch {epoch}"
            where = f"{when} (figures/{kind}/{path.name}). {caption}".strip()
            body = pages.figure(png, heading, where)
        parts.append(pages.fragment('<h3 id="fig-{}">{}</h3>{}', kind, heading, body))
    return pages.join(parts)


def _changed_data(run_dir: Path, config: dict[str, object]) -> str | None:
    """Why a ``--data`` run's files no longer hold the data it was trained on, or None
    (:func:`sae.data.rundata.changed_data`)."""
    if not config.get("data"):
        return None
    return changed_data(run_dir)


@dataclass(frozen=True)
class _Data:
    """What a run's data are, as its pages must word them."""

    images: bool = True  # the SAE's inputs are images (not rows of activations)
    labelled: bool = True  # the inputs have classes

    @property
    def noun(self) -> str:
        return "images" if self.images else "inputs"


def _data_of(run_dir: Path, config: dict[str, object]) -> _Data:
    """A ``--data`` run's inputs are rows of activations, with classes unless its data record
    (``data.json``) says they have none; an image run's are images with classes."""
    if not config.get("data"):
        return _Data()
    record = read_record(run_dir) or {}
    return _Data(images=False, labelled=record.get("labelled") is not False)


def _lookup(config: dict[str, object], keys: tuple[str, ...]) -> str | None:
    for key in keys:
        if key in config and isinstance(config[key], str | int | float):
            return str(config[key])
    return None


def render_report(run_dir: Path, resume_command: str | None = None) -> str:
    """The complete HTML text of a run's report; ``resume_command``: the run was interrupted
    and goes on with this command (said at the top of the page)."""
    run_dir = Path(run_dir)
    config, config_problem = _read_config(run_dir / "config.yaml")
    metrics, metrics_problem = _read_metrics(run_dir / "metrics.json")
    model = _lookup(config, ("model", "model.name", "model.type", "model.kind"))
    dataset = _lookup(config, ("data", "dataset", "data.dataset", "data.name", "dataset.name"))
    name = _lookup(config, ("name", "run_name")) or run_dir.resolve().name
    subtitle = " on ".join(part for part in (model, dataset) if part) or "model not recorded"
    status = ("complete: final test metrics present" if not metrics_problem
              else "no final test metrics (interrupted or still training)")
    line = headline(metrics) if not metrics_problem else None
    intro = [pages.fragment('<strong class="headline">{}</strong>', line)] if line else []
    data = _data_of(run_dir, config)
    changed = _changed_data(run_dir, config)
    if changed:
        intro.append(pages.fragment(
            "<p><strong>Not the data it was trained on:</strong> {}. The metrics and figures "
            "here are of the data the run was trained on; pages built from the files as they "
            "are now (the feature browser) would show other inputs, or none.</p>", changed))
    if resume_command is not None:
        status = "interrupted"
        intro.append(pages.fragment(
            "<p>Training was interrupted; the page shows its last checkpoint's figures and the "
            "curves so far. Continue it with <code>{}</code>.</p>", resume_command))
    return pages.render_page(
        title=f"{name}: {subtitle}", heading=name,
        subtitle=f"{subtitle} · run {status} · report generated {pages.timestamp()}",
        intro=intro,
        sections=[
            pages.Section("metrics", "Final test metrics",
                          _metrics_section(metrics, metrics_problem, data),
                          nav="Final metrics"),
            *([pages.Section("features", "Every unit", pages.fragment(
                '<p><a href="features.html">The feature browser</a>: each unit\'s decoder atom, '
                "the test inputs that activate it most, its activation histogram{}, in a "
                "sortable index.</p>", " and class distribution" if data.labelled else ""),
                nav="Features")]
              if (run_dir / "features.html").is_file() else []),
            pages.Section("curves", "Training curves", _curves_section(run_dir)),
            pages.Section("figures", "Figures (latest epoch of each kind)",
                          _figures_section(run_dir, config, data), nav="Figures"),
            pages.Section("config", "Config", _config_section(config, config_problem)),
        ])


# --------------------------------------------------------------------------- writing


def write_report(run_dir: Path, resume_command: str | None = None) -> Path:
    """Write ``<run_dir>/report.html`` and return its path (``resume_command``: see
    :func:`render_report`).

    Raises:
        RunFolderError: ``run_dir`` is missing, not a folder, or has no ``config.yaml``.
    """
    run_dir = RunFolder.open(run_dir).path
    out = run_dir / "report.html"
    write_text(out, render_report(run_dir, resume_command))
    return out


# --------------------------------------------------------------------------- CLI


def _draw_figures(run_dir: Path) -> None:
    """Draw a finished run's missing figures from its checkpoint; a checkpoint or dataset that
    cannot be read leaves the report without figures, said in one line."""
    try:
        from sae.training.callbacks import figures_from_checkpoint  # torch and Lightning

        figures_from_checkpoint(run_dir)
    except Exception as exc:  # noqa: BLE001 (the report is still written)
        message = " ".join(str(exc).split())[:300] or type(exc).__name__
        print(f"note: no figures drawn: {message}", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    # Ctrl-C interrupts even when started from a script that ignores SIGINT in the background
    signal.signal(signal.SIGINT, signal.default_int_handler)
    parser = OneLineParser(prog="python -m sae.report",
                           description="Write <run-folder>/report.html, a self-contained run "
                                       "report.")
    parser.add_argument("run", type=path_arg, help="run folder (holds config.yaml)")
    parser.add_argument("--no-figures", action="store_true",
                        help="do not draw the figures of a finished run that has none (a sweep "
                             "run) from its last checkpoint")
    try:
        args = parser.parse_args(argv)
        run = RunFolder.open(args.run)
        with interruptible():
            drawn = [e for _, e, _ in latest_figures(args.run) if e is not None]
            if (not args.no_figures and not drawn
                    and run.checkpoint.is_file()):
                changed = _changed_data(args.run, _read_config(args.run / "config.yaml")[0])
                if changed:  # drawn from these files, the figures would show other data
                    print(f"note: no figures drawn: {changed}", file=sys.stderr)
                else:
                    # torch and Lightning: a stop mid-import ends the command at once
                    with importing(interrupted if running_as("sae.report") else None):
                        import sae.training.callbacks  # noqa: F401
                    _draw_figures(args.run)
            path = write_report(args.run)
    except (UsageError, RunFolderError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except STOPS as exc:  # report.html is written atomically: never half of one
        return interrupted(exc)
    print(path)
    return 0


def as_command() -> None:
    """Run as ``python -m sae.report``: exit with :func:`main`'s code."""
    code = main()
    if code in (130, 143):  # stopped: report.html is written atomically, so nothing is left
        exit_now(code)
    sys.exit(code)
