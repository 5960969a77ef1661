"""The data module of a run's settings: images, an activation matrix, or a model's layer."""

from __future__ import annotations

from sae.data.images import ImageDataModule
from sae.data.matrixdata import MatrixDataModule
from sae.data.streamed import StreamedDataModule


def data_module(settings: dict, **extra):
    """The data module of a run's flat settings (``{field name: value}``, as
    :meth:`sae.settings.config.RunConfig.settings` or a ``config.yaml`` gives them): the layer of
    ``source`` (read while its model runs), the activation matrix of ``data``, else the image
    dataset (``dataset``, ``data_dir``); split settings as the run has them, ``extra`` passed on
    (batch_size, shuffle_seed)."""
    get = settings.get
    if get("source"):
        return StreamedDataModule(get("source"), get("hook"), val_size=get("val_size"),
                                  limit_train=get("limit_train"), limit_test=get("limit_test"),
                                  buffer_rows=get("buffer_rows", 8192),
                                  positions=get("positions", "all"), **extra)
    if get("data"):
        return MatrixDataModule(get("data"), val_size=get("val_size"),
                                limit_train=get("limit_train"), limit_test=get("limit_test"),
                                data_dir=get("data_dir"), **extra)
    return ImageDataModule(get("dataset", "mnist"), get("data_dir"),
                           val_size=get("val_size"), limit_train=get("limit_train"),
                           limit_test=get("limit_test"), **extra)
