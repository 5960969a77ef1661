r"""A support gate with a straight-through pseudo-derivative, for unshrunk sparse codes.

A sparse map (sparsemax) decides which units are on; an unshrunk code then gives each unit on the
support a value that does not depend on the threshold, :math:`h_j = v_j\,H(u_j)` with
:math:`u_j = s_j - \tau` the unit's margin over the threshold and :math:`H` the Heaviside step.
:math:`H` has zero derivative almost everywhere, so a unit off the support would get no gradient
from the reconstruction and could never return. As for JumpReLU's thresholds (Rajamanoharan et
al. 2024), the step gets a pseudo-derivative, a rectangle kernel :math:`K(z) = 1[|z| < 1/2]` of
bandwidth :math:`\varepsilon`:

.. math::
    \frac{\partial H(u_j)}{\partial u_j} := \frac{1}{\varepsilon}
        K\!\left(\frac{u_j}{\varepsilon}\right),

so a unit within :math:`\varepsilon/2` of the threshold, on either side, learns whether being on
would lower the loss (the reconstruction's gradient times its value :math:`v_j`, the size of the
jump), and a unit just outside can be pulled back in.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["rectangle_kernel", "support_gate"]


def rectangle_kernel(u: Tensor, eps: Tensor | float) -> Tensor:
    """K(u/ε)/ε = 1[|u| < ε/2]/ε: the pseudo-derivative of the step H(u), like u [...] (ε > 0,
    a float or a tensor broadcastable to u)."""
    return (u.abs() < eps / 2).to(u.dtype) / eps


class _SupportGate(torch.autograd.Function):
    @staticmethod
    def forward(ctx, u: Tensor, on: Tensor, eps: Tensor | float) -> Tensor:
        ctx.save_for_backward(u)
        ctx.eps = eps
        return on.to(u.dtype)

    @staticmethod
    def backward(ctx, g: Tensor):
        (u,) = ctx.saved_tensors
        return g * rectangle_kernel(u, ctx.eps), None, None


def support_gate(u: Tensor, on: Tensor, eps: Tensor | float) -> Tensor:
    """The step H(u) as the 0/1 mask ``on`` (forward), with ∂/∂u = K(u/ε)/ε (backward).

    u [...] the margins over the threshold, on [...] bool, the support (u > 0 up to rounding: the
    forward uses ``on`` so that the gate is exactly the support map's), ε > 0 a float or a tensor
    broadcastable to u (not differentiated). No gradient reaches ``on`` or ε.
    """
    if torch.is_tensor(eps):
        eps = eps.detach()
    return _SupportGate.apply(u, on, eps)
