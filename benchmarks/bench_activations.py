"""Forward+backward speed of the sparse maps against torch.softmax and the `entmax` package.

    python benchmarks/bench_activations.py [--threads 2] [--rows 256] [--width 512] [--scale 1]

For --rows rows (256) of float32 standard-normal scores (times --scale) and d in {16, 256, 512,
1024, 4096, 16384} (or --width), prints the median time of y = f(x); y.backward(g) for each map,
and its ratio to torch.softmax; "sparsemax" and "entmax15" are what ``sae.activations`` runs (on
CPU, sparsemax of rows up to 4096 wide runs in the compiled kernels of ``sae.activations.kernels``;
on CUDA both run in the Triton kernels of ``sae.activations.triton_kernels``), "(ops)" their
tensor-op path (CUDA without triton, torch.compile, wider rows). The maps run in turn within
every repetition and the ratio is the median over repetitions of the ratio within one
repetition, so that a busy machine, which slows the maps alike, moves the absolute times more
than the ratios. CPU always (with torch.set_num_threads(--threads)); CUDA too when present.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's sae, not another
from sae.activations import (  # noqa: E402
    entmax15,
    entmax_alpha,
    kernels,  # noqa: E402
    sparsemax,
    triton_kernels,
)

try:
    import entmax
except ImportError:  # the package is a test dependency only
    entmax = None

SIZES = (16, 256, 512, 1024, 4096, 16384)  # 512: the SAE's default width


def tensor_ops(fn: Callable) -> Callable:
    """fn without the compiled kernels (numba on CPU, Triton on CUDA): the tensor-op path."""

    def run(x: torch.Tensor) -> torch.Tensor:
        saved = kernels._ENABLED, triton_kernels._ENABLED
        kernels._ENABLED = triton_kernels._ENABLED = False
        try:
            return fn(x, -1)
        finally:
            kernels._ENABLED, triton_kernels._ENABLED = saved

    return run


def maps() -> dict[str, Callable]:
    alpha = torch.tensor(1.5, requires_grad=True)  # a learnable alpha, as in EntmaxAlpha
    out: dict[str, Callable] = {
        "softmax": lambda x: torch.softmax(x, -1),
        "sparsemax": lambda x: sparsemax(x, -1),
        "sparsemax(ops)": tensor_ops(sparsemax),
        "entmax15": lambda x: entmax15(x, -1),
        "entmax15(ops)": tensor_ops(entmax15),
        "entmax_alpha(t)": lambda x: entmax_alpha(x, alpha.to(x.device), -1),
    }
    if entmax is not None:
        out["pkg sparsemax"] = lambda x: entmax.sparsemax(x, -1)
        out["pkg sparsemax k64"] = lambda x: entmax.sparsemax(x, -1, k=64)
        out["pkg entmax15"] = lambda x: entmax.entmax15(x, -1)
        out["pkg bisect(t)"] = lambda x: entmax.entmax_bisect(x, alpha.to(x.device), -1)
    return out


def time_all(fns: dict[str, Callable], x: torch.Tensor, g: torch.Tensor, budget: float):
    """Per map: (median seconds of forward+backward, median ratio to the first map within a
    repetition); and the number of repetitions. The maps run in turn in every repetition."""
    sync = torch.cuda.synchronize if x.is_cuda else (lambda: None)

    def once(f: Callable) -> float:
        x.grad = None
        sync()
        t0 = time.perf_counter()
        f(x).backward(g)
        sync()
        return time.perf_counter() - t0

    for f in fns.values():  # warm-up (allocator, lazy initialisation)
        once(f)
    first = {k: once(f) for k, f in fns.items()}
    reps = max(5, min(41, int(budget / max(sum(first.values()), 1e-9))))
    times: dict[str, list[float]] = {k: [v] for k, v in first.items()}
    for _ in range(reps):
        for k, f in fns.items():
            times[k].append(once(f))
    base = next(iter(times.values()))
    return {
        k: (statistics.median(v), statistics.median(t / b for t, b in zip(v, base, strict=True)))
        for k, v in times.items()
    }, reps + 1


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rows", type=int, default=256)
    ap.add_argument("--scale", type=float, default=1.0, help="std of the random scores")
    ap.add_argument("--budget", type=float, default=6.0, help="seconds per size and device")
    ap.add_argument("--sizes", "--width", type=int, nargs="*", default=list(SIZES),
                    help="row widths d")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    fns = maps()
    names = list(fns)
    print(f"torch {torch.__version__}, entmax {getattr(entmax, '__version__', 'absent')}, "
          f"{args.rows} rows, float32, scores ~ N(0, {args.scale}^2), "
          f"CPU threads {torch.get_num_threads()}")
    print("median forward+backward time in ms (ratio to softmax)")
    for device in devices:
        print(f"\n[{device}]")
        print(f"{'d':>6} {'reps':>4} " + " ".join(f"{n:>19}" for n in names))
        for d in args.sizes:
            gen = torch.Generator().manual_seed(d)
            x = (args.scale * torch.randn(args.rows, d, generator=gen)).to(device)
            x.requires_grad_(True)
            g = torch.randn(args.rows, d, generator=gen).to(device)
            med, reps = time_all(fns, x, g, args.budget)
            cells = [f"{1e3 * med[n][0]:9.3f} ({med[n][1]:5.1f}x)" for n in names]
            print(f"{d:>6} {reps:>4} " + " ".join(f"{c:>19}" for c in cells), flush=True)


if __name__ == "__main__":
    main()
