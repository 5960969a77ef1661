"""Test-set evaluation of a trained SAE: every metric of ``metrics.json`` in one place.

Used by a run at its end (:mod:`sae.training.engine`) and by a sweep's analysis of finished runs
(:mod:`sae.sweep.analysis`), so both report the same numbers by the same definitions
(:mod:`sae.metrics`).
"""

from __future__ import annotations

from torch import Tensor

from sae import metrics
from sae.models import SparseAutoencoder, decode_dataset, encode_dataset

__all__ = ["dynamic_measures", "evaluate", "ground_truth_measures", "linear_decoder"]


def linear_decoder(model: SparseAutoencoder) -> tuple[Tensor, Tensor] | None:
    """(atoms W [D, H], offset b [D]) with x̂ = W h + b, or None for a non-linear decoder."""
    decoder = model.linear_decoder()
    if decoder is None:
        return None
    return decoder[0].float().cpu(), decoder[1].float().cpu()


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


def ground_truth_measures(model: SparseAutoencoder, truth, x_test: Tensor, codes: Tensor,
                          x_val: Tensor | None = None) -> dict:
    """The scores against known features (``metrics.ground_truth``) on the test rows, and
    ``val_gt_l0_spearman`` on the validation rows (what a design is chosen by); ``truth`` is
    the data's :class:`sae.data.matrixdata.Truth`. None values for a non-linear decoder."""
    decoder = linear_decoder(model)
    if decoder is None:
        return dict.fromkeys([*metrics.GROUND_TRUTH_KEYS, "val_gt_l0_spearman"])
    atoms, _ = decoder
    match = metrics.match_features(atoms, truth.features)
    mean = model.mean_image.cpu()
    out = metrics.ground_truth(codes, truth.test, atoms, truth.features, x_test, mean,
                               model.fire_threshold, match)
    if x_val is not None:
        _, val_codes = encode_dataset(model, x_val)
        out["val_gt_l0_spearman"] = metrics.ground_truth(
            val_codes, truth.val, atoms, truth.features, x_val, mean, model.fire_threshold,
            match)["gt_l0_spearman"]
    return out


def evaluate(model: SparseAutoencoder, x_test: Tensor, x_train: Tensor | metrics.PCA,
             mean_image: Tensor, truth=None, x_val: Tensor | None = None) -> tuple[dict, Tensor]:
    """All test metrics of ``model`` on x_test [N, D] -> (metrics, codes [N, H] on CPU); on
    data whose features are known (``truth``, :class:`sae.data.matrixdata.Truth`), the scores
    against them too (the validation rows ``x_val`` for ``val_gt_l0_spearman``)."""
    x_hat, codes = encode_dataset(model, x_test)
    result = metrics.summarize(x_test, x_hat, codes, mean_image, threshold=model.fire_threshold)
    # the reconstruction from only the units counted in L0 (differs from fvu for sigmoid codes,
    # whose sub-threshold activity still reconstructs)
    result["fvu_at_l0"] = result["fvu"]
    if model.fire_threshold > 0:
        kept = codes * metrics.active(codes, model.fire_threshold)
        result["fvu_at_l0"] = metrics.fvu(x_test, decode_dataset(model, kept), mean_image)
    result.update(dynamic_measures(model, x_test, codes, x_train))
    if truth is not None:
        result.update(ground_truth_measures(model, truth, x_test, codes, x_val))
    return result, codes
