"""GPU speed of the sparse maps, of SAE training steps and of a default training run, in one table.

    python benchmarks/bench_gpu.py --data-dir DATA_DIR [--budget 1.5] [--steps 200] [--no-run]

On a CUDA machine, prints the GPU, the date and the versions, then one table:

- ``map``: median forward+backward time (float32, scores ~ N(0, 1)) of sparsemax and entmax15
  through our Triton kernels (``sae.activations.triton_kernels``), our tensor-op path and the
  ``entmax`` package, and of torch.softmax, with the ratio to softmax, at 256 x 512 (the SAE's
  size), 4096 x 4096, 4096 x 16384 and 256 x {256, 1024, 4096, 16384}. Each time is a CUDA-event
  measurement of a loop of calls (so launches overlap as in training), the maps interleaved in
  every repetition; the ratio is the median of the per-repetition ratios. The ``check`` column
  gives the largest difference of output and input gradient between the Triton and tensor-op
  paths (a correctness check on the GPU).
- ``step``: median time of one training step per model at the default size (784 -> 512, batch
  256, float32): a bare PyTorch loop (forward, loss = MSE + lambda * penalty, backward, gradient
  clipping, Adam) on data already on the GPU, and Lightning's ``Trainer.fit`` (time between
  consecutive batch starts: data transfer and Lightning's own work included).
- ``run``: ``wall_time_s`` of a default 10-epoch run, ``python -m sae.run --model sparsemax
  --lambda 0.01 --accelerator gpu --data-dir DATA_DIR``, read from its metrics.json (and, with
  ``--run-ops``, the same run on the tensor-op path, ``SAE_NO_TRITON=1``).

Without ``--data-dir`` the training rows are skipped. Without CUDA the script prints one line and
exits 0.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # this checkout's sae, not another
sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_activations import maps  # noqa: E402

from sae.activations import triton_kernels  # noqa: E402

MAP_SIZES = ((256, 512), (4096, 4096), (4096, 16384), (256, 256), (256, 1024), (256, 4096),
             (256, 16384))
MAP_NAMES = ("softmax", "sparsemax", "sparsemax(ops)", "pkg sparsemax", "entmax15",
             "entmax15(ops)", "pkg entmax15")
BATCH = 256
DEVICE = "cuda"  # everything runs here (a CPU smoke test of the script may change it)


def accelerator() -> str:
    """Lightning's name for DEVICE."""
    return "gpu" if DEVICE == "cuda" else DEVICE


def error(message: str) -> None:
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(2)


# --------------------------------------------------------------------------- maps
def time_maps(fns: dict[str, Callable], x: torch.Tensor, g: torch.Tensor, budget: float):
    """Per map: (median ms of one forward+backward, median ratio to the first map). Each
    measurement is a loop of `inner` calls between two CUDA events; repetitions interleave the
    maps, so that clock and thermal drift hit them alike."""

    def loop(f: Callable, inner: int) -> tuple[torch.cuda.Event, torch.cuda.Event]:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(inner):
            torch.autograd.grad(f(x), x, g)
        end.record()
        return start, end

    for f in fns.values():  # warm-up: compilation, autotuning caches, the allocator
        loop(f, 3)
    torch.cuda.synchronize()
    probe = {k: loop(f, 3) for k, f in fns.items()}
    torch.cuda.synchronize()
    once = {k: s.elapsed_time(e) / 3 for k, (s, e) in probe.items()}  # ms
    inner = {k: max(1, min(200, int(2.0 / max(v, 1e-3)))) for k, v in once.items()}  # ~2 ms
    reps = max(5, min(31, int(1e3 * budget / sum(inner[k] * once[k] for k in fns))))
    times: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(reps):
        events = {k: loop(f, inner[k]) for k, f in fns.items()}
        torch.cuda.synchronize()
        for k, (s, e) in events.items():
            times[k].append(s.elapsed_time(e) / inner[k])
    base = next(iter(times.values()))
    return {
        k: (statistics.median(v), statistics.median(t / b for t, b in zip(v, base, strict=True)))
        for k, v in times.items()
    }


