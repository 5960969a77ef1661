"""A run's training step against a bare PyTorch loop of the same model on the same rows.

    python benchmarks/bench_step.py [--dim 64] [--hidden 512] [--batch 256] [--steps 600]
                                    [--repeats 5] [--models topk sparsemax] [--clock cpu]
    python benchmarks/bench_step.py --profile topk [--steps 2000]

Writes a small ground-truth data set (``sae.data.synth.generate``, D = --dim) as a ``.npy`` in a
temporary folder, then, per repeat and model, interleaved:

- **bare**: the model's own PyTorch loop on the same training rows in memory: forward, the loss
  a run computes (FVU + λ · penalty + the variant's extra term, AuxK with its dead-unit
  tracker), backward, the decoder-norm gradient projection, gradient clipping (``--grad-clip``,
  a run's default), an Adam step and the decoder's renormalisation; no validation, logging or
  callbacks;
- **run**: ``python -m sae.run`` in this process (``sae.runner.command.main``) on the ``.npy``
  with ``--max-steps --steps --no-figures --no-features --no-report --progress off``: every
  callback, logger, validation (one per epoch of --epoch-steps steps) and checkpoint of a run,
  timed from the first training step's start to the end of training (the last validation and
  its checkpoints included; the start-up and the test metrics after it excluded).

It prints the median per-step time of each and the median of the per-repeat ratios run / bare
(target <= 1.5 at D 64, 512 units, batch 256), and two floors between them:

- **module**: the run's training module in a Trainer of its own (no callbacks, loggers,
  validation, checkpoints or file reads; batches of the same rows made beforehand): Lightning's
  loop and hooks around the run's step, apart from the run's own extras;
- **empty**: a Lightning loop of the same length whose step only returns a constant loss: what
  Lightning's loop alone puts under any run.

One torch thread (``torch.set_num_threads(1)``). ``--clock cpu`` (the default) counts this
process's CPU time, which other processes on the machine do not inflate; ``--clock wall`` counts
wall time. A first round, not counted, compiles and loads the kernels.
``--profile MODEL`` runs one such run under cProfile and prints where its steps spend their
time.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import io
import pstats
import statistics
import tempfile
import time
import warnings
from pathlib import Path

import lightning.pytorch as L
import numpy as np
import torch

from sae.data.synth import SynthConfig, generate
from sae.models import SAEConfig, build_model
from sae.models.losses import column_norms, fvu_term
from sae.runner import command
from sae.training import engine
from sae.training.engine import quiet_lightning
from sae.training.module import training_module

VAL_SIZE = 5000  # a run's default validation rows (carved again as test rows from a .npy)
WARMUP = 10  # bare steps before the clock starts: as a run's first steps, after the kernels load


class RunClock(L.Callback):
    """The clock at the first training step's start and at the end of training."""

    def __init__(self, clock):
        self.clock, self.start, self.end = clock, None, None

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if self.start is None:
            self.start = self.clock()

    def on_train_end(self, trainer, pl_module) -> None:
        self.end = self.clock()


def write_rows(folder: Path, dim: int, train_rows: int) -> tuple[Path, torch.Tensor]:
    """A ``.npy`` of ground-truth rows with room for the validation and test rows a run carves
    from it, and the rows as a tensor."""
    cfg = SynthConfig(dim=dim, features=4 * dim, train=train_rows + 2 * VAL_SIZE, test=10)
    rows = generate(cfg).train_x
    path = folder / "rows.npy"
    np.save(path, rows)
    return path, torch.from_numpy(rows)


