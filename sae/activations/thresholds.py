r"""Thresholded codes: JumpReLU with straight-through threshold gradients, and batch top-k.

**JumpReLU** (Rajamanoharan et al. 2024, "Jumping Ahead"). With a threshold :math:`\theta_j > 0`
per unit,

.. math::
    h_j = a_j \, H(a_j - \theta_j), \qquad L_0(h) = \sum_j H(a_j - \theta_j),

where :math:`H` is the Heaviside step. Active values are :math:`a_j` itself: unlike a ReLU with
a bias, the threshold does not shrink them. :math:`H` has no useful derivative, so the threshold
learns through pseudo-derivatives (straight-through estimators) with a rectangle kernel
:math:`K(u) = 1[|u| < 1/2]` of bandwidth :math:`\varepsilon`:

.. math::
    \frac{\partial h_j}{\partial \theta_j} := -\frac{\theta_j}{\varepsilon}
        K\!\left(\frac{a_j - \theta_j}{\varepsilon}\right), \qquad
    \frac{\partial H(a_j - \theta_j)}{\partial \theta_j} := -\frac{1}{\varepsilon}
        K\!\left(\frac{a_j - \theta_j}{\varepsilon}\right),

and :math:`\partial h_j / \partial a_j = H(a_j - \theta_j)`, :math:`\partial H / \partial a_j
= 0`: the L0 penalty moves thresholds, the reconstruction moves both.

**Batch top-k** (Bussmann, Leask & Nanda 2024). In training, the :math:`kB` largest entries of
:math:`\mathrm{ReLU}(a)` over a whole batch of :math:`B` inputs are kept, so the mean L0 is
exactly :math:`k` while each input's L0 varies. At inference one threshold :math:`\theta`,
estimated during training, replaces the batch: :math:`h_j = a_j \, 1[a_j > \theta]`, so an input's
code never depends on the rest of its batch.

**Top-k selection** (``topk_relu``, ``batch_topk``). On CPU the k-th largest value is found by
selection in compiled loops (``sae.activations.kernels.topk_relu``) instead of ``torch.topk``, and
the code is formed in the same pass; the values, and the gradient (that of ReLU on the kept
entries, 0 elsewhere), are those of the ``torch.topk`` formulation, which runs on other devices,
under ``torch.compile``, without numba, and for rows that hold a NaN.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor

from sae.activations import kernels

__all__ = ["batch_topk", "energy_factor", "jumprelu", "rows_topk_relu", "step_l0",
           "threshold_code", "topk_relu", "update_running_threshold"]

_is_compiling = getattr(torch.compiler, "is_compiling", lambda: False)


def _window(a: Tensor, theta: Tensor, eps: float) -> Tensor:
    """K((a − θ)/ε)/ε: the rectangle kernel of bandwidth ε around the threshold."""
    return ((a - theta).abs() < eps / 2).to(a.dtype) / eps


class _JumpReLU(torch.autograd.Function):
    @staticmethod
    def forward(ctx, a: Tensor, theta: Tensor, eps: float) -> Tensor:
        ctx.save_for_backward(a, theta)
        ctx.eps = eps
        return a * (a > theta).to(a.dtype)

    @staticmethod
    def backward(ctx, g: Tensor):
        a, theta = ctx.saved_tensors
        grad_a = g * (a > theta).to(g.dtype)
        grad_theta = -(theta * _window(a, theta, ctx.eps) * g)
        return grad_a, grad_theta.sum_to_size(theta.shape), None


class _Step(torch.autograd.Function):
    @staticmethod
    def forward(ctx, a: Tensor, theta: Tensor, eps: float) -> Tensor:
        ctx.save_for_backward(a, theta)
        ctx.eps = eps
        return (a > theta).to(a.dtype)

    @staticmethod
    def backward(ctx, g: Tensor):
        a, theta = ctx.saved_tensors
        grad_theta = -(_window(a, theta, ctx.eps) * g)
        return None, grad_theta.sum_to_size(theta.shape), None


def jumprelu(a: Tensor, theta: Tensor, eps: float) -> Tensor:
    """a [..., H], θ [H] (> 0) -> a · H(a − θ) [..., H], straight-through gradients for θ."""
    return _JumpReLU.apply(a, theta, eps)


def step_l0(a: Tensor, theta: Tensor, eps: float) -> Tensor:
    """a [..., H], θ [H] -> H(a − θ) [..., H] (0/1), whose sum is L0; gradients reach θ only."""
    return _Step.apply(a, theta, eps)


def _torch_topk_relu(a: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """ReLU of the k largest entries of each row of a [rows, n] (zeros elsewhere) by
    ``torch.topk``, and each row's smallest positive kept value (0 where none)."""
    values, index = torch.topk(a, k, dim=-1, sorted=False)
    values = F.relu(values)
    smallest = values.masked_fill(values <= 0, torch.inf).amin(-1)
    return torch.zeros_like(a).scatter_(-1, index, values), smallest.masked_fill_(
        smallest == torch.inf, 0.0)