def triton_vs_ops(fns: dict[str, Callable], name: str, x: torch.Tensor, g: torch.Tensor) -> str:
    """Largest |difference| of output and input gradient between the Triton and tensor-op
    paths of one map."""
    out = []
    for key in (name, f"{name}(ops)"):
        y = fns[key](x)
        (gx,) = torch.autograd.grad(y, x, g)
        out.append((y.detach(), gx))
    dy = (out[0][0] - out[1][0]).abs().max().item()
    dg = (out[0][1] - out[1][1]).abs().max().item()
    flag = "" if dy <= 1e-5 and dg <= 1e-4 else "  MISMATCH"
    return f"max|dy| {dy:.1e} max|dgrad| {dg:.1e}{flag}"


def map_rows(budget: float) -> list[tuple]:
    every = maps()
    fns = {k: every[k] for k in MAP_NAMES if k in every}
    rows = []
    for r, d in MAP_SIZES:
        gen = torch.Generator().manual_seed(d)
        x = torch.randn(r, d, generator=gen).to(DEVICE).requires_grad_()
        g = torch.randn(r, d, generator=gen).to(DEVICE)
        med = time_maps(fns, x, g, budget)
        checks = {m: triton_vs_ops(fns, m, x, g) for m in ("sparsemax", "entmax15")}
        if not triton_kernels.available(x.detach()):
            checks = {m: "(Triton path off)" for m in checks}
        for k, (ms, ratio) in med.items():
            rows.append(("map", k, f"{r}x{d}", ms, ratio, checks.get(k, "")))
        print(f"  measured {r}x{d}", file=sys.stderr, flush=True)
    return rows


# --------------------------------------------------------------------------- training steps
def make_model(name: str, mean: torch.Tensor, data_var: float):
    from sae.models import build_model
    from sae.settings.config import SAEConfig

    torch.manual_seed(0)
    config = SAEConfig(model=name)
    return config, build_model(config, mean, data_var)


def bare_step_ms(name: str, x_all: torch.Tensor, mean: torch.Tensor, data_var: float,
                 steps: int, warm: int) -> float:
    """Median ms of a plain training step (no Lightning), batches sliced from GPU data."""
    config, model = make_model(name, mean, data_var)
    model = model.to(DEVICE)
    opt = torch.optim.Adam(model.parameters(), lr=config.lr)
    order = torch.randperm(len(x_all), device=x_all.device)
    events = [torch.cuda.Event(enable_timing=True) for _ in range(steps + 1)]
    for i in range(warm + steps + 1):
        if i >= warm:
            events[i - warm].record()
        if i == warm + steps:
            break
        start = (i * BATCH) % (len(x_all) - BATCH)
        x = x_all[order[start:start + BATCH]]
        x_hat, h, extras = model.forward_pass(x)
        loss = torch.nn.functional.mse_loss(x_hat, x) + config.lam * model.penalty(h, extras)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
    torch.cuda.synchronize()
    return statistics.median(events[i].elapsed_time(events[i + 1]) for i in range(steps))


def lightning_step_ms(name: str, dm, mean: torch.Tensor, data_var: float, steps: int,
                      warm: int) -> float:
    """Median ms between consecutive training-batch starts under Lightning's Trainer.fit."""
    import lightning.pytorch as L

    class StepEvents(L.Callback):
        def __init__(self):
            self.events: list[torch.cuda.Event] = []

        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            self.events.append(event)

    _, model = make_model(name, mean, data_var)
    timer = StepEvents()
    trainer = L.Trainer(accelerator=accelerator(), devices=1, max_steps=warm + steps + 1,
                        logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, limit_val_batches=0, num_sanity_val_steps=0,
                        gradient_clip_val=1.0, callbacks=[timer])
    from sae.training.module import SAETraining

    trainer.fit(SAETraining(model), datamodule=dm)
    torch.cuda.synchronize()
    ev = timer.events[warm:]
    return statistics.median(a.elapsed_time(b) for a, b in zip(ev[:-1], ev[1:], strict=True))


def step_rows(data_dir: str, steps: int, warm: int) -> list[tuple]:
    from sae.data.images import ImageDataModule
    from sae.settings.config import MODELS
    from sae.training.engine import quiet_lightning

    quiet_lightning()
    dm = ImageDataModule("mnist", data_dir, batch_size=BATCH)
    dm.setup()
    mean = dm.train_mean
    data_var = float((dm.train_x - mean).pow(2).sum(-1).mean())
    x_all = dm.train_x.to(DEVICE)
    rows = []
    for name in MODELS:
        bare = bare_step_ms(name, x_all, mean, data_var, steps, warm)
        light = lightning_step_ms(name, dm, mean, data_var, steps, warm)
        rows.append(("step", f"{name} bare", "784->512 b256", bare, None, ""))
        rows.append(("step", f"{name} lightning", "784->512 b256", light, light / bare,
                     "ratio: lightning / bare"))
        print(f"  measured steps of {name}", file=sys.stderr, flush=True)
    return rows


