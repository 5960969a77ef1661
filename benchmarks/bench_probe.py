"""Linear probes: the L-BFGS-B solver of ``sae.metrics.linear_probes`` against the previous one.

    python benchmarks/bench_probe.py [--run DIR] [--model topk --k 32 --lambda 0.01]
                                     [--dataset mnist] [--pixels] [--repeats 3] [--threads 2]

Fits both probes (softmax and sparsemax loss) on the codes of a trained SAE, the 55 000-image
train split against the test set, as a sweep's analysis does: ``--run DIR`` takes the model of a
finished run folder (checkpoints/last.ckpt), otherwise one epoch of ``--model`` is trained first
in a temporary folder. ``--pixels`` fits them on the raw pixels instead. The previous solver (a
copy below: torch L-BFGS, strong-Wolfe line search, float32, torch CSR products below 5 %
density) and the current one run alternately, ``--repeats`` times each; prints the median
seconds of each probe, old / new, and the accuracies of both (target: <= 2 s per probe on
2 cores, accuracies within 0.1 point).
"""

from __future__ import annotations

import argparse
import math
import statistics
import tempfile
import time
import warnings
from pathlib import Path

import torch

from sae.data.images import ImageDataModule
from sae.metrics import PROBE_LOSSES, ProbeResult, linear_probe, linear_probes, probe_loss
from sae.metrics.basic import _column_mean_std, _flat
from sae.metrics.probes import _accuracy, _support
from sae.models import encode_dataset
from sae.training.checkpoints import load_checkpoint

# --------------------------------------------------------------------------------------------------
# the previous solver, kept here for the comparison only


def _csr_transpose(a: torch.Tensor) -> torch.Tensor:
    crow, col, val = a.crow_indices(), a.col_indices(), a.values()
    n, d = a.shape
    rows = torch.repeat_interleave(torch.arange(n, device=col.device), crow.diff())
    order = torch.argsort(col, stable=True)
    new_crow = torch.zeros(d + 1, dtype=crow.dtype, device=crow.device)
    new_crow[1:] = torch.bincount(col, minlength=d).cumsum(0)
    return torch.sparse_csr_tensor(new_crow, rows[order].to(crow.dtype), val[order], (d, n))


def _products(x: torch.Tensor, sparse: bool):
    if not sparse:
        return (lambda w: x @ w), (lambda g: (g.T @ x).T)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        xs = x.to_sparse_csr()
        xt = _csr_transpose(xs)
    return (lambda w: xs @ w), (lambda g: xt @ g)


def previous_linear_probe(xtr, ytr, xte, yte, *, loss="softmax", seed=0, max_iter=200,
                          weight_decay=1e-3, history_size=20) -> ProbeResult:
    """The previous ``linear_probe`` with its defaults (standardised float32 features)."""
    xtr, xte = _flat(xtr, "train_features"), _flat(xte, "test_features")
    ytr, yte = ytr.reshape(-1).long(), yte.reshape(-1).long()
    n_classes = 1 + max(int(ytr.max()), int(yte.max()))
    xtr = xtr.float()
    n, d = xtr.shape
    mean, std = _column_mean_std(xtr)
    scale, shift = (1.0 / std).float(), (mean / std).float()
    sparse = int(xtr.count_nonzero()) / max(xtr.numel(), 1) <= 0.05
    forward, backward = _products(xtr, sparse)
    gen = torch.Generator().manual_seed(seed)
    w0 = torch.randn(d, n_classes, generator=gen, dtype=torch.float64) * (0.01 / math.sqrt(d))
    w = w0.float().requires_grad_(True)
    b = torch.zeros(n_classes, requires_grad=True)

    def raw_params():
        return w * scale.unsqueeze(1), b - shift @ w

    def objective():
        w_raw, b_raw = raw_params()
        per_sample, g = probe_loss(forward(w_raw) + b_raw, ytr, loss)
        value = per_sample.sum() / n + 0.5 * weight_decay * w.square().sum()
        g = g.div_(n)
        g_b = g.sum(dim=0)
        g_w = backward(g) * scale.unsqueeze(1) - shift.unsqueeze(1) * g_b + weight_decay * w
        return value, g_w.contiguous(), g_b

    opt = torch.optim.LBFGS([w, b], lr=1.0, max_iter=max_iter, history_size=history_size,
                            line_search_fn="strong_wolfe", tolerance_grad=1e-7,
                            tolerance_change=1e-12)

    def closure():
        with torch.no_grad():
            value, w.grad, b.grad = objective()
        return value

    opt.step(closure)
    with torch.no_grad():
        final = float(objective()[0])
        w_raw, b_raw = raw_params()
        return ProbeResult(
            test_accuracy=_accuracy(xte, yte, w_raw, b_raw),
            train_accuracy=_accuracy(xtr, ytr, w_raw, b_raw), train_loss=final,
            n_iter=int(opt.state[w].get("n_iter", 0)), sparse=sparse, weight=w_raw.clone(),
            bias=b_raw.clone(), loss=loss, test_support=_support(xte, w_raw, b_raw, loss))