def run_seconds(path: Path, out: Path, model: str, args, clock) -> float:
    """Seconds per step of ``python -m sae.run`` on ``path``, start-up and test excluded."""
    timer = RunClock(clock)
    build = engine.build_trainer

    def with_timer(config, out_, steps_per_epoch, callbacks, loggers, preloaded=None):
        return build(config, out_, steps_per_epoch, [*callbacks, timer], loggers, preloaded)

    argv = ["--data", str(path), "--model", model, "--hidden", str(args.hidden),
            "--batch-size", str(args.batch), "--max-steps", str(args.steps), "--seed", "0",
            "--grad-clip", str(args.grad_clip), "--accelerator", "cpu", "--no-figures",
            "--no-features", "--no-report", "--progress", "off", "--out", str(out)]
    engine.build_trainer = with_timer
    said = io.StringIO()
    try:
        with contextlib.redirect_stdout(said), contextlib.redirect_stderr(said):
            code = command.main(argv)
    finally:
        engine.build_trainer = build
    if code != 0 or timer.end is None:
        raise SystemExit(f"sae.run {' '.join(argv)} failed with exit code {code}:\n"
                         f"{said.getvalue()[-2000:]}")
    return (timer.end - timer.start) / args.steps


def bare_seconds(rows: torch.Tensor, model_name: str, args, clock) -> float:
    """Seconds per step of the same model's plain PyTorch loop (the module docstring's)."""
    torch.manual_seed(0)
    x_all = rows[: args.epoch_steps * args.batch]
    mean = x_all.mean(0)
    data_var = float((x_all - mean).pow(2).sum(-1).mean())
    model = build_model(SAEConfig(model=model_name, hidden=args.hidden, input_dim=args.dim),
                        mean, data_var)
    opt = torch.optim.Adam(model.param_groups(), lr=model.config.lr)
    since = torch.zeros(args.hidden, dtype=torch.long)
    params = list(model.parameters())
    W = model.W_dec
    perm = torch.randperm(len(x_all))
    start = None
    for step in range(WARMUP + args.steps):
        if step == WARMUP:
            start = clock()
        i = step % args.epoch_steps * args.batch
        x = x_all[perm[i:i + args.batch]]
        x_hat, h, extras = model.forward_pass(x)
        loss = fvu_term(x, x_hat, model.data_var) + model.config.lam * model.penalty(h, extras)
        if model.needs_dead_units:
            extras["dead"] = since >= model.config.dead_window
        aux = model.extra_loss(x, x_hat, h, extras)
        if aux is not None:
            loss = loss + aux
        with torch.no_grad():
            since.add_(len(x)).masked_fill_(h.amax(0) > model.fire_threshold, 0)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        with torch.no_grad():
            W.grad.addcmul_(W, torch.linalg.vecdot(W.grad, W, dim=0), value=-1)
            if args.grad_clip:
                torch.nn.utils.clip_grad_norm_(params, args.grad_clip)
        opt.step()
        with torch.no_grad():
            W.div_(column_norms(W).clamp_min_(1e-8))
    return (clock() - start) / args.steps


class EmptyStep(L.LightningModule):
    """A module whose step is free: what remains of a step is Lightning's loop."""

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(1))

    def training_step(self, batch, batch_idx):
        return self.w.sum()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.0)


def empty_seconds(rows: torch.Tensor, args, clock) -> float:
    """Seconds per step of a Lightning loop over batches of the same rows with a free step."""
    # the batches made beforehand and served whole: no indexing or collation in the loop
    batches = [(x,) for x in rows[: args.epoch_steps * args.batch].split(args.batch)]
    loader = torch.utils.data.DataLoader(batches, batch_size=None)
    timer = RunClock(clock)
    trainer = L.Trainer(max_steps=args.steps, accelerator="cpu", devices=1, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, num_sanity_val_steps=0,
                        callbacks=[timer])
    trainer.fit(EmptyStep(), train_dataloaders=loader)
    return (timer.end - timer.start) / args.steps


def module_seconds(rows: torch.Tensor, model_name: str, args, clock) -> float:
    """Seconds per step of the run's training module in a Trainer of its own: Lightning's loop
    and hooks around the run's step, without the run's callbacks, loggers, validation,
    checkpoints or file reads (batches of the same rows made beforehand)."""
    x_all = rows[: args.epoch_steps * args.batch]
    mean = x_all.mean(0)
    torch.manual_seed(0)
    module = training_module(SAEConfig(model=model_name, hidden=args.hidden, input_dim=args.dim),
                             mean, float((x_all - mean).pow(2).sum(-1).mean()))
    batches = [(x,) for x in x_all[torch.randperm(len(x_all))].split(args.batch)]
    timer = RunClock(clock)
    trainer = L.Trainer(max_steps=args.steps, accelerator="cpu", devices=1, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, num_sanity_val_steps=0,
                        gradient_clip_val=args.grad_clip or None, log_every_n_steps=50,
                        limit_val_batches=0, callbacks=[timer])
    trainer.fit(module, train_dataloaders=torch.utils.data.DataLoader(batches, batch_size=None))
    return (timer.end - timer.start) / args.steps


