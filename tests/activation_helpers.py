"""What the sparse-map tests share: float64 sort-based references, the maps by name, random
scores, and the switch between the compiled CPU kernels and the tensor-op path."""

from __future__ import annotations

import torch

from sae.activations import (
    entmax15,
    entmax_alpha,
    kernels,
    sparsemax,
)

F64 = torch.float64


def use_path(path: str, monkeypatch) -> str:
    """``"kernels"``: the compiled CPU sparsemax kernels (sae.activations.kernels);
    ``"tensor-ops"``: the path that CUDA, torch.compile and machines without numba use."""
    if path == "tensor-ops":
        monkeypatch.setattr(kernels, "_ENABLED", False)
    return path


# --------------------------------------------------------------------------- references
def ref_sparsemax(x: torch.Tensor) -> torch.Tensor:
    """Sort-and-threshold (Martins & Astudillo, 2016, Algorithm 1) over the last dim."""
    z = x.sort(-1, descending=True).values
    k = torch.arange(1, x.shape[-1] + 1, dtype=x.dtype)
    cs = z.cumsum(-1)
    size = (1 + k * z > cs).sum(-1, keepdim=True)
    tau = (cs.gather(-1, size - 1) - 1) / size
    return (x - tau).clamp_min(0)


def ref_entmax15(x: torch.Tensor) -> torch.Tensor:
    """Sort-based 1.5-entmax (Peters, Niculae & Martins, 2019, Algorithm 2) over the last dim."""
    u = x / 2
    z = u.sort(-1, descending=True).values
    k = torch.arange(1, x.shape[-1] + 1, dtype=x.dtype)
    mean = z.cumsum(-1) / k
    var = (z * z).cumsum(-1) / k - mean**2
    tau = mean - (1 / k - var).clamp_min(0).sqrt()
    size = (tau <= z).sum(-1, keepdim=True)
    return (u - tau.gather(-1, size - 1)).clamp_min(0) ** 2


def ref_entmax_alpha(x: torch.Tensor, alpha: float) -> torch.Tensor:
    """alpha-entmax by 64 bisection steps on the threshold (to 2^-64), over the last dim."""
    z = (alpha - 1) * (x - x.amax(-1, keepdim=True))
    lo = torch.full_like(z[..., :1], -1.0)
    hi = torch.zeros_like(lo)
    for _ in range(64):
        mid = (lo + hi) / 2
        ok = (z - mid).clamp_min(0).pow(1 / (alpha - 1)).sum(-1, keepdim=True) >= 1
        lo, hi = torch.where(ok, mid, lo), torch.where(ok, hi, mid)
    p = (z - lo).clamp_min(0).pow(1 / (alpha - 1))
    return p / p.sum(-1, keepdim=True)


def threshold_of(name: str, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """The threshold t of each row (last dim), read off the output on its largest entry."""
    j = y.argmax(-1, keepdim=True)
    xj, yj = x.gather(-1, j), y.gather(-1, j)
    alpha = {"sparsemax": 2.0, "entmax15": 1.5}.get(name, ALPHA)
    return xj - yj ** (alpha - 1) / (alpha - 1)


ALPHA = 1.3
MAPS = {
    "sparsemax": (sparsemax, ref_sparsemax),
    "entmax15": (entmax15, ref_entmax15),
    "alpha": (
        lambda x, **kw: entmax_alpha(x, ALPHA, **kw),
        lambda x: ref_entmax_alpha(x, ALPHA),
    ),
}
NAMES = list(MAPS)


def rand(*shape, scale=1.0, seed=0, dtype=F64):
    g = torch.Generator().manual_seed(seed)
    return (scale * torch.randn(*shape, generator=g, dtype=F64)).to(dtype)