# --------------------------------------------------------------------------------------------------


def features(args, dm: ImageDataModule) -> tuple[torch.Tensor, torch.Tensor, str]:
    """Train and test features, and a description of where they come from."""
    if args.pixels:
        return dm.train_x, dm.test_x, f"{args.dataset} pixels"
    if args.run is None:
        from sae.runner.command import main as run_main

        folder = Path(tempfile.mkdtemp(prefix="bench-probe-")) / "run"
        argv = ["--model", args.model, "--k", str(args.k), "--lambda", str(args.lam),
                "--epochs", "1", "--dataset", args.dataset, "--no-figures", "--no-features",
                "--no-report", "--progress", "off", "--out", str(folder)]
        if args.data_dir:
            argv += ["--data-dir", args.data_dir]
        if run_main(argv) != 0:
            raise SystemExit("error: the training run failed")
        args.run = folder
    model = load_checkpoint(Path(args.run) / "checkpoints" / "last.ckpt")
    _, train_codes = encode_dataset(model, dm.train_x)
    _, test_codes = encode_dataset(model, dm.test_x)
    l0 = float((train_codes > 0).sum(1).float().mean())
    units = train_codes.shape[1]
    return train_codes, test_codes, f"codes of {args.run} (train L0 {l0:.1f} of {units})"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--run", default=None, help="a finished run folder (default: train one)")
    p.add_argument("--model", default="topk")
    p.add_argument("--k", type=int, default=32)
    p.add_argument("--lambda", dest="lam", type=float, default=0.01)
    p.add_argument("--dataset", default="mnist")
    p.add_argument("--data-dir", default=None)
    p.add_argument("--pixels", action="store_true", help="probe raw pixels instead of codes")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    dm = ImageDataModule(args.dataset, args.data_dir)
    dm.setup()
    xtr, xte, what = features(args, dm)
    ytr, yte = dm.train_y, dm.test_y
    print(f"{what}: train {tuple(xtr.shape)}, test {tuple(xte.shape)}, "
          f"density {float((xtr != 0).float().mean()):.4f}, threads {args.threads}")
    linear_probes(xtr[:100], ytr[:100], xte[:10], yte[:10])  # compile (or load) the loops first
    old_t = {loss: [] for loss in PROBE_LOSSES}
    new_t = {loss: [] for loss in PROBE_LOSSES}
    both_t: list[float] = []
    for _ in range(args.repeats):
        old, new = {}, {}
        for loss in PROBE_LOSSES:
            start = time.perf_counter()
            old[loss] = previous_linear_probe(xtr, ytr, xte, yte, loss=loss)
            old_t[loss].append(time.perf_counter() - start)
            start = time.perf_counter()
            new[loss] = linear_probe(xtr, ytr, xte, yte, loss=loss)
            new_t[loss].append(time.perf_counter() - start)
        start = time.perf_counter()
        linear_probes(xtr, ytr, xte, yte)
        both_t.append(time.perf_counter() - start)
    print(f"{'loss':10s} {'old s':>7s} {'new s':>7s} {'old/new':>8s} {'old acc %':>9s} "
          f"{'new acc %':>9s} {'old it':>6s} {'new it':>6s} {'old obj':>11s} {'new obj':>11s}")
    for loss in PROBE_LOSSES:
        o, n = old[loss], new[loss]
        om, nm = statistics.median(old_t[loss]), statistics.median(new_t[loss])
        print(f"{loss:10s} {om:7.2f} {nm:7.2f} {om / nm:8.1f} "
              f"{100 * o.test_accuracy:9.2f} {100 * n.test_accuracy:9.2f} {o.n_iter:6d} "
              f"{n.n_iter:6d} {o.train_loss:11.8f} {n.train_loss:11.8f}")
    old_sum = sum(statistics.median(t) for t in old_t.values())
    both = statistics.median(both_t)
    print(f"both probes: old {old_sum:.2f} s, new {both:.2f} s (one linear_probes call), "
          f"old / new {old_sum / both:.1f}; medians of {args.repeats} (the one-loss calls: "
          f"{' '.join(f'{x:.2f}' for x in new_t['softmax'])} and "
          f"{' '.join(f'{x:.2f}' for x in new_t['sparsemax'])} s)")


if __name__ == "__main__":
    main()
