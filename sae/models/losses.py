"""Pure loss terms of the SAE variants: tensors in, a scalar tensor out; no Lightning, no state.

Shapes: B inputs of D pixels, H code units (G groups of H/G units for the grouped support maps).
``v`` is the data variance E‖x − x̄‖² (a scalar), so a reconstruction term divided by it is a
fraction of variance unexplained and every λ is independent of the data's scale.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from sae.activations.thresholds import topk_relu


def fvu_term(x: Tensor, x_hat: Tensor, data_var: Tensor | float) -> Tensor:
    """The batch's fraction of variance unexplained: mean_b ‖x_b − x̂_b‖² / v.

    x [B, D], x_hat [B, D], data_var v (0-d or float) -> scalar. 1 for x̂ = x̄ on average, 0 for a
    perfect reconstruction.
    """
    return (x - x_hat).pow(2).sum(-1).mean() / data_var


class _ColumnNorms(torch.autograd.Function):
    @staticmethod
    def forward(ctx, W: Tensor) -> Tensor:
        norms = torch.linalg.vecdot(W, W, dim=0).sqrt_()
        ctx.save_for_backward(W, norms)
        return norms

    @staticmethod
    def backward(ctx, g: Tensor) -> Tensor:
        W, norms = ctx.saved_tensors
        return W * (g / norms).masked_fill_(norms == 0, 0.0)


def column_norms(W: Tensor) -> Tensor:
    """‖W[:, j]‖ for each column of W [D, H] -> [H], with the gradient of ``W.norm(dim=0)``
    (W[:, j] / ‖W[:, j]‖, 0 for a zero column).

    The same values as ``W.norm(dim=0)`` up to rounding, many times faster on CPU: the norm
    kernel reduces across the rows of a row-major W slowly, a dot product along them does not.
    """
    return _ColumnNorms.apply(W)


def decoder_weighted_l1(h: Tensor, W_dec: Tensor, unit: Tensor | float) -> Tensor:
    """mean_b Σ_j ‖W_dec[:, j]‖ · h_bj / unit: code mass that cannot be dodged by rescaling.

    h [B, H], W_dec [D, H], unit (0-d or float) -> scalar. Halving h while doubling W_dec's
    columns leaves it unchanged; ``unit`` expresses the mass in units of the data's norm.
    Computed as (Σ_b h_b) · ‖W_dec‖ / B: no [B, H] product.
    """
    return torch.dot(h.sum(0), column_norms(W_dec)) / (len(h) * unit)


def kl_sparsity(h: Tensor, rho: float) -> Tensor:
    """Σ_j KL(ρ ‖ ρ̂_j) = Σ_j ρ log(ρ/ρ̂_j) + (1−ρ) log((1−ρ)/(1−ρ̂_j)), ρ̂_j = mean_b h_bj.

    h [B, H] in (0, 1) -> scalar ≥ 0, zero when every unit's batch mean is ρ (Ng, UFLDL notes).
    ρ̂ is clamped to [1e-6, 1 − 1e-6] so that saturated units give a finite value and gradient.
    """
    rho_hat = h.mean(0).clamp(1e-6, 1 - 1e-6)
    kl = rho * torch.log(rho / rho_hat) + (1 - rho) * torch.log((1 - rho) / (1 - rho_hat))
    return kl.sum()


def effective_support(p: Tensor, groups: int = 1, eps: float = 1e-6) -> Tensor:
    """mean_b Σ_g (Σ_j sqrt(p_bgj))²: the effective number of active units (Hill number of
    order 1/2), summed over groups.

    p [B, H], each of the G groups of H/G entries on the simplex -> scalar. It is k for a
    distribution uniform on k units, 1 for a one-hot one. The ε keeps the gradient (∝ 1/sqrt(p))
    finite at tiny entries; subtracting sqrt(ε) keeps exact zeros at zero.
    """
    p = p.view(len(p), groups, -1)
    root_sum = ((p + eps).sqrt() - eps**0.5).sum(-1)  # [B, G]
    return root_sum.pow(2).sum(-1).mean()


def auxk_term(residual: Tensor, a: Tensor, dead: Tensor, W_dec: Tensor, k_aux: int,
              data_var: Tensor | float, compact: bool | None = None) -> Tensor:
    """AuxK (Gao et al. 2024): how well the k_aux largest dead units model the residual.

    residual e = x − x̂ [B, D] (detach it: only the dead units should learn from this term),
    pre-activations a [B, H], dead [H] bool, W_dec [D, H] -> ‖e − W_dec z‖² / v averaged over the
    batch, z [B, H] the ReLU of the k_aux largest dead pre-activations (live units masked out).

    ``compact`` (default: on CPU) computes it on the dead units' columns only, z [B, n_dead]
    and W_dec[:, dead]: the same value and gradients, with matrix products n_dead / H the size,
    and no selection at all when there are at most k_aux dead units. Finding the dead units is a
    host synchronisation, which the masked form (the default on accelerators) avoids.
    """
    if compact is None:
        compact = a.device.type == "cpu"
    if compact:
        idx = dead.nonzero().squeeze(-1)
        z = topk_relu(a.index_select(-1, idx), k_aux)  # all of ReLU when k_aux >= n_dead
        return fvu_term(residual, F.linear(z, W_dec.index_select(-1, idx)), data_var)
    a = a.masked_fill(~dead, float("-inf"))
    values, index = torch.topk(a, min(k_aux, a.shape[-1]), dim=-1)
    z = torch.zeros_like(a).scatter_(-1, index, F.relu(values).nan_to_num(0.0))
    return fvu_term(residual, F.linear(z, W_dec), data_var)