def profile(path: Path, out: Path, args) -> None:
    """One run of ``args.profile`` under cProfile: the functions of most own time, and of most
    time with what they call; a short run before it compiles and imports what a run uses."""
    run_seconds(path, out.with_name("warm"), args.profile,
                argparse.Namespace(**{**vars(args), "steps": 20}), time.process_time)
    profiler = cProfile.Profile()
    profiler.enable()
    seconds = run_seconds(path, out, args.profile, args, time.process_time)
    profiler.disable()
    print(f"{args.profile}: {1e3 * seconds:.3f} ms a step (CPU time, under the profiler)")
    for key in ("tottime", "cumulative"):
        pstats.Stats(profiler).strip_dirs().sort_stats(key).print_stats(args.top)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--steps", type=int, default=600, help="optimiser steps per timed loop")
    p.add_argument("--epoch-steps", type=int, default=200,
                   help="training rows / batch: a validation every this many steps")
    p.add_argument("--grad-clip", type=float, default=1.0, help="as a run's --grad-clip")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--models", nargs="+", default=["topk", "sparsemax"])
    p.add_argument("--clock", choices=("cpu", "wall"), default="cpu")
    p.add_argument("--profile", metavar="MODEL", help="profile one run of MODEL instead")
    p.add_argument("--top", type=int, default=40, help="--profile: functions shown")
    args = p.parse_args()
    torch.set_num_threads(1)
    quiet_lightning()
    # the module's own Trainer trains without validation on purpose
    warnings.filterwarnings("ignore", message=".*but have no `val_dataloader`.*")
    clock = time.process_time if args.clock == "cpu" else time.perf_counter
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        path, rows = write_rows(folder, args.dim, args.epoch_steps * args.batch)
        if args.profile:
            profile(path, folder / "run", args)
            return
        short = argparse.Namespace(**{**vars(args), "steps": 20})
        for m in args.models:  # not counted: kernels compile (numba) and load on first use
            bare_seconds(rows, m, short, clock)
            run_seconds(path, folder / f"warm-{m}", m, short, clock)
        ms: dict[str, list[float]] = {}
        ratio: dict[str, list[float]] = {}
        for rep in range(args.repeats):
            got = {"empty": empty_seconds(rows, args, clock)}
            for m in args.models:  # interleaved: load from other processes hits both alike
                got[f"{m} bare"] = bare_seconds(rows, m, args, clock)
                got[f"{m} module"] = module_seconds(rows, m, args, clock)
                got[f"{m} run"] = run_seconds(path, folder / f"run-{m}-{rep}", m, args, clock)
                ratio.setdefault(m, []).append(got[f"{m} run"] / got[f"{m} bare"])
            for k, v in got.items():
                ms.setdefault(k, []).append(1e3 * v)
            print(f"repeat {rep + 1}: " + ", ".join(f"{k} {1e3 * v:.3f}" for k, v in got.items())
                  + " ms", flush=True)
    print(f"\nD {args.dim}, {args.hidden} units, batch {args.batch}, {args.steps} steps "
          f"(a validation every {args.epoch_steps}), 1 thread, {args.clock} time, median of "
          f"{args.repeats} repeats")
    print(f"empty Lightning step: {statistics.median(ms['empty']):.3f} ms")
    for m in args.models:
        bare, module, run = (statistics.median(ms[f"{m} {k}"]) for k in ("bare", "module", "run"))
        r = statistics.median(ratio[m])
        print(f"{m:<10} bare {bare:7.3f} ms  module {module:7.3f} ms  run {run:7.3f} ms  "
              f"run/bare {r:4.2f}x (target <= 1.5: {'met' if r <= 1.5 else 'not met'})")


if __name__ == "__main__":
    main()
