r"""Sparse probability maps: sparsemax, 1.5-entmax and alpha-entmax.

All three solve, for every row :math:`x \in \mathbb{R}^d`,

.. math::
    p^\star = \operatorname*{argmax}_{p \in \Delta^d}\; \langle p, x\rangle + H^T_\alpha(p),
    \qquad H^T_\alpha(p) = \frac{1}{\alpha(\alpha-1)} \sum_j (p_j - p_j^\alpha),

whose solution is :math:`p^\star_j = [(\alpha-1)(x_j - t)]_+^{1/(\alpha-1)}` with the
threshold :math:`t` fixed by :math:`\sum_j p^\star_j = 1` (Peters, Niculae & Martins, 2019).
:math:`\alpha = 2` is sparsemax, the Euclidean projection onto the simplex (Martins &
Astudillo, 2016); :math:`\alpha \to 1` tends to softmax. Entries below the threshold get
exact zeros.

Each map comes as a function and an ``nn.Module``, works along any ``dim`` (negative ones
included), on any shape, on CPU and CUDA, and can be applied independently to ``groups`` equal
slices ("heads") of ``dim``. float64 and float32 are computed in their own precision; float16 and
bfloat16 are computed in float32 and returned in the input dtype.

**Non-finite input** follows ``torch.softmax``: a row (one group of one slice along ``dim``)
that holds a NaN or a ``+inf``, or whose entries are all ``-inf``, gives a NaN row and a NaN
input gradient for that row; ``-inf`` entries of an otherwise finite row get exactly 0 (and zero
gradient) while the other entries get the map of the finite ones. Nothing raises on data values.
Bad rows are left out of the computation, so the other rows and their gradients are exactly
(bitwise) what they would be without them. Empty tensors pass through.

**Compiled CPU kernels.** On CPU, sparsemax of float32/float64 rows of up to
``sae.activations.kernels.MAX_WIDTH`` entries runs in compiled loops instead
(:mod:`sae.activations.kernels`, numba):
the same exact threshold (Michelot's fixed point on the entries above max − 1), without the
per-op overhead that dominates the tensor-op path on such rows. ``SAE_NO_KERNELS=1`` switches
them off; the tests run every map on both paths.

**Fused GPU kernels.** On CUDA, sparsemax and 1.5-entmax of float32/bfloat16/float16 rows of up
to ``sae.activations.triton_kernels.MAX_WIDTH`` entries run as one Triton kernel forward and one
backward (:mod:`sae.activations.triton_kernels`): the same exact thresholds and non-finite
conventions, without the
dozens of launches of the tensor-op path. ``SAE_NO_TRITON=1`` switches them off.

**torch.compile.** Each map is registered as an opaque operator (``torch.library.custom_op``,
with its backward), so compiled graphs call the same exact code and ``fullgraph=True`` holds.

The ``entmax`` package (Peters et al.) is the reference these are tested against. It is not
called: the code here is faster at every benchmarked size (``benchmarks/bench_activations.py``)
and handles the non-finite cases above.

The package is split by job: :mod:`sae.activations.solver` (the thresholds of rows),
:mod:`sae.activations.autograd` (gradients, kernels, the ``torch.compile`` operator) and
:mod:`sae.activations.api` (the public functions and modules), re-exported here.
"""

from sae.activations.api import (
    Entmax15,
    EntmaxAlpha,
    Sparsemax,
    entmax15,
    entmax_alpha,
    softplus_inverse,
    sparsemax,
)

__all__ = [
    "softplus_inverse",
    "sparsemax",
    "entmax15",
    "entmax_alpha",
    "Sparsemax",
    "Entmax15",
    "EntmaxAlpha",
]
