"""The public sparse probability maps: functions on any shape and ``dim``, and their modules (see
:mod:`sae.activations`)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from sae.activations import triton_kernels
from sae.activations.autograd import _entmax_op, _EntmaxFunction, _is_compiling

_ALPHA_MIN_GAP = 1e-3  # EntmaxAlpha keeps alpha >= 1 + this, whatever its parameter does


def _entmax(x: Tensor, alpha: float | Tensor, dim: int, groups: int, name: str) -> Tensor:
    """Reshape to [rows, n] rows (n = size of dim / groups), apply, and reshape back."""
    if not x.is_floating_point():
        raise TypeError(f"{name}: expected a floating-point tensor, got {x.dtype}")
    if isinstance(groups, bool) or not isinstance(groups, int) or groups < 1:
        raise ValueError(f"{name}: groups must be a positive int, got {groups!r}")
    if x.dim() == 0:
        if dim not in (0, -1):
            raise IndexError(f"{name}: dim {dim} out of range for a 0-d tensor")
        return _entmax(x.reshape(1), alpha, 0, groups, name).reshape(())
    if not -x.dim() <= dim < x.dim():
        raise IndexError(f"{name}: dim {dim} out of range for a {x.dim()}-d tensor")
    size = x.shape[dim]
    if size % groups:
        raise ValueError(
            f"{name}: size {size} of dim {dim} is not divisible by groups={groups}"
        )
    if x.numel() == 0:
        return x.clone()
    tensor_alpha = isinstance(alpha, Tensor)
    fast = x.dim() == 2 and groups == 1 and dim in (-1, 1) and not tensor_alpha
    compiling = _is_compiling() and _entmax_op is not None
    if fast and not compiling and (
        x.dtype in (torch.float32, torch.float64) or triton_kernels.available(x)
    ):
        return _EntmaxFunction.apply(x, alpha)  # the common case: rows as they are
    work = torch.float32 if x.dtype in (torch.float16, torch.bfloat16) else x.dtype
    xm = x.movedim(dim, -1).to(work)
    if tensor_alpha:
        # One alpha per slice along dim, shared by its groups.
        shape = list(x.shape)
        shape[dim] = 1
        alpha = alpha.to(device=x.device, dtype=work).expand(shape).movedim(dim, -1)
    if compiling:
        kind = 0 if tensor_alpha else (2 if alpha == 2.0 else 1)
        a = alpha if tensor_alpha else xm.new_tensor(alpha)
        return _entmax_op(xm, a, kind, groups).movedim(-1, dim).to(x.dtype)
    rows = xm.reshape(-1, size // groups)  # a view in the common case
    if tensor_alpha:
        alpha = alpha.expand(*alpha.shape[:-1], groups).reshape(-1, 1)
    y = _EntmaxFunction.apply(rows, alpha)
    return y.view(xm.shape).movedim(-1, dim).to(x.dtype)


def sparsemax(x: Tensor, dim: int = -1, groups: int = 1) -> Tensor:
    r"""Sparsemax (Martins & Astudillo, 2016): the Euclidean projection onto the simplex.

    .. math::
        \operatorname{sparsemax}(x) = \operatorname*{argmin}_{p \in \Delta^d} \|p - x\|_2^2
        = [x - \tau]_+, \qquad \tau = \frac{\sum_{j \in S} x_j - 1}{|S|},
        \quad S = \{j : x_j > \tau\}.

    The threshold is exact (see the module docstring), so entries below it are exactly 0 and
    the support equals that of the sort-based formula. Backward: on the support,
    :math:`\partial L/\partial x = g - \operatorname{mean}_S(g)`, and 0 elsewhere.

    Args:
        x: input of any shape and floating dtype (float16/bfloat16 computed in float32).
        dim: the dimension to normalise over; negative values count from the end.
        groups: split ``dim`` into this many equal groups and normalise each independently
            (each group sums to 1); ``x.shape[dim]`` must be divisible by it.

    Returns:
        A tensor like ``x`` whose groups along ``dim`` lie on the simplex. Non-finite input
        follows ``torch.softmax`` (module docstring). Under ``torch.compile``,
        ``fullgraph=True`` holds.
    """
    return _entmax(x, 2.0, dim, groups, "sparsemax")


def entmax15(x: Tensor, dim: int = -1, groups: int = 1) -> Tensor:
    r"""1.5-entmax (Peters, Niculae & Martins, 2019): alpha-entmax with alpha = 1.5.

    .. math::
        \operatorname{entmax}_{1.5}(x) = [x/2 - \tau]_+^2, \qquad \sum_j [x_j/2 - \tau]_+^2 = 1,

    between softmax and sparsemax: sparse, but smoother than sparsemax. The threshold is exact
    (closed form on the support, found by Newton's method; module docstring). Backward: with
    :math:`s = \sqrt{p}`, :math:`\partial L/\partial x = s \odot g - s\,\langle s, g\rangle /
    \textstyle\sum_j s_j`.

    Args and returns as for :func:`sparsemax`.
    """
    return _entmax(x, 1.5, dim, groups, "entmax15")


def entmax_alpha(x: Tensor, alpha: float | Tensor, dim: int = -1, groups: int = 1) -> Tensor:
    r"""alpha-entmax (Peters, Niculae & Martins, 2019), differentiable in ``x`` and ``alpha``.

    .. math::
        \operatorname{entmax}_\alpha(x)_j = [(\alpha - 1) x_j - \tau]_+^{1/(\alpha-1)},
        \qquad \sum_j \operatorname{entmax}_\alpha(x)_j = 1.

    alpha = 2 is :func:`sparsemax`, alpha = 1.5 is :func:`entmax15`, alpha -> 1 tends to
    softmax. The gradient with respect to alpha follows Correia, Niculae & Martins (2019).

    Args:
        x: as for :func:`sparsemax`.
        alpha: a python float > 1, or a tensor (0-d, or broadcastable to ``x.shape`` with
            ``x.shape[dim]`` replaced by 1: one alpha per slice, shared by its groups) that may
            require grad. A python float equal to 2 or 1.5 takes the exact sparsemax / 1.5-entmax
            path; other values and tensors are solved to machine precision and renormalised.
            Tensor entries <= 1 or non-finite are treated like bad data: those rows are NaN,
            nothing raises; :class:`EntmaxAlpha` keeps alpha above 1 by construction.
        dim: as for :func:`sparsemax`.
        groups: as for :func:`sparsemax`.
    """
    if not isinstance(alpha, Tensor):
        alpha = float(alpha)
        if not alpha > 1:
            raise ValueError(f"entmax_alpha: alpha must be > 1, got {alpha}")
        if alpha not in (1.5, 2.0):
            alpha = torch.tensor(alpha, dtype=torch.float64)  # rounded once, to x's dtype
    return _entmax(x, alpha, dim, groups, "entmax_alpha")


class Sparsemax(nn.Module):
    """Module form of :func:`sparsemax`."""

    def __init__(self, dim: int = -1, groups: int = 1) -> None:
        super().__init__()
        self.dim = dim
        self.groups = groups

    def forward(self, x: Tensor) -> Tensor:
        return sparsemax(x, self.dim, self.groups)

    def extra_repr(self) -> str:
        return f"dim={self.dim}, groups={self.groups}"


class Entmax15(nn.Module):
    """Module form of :func:`entmax15`."""

    def __init__(self, dim: int = -1, groups: int = 1) -> None:
        super().__init__()
        self.dim = dim
        self.groups = groups

    def forward(self, x: Tensor) -> Tensor:
        return entmax15(x, self.dim, self.groups)

    def extra_repr(self) -> str:
        return f"dim={self.dim}, groups={self.groups}"


def softplus_inverse(y: float) -> float:
    """x with softplus(x) = y > 0: log(exp(y) − 1), computed without overflow. Initialises a
    parameter that passes through softplus (a learnable alpha, the Sparsemax-SAE's scale)."""
    return y + math.log(-math.expm1(-y))


class EntmaxAlpha(nn.Module):
    r"""Module form of :func:`entmax_alpha`, with an optionally learnable alpha.

    A learnable alpha is parameterised as :math:`\alpha = 1 + 10^{-3} + \operatorname{softplus}
    (\theta)`, so it stays above 1 whatever the optimiser does to :math:`\theta` (a learned
    alpha that reaches 1 gives NaN in implementations that clamp or take alpha directly).
    ``alpha`` (property) is the current value as a 0-d tensor.

    Args:
        alpha: initial (or fixed) alpha, > 1.001 when learnable, > 1 otherwise.
        learnable: make alpha a parameter (``alpha_raw``, i.e. :math:`\theta`).
        dim: as for :func:`sparsemax`.
        groups: as for :func:`sparsemax`.
    """

    def __init__(
        self, alpha: float = 1.5, learnable: bool = False, dim: int = -1, groups: int = 1
    ) -> None:
        super().__init__()
        alpha = float(alpha)
        floor = 1 + _ALPHA_MIN_GAP if learnable else 1.0
        if not alpha > floor:
            raise ValueError(f"EntmaxAlpha: alpha must be > {floor}, got {alpha}")
        self.learnable = learnable
        self.dim = dim
        self.groups = groups
        if learnable:
            self.alpha_raw = nn.Parameter(torch.tensor(softplus_inverse(alpha - floor)))
        else:
            self.register_buffer("alpha_value", torch.tensor(alpha))
            self._alpha = alpha

    @property
    def alpha(self) -> Tensor:
        if self.learnable:
            return 1 + _ALPHA_MIN_GAP + F.softplus(self.alpha_raw)
        return self.alpha_value

    def forward(self, x: Tensor) -> Tensor:
        alpha = self.alpha if self.learnable else self._alpha
        return entmax_alpha(x, alpha, self.dim, self.groups)

    def extra_repr(self) -> str:
        return f"learnable={self.learnable}, dim={self.dim}, groups={self.groups}"
