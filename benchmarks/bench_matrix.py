"""Training from an activation file read as it goes against the same rows in memory.

    OMP_NUM_THREADS=1 python benchmarks/bench_matrix.py [--gib 2.1] [--dim 256] [--steps 300]
                                                        [--folder DIR] [--keep]

Writes an (N, D) float32 ``.npy`` of ``--gib`` GiB of random rank-32 rows (default 2.1 GiB,
256 values per row: 2.2 million rows) into ``--folder`` (default: a new temporary folder beside
the system's temp files), after checking that the disk holds twice that much. Then, for the same
``sae.data.matrixdata.MatrixDataModule`` split (1 000 validation and 1 000 test rows carved off) it
trains the same model (``--model``, ``--hidden`` units, batch 256) under Lightning for
``--steps`` steps, first with the training rows read into memory, then read from the file a
batch at a time (``sae.data.npyfile.FileRows``), after asking the kernel to drop the file's
pages from its cache (``posix_fadvise(DONTNEED)``) so that the reads come from the disk, as for
a file larger than memory.

A step is timed from one batch's start to the next one's (fetching the batch included); the
first 20 steps of each are left out. Prints the median and mean ms/step of each and the ratio
from the file / in memory of the means (target <= 1.25). The file is deleted at the end unless
``--keep``.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import lightning.pytorch as L
import numpy as np
import torch

from sae.data.matrixdata import MatrixDataModule, drop_cache, train_moments
from sae.models import build_model
from sae.settings.config import SAEConfig
from sae.training.engine import quiet_lightning
from sae.training.module import SAETraining

WARMUP = 20


class StepClock(L.Callback):
    """Start-to-start time of every training batch (the next batch's fetch included)."""

    def __init__(self):
        self.starts: list[float] = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self.starts.append(time.perf_counter())

    def on_train_end(self, trainer, pl_module) -> None:
        self.starts.append(time.perf_counter())

    def step_ms(self) -> list[float]:
        return [1000 * (b - a) for a, b in zip(self.starts, self.starts[1:], strict=False)]


def write_matrix(path: Path, rows: int, dim: int, seed: int = 0) -> None:
    """Rows of rank 32 (sparse non-negative codes times a fixed basis), a block at a time."""
    from numpy.lib.format import open_memmap

    r = np.random.default_rng(seed)
    basis = r.standard_normal((32, dim), dtype=np.float32)
    out = open_memmap(path, mode="w+", dtype=np.float32, shape=(rows, dim))
    block = 1 << 16
    for start in range(0, rows, block):
        n = min(block, rows - start)
        codes = np.maximum(r.standard_normal((n, 32), dtype=np.float32), 0)
        out[start:start + n] = codes @ basis
    out.flush()
    del out


def time_steps(path: Path, in_memory: bool, config: SAEConfig, steps: int) -> list[float]:
    dm = MatrixDataModule(path, batch_size=256, val_size=1000, in_memory=in_memory)
    dm.setup()
    mean, var = train_moments(dm)
    model = SAETraining(build_model(config, mean, var))
    if not in_memory:
        drop_cache(path)  # the reads of the run come from the disk
    clock = StepClock()
    trainer = L.Trainer(max_steps=steps, accelerator="cpu", devices=1, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, limit_val_batches=0,
                        num_sanity_val_steps=0, callbacks=[clock])
    trainer.fit(model, train_dataloaders=dm.train_dataloader())
    return clock.step_ms()[WARMUP:]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gib", type=float, default=2.1)
    parser.add_argument("--dim", type=int, default=256)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--model", default="topk")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--folder", type=Path, default=None)
    parser.add_argument("--keep", action="store_true")
    args = parser.parse_args()
    quiet_lightning()
    torch.manual_seed(0)

    rows = int(args.gib * (1 << 30)) // (4 * args.dim)
    folder = Path(tempfile.mkdtemp(prefix="bench-matrix-", dir=args.folder))
    need = 2 * rows * 4 * args.dim
    free = shutil.disk_usage(folder).free
    if free < need:
        raise SystemExit(f"{folder}: {free >> 30} GiB free, {need >> 30} GiB needed")
    path = folder / "acts.npy"
    try:
        start = time.perf_counter()
        write_matrix(path, rows, args.dim)
        print(f"wrote {path}: {rows:,} x {args.dim} float32, "
              f"{path.stat().st_size / (1 << 30):.2f} GiB in {time.perf_counter() - start:.0f} s",
              flush=True)
        config = SAEConfig(model=args.model, input_dim=args.dim, hidden=args.hidden, k=32)
        results = {}
        for name, in_memory in (("in memory", True), ("from the file, cold", False)):
            ms = time_steps(path, in_memory, config, args.steps)
            results[name] = ms
            print(f"{name:>20}: median {statistics.median(ms):.1f} ms/step, mean "
                  f"{statistics.fmean(ms):.1f} ms/step over {len(ms)} steps", flush=True)
        ratio = statistics.fmean(results["from the file, cold"]) / \
            statistics.fmean(results["in memory"])
        print(f"from the file / in memory (means): {ratio:.2f} (target <= 1.25)")
    finally:
        if not args.keep:
            shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
