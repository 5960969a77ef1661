"""Epoch time of the sae.run training loop against a bare PyTorch loop, and model against model.

    python benchmarks/bench_epoch.py [--epochs 3] [--run-epochs 10] [--hidden 512] [--threads 2]
    python benchmarks/bench_epoch.py --mode steps [--widths 512 4096] [--thread-counts 1 2]
    python benchmarks/bench_epoch.py --mode steps --trained RUN [RUN ...]

Epoch mode prints median seconds per epoch (MNIST, 55 000 training images, batch 256, no
validation) and:
  - Lightning / bare loop for the same Sparsemax-SAE (target <= 1.15);
  - Sparsemax-SAE / ReLU (L1) SAE under Lightning at the same width (target <= 1.15);
  - a whole run of --run-epochs epochs (sae.run's default: 10) with validation, with / without
    the figure callback at its default cadence, which renders once, at the end (target <= 1.10).
The variants are interleaved epoch by epoch-block so that load from other processes hits all alike.

Step mode times every model's training step side by side: per repeat, thread count and width,
each model trains --warmup + --steps real steps on MNIST under Lightning (the guards, gradient
clipping and logging cadence of ``sae.run``), and the mean time of the last --steps steps (batch
start to batch end: forward, backward, clipping, optimiser step, decoder renormalisation, guards)
is its ms/step. It prints the median over repeats of ms/step and of the ratio to the L1 SAE's
within the same repeat (target <= 1.5 for every model). --dead-window is short by default so
that the dead-unit machinery (AuxK, the tracker) runs as it does in a long run with dead units.

A fresh model is not always what most of a run costs: the entmax SAE's learned alpha starts at
1.5 and ends near 2.1 on MNIST, a regime its solver prices differently, and a trained model's
scores are spread unlike a fresh one's. --trained times the models of finished run folders
instead (their last checkpoint, loaded without running code from it), side by side in the same
way, as ratios to the first folder's (say an L1 SAE's of the same width).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import lightning.pytorch as L
import torch

from sae.data.images import ImageDataModule
from sae.models import MODELS, SAEConfig, build_model
from sae.models.losses import fvu_term
from sae.settings.config import TrainConfig
from sae.training.checkpoints import model_from_checkpoint, read_checkpoint
from sae.training.engine import quiet_lightning
from sae.training.guards import NonFiniteLossGuard, training_callbacks
from sae.training.module import SAETraining


class EpochTimer(L.Callback):
    def __init__(self):
        self.times: list[float] = []

    def on_train_epoch_start(self, trainer, pl_module):
        self._start = time.perf_counter()

    def on_train_epoch_end(self, trainer, pl_module):
        self.times.append(time.perf_counter() - self._start)


class StepTimer(L.Callback):
    """Seconds of each training step, from batch start to batch end (add it last, so that the
    other callbacks' batch-end work is inside), by ``clock``: wall time, or this process's CPU
    time, which time-sharing with other processes does not inflate (with one torch thread it
    is the step's own work)."""

    def __init__(self, clock=time.perf_counter):
        self.times: list[float] = []
        self.clock = clock

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self._start = self.clock()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.times.append(self.clock() - self._start)


def make_model(dm: ImageDataModule, name: str, hidden: int, **settings):
    torch.manual_seed(0)
    data_var = float((dm.train_x - dm.train_mean).pow(2).sum(-1).mean())
    return SAETraining(build_model(SAEConfig(model=name, hidden=hidden, **settings),
                                   dm.train_mean, data_var))


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
    module = make_model(dm, name, hidden)
    model = module.sae
    opt = torch.optim.Adam(model.parameters(), lr=model.config.lr)
    times = []
    for _ in range(epochs):
        start = time.perf_counter()
        perm = torch.randperm(len(dm.train_x))
        for i in range(0, len(perm), dm.batch_size):
            x = dm.train_x[perm[i:i + dm.batch_size]]
            x_hat, h, extras = model.forward_pass(x)
            loss = fvu_term(x, x_hat, model.data_var) + model.config.lam * model.penalty(h, extras)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            module.on_before_optimizer_step(opt)
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            with torch.no_grad():
                model.W_dec.div_(model.W_dec.norm(dim=0, keepdim=True))
        times.append(time.perf_counter() - start)
    return times


def step_seconds(dm, name: str, hidden: int, steps: int, warmup: int, dead_window: int,
                 clock=time.perf_counter, model=None) -> float:
    """Mean seconds of a training step of ``name`` over ``steps`` steps after ``warmup``.

    The guards of a run are on except the non-finite-loss stop: with the default settings the KL
    SAE at 4 096 units starts above its divergence bound (some 2 000 sigmoid units at 0.5) and
    would stop at once; the stop costs one flag read per step.
    """
    if model is None:
        model = make_model(dm, name, hidden, dead_window=dead_window)
    guards = [c for c in training_callbacks(model.config) if not isinstance(c, NonFiniteLossGuard)]
    timer = StepTimer(clock)
    trainer = L.Trainer(max_steps=warmup + steps, accelerator="cpu", devices=1, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, limit_val_batches=0,
                        num_sanity_val_steps=0, gradient_clip_val=1.0, log_every_n_steps=50,
                        callbacks=[*guards, timer])
    trainer.fit(model, datamodule=dm)
    return statistics.fmean(timer.times[warmup:])


def trained_main(args, dm) -> None:
    """ms/step of the trained models of run folders, and their ratio to the first's."""
    clock = time.process_time if args.clock == "cpu" else time.perf_counter
    ms: dict = {(run, t): [] for run in args.trained for t in args.thread_counts}
    label = {}
    for rep in range(args.repeats):
        for threads in args.thread_counts:
            torch.set_num_threads(threads)
            for run in args.trained:
                model = SAETraining(model_from_checkpoint(
                    read_checkpoint(Path(run) / "checkpoints/last.ckpt")))
                label[run] = f"{model.config.model} (H={model.config.hidden})"
                ms[run, threads].append(1e3 * step_seconds(
                    dm, "", 0, args.steps, args.warmup, args.dead_window, clock, model=model))
            print(f"repeat {rep + 1} threads={threads}: " + ", ".join(
                f"{label[r]} {ms[r, threads][-1]:.1f}" for r in args.trained), flush=True)
    print(f"\nbatch {dm.batch_size}, {args.steps} steps after {args.warmup}, {args.clock} time, "
          f"median of {args.repeats} repeats: ms/step (ratio to the first)")
    for threads in args.thread_counts:
        ref = statistics.median(ms[args.trained[0], threads])
        for run in args.trained:
            med = statistics.median(ms[run, threads])
            print(f"{threads} thr {label[run]:<24}{med:8.1f} ({med / ref:4.2f}x)  {run}")


def steps_main(args, dm) -> None:
    """Every model's ms/step and its ratio to the L1 SAE's, per thread count and width."""
    models = ["l1", *[m for m in args.models if m != "l1"]]
    configs = [(t, w) for t in args.thread_counts for w in args.widths]
    clock = time.process_time if args.clock == "cpu" else time.perf_counter
    ms: dict = {(m, c): [] for m in models for c in configs}
    ratio: dict = {(m, c): [] for m in models for c in configs}
    for rep in range(args.repeats):
        for threads, width in configs:
            torch.set_num_threads(threads)
            got = {m: step_seconds(dm, m, width, args.steps, args.warmup, args.dead_window, clock)
                   for m in models}
            for m in models:
                ms[m, (threads, width)].append(1e3 * got[m])
                ratio[m, (threads, width)].append(got[m] / got["l1"])
            print(f"repeat {rep + 1} threads={threads} hidden={width}: "
                  + ", ".join(f"{m} {1e3 * got[m]:.1f}" for m in models), flush=True)
    print(f"\nbatch {dm.batch_size}, {args.steps} steps after {args.warmup}, {args.clock} time, "
          f"median of {args.repeats} repeats: ms/step (ratio to l1; target <= 1.5)")
    print(f"{'model':<11}" + "".join(f"{f'{t} thr, H={w}':>22}" for t, w in configs))
    for m in models:
        cells = [f"{statistics.median(ms[m, c]):9.1f} ({statistics.median(ratio[m, c]):4.2f}x)"
                 for c in configs]
        print(f"{m:<11}" + "".join(f"{c:>22}" for c in cells))
    worst = max(statistics.median(ratio[m, c]) for m in models for c in configs)
    print(f"largest ratio to l1: {worst:.2f} ({'met' if worst <= 1.5 else 'not met'})")


def whole_run_seconds(dm, hidden: int, epochs: int, figures: bool) -> float:
    from sae.training.callbacks import FigureCallback

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
    parser.add_argument("--mode", choices=("epochs", "steps"), default="epochs")
    steps = parser.add_argument_group("step mode")
    steps.add_argument("--models", nargs="+", default=list(MODELS), choices=MODELS)
    steps.add_argument("--widths", type=int, nargs="+", default=[512, 4096])
    steps.add_argument("--thread-counts", type=int, nargs="+", default=[1, 2])
    steps.add_argument("--steps", type=int, default=20, help="timed steps per model and width")
    steps.add_argument("--warmup", type=int, default=20, help="untimed steps before them")
    steps.add_argument("--repeats", type=int, default=3)
    steps.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                       help="wall time, or the process's CPU time (robust to a busy machine "
                       "with one thread; counts every thread's time with more)")
    steps.add_argument("--dead-window", type=int, default=2560,
                       help="samples without firing after which a unit counts as dead")
    steps.add_argument("--trained", nargs="+", metavar="RUN",
                       help="time the trained models of these run folders instead (MNIST runs; "
                       "ratios to the first)")
    args = parser.parse_args()
    quiet_lightning()
    torch.set_num_threads(args.threads)
    dm = ImageDataModule("mnist", args.data_dir, batch_size=TrainConfig().batch_size)  # sae.run's
    dm.setup()
    if args.mode == "steps":
        trained_main(args, dm) if args.trained else steps_main(args, dm)
        return
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
