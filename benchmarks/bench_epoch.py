"""Epoch time of the sae.run training loop against a bare PyTorch loop, and model against model.

    python benchmarks/bench_epoch.py [--epochs 3] [--run-epochs 10] [--hidden 512] [--threads 2]

Prints median seconds per epoch (MNIST, 55 000 training images, batch 256, no validation) and:
  - Lightning / bare loop for the same Sparsemax-SAE (target <= 1.15);
  - Sparsemax-SAE / ReLU (L1) SAE under Lightning at the same width (target <= 1.15);
  - a whole run of --run-epochs epochs (sae.run's default: 10) with validation, with / without
    the figure callback at its default cadence, which renders once, at the end (target <= 1.10).
The variants are interleaved epoch by epoch-block so that load from other processes hits all alike.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import lightning.pytorch as L
import torch

from sae.data import ImageDataModule
from sae.models import SAEConfig, build_model, training_callbacks
from sae.training import quiet_lightning


class EpochTimer(L.Callback):
    def __init__(self):
        self.times: list[float] = []

    def on_train_epoch_start(self, trainer, pl_module):
        self._start = time.perf_counter()

    def on_train_epoch_end(self, trainer, pl_module):
        self.times.append(time.perf_counter() - self._start)


def make_model(dm: ImageDataModule, name: str, hidden: int):
    torch.manual_seed(0)
    data_var = float((dm.train_x - dm.train_mean).pow(2).sum(-1).mean())
    return build_model(SAEConfig(model=name, hidden=hidden), dm.train_mean, data_var)


def lightning_epochs(dm, name: str, hidden: int, epochs: int, callbacks=()) -> list[float]:
    """Epoch times under Lightning, with the guards a run uses (dead units, non-finite loss)."""
    model = make_model(dm, name, hidden)
    callbacks = [*training_callbacks(model.config), *callbacks]
    timer = EpochTimer()
    trainer = L.Trainer(max_epochs=epochs, accelerator="cpu", devices=1, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, limit_val_batches=0,
                        num_sanity_val_steps=0, gradient_clip_val=1.0,
                        callbacks=[timer, *callbacks])
    trainer.fit(model, datamodule=dm)
    return timer.times


def bare_epochs(dm, name: str, hidden: int, epochs: int) -> list[float]:
    """The same model, loss, clipping, unit-norm constraint and data, in a plain loop."""
    model = make_model(dm, name, hidden)
    opt = torch.optim.Adam(model.parameters(), lr=model.config.lr)
    times = []
    for _ in range(epochs):
        start = time.perf_counter()
        perm = torch.randperm(len(dm.train_x))
        for i in range(0, len(perm), dm.batch_size):
            x = dm.train_x[perm[i:i + dm.batch_size]]
            x_hat, h, extras = model(x)
            loss = model.recon_loss(x, x_hat) + model.config.lam * model.penalty(h, extras)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            model.on_before_optimizer_step(opt)
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            with torch.no_grad():
                model.W_dec.div_(model.W_dec.norm(dim=0, keepdim=True))
        times.append(time.perf_counter() - start)
    return times


def whole_run_seconds(dm, hidden: int, epochs: int, figures: bool) -> float:
    from sae.callbacks import FigureCallback

    with tempfile.TemporaryDirectory() as tmp:
        callbacks = [FigureCallback(Path(tmp), class_names=dm.class_names)] if figures else []
        model = make_model(dm, "sparsemax", hidden)
        trainer = L.Trainer(max_epochs=epochs, accelerator="cpu", devices=1, logger=False,
                            enable_checkpointing=False, enable_progress_bar=False,
                            enable_model_summary=False, num_sanity_val_steps=0,
                            callbacks=callbacks)
        start = time.perf_counter()
        trainer.fit(model, datamodule=dm)
        return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=3, help="epochs per block")
    parser.add_argument("--blocks", type=int, default=2, help="interleaved repetitions")
    parser.add_argument("--run-epochs", type=int, default=10,
                        help="epochs of the whole runs with and without figures (0: skip them)")
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--data-dir", default=None)
    args = parser.parse_args()
    quiet_lightning()
    torch.set_num_threads(args.threads)
    dm = ImageDataModule("mnist", args.data_dir, batch_size=256)
    dm.setup()
    times: dict[str, list[float]] = {"bare sparsemax": [], "lightning sparsemax": [],
                                     "lightning l1 (relu)": []}
    runs: dict[str, list[float]] = {"with figures": [], "without figures": []}
    for _ in range(args.blocks):
        # drop each block's first epoch: it pays one-off warm-up costs in both loops
        times["bare sparsemax"] += bare_epochs(dm, "sparsemax", args.hidden, args.epochs)[1:]
        times["lightning sparsemax"] += lightning_epochs(
            dm, "sparsemax", args.hidden, args.epochs)[1:]
        times["lightning l1 (relu)"] += lightning_epochs(dm, "l1", args.hidden, args.epochs)[1:]
        if args.run_epochs:
            runs["without figures"].append(
                whole_run_seconds(dm, args.hidden, args.run_epochs, False))
            runs["with figures"].append(whole_run_seconds(dm, args.hidden, args.run_epochs, True))
        print("block:", {k: [round(t, 2) for t in v] for k, v in {**times, **runs}.items()},
              flush=True)
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"threads={args.threads} hidden={args.hidden} batch=256 "
          f"train images={len(dm.train_x)} epochs/block={args.epochs} blocks={args.blocks}")
    print(f"{'loop':<24}{'median s/epoch':>16}{'epochs':>8}")
    for k, v in times.items():
        print(f"{k:<24}{med[k]:>16.3f}{len(v):>8}")
    print(f"lightning / bare (sparsemax):         "
          f"{med['lightning sparsemax'] / med['bare sparsemax']:.3f}  (target <= 1.15)")
    print(f"sparsemax / relu (lightning):         "
          f"{med['lightning sparsemax'] / med['lightning l1 (relu)']:.3f}  (target <= 1.15)")
    if not args.run_epochs:
        return
    run_med = {k: statistics.median(v) for k, v in runs.items()}
    print(f"whole run {args.run_epochs} epochs + validation, median s: "
          f"without figures {run_med['without figures']:.2f}, "
          f"with figures {run_med['with figures']:.2f}")
    print(f"with / without figure callback:       "
          f"{run_med['with figures'] / run_med['without figures']:.3f}  (target <= 1.10)")


if __name__ == "__main__":
    main()
