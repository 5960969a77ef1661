"""A run folder in, its ``features.html`` out (:func:`build_features`)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from sae.data.matrix import MatrixError
from sae.data.rundata import read_record, same_data
from sae.pages.features.page import render_features_page
from sae.pages.features.stats import feature_stats, probe_weights
from sae.pages.report import TEST_SET_PNG
from sae.system.io import find_link, write_text
from sae.training.runfolder import RunFolder, RunFolderError

__all__ = ["EMBEDDING_PNG", "PROBE_TRAIN_INPUTS", "build_features", "checked_run",
           "write_features"]


def checked_run(run_dir: Path) -> tuple[RunFolder, dict]:
    """The run folder (holding no link) and its settings (:meth:`RunFolder.settings`), with its
    last checkpoint, without heavy imports.

    Raises:
        RunFolderError: missing folder, no readable or invalid ``config.yaml``, a link inside
            it, or no ``last.ckpt``.
    """
    run = RunFolder.open(run_dir)
    link = find_link(run.path)
    if link is not None:  # the page and the embedding figure would be written through it
        raise RunFolderError(f"refusing run folder {run_dir}: {link} is a link")
    settings = run.settings()
    if not run.checkpoint.is_file():
        raise RunFolderError(f"no checkpoint: {run.checkpoint} does not exist (has the run "
                             "trained?)")
    return run, settings


PROBE_TRAIN_INPUTS = 10_000  # training inputs the probe is fitted on (as many as MNIST's test)
EMBEDDING_PNG = Path("figures") / "code_embedding" / TEST_SET_PNG  # in the run folder


def build_features(run_dir: str | Path, data_dir: str | Path | None = None,
                   max_inputs: int | None = None, out: str | Path | None = None) -> Path:
    """Write a run's feature browser (default ``<run_dir>/features.html``) and return its path.

    Loads ``checkpoints/last.ckpt`` and the run's data as it trained on them (its ``dataset``,
    validation split, ``limit_train`` and ``limit_test`` from ``config.yaml``; ``data_dir``
    overrides the run's ``data_dir``, which falls back to ``$SAE_DATA_DIR`` as in
    :func:`sae.data.images.load_arrays`), then :func:`write_features`.

    Args:
        run_dir: a run folder written by ``python -m sae.run``.
        data_dir: folder of the IDX files, if not the run's.
        max_inputs: use only the first this many test inputs (after ``limit_test``).
        out: where to write the page instead of ``<run_dir>/features.html``.

    A run on activations (``--data``) shows, per unit, the inputs its rows came from: images or
    texts (:mod:`sae.pages.features.inputs`); its atoms are drawn in the data's own space.

    Raises:
        RunFolderError: not a run folder, or no readable checkpoint.
        sae.data.images.DataSourceError: the data cannot be found.
    """
    run_dir = Path(run_dir)
    run, config = checked_run(run_dir)
    ckpt = run.checkpoint

    # torch and Lightning: only once the run folder is checked (python -m sae.features)
    from sae.training.checkpoints import CheckpointError, model_from_checkpoint, read_checkpoint

    try:
        dm = run.data_module(data_dir)
        dm.load()
    except MatrixError as exc:
        raise RunFolderError(str(exc)) from None
    if config.get("data"):  # the inputs shown must be the ones the run was trained on
        recorded = read_record(run_dir)
        why = None if recorded is None else same_data(dm.record, recorded, config["data"])
        if why:
            raise RunFolderError(f"the data changed since {run_dir} was trained: {why}; the "
                                 "page would show other inputs (restore the file, or train "
                                 "the run again)")
    try:
        model = model_from_checkpoint(read_checkpoint(ckpt))
    except (CheckpointError, OSError, RuntimeError, KeyError, ValueError) as exc:
        raise RunFolderError(f"cannot load {ckpt}: {exc}") from None
    return write_features(run_dir, model, dm, max_inputs=max_inputs, out=out,
                          data_dir=data_dir if data_dir is not None else config.get("data_dir"))


def write_features(run_dir: Path, model, dm, test_codes=None, max_inputs: int | None = None,
                   out: str | Path | None = None, data_dir=None) -> Path:
    """Write the feature browser of ``model`` (a trained SAE) on the loaded data module ``dm``
    into run folder ``run_dir``; returns the page's path.

    Encodes the test split (unless its codes ``test_codes`` [N, H] are given: a run at its end
    has them), computes :func:`feature_stats` with the model's ``fire_threshold`` (and, for the
    one-layer SAE on pixels, its encoder rows for the attributions), fits the probe of
    :func:`probe_weights` on the codes of the first :data:`PROBE_TRAIN_INPUTS` inputs of the
    training split and scores it on the test codes (not without labels), saves the code
    embedding (beside the same inputs' pixel embedding for an image run) as
    ``figures/code_embedding/test_set.png`` (its own name: drawn from the test set after
    training, not at a validation epoch) and writes the page atomically, linking the run's
    ``report.html`` by a relative path. A run on activations shows, per input, the image or
    text its row came from (:func:`sae.pages.features.inputs.module_inputs`; ``data_dir`` finds the
    source images).
    """
    # matplotlib, torch and Lightning: only once the run folder is checked
    from sae.figures import save_png
    from sae.figures.embedding import embedding_figure  # likewise
    from sae.models import encode_codes  # likewise
    from sae.pages.features.inputs import module_inputs  # likewise
    from sae.training.callbacks import run_label  # likewise

    inputs = module_inputs(dm, data_dir, max_inputs)
    dataset, class_names, x, labels = inputs.dataset, inputs.class_names, inputs.x, inputs.labels
    test_codes = encode_codes(model, x) if test_codes is None else test_codes[:len(x)]
    if len(labels) and (int(labels.min()) < 0 or int(labels.max()) >= len(class_names)):
        raise RunFolderError(f"the {dataset} test labels hold values outside 0-"
                             f"{len(class_names) - 1}; the data files are damaged")
    codes, rows = test_codes.numpy(), x.numpy()
    # attributions are per pixel: only for a one-layer SAE on the pixels themselves
    attribution = model.attribution() if inputs.pixels else None
    encoder, centre = (None, None) if attribution is None else \
        (t.cpu().numpy() for t in attribution)
    stats = feature_stats(codes, labels, rows, model.atoms().cpu().numpy(),
                          model.fire_threshold, n_classes=len(class_names),
                          encoder=encoder, centre=centre)
    if inputs.has_labels:  # no probe without labels (the page says so)
        train_codes = encode_codes(model, dm.train_x[:PROBE_TRAIN_INPUTS])
        stats["probe_weight"], stats["probe_accuracy"] = probe_weights(
            train_codes.numpy(), dm.train_y[:PROBE_TRAIN_INPUTS].numpy(), codes, labels,
            len(class_names))
        stats["probe_train_inputs"] = np.asarray(len(train_codes))
    figure = embedding_figure(codes, labels, class_names,
                              pixels=rows if inputs.pixels else None)
    figure.suptitle(f"{run_label(model.config, dataset)}\n{figure.get_suptitle()}")
    png = save_png(figure, run_dir / EMBEDDING_PNG)
    name = run_dir.resolve().name
    subtitle = (f"{model.config.model} on {dataset}, {model.config.hidden:,} units, "
                "checkpoint checkpoints/last.ckpt" + ("" if inputs.has_labels else
                                                      "; rows without labels"))
    target = Path(out) if out is not None else run_dir / "features.html"
    report = run_dir / "report.html"
    href = Path(os.path.relpath(report.resolve(), target.resolve().parent)).as_posix()
    page = render_features_page(stats, inputs.images, name, class_names, subtitle,
                                embedding_png=png.read_bytes(),
                                embedding_beside_pixels=inputs.pixels,
                                report=(href, report.is_file()), texts=inputs.texts,
                                labelled=inputs.has_labels)
    write_text(target, page)
    return target
