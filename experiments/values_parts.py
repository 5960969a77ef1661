"""What a run's values lose against the best values on its own supports, and why.

    SAE_DATA_DIR=../shared/datasets python experiments/values_parts.py RUN [RUN ...]

For each finished run folder with a linear decoder x̂ = W h + b (unit-norm atoms), on the whole
test set (``support_fvu`` in metrics.json uses 2 000 evenly spaced test inputs, so the first
columns differ a little from the published ones):

- ``fvu``: the model's own reconstruction;
- ``support fvu``: the least-squares code on each input's own support (``sae.metrics
  .dynamic_sparsity``), the best any values could do there; ``values lose`` = fvu − support fvu;
- ``scaled fvu``: each input's code multiplied by its best scalar c_n = ⟨x_n − b, W h_n⟩ /
  ‖W h_n‖², and ``scale share`` = (fvu − scaled fvu) / (fvu − support fvu): how much of what the
  values lose is one wrong magnitude per input (the Sparsemax-SAE's values carry an input-wide
  factor r(x)) rather than wrong proportions among the active units;
- ``coherence``: the mean over inputs of the mean |cos| between two active atoms of the input.
  Least squares on a support undoes the overlap of its atoms (the Gram matrix W_Sᵀ W_S); an
  encoder's values, one score per unit, cannot, so the more the active atoms overlap, the more
  the values lose to the support's best (with orthogonal atoms the two coincide).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from sae import metrics
from sae.data.images import DataSourceError
from sae.models import encode_dataset
from sae.settings.setting import UsageError
from sae.sweep.analysis import DataCache
from sae.training.checkpoints import CheckpointError
from sae.training.evaluate import linear_decoder
from sae.training.runfolder import RunFolder, RunFolderError

# what a damaged or unsuitable run folder raises: one line and exit 2, never a traceback
BAD_RUN = (CheckpointError, DataSourceError, OSError, RunFolderError, UsageError, ValueError)


def coherence(codes: torch.Tensor, atoms: torch.Tensor, threshold: float = 0.0) -> float:
    """Mean over inputs with two or more active units of the mean |cos| of their active atoms.

    codes [N, H], atoms W [D, H]; inputs with fewer than two active units are left out.
    """
    w = atoms.double() / atoms.double().norm(dim=0).clamp_min(1e-12)
    cos = (w.T @ w).abs()  # [H, H]
    total, count = 0.0, 0
    for row in metrics.active(codes, threshold):
        idx = row.nonzero().squeeze(1)
        k = idx.numel()
        if k < 2:
            continue
        block = cos[idx][:, idx]
        total += float((block.sum() - block.diagonal().sum()) / (k * (k - 1)))
        count += 1
    return total / count if count else float("nan")


def parts(folder: Path, data: DataCache) -> dict:
    """The value measures of one run (see the module docstring)."""
    run = RunFolder(folder)
    settings = run.settings()
    model = run.model()
    decoder = linear_decoder(model)
    if decoder is None:
        raise ValueError("the decoder is not linear (--arch mlp): no atoms to compare")
    atoms, offset = decoder
    dm = data.get(settings)
    x = dm.test_x.flatten(1).double()
    x_hat, codes = encode_dataset(model, dm.test_x)
    mean = model.mean_image.cpu().flatten().double()
    fvu = metrics.fvu(x, x_hat.double(), mean)
    support = metrics.dynamic_sparsity(dm.test_x, codes, atoms, offset, model.mean_image.cpu(),
                                       dm.train_pca(), threshold=model.fire_threshold,
                                       max_inputs=None)["support_fvu"]
    y, part = x - offset.double(), x_hat.double() - offset.double()  # part = W h
    scale = (y * part).sum(1) / part.square().sum(1).clamp_min(1e-30)
    scaled = metrics.fvu(x, offset.double() + scale[:, None] * part, mean)
    lose = fvu - support
    return {"l0": float(metrics.l0(codes, model.fire_threshold).double().mean()), "fvu": fvu,
            "support": support, "lose": lose, "scaled": scaled,
            "share": (fvu - scaled) / lose if lose > 0 else float("nan"),
            "coherence": coherence(codes, atoms, model.fire_threshold)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("runs", nargs="+", type=Path, help="finished run folders")
    args = p.parse_args(argv)
    data = DataCache()
    print(f"{'run':52s} {'L0':>6s} {'fvu':>7s} {'support':>8s} {'lose':>7s} {'scaled':>7s} "
          f"{'share':>6s} {'coherence':>9s}")
    for folder in args.runs:
        if not RunFolder(folder).checkpoint.is_file():
            print(f"error: {folder} has no checkpoints/last.ckpt", file=sys.stderr)
            return 2
        try:
            r = parts(folder, data)
        except BAD_RUN as e:
            print(f"error: {folder}: {e}", file=sys.stderr)
            return 2
        print(f"{str(folder)[-52:]:52s} {r['l0']:6.1f} {r['fvu']:7.4f} {r['support']:8.4f} "
              f"{r['lose']:7.4f} {r['scaled']:7.4f} {r['share']:6.2f} {r['coherence']:9.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
