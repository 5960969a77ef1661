"""The test inputs a feature browser shows: what the model encodes, and what a person sees.

For an image run the two are the same 28x28 images. For a run on activations (``--data``) the
model encodes rows of D numbers, and a person sees what each row came from: the source images
when the data names an image dataset (``images`` and ``rows`` in its manifest), the row's text
when it gives texts, else just the row's number.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

__all__ = ["TestInputs", "test_inputs"]


@dataclass
class TestInputs:
    x: torch.Tensor  # [N, D], what the model encodes
    labels: np.ndarray  # [N] class of each input (0 for unlabelled rows)
    class_names: list[str]
    dataset: str  # for the page's subtitle
    images: np.ndarray | None  # [N, h, w] shown per input; None when texts are shown
    texts: list[str] | None  # shown per input instead of images
    pixels: bool  # x are the images' pixels (attributions apply)
    has_labels: bool = True


def test_inputs(config: dict, data_dir=None, max_inputs: int | None = None) -> TestInputs:
    """The test split a run was evaluated on (``config``: its settings), first ``max_inputs``.

    Raises:
        sae.data.DataSourceError: the images cannot be found.
        sae.matrix.MatrixError: the activation files cannot be used.
    """
    from sae.data import CLASS_NAMES, load_arrays, to_float

    if not config.get("data"):
        dataset = str(config.get("dataset", "mnist"))
        arrays = load_arrays(dataset, data_dir if data_dir is not None else config.get("data_dir"))
        images, labels = arrays.test_images, arrays.test_labels
        for limit in (config.get("limit_test"), max_inputs):
            if limit:
                images, labels = images[:int(limit)], labels[:int(limit)]
        names = CLASS_NAMES.get(dataset, [str(c) for c in range(int(labels.max()) + 1)])
        return TestInputs(to_float(images), labels, names, dataset, images, None, True)

    from sae.matrixdata import data_module

    dm = data_module(config)
    dm.setup()
    keep = slice(0, int(max_inputs)) if max_inputs else slice(None)
    x, labels = dm.test_x[keep], dm.test_y[keep].numpy()
    images = texts = None
    if dm.test_rows is not None:
        arrays = load_arrays(dm.images, data_dir if data_dir is not None
                             else config.get("data_dir"))
        source = arrays.test_images if dm.test_rows_split == "test" else arrays.train_images
        images = source[dm.test_rows[keep]]
    elif dm.test_texts is not None:
        texts = dm.test_texts[keep]
    else:
        texts = [f"row {i}" for i in dm.test_row_numbers[keep]]
    return TestInputs(x, labels, list(dm.class_names), dm.dataset, images, texts, False,
                      dm.has_labels)
