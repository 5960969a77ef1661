"""Per SAE and step: a bare PyTorch loop, a single run, and stacks of 4, 8 and 16 runs.

    python benchmarks/bench_stack.py [--dim 64] [--hidden 512] [--batch 256] [--steps 400]
                                     [--sizes 4 8 16] [--repeats 3] [--models topk sparsemax]

On the ground-truth rows of ``bench_step.py`` (D = --dim), per repeat and model, interleaved:

- **bare**: the model's own PyTorch loop (``bench_step.bare_seconds``: forward, the run's loss,
  backward, projection, clipping, Adam, renormalisation; nothing else);
- **run**: ``python -m sae.run`` in this process (``bench_step.run_seconds``), every callback,
  logger, validation and checkpoint included, start-up and test metrics excluded;
- **stack N**: N runs of the model (learning rates 1e-3 · (1 + i/10), so that no two are the
  same model) trained as one stack (``sae.runner.stack.main``), timed the same way; its time per
  step is divided by N.

It prints each median in ms per SAE and step, and the medians of the per-repeat ratios to the
bare loop. One torch thread; ``--clock cpu`` (the default) counts this process's CPU time.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import statistics
import tempfile
import time
import warnings
from pathlib import Path

import torch
from bench_step import RunClock, bare_seconds, run_seconds, write_rows

from sae.runner import stack
from sae.training import stackrun
from sae.training.engine import quiet_lightning


def stack_seconds(path: Path, out: Path, model: str, n: int, args, clock) -> float:
    """Seconds per SAE and step of a stack of ``n`` runs of ``model`` on ``path``."""
    timer = RunClock(clock)
    build = stackrun.build_trainer

    def with_timer(config, out_, steps_per_epoch, callbacks, loggers, preloaded=None,
                   checkpoint_io=None):
        return build(config, out_, steps_per_epoch, [*callbacks, timer], loggers, preloaded,
                     checkpoint_io)

    argvs = [["--data", str(path), "--model", model, "--hidden", str(args.hidden),
              "--batch-size", str(args.batch), "--max-steps", str(args.steps), "--seed", "0",
              "--lr", f"{1e-3 * (1 + i / 10):.6g}", "--accelerator", "cpu", "--no-figures",
              "--no-features", "--no-report", "--progress", "off", "--out", str(out / str(i))]
             for i in range(n)]
    stackrun.build_trainer = with_timer
    said = io.StringIO()
    try:
        with contextlib.redirect_stdout(said), contextlib.redirect_stderr(said):
            codes = stack.main(argvs)
    finally:
        stackrun.build_trainer = build
    if any(codes) or timer.end is None:
        raise SystemExit(f"the stack of {n} failed ({codes}):\n{said.getvalue()[-2000:]}")
    return (timer.end - timer.start) / args.steps / n


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--steps", type=int, default=400, help="optimiser steps per timed loop")
    p.add_argument("--epoch-steps", type=int, default=200,
                   help="training rows / batch: a validation every this many steps")
    p.add_argument("--grad-clip", type=float, default=1.0, help="as a run's --grad-clip")
    p.add_argument("--sizes", type=int, nargs="+", default=[4, 8, 16])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--models", nargs="+", default=["topk", "sparsemax"])
    p.add_argument("--clock", choices=("cpu", "wall"), default="cpu")
    args = p.parse_args()
    torch.set_num_threads(1)
    quiet_lightning()
    warnings.filterwarnings("ignore", message=".*--lambda is ignored.*")
    clock = time.process_time if args.clock == "cpu" else time.perf_counter
    ms: dict[str, list[float]] = {}
    ratio: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        path, rows = write_rows(folder, args.dim, args.epoch_steps * args.batch)
        short = argparse.Namespace(**{**vars(args), "steps": 20})
        for m in args.models:  # not counted: kernels compile and load on first use
            bare_seconds(rows, m, short, clock)
            stack_seconds(path, folder / f"warm-{m}", m, 2, short, clock)
        for rep in range(args.repeats):
            got = {}
            for m in args.models:  # interleaved: load from other processes hits all alike
                got[f"{m} bare"] = bare = bare_seconds(rows, m, args, clock)
                got[f"{m} run"] = run_seconds(path, folder / f"run-{m}-{rep}", m, args, clock)
                for n in args.sizes:
                    got[f"{m} stack {n}"] = stack_seconds(path, folder / f"s{n}-{m}-{rep}", m,
                                                          n, args, clock)
                for k in [k for k in got if k.startswith(m) and k != f"{m} bare"]:
                    ratio.setdefault(k, []).append(got[k] / bare)
            for k, v in got.items():
                ms.setdefault(k, []).append(1e3 * v)
            print(f"repeat {rep + 1}: " + ", ".join(f"{k} {1e3 * v:.3f}" for k, v in got.items())
                  + " ms", flush=True)
    print(f"\nD {args.dim}, {args.hidden} units, batch {args.batch}, {args.steps} steps, "
          f"one thread, {args.clock} clock: median ms per SAE and step (ratio to bare)")
    for k, v in ms.items():
        shown = f" ({statistics.median(ratio[k]):.2f}x)" if k in ratio else ""
        print(f"  {k:>22}: {statistics.median(v):7.3f}{shown}")


if __name__ == "__main__":
    main()
