"""Test-set evaluation of a trained SAE: every metric of ``metrics.json`` in one place.

Used by a run at its end (:mod:`sae.training`) and by a sweep's analysis of finished runs
(:mod:`sae.sweep.analysis`), so both report the same numbers by the same definitions
(:mod:`sae.metrics`).
"""

from __future__ import annotations

import torch
from torch import Tensor

from sae import metrics
from sae.models import SparseAutoencoder, decode_dataset, encode_dataset

__all__ = ["dynamic_measures", "evaluate", "linear_decoder"]


def linear_decoder(model: SparseAutoencoder) -> tuple[Tensor, Tensor] | None:
    """(atoms W [D, H], offset b [D]) with x̂ = W h + b, or None for a non-linear decoder."""
    if model.config.arch != "linear":
        return None
    with torch.no_grad():
        return ((model.W_dec * model.code_scale).detach().float().cpu(),
                model.b_dec.detach().float().cpu())


def dynamic_measures(model: SparseAutoencoder, x_test: Tensor, codes: Tensor,
                     x_train: Tensor | metrics.PCA) -> dict:
    """support_fvu, adaptive_gain, adaptivity (``metrics.dynamic_sparsity``) of ``model``.

    Needs the decoder to be linear (least squares on a support); None values otherwise.
    """
    decoder = linear_decoder(model)
    if decoder is None:
        return dict.fromkeys(metrics.DYNAMIC_KEYS)
    atoms, offset = decoder
    return metrics.dynamic_sparsity(x_test, codes, atoms, offset, model.mean_image.cpu(),
                                     x_train, threshold=model.fire_threshold)


def evaluate(model: SparseAutoencoder, x_test: Tensor, x_train: Tensor | metrics.PCA,
             mean_image: Tensor) -> tuple[dict, Tensor]:
    """All test metrics of ``model`` on x_test [N, D] -> (metrics, codes [N, H] on CPU)."""
    x_hat, codes = encode_dataset(model, x_test)
    result = metrics.summarize(x_test, x_hat, codes, mean_image, threshold=model.fire_threshold)
    # the reconstruction from only the units counted in L0 (differs from fvu for sigmoid codes,
    # whose sub-threshold activity still reconstructs)
    result["fvu_at_l0"] = result["fvu"]
    if model.fire_threshold > 0:
        kept = codes * metrics.active(codes, model.fire_threshold)
        result["fvu_at_l0"] = metrics.fvu(x_test, decode_dataset(model, kept), mean_image)
    result.update(dynamic_measures(model, x_test, codes, x_train))
    return result, codes
