"""What training several SAEs on shared batches could save: the data path's share of an epoch.

A sweep's runs that share a dataset, an architecture and a seed of data order read the same
batches. Trained in one worker on batches read once, N of them would save the data path of N − 1
(reading the rows, shuffling, collating, Lightning's loop around them) and nothing else: each SAE
still does its own matrix products. This prints, for the MNIST preset's setup (55 000 images,
batch 256, 512 units, one thread as in a 2-core sweep with --jobs 2), the median seconds of

  - an epoch of the data path alone: the training loader iterated, each batch touched;
  - an epoch of training each model under Lightning (as bench_epoch.py, no validation);
  - an epoch of the L1 SAE in a bare PyTorch loop: what Lightning's loop adds per step is what
    one loop around N SAEs could also share;

and the share of each model's epoch that sharing could take off: the data path's, and with it
the loop's.

    SAE_DATA_DIR=../shared/datasets python benchmarks/bench_shared_batches.py [--repeats 3]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from bench_epoch import bare_epochs, lightning_epochs

from sae.data.images import ImageDataModule
from sae.training.engine import quiet_lightning

MODELS = ("l1", "sparsemax", "topk", "batchtopk")


def data_epoch(dm: ImageDataModule) -> float:
    """Seconds to read one epoch of training batches, touching each."""
    start, total = time.perf_counter(), 0.0
    for batch in dm.train_dataloader():
        x = batch[0] if isinstance(batch, list | tuple) else batch
        total += float(x[0, 0])
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--data-dir", default=None)
    args = parser.parse_args()
    quiet_lightning()
    torch.set_num_threads(args.threads)
    dm = ImageDataModule("mnist", args.data_dir, batch_size=256, val_size=5000)
    dm.setup()
    data, bare, train = [], [], {m: [] for m in MODELS}
    for _ in range(args.repeats):  # interleaved, so that load from elsewhere hits all alike
        data.append(data_epoch(dm))
        bare += bare_epochs(dm, "l1", args.hidden, epochs=1)
        for model in MODELS:
            train[model] += lightning_epochs(dm, model, args.hidden, epochs=1)
    d, loop = statistics.median(data), statistics.median(train["l1"]) - statistics.median(bare)
    print(f"data path: {d:.2f} s an epoch; Lightning's loop beyond a bare one (L1 SAE): "
          f"{loop:.2f} s (medians of {args.repeats})")
    for model in MODELS:
        t = statistics.median(train[model])
        print(f"{model:10s} training {t:6.2f} s an epoch · data path / training = {d / t:.3f} · "
              f"with the loop {(d + max(loop, 0.0)) / t:.3f}")


if __name__ == "__main__":
    main()