def run_rows(data_dir: str, epochs: int, ops_too: bool) -> list[tuple]:
    rows = []
    for label, extra_env in (("triton", {}), ("tensor ops", {"SAE_NO_TRITON": "1"})):
        if label == "tensor ops" and not ops_too:
            continue
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "run"
            cmd = [sys.executable, "-m", "sae.run", "--model", "sparsemax", "--lambda", "0.01",
                   "--accelerator", accelerator(), "--data-dir", data_dir,
                   "--epochs", str(epochs), "--out", str(out), "--progress", "off"]
            env = {**os.environ, **extra_env,
                   "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT),
                                                               os.environ.get("PYTHONPATH")]))}
            done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
            if done.returncode != 0:
                tail = done.stderr.strip().splitlines()[-3:]
                rows.append(("run", f"sparsemax {epochs} ep ({label})", "", None, None,
                             "failed: " + " | ".join(tail)))
                continue
            metrics = json.loads((out / "metrics.json").read_text())
            rows.append(("run", f"sparsemax {epochs} ep ({label})", "784->512 b256", None, None,
                         f"wall_time_s {metrics['wall_time_s']:.1f}, {metrics.get('steps')} steps"))
        print(f"  finished the {label} run", file=sys.stderr, flush=True)
    return rows


# --------------------------------------------------------------------------- main
def print_table(rows: list[tuple]) -> None:
    print(f"{'kind':<5} {'what':<24} {'size':<14} {'ms':>10} {'ratio':>7}  note")
    for kind, what, size, ms, ratio, note in rows:
        ms_s = f"{ms:10.4f}" if ms is not None else f"{'-':>10}"
        ratio_s = f"{ratio:6.2f}x" if ratio is not None else f"{'':>7}"
        print(f"{kind:<5} {what:<24} {size:<14} {ms_s} {ratio_s}  {note}".rstrip())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data-dir", default=None, help="folder holding mnist/ (IDX files)")
    ap.add_argument("--budget", type=float, default=1.5, help="seconds per map size (about)")
    ap.add_argument("--steps", type=int, default=200, help="timed training steps per model")
    ap.add_argument("--warmup", type=int, default=30, help="untimed steps before them")
    ap.add_argument("--run-epochs", type=int, default=10, help="epochs of the sae.run run")
    ap.add_argument("--no-run", action="store_true", help="skip the sae.run training run")
    ap.add_argument("--run-ops", action="store_true",
                    help="also time the run on the tensor-op path (SAE_NO_TRITON=1)")
    ap.add_argument("--no-maps", action="store_true", help="skip the map timings")
    args = ap.parse_args()
    if args.budget <= 0 or args.steps < 2 or args.warmup < 0 or args.run_epochs < 1:
        error("--budget must be > 0, --steps >= 2, --warmup >= 0, --run-epochs >= 1")
    if args.data_dir is not None and not (Path(args.data_dir) / "mnist").is_dir():
        error(f"--data-dir {args.data_dir} holds no mnist/ folder")
    if not torch.cuda.is_available():
        print("bench_gpu: no CUDA device here; nothing to measure")
        return
    import triton

    entmax = sys.modules.get("entmax")
    on = triton_kernels.available(torch.ones(1, 8, device=DEVICE))
    print(f"GPU {torch.cuda.get_device_name()}, "
          f"{datetime.datetime.now().isoformat(' ', 'seconds')}, torch {torch.__version__}, "
          f"triton {triton.__version__}, entmax {getattr(entmax, '__version__', 'absent')}, "
          f"Triton path {'on' if on else 'OFF'}")
    rows: list[tuple] = []
    if not args.no_maps:
        rows += map_rows(args.budget)
    if args.data_dir is None:
        rows.append(("step", "(skipped)", "", None, None, "training rows need --data-dir"))
    else:
        rows += step_rows(args.data_dir, args.steps, args.warmup)
        if not args.no_run:
            rows += run_rows(args.data_dir, args.run_epochs, args.run_ops)
    print_table(rows)


if __name__ == "__main__":
    main()