class _TopKReLU(torch.autograd.Function):
    """ReLU of the k largest entries of each row of a [rows, n]: the compiled selection, or
    ``torch.topk`` for rows with a NaN. Gradient: g where the code is not <= 0, which is ReLU's
    gradient on the kept entries (NaN ones included) and 0 elsewhere, as through torch.topk."""

    @staticmethod
    def forward(ctx, a: Tensor, k: int) -> tuple[Tensor, Tensor]:
        got = kernels.topk_relu(a, k)
        h, smallest = got if got is not None else _torch_topk_relu(a, k)
        ctx.save_for_backward(h)
        ctx.mark_non_differentiable(smallest)
        return h, smallest

    @staticmethod
    def backward(ctx, g: Tensor, _):
        (h,) = ctx.saved_tensors
        return torch.where(h <= 0, 0.0, g), None


def _rows_topk_relu(a: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """(code, smallest positive kept value per row) of the rows of a [rows, n], 1 <= k <= n."""
    if kernels.compiled(a) and not _is_compiling() and a.numel():
        return _TopKReLU.apply(a, k)
    return _torch_topk_relu(a, k)


def topk_relu(a: Tensor, k: int) -> Tensor:
    """a [B, H] -> ReLU of each row's k largest entries, zeros elsewhere (all of ReLU(a) when
    k >= H). Ties at the k-th value may be broken either way; exactly k entries are kept."""
    if k >= a.shape[-1]:
        return F.relu(a)
    return _rows_topk_relu(a, k)[0]


def rows_topk_relu(a: Tensor, k: Tensor) -> Tensor:
    """a [B, H], k [B] integers in [1, H] -> ReLU of row b's k[b] largest entries, zeros
    elsewhere (a per-input budget; one sort of the largest max(k) entries a row)."""
    kmax = int(k.max())
    if kmax >= a.shape[-1] and bool((k >= a.shape[-1]).all()):
        return F.relu(a)
    values, index = a.topk(min(kmax, a.shape[-1]), dim=-1)
    keep = torch.arange(values.shape[-1], device=a.device)[None, :] < k[:, None]
    return torch.zeros_like(a).scatter(-1, index, F.relu(values) * keep)


def energy_factor(x_centred: Tensor, data_var: Tensor, power: float) -> Tensor:
    """e(x)^γ [B, 1] with e(x) = ‖x − b_dec‖ / √v, the input's norm over the typical one: the
    energy rule's factor (the Sparsemax-SAE's energy temperature, given to the baselines)."""
    norm = x_centred.norm(dim=-1, keepdim=True) / data_var.sqrt()
    return norm.clamp_min(1e-6).pow(power)


def batch_topk(a: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """Keep the k·B largest entries of ReLU(a) over the batch a [B, H].

    Returns (h [B, H], the smallest kept positive value, a 0-d tensor; 0 when none is positive).
    Ties at the cut are broken either way, so exactly min(k·B, B·H) entries are kept.
    """
    n = min(k * a.shape[0], a.numel())
    h, smallest = _rows_topk_relu(a.reshape(1, -1), n)
    return h.view_as(a), smallest[0].detach()


@torch.no_grad()
def update_running_threshold(threshold: Tensor, batches: Tensor, value: Tensor,
                             rate: float) -> None:
    """θ ← θ + rate·(value − θ) in place (θ = value on the first batch), value averaged over DDP
    ranks first; ``batches`` counts the updates. A buffer pair saved in the checkpoint."""
    value = value.to(threshold.dtype)
    if dist.is_available() and dist.is_initialized():
        value = value.clone()
        dist.all_reduce(value)
        value /= dist.get_world_size()
    first = batches == 0
    threshold.add_(torch.where(first, 1.0, rate) * (value - threshold))
    batches += 1


def threshold_code(a: Tensor, theta: Tensor | float) -> Tensor:
    """a [..., H] -> a · 1[a > θ]: the inference-time code of batch top-k (θ ≥ 0)."""
    return a * (a > theta).to(a.dtype)
