"""A run folder in, its ``features.html`` out (:func:`build_features`)."""

from __future__ import annotations

import os
from pathlib import Path

from sae.features.page import render_features_page
from sae.features.stats import feature_stats, probe_weights
from sae.io import write_text
from sae.report import RunFolderError

__all__ = ["build_features", "checked_run"]


def checked_run(run_dir: Path) -> tuple[dict, Path]:
    """The run's settings (``config.yaml``, checked by the settings layer as for a resume:
    a mapping of known settings with valid values) and checkpoint path, without heavy imports.

    Raises:
        RunFolderError: missing folder, no readable or invalid ``config.yaml``, or no
            ``last.ckpt``.
    """
    if not run_dir.exists():
        raise RunFolderError(f"run folder not found: {run_dir}")
    if not run_dir.is_dir():
        raise RunFolderError(f"not a folder: {run_dir}")
    path = run_dir / "config.yaml"
    if not path.is_file():
        raise RunFolderError(f"not a run folder (no config.yaml): {run_dir}")
    from sae.io import find_link

    link = find_link(run_dir)
    if link is not None:  # the page and the embedding figure would be written through it
        raise RunFolderError(f"refusing run folder {run_dir}: {link} is a link")
    from sae.cli import UsageError, read_settings_file

    try:
        config = {"dataset": "mnist", **read_settings_file(path)}
    except UsageError as exc:
        raise RunFolderError(str(exc)) from None
    ckpt = run_dir / "checkpoints" / "last.ckpt"
    if not ckpt.is_file():
        raise RunFolderError(f"no checkpoint: {ckpt} does not exist (has the run trained?)")
    return config, ckpt


def build_features(run_dir: str | Path, data_dir: str | Path | None = None,
                   max_inputs: int | None = None, out: str | Path | None = None) -> Path:
    """Write a run's feature browser (default ``<run_dir>/features.html``) and return its path.

    Loads ``checkpoints/last.ckpt``, reads the test split the run used (its ``dataset`` and
    ``limit_test`` from ``config.yaml``; ``data_dir`` overrides the run's ``data_dir``, which
    falls back to ``$SAE_DATA_DIR`` as in :func:`sae.data.load_arrays`), encodes it, computes
    :func:`feature_stats` with the model's ``fire_threshold`` (and, for the one-layer SAE, its
    encoder rows for the attributions), fits the probe of :func:`probe_weights`, saves the code
    embedding as
    ``figures/code_embedding/epoch_<E>.png`` (E: the checkpoint's epoch) and writes the page
    atomically, linking the run's ``report.html`` by a relative path.

    Args:
        run_dir: a run folder written by ``python -m sae.run``.
        data_dir: folder of the IDX files, if not the run's.
        max_inputs: use only the first this many test inputs (after ``limit_test``).
        out: where to write the page instead of ``<run_dir>/features.html``.

    A run on activations (``--data``) shows, per unit, the inputs its rows came from: images or
    texts (:mod:`sae.features.inputs`); its atoms are drawn in the data's own space.

    Raises:
        RunFolderError: not a run folder, or no readable checkpoint.
        sae.data.DataSourceError: the test split cannot be found.
    """
    run_dir = Path(run_dir)
    config, ckpt = checked_run(run_dir)

    from sae.checkpoints import CheckpointError, model_from_checkpoint, read_checkpoint
    from sae.features.inputs import test_inputs
    from sae.figures import save_png
    from sae.figures.embedding import embedding_figure
    from sae.matrix import MatrixError
    from sae.models import encode_dataset

    try:
        inputs = test_inputs(config, data_dir, max_inputs)
    except MatrixError as exc:
        raise RunFolderError(str(exc)) from None
    dataset, labels, class_names = inputs.dataset, inputs.labels, inputs.class_names
    try:
        state = read_checkpoint(ckpt)
        model, epoch = model_from_checkpoint(state), int(state.get("epoch", 0))
    except (CheckpointError, OSError, RuntimeError, KeyError, ValueError) as exc:
        raise RunFolderError(f"cannot load {ckpt}: {exc}") from None
    x = inputs.x
    _, codes = encode_dataset(model, x)
    if len(labels) and (int(labels.min()) < 0 or int(labels.max()) >= len(class_names)):
        raise RunFolderError(f"the {dataset} test labels hold values outside 0-"
                             f"{len(class_names) - 1}; the data files are damaged")
    # attributions are per pixel: only for a one-layer SAE on the pixels themselves
    linear = model.config.arch == "linear" and inputs.pixels
    stats = feature_stats(codes.numpy(), labels, x.numpy(), model.atoms().cpu().numpy(),
                          model.fire_threshold, n_classes=len(class_names),
                          encoder=model.W_enc.detach().cpu().numpy() if linear else None,
                          centre=model.b_dec.detach().cpu().numpy() if linear else None)
    if inputs.has_labels:  # no probe without labels (the page says so)
        stats["probe_weight"], stats["probe_accuracy"] = probe_weights(
            codes.numpy(), labels, len(class_names))
    figure = save_png(embedding_figure(codes.numpy(), labels, class_names),
                      run_dir / "figures" / "code_embedding" / f"epoch_{epoch}.png")
    name = run_dir.resolve().name
    subtitle = (f"{model.config.model} on {dataset}, {model.config.hidden:,} units, "
                f"checkpoint {ckpt.relative_to(run_dir)}"
                + ("" if inputs.has_labels else "; unlabelled data: no classes, no probe"))
    target = Path(out) if out is not None else run_dir / "features.html"
    report = run_dir / "report.html"
    href = Path(os.path.relpath(report.resolve(), target.resolve().parent)).as_posix()
    page = render_features_page(stats, inputs.images, name, class_names, subtitle,
                                embedding_png=figure.read_bytes(),
                                report=(href, report.is_file()), texts=inputs.texts)
    write_text(target, page)
    return target
