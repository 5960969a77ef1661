"""Gradients of the sparse probability maps on rows: the vector-Jacobian products, the autograd
function that dispatches rows to the compiled CPU or fused GPU kernels, and the opaque
``torch.compile`` operator (see :mod:`sae.activations`)."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from sae.activations import kernels, triton_kernels
from sae.activations.solver import _partial_maxima, _solve


def _support_weights(y: Tensor, alpha: Tensor) -> Tensor:
    """s = y^(2-alpha) on the support, 0 elsewhere (a tensor alpha)."""
    return torch.where(y > 0, y.pow(2 - alpha), 0.0)


def _grad_x(y: Tensor, g: Tensor, alpha: float | Tensor, s: Tensor | None = None) -> Tensor:
    r"""Vector-Jacobian product on rows: with s = y^(2-alpha) on the support and 0 elsewhere,
    dx = s * g - s * <s, g> / sum(s); for sparsemax s is the support indicator, so
    dx = g - mean_S(g) on S and 0 elsewhere. s may be given (a tensor alpha)."""
    if not isinstance(alpha, Tensor) and triton_kernels.available(y):  # CUDA rows: fused
        return triton_kernels.backward(y, g, alpha)
    if s is None and isinstance(alpha, Tensor):
        s = _support_weights(y, alpha)
    elif s is None:
        s = y.sign() if alpha == 2.0 else y.sqrt()
    sg = s * g
    q = sg.sum(-1, keepdim=True).div_(s.sum(-1, keepdim=True))
    return sg.addcmul_(s, q, value=-1)


def _grad_alpha(y: Tensor, g: Tensor, alpha: Tensor, s: Tensor | None = None) -> Tensor:
    r"""d<g, y>/d alpha per row (Correia, Niculae & Martins, 2019):
    with s = y^(2-alpha), s~ = s / sum(s), h_j = y_j log y_j and H = sum(h),
    sum_j g_j [(y_j - s~_j)/(alpha-1)^2 - (h_j - s~_j H)/(alpha-1)]. s may be given."""
    s = _support_weights(y, alpha) if s is None else s
    s = s / s.sum(-1, keepdim=True)
    h = torch.xlogy(y, y)  # 0 where y = 0
    ent = h.sum(-1, keepdim=True)
    am1 = alpha - 1
    return (g * ((y - s) / am1**2 - (h - s * ent) / am1)).sum(-1, keepdim=True)


def _scatter_blocks(vals: Tensor, flat: Tensor, rows: int, n: int) -> Tensor:
    """A [rows, n] zero matrix with the gathered blocks `vals` written back at `flat`."""
    b = vals.numel() // flat.numel()
    out = vals.new_zeros(rows * n // b, b)
    return out.index_copy_(0, flat, vals.view(-1, b)).view(rows, n)


def _rows_forward(x: Tensor, alpha: float | Tensor):
    """The map of the rows of x: (output, (p, flat, good, alpha) for `_rows_backward`)."""
    rows, n = x.shape
    tensor_alpha = isinstance(alpha, Tensor)
    if not tensor_alpha and triton_kernels.available(x):  # CUDA rows: one fused kernel
        out = triton_kernels.forward(x, alpha)
        return out, (out, None, None, alpha)
    part = _partial_maxima(x)
    m = (x if part is None else part).amax(-1, keepdim=True)
    # softmax's conventions: a NaN, a +inf, or no finite entry makes the row NaN; so does an
    # alpha <= 1 or non-finite. One reduction tells whether any row is bad at all.
    probe = m.sum()
    if tensor_alpha:
        probe = probe + torch.log(alpha - 1).sum()
    good = None
    if not math.isfinite(probe.item()):
        bad = ~torch.isfinite(m)
        if tensor_alpha:
            bad |= ~(alpha > 1) | ~torch.isfinite(alpha)
        # The rows are solved together (shared passes and gathers): leave the bad ones out, so
        # that the others get exactly the result they would get without them.
        good = (~bad).reshape(-1).nonzero().reshape(-1)
        x, m = x.index_select(0, good), m.index_select(0, good)
        part = part.index_select(0, good) if part is not None else None
        alpha = alpha.index_select(0, good) if tensor_alpha else alpha
    if x.shape[0] == 0:  # no good row
        p, flat = x.clone(), None
    else:
        _, _, p, _, flat = _solve(x, alpha, m, part)
    if tensor_alpha:
        p = p / p.sum(-1, keepdim=True)
    out = p if flat is None else _scatter_blocks(p, flat, p.shape[0], n)
    if good is not None:
        out = out.new_full((rows, n), math.nan).index_copy_(0, good, out)
    return out, (p, flat, good, alpha)


def _rows_backward(g: Tensor, alpha: float | Tensor, y: Tensor, flat, good, need_alpha: bool):
    """(dx, dalpha or None) of the rows, from `_rows_forward`'s saved tensors."""
    rows, n = g.shape
    if good is not None:
        g = g.index_select(0, good)
    if flat is not None:  # only the gathered candidate blocks can carry gradient
        g = g.reshape(-1, y.numel() // flat.numel()).index_select(0, flat).view(y.shape[0], -1)
    s = _support_weights(y, alpha) if isinstance(alpha, Tensor) else None  # shared by both
    gx = _grad_x(y, g, alpha, s)
    ga = _grad_alpha(y, g, alpha, s) if need_alpha else None
    if flat is not None:
        gx = _scatter_blocks(gx, flat, y.shape[0], n)
    if good is not None:  # bad rows: NaN gradients, as softmax gives them
        gx = gx.new_full((rows, n), math.nan).index_copy_(0, good, gx)
        if ga is not None:
            ga = ga.new_full((rows, 1), math.nan).index_copy_(0, good, ga)
    return gx, ga


class _EntmaxFunction(torch.autograd.Function):
    """The map on [rows, n] float rows; alpha: 2.0, 1.5 or a [rows, 1] tensor."""

    @staticmethod
    def forward(ctx, x: Tensor, alpha: float | Tensor) -> Tensor:
        ctx.kernel = not isinstance(alpha, Tensor) and alpha == 2.0 and kernels.available(x)
        # compiled CPU rows (sae.activations.kernels): same result, a fraction of the time
        if ctx.kernel:
            out = kernels.sparsemax_forward(x.contiguous())
            ctx.save_for_backward(out)
            return out
        out, (p, flat, good, alpha) = _rows_forward(x, alpha)  # alpha of the good rows
        tensor_alpha = isinstance(alpha, Tensor)
        ctx.save_for_backward(p, flat, good, alpha if tensor_alpha else None)
        ctx.alpha = None if tensor_alpha else alpha
        return out

    @staticmethod
    def backward(ctx, g: Tensor):
        if ctx.kernel:
            (y,) = ctx.saved_tensors
            return kernels.sparsemax_backward(y, g), None
        y, flat, good, alpha_t = ctx.saved_tensors
        alpha = ctx.alpha if alpha_t is None else alpha_t
        gx, ga = _rows_backward(g, alpha, y, flat, good, ctx.needs_input_grad[1])
        return gx, ga


# torch.compile sees each map as one opaque operator (the data-dependent loops above cannot be
# traced), so that compiled graphs run the same exact code and fullgraph=True holds. The
# operator takes the input with `dim` moved last and reshapes it to rows itself: a reshape by
# groups in the traced graph compiles to slow code under dynamic shapes. Its backward
# recomputes from the full output (gathered blocks have data-dependent shapes). alpha is a
# tensor here: [..., 1] (one per slice), or 0-d for kind 2 (sparsemax) and 1 (1.5-entmax).
def _op_rows(x: Tensor, alpha: Tensor, kind: int, groups: int):
    rows = x.reshape(-1, x.shape[-1] // groups)
    if kind == 2 or kind == 1:
        return rows, 2.0 if kind == 2 else 1.5
    return rows, alpha.expand(*x.shape[:-1], groups).reshape(-1, 1)


# torch.library.custom_op needs torch >= 2.4; older versions compile with a graph break here.
_is_compiling = getattr(torch.compiler, "is_compiling", lambda: False)
_entmax_op = None
if hasattr(torch.library, "custom_op"):
    @torch.library.custom_op("sae::entmax", mutates_args=())
    def _entmax_op(x: Tensor, alpha: Tensor, kind: int, groups: int) -> Tensor:
        rows, a = _op_rows(x, alpha, kind, groups)
        return _rows_forward(rows, a)[0].view(x.shape)

    @_entmax_op.register_fake
    def _(x: Tensor, alpha: Tensor, kind: int, groups: int) -> Tensor:
        return torch.empty_like(x, memory_format=torch.contiguous_format)

    @torch.library.custom_op("sae::entmax_backward", mutates_args=())
    def _entmax_op_backward(
        y: Tensor, g: Tensor, alpha: Tensor, kind: int, groups: int
    ) -> tuple[Tensor, Tensor]:
        rows, a = _op_rows(y, alpha, kind, groups)
        g_rows = g.reshape(rows.shape)
        gx = _grad_x(rows, g_rows, a).view(y.shape)  # NaN rows of y give NaN rows, as in eager
        if kind != 0:
            return gx, torch.zeros_like(alpha)
        ga = _grad_alpha(rows, g_rows, a).view(*y.shape[:-1], groups).sum(-1, keepdim=True)
        return gx, ga

    @_entmax_op_backward.register_fake
    def _(y: Tensor, g: Tensor, alpha: Tensor, kind: int, groups: int) -> tuple[Tensor, Tensor]:
        return torch.empty_like(y), torch.empty_like(alpha)

    def _op_setup(ctx, inputs, output) -> None:
        ctx.save_for_backward(output, inputs[1])
        ctx.kind, ctx.groups = inputs[2], inputs[3]

    def _op_backward(ctx, g: Tensor):
        y, alpha = ctx.saved_tensors
        gx, ga = _entmax_op_backward(y, g, alpha, ctx.kind, ctx.groups)
        return gx, (ga if ctx.kind == 0 else None), None, None

    _entmax_op.register_autograd(_op_backward, setup_context=_op_setup)
