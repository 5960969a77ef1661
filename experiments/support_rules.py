"""Which rule chooses the supports: a run's own, or a fixed threshold on the same model's scores.

    SAE_DATA_DIR=../shared/datasets python experiments/support_rules.py RUN [RUN ...]

For each finished run folder, on the test inputs that ``adaptivity`` uses (2 000 evenly spaced),
the supports of the trained model chosen three ways, at the same mean L0:

- ``own``: the model's own code at inference (for a Sparsemax-SAE trained with
  ``inference: sparsemax``, sparsemax's support of a / T(x); with the default threshold, its
  threshold on v, which makes ``own`` and ``θ on v`` nearly the same);
- ``θ on a``: one threshold θ for every unit and input on the encoder's pre-activations a, the
  rule of JumpReLU and of BatchTopK at inference (θ: the quantile of a that gives the own mean
  L0);
- ``θ on v`` (the Sparsemax-SAE only): the same on the value each unit would carry were it on
  the support, v_j = r · ReLU(a_j / (T σ(a))), the unshrunk value;
- ``top k``: each input's k̄ highest-scoring units (``support_fvu_const``, a constant L0).

For each: ``support_fvu`` (the best any code with those supports could do through the model's
decoder), ``adaptivity`` (``sae.metrics``, the published definitions) and, for ``own`` and
``θ on v``, the FVU of the model's own values on those supports (for ``θ on v`` the code
v_j·[v_j > θ]: the trained model with a fixed threshold in place of sparsemax at inference, as
BatchTopK swaps its batch top-k for a threshold). The model, its decoder
and the mean L0 are the same in every column, so a column that beats ``own`` on both says the
model's own rule chooses worse supports than a fixed threshold would on the same scores; one that
beats it on adaptivity only says the two criteria trade against each other on that model.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from sae import metrics
from sae.activations.thresholds import threshold_code
from sae.models import decode_dataset, encode_codes
from sae.models.sparsemax import SparsemaxSAE
from sae.sweep.analysis import DataCache
from sae.training.evaluate import linear_decoder
from sae.training.runfolder import RunFolder


@torch.no_grad()
def unit_scores(model, x: torch.Tensor) -> dict[str, torch.Tensor]:
    """Per-unit scores [N, H] a fixed threshold could be put on: a, and v for the Sparsemax-SAE."""
    model.eval()
    a, x_centred = model.pre_activations(x.flatten(1).to(model.device))
    out = {"θ on a": a}
    if isinstance(model, SparsemaxSAE) and model.config.groups == 1:
        out["θ on v"] = model.unshrunk_values(a, x_centred).view_as(a)
    return {k: v.float().cpu() for k, v in out.items()}


def threshold_codes(scores: torch.Tensor, mean_l0: float) -> torch.Tensor:
    """Codes [N, H]: the scores on {score > θ}, 0 elsewhere, θ the one that gives mean L0
    ``mean_l0`` (the scores must be positive where they pass it)."""
    flat = scores.flatten()
    keep = max(1, min(flat.numel() - 1, round(mean_l0 * scores.shape[0])))
    theta = flat.kthvalue(flat.numel() - keep).values
    return threshold_code(scores, theta.clamp_min(0))


def rules(folder: Path, data: DataCache) -> dict:
    """support_fvu and adaptivity of each rule for one run (see the module docstring)."""
    run = RunFolder(folder)
    model = run.model()
    dm = data.get(run.settings())
    decoder = linear_decoder(model)
    if decoder is None:
        raise ValueError(f"{folder}: the decoder is not linear")
    atoms, offset = decoder
    pca = dm.train_pca()
    idx = torch.arange(metrics.DYNAMIC_SUBSET) * len(dm.test_x) // metrics.DYNAMIC_SUBSET
    x = dm.test_x[idx].flatten(1)
    codes = encode_codes(model, x)
    mean = model.mean_image.cpu()

    def measure(c: torch.Tensor, threshold: float = 0.0) -> dict:
        return metrics.dynamic_sparsity(x, c, atoms, offset, mean, pca, threshold=threshold,
                                        max_inputs=None)

    def fvu(c: torch.Tensor) -> float:  # with the model's values, through its decoder
        return metrics.fvu(x, decode_dataset(model, c), mean)

    own = measure(codes, model.fire_threshold)
    l0 = float(metrics.l0(codes, model.fire_threshold).double().mean())
    out = {"L0": l0, "own": (own["support_fvu"], own["adaptivity"], fvu(codes)),
           "top k": (own["support_fvu_const"], 0.0, None)}
    for name, scores in unit_scores(model, x).items():
        c = threshold_codes(scores, l0)
        m = measure(c)
        # v is what the unit would carry: that code is the model's own values on those supports
        out[name] = (m["support_fvu"], m["adaptivity"], fvu(c) if name == "θ on v" else None)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("runs", nargs="+", type=Path, help="finished run folders")
    args = p.parse_args(argv)
    data = DataCache()
    names = ["own", "θ on a", "θ on v", "top k"]
    print("support FVU / adaptivity / FVU with the model's values, at the run's own mean L0")
    print(f"{'run':52s} {'L0':>5s}  " + "  ".join(f"{n:>24s}" for n in names))
    for folder in args.runs:
        if not RunFolder(folder).checkpoint.is_file():
            print(f"error: {folder} has no checkpoints/last.ckpt", file=sys.stderr)
            return 2
        r = rules(folder, data)
        cells = ["–" if n not in r else " / ".join(
            "–" if v is None else f"{v:.{d}f}" for v, d in zip(r[n], (4, 2, 4), strict=True))
            for n in names]
        print(f"{str(folder)[-52:]:52s} {r['L0']:5.1f}  " + "  ".join(f"{c:>24s}" for c in cells))
    return 0


if __name__ == "__main__":
    sys.exit(main())
