"""The test inputs a feature browser shows: what the model encodes, and what a person sees.

For an image run the two are the same 28x28 images. For a run on activations (``--data``, or a
model's layer with ``--source``) the model encodes rows of D numbers, and a person sees what each
row came from: the source images when the data names an image dataset (``images`` and ``rows`` in
its manifest) or the model's inputs are images, the row's text when it gives texts, else just the
row's number.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

__all__ = ["TestInputs", "module_inputs"]


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


def module_inputs(dm, data_dir=None, max_inputs: int | None = None) -> TestInputs:
    """The test split of a loaded data module ``dm`` (images or activation rows), its first
    ``max_inputs``, with what a person sees of each input.

    Raises:
        sae.data.images.DataSourceError: the source images of activation rows cannot be found.
    """
    # Lightning, loaded with ``dm``: not at this module's import
    from sae.data.images import load_arrays
    from sae.data.matrixdata import MatrixDataModule  # likewise
    from sae.data.streamed import StreamedDataModule  # likewise

    keep = slice(0, int(max_inputs)) if max_inputs else slice(None)
    x, labels = dm.test_x[keep], dm.test_y[keep].numpy()
    if not isinstance(dm, MatrixDataModule | StreamedDataModule):
        pixels = x.numpy()
        side = int(round(pixels.shape[1] ** 0.5))
        shape = (side, side) if side * side == pixels.shape[1] else (1, pixels.shape[1])
        return TestInputs(x, labels, list(dm.class_names), dm.dataset,
                          pixels.reshape(len(pixels), *shape), None, True)
    images = texts = None
    if getattr(dm, "test_images", None) is not None:  # a model's inputs that are images
        images = dm.test_images[keep]
    elif dm.test_rows is not None:
        arrays = load_arrays(dm.images, data_dir if data_dir is not None else dm.data_dir)
        source = arrays.test_images if dm.test_rows_split == "test" else arrays.train_images
        images = source[dm.test_rows[keep]]
    elif dm.test_texts is not None:
        texts = dm.test_texts[keep]
    else:
        noun = "input" if isinstance(dm, StreamedDataModule) else "row"
        texts = [f"{noun} {i}" for i in dm.test_row_numbers[keep]]
    return TestInputs(x, labels, list(dm.class_names), dm.dataset, images, texts, False,
                      dm.has_labels)
