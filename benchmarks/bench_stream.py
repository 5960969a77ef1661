"""Training on a network's layer read while the network runs, against the same layer pre-dumped.

    OMP_NUM_THREADS=1 python benchmarks/bench_stream.py [--layer 2] [--steps 300] [--repeats 3]

The toolkit's MNIST classifier (``python -m sae.layer``'s MLP, 784-512-256-10, trained for one
epoch here) is the source. For the same training inputs (MNIST's training images less 5 000
validation and 5 000 test ones) and the same SAE (``--model``, ``--hidden`` units, batch 256) it
times ``--steps`` training steps under Lightning twice, interleaved ``--repeats`` times:

- **pre-dumped**: the layer's activations of every training image written to an ``.npy`` first
  (``sae.data.matrixdata.MatrixDataModule``, rows in memory), as ``python -m sae.layer`` and
  ``--data`` do;
- **streamed**: ``sae.data.streamed.StreamedDataModule``, the classifier running on a chunk of
  ``--buffer-rows`` inputs of the epoch's order at a time, a forward hook reading the layer.

A step is timed from one batch's start to the next one's (computing the rows included: a
streamed step that starts a chunk pays for the whole chunk, so the mean is the fair measure);
the first 20 steps of each are left out. Prints the median and mean ms/step of each, the ratio
streamed / pre-dumped of both (target <= 1.3), and the process's peak RSS after each.
"""

from __future__ import annotations

import argparse
import resource
import statistics
import tempfile
from pathlib import Path

import lightning.pytorch as L
import numpy as np
import torch
from bench_matrix import WARMUP, StepClock  # this folder: run as python benchmarks/...
from torch.utils.data import TensorDataset

from sae.data.images import load_arrays, to_float
from sae.data.layer import activations, train_classifier
from sae.data.matrixdata import MatrixDataModule, train_moments
from sae.data.streamed import StreamedDataModule, register_python_source
from sae.models import build_model
from sae.settings.config import SAEConfig
from sae.training.engine import quiet_lightning
from sae.training.module import SAETraining


def time_steps(dm, config: SAEConfig, steps: int) -> list[float]:
    dm.setup()
    mean, var = train_moments(dm)
    module = SAETraining(build_model(config, mean, var))
    clock = StepClock()
    trainer = L.Trainer(max_steps=steps + 1, accelerator="cpu", devices=1, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, limit_val_batches=0,
                        num_sanity_val_steps=0, callbacks=[clock])
    trainer.fit(module, train_dataloaders=dm.train_dataloader())
    return clock.step_ms()[WARMUP:]


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layer", type=int, default=2)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--model", default="topk")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--buffer-rows", type=int, default=8192)
    parser.add_argument("--data-dir", default=None)
    args = parser.parse_args()
    quiet_lightning()
    torch.manual_seed(0)

    arrays = load_arrays("mnist", args.data_dir)
    x = to_float(arrays.train_images)
    y = torch.from_numpy(arrays.train_labels)
    classifier = train_classifier("mlp", x, y, epochs=1, seed=0, say=lambda line: None)
    register_python_source((classifier, TensorDataset(x, y)))
    hook = str(args.layer - 1)
    with tempfile.TemporaryDirectory(prefix="bench-stream-") as folder:
        path = Path(folder) / "acts.npy"
        np.save(path, activations(classifier, x, args.layer).numpy())
        dim = int(np.load(path, mmap_mode="r").shape[1])
        config = SAEConfig(model=args.model, input_dim=dim, hidden=args.hidden, k=32)
        ms: dict[str, list[float]] = {"pre-dumped": [], "streamed": []}
        for rep in range(args.repeats):
            dumped = MatrixDataModule(path, batch_size=256, val_size=5000, in_memory=True)
            ms["pre-dumped"] += time_steps(dumped, config, args.steps)
            rss_dumped = peak_rss_mib()
            streamed = StreamedDataModule("python", hook, batch_size=256, val_size=5000,
                                          buffer_rows=args.buffer_rows)
            ms["streamed"] += time_steps(streamed, config, args.steps)
            print(f"repeat {rep + 1}: pre-dumped {statistics.median(ms['pre-dumped']):.2f}, "
                  f"streamed {statistics.median(ms['streamed']):.2f} ms/step (medians so far); "
                  f"peak RSS {rss_dumped:.0f} MiB, then {peak_rss_mib():.0f} MiB", flush=True)
    print(f"\nlayer {args.layer} ({dim} values), {args.model} with {args.hidden} units, batch "
          f"256, {args.steps} steps x {args.repeats} repeats, buffer {args.buffer_rows} rows")
    for name, values in ms.items():
        print(f"{name:>11}: median {statistics.median(values):.2f} ms/step, mean "
              f"{statistics.fmean(values):.2f}")
    med = statistics.median(ms["streamed"]) / statistics.median(ms["pre-dumped"])
    mean = statistics.fmean(ms["streamed"]) / statistics.fmean(ms["pre-dumped"])
    print(f"streamed / pre-dumped: {med:.2f} (medians), {mean:.2f} (means); target <= 1.3")


if __name__ == "__main__":
    main()
