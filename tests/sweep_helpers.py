"""What the sweep tests share: a tiny sweep file, and results frames built from rows."""

from pathlib import Path

import yaml

from sae.sweep import aggregate

TINY = {
    "description": "two models on 200 images",
    "datasets": ["mnist"],
    "seeds": [0],
    "common": {"hidden": 16, "k": 4, "limit_train": 200, "val_size": 100, "limit_test": 200,
               "batch_size": 64, "epochs": 1, "no_figures": True, "no_report": True},
    "models": {"kl": {"lambda": [0.1]}, "topk": {"k": [4]}},
}


def write_yaml(path: Path, data) -> Path:
    path.write_text(yaml.safe_dump(data, sort_keys=False) if not isinstance(data, str) else data)
    return path


def results(rows):
    """A results frame from (dataset, model, kind, param, value, seed, fvu, l0, probe) rows."""
    records = [dict(zip(["dataset", "model", "kind", "param", "value", "seed", "fvu", "l0_mean",
                         "probe_accuracy"], r, strict=True)) for r in rows]
    for r in records:
        r.update(mse=r["fvu"] / 10, l0_std=1.0, dead_fraction=0.1, wall_time_s=60.0,
                 l0_ink_corr=0.5,
                 # the sparsemax-loss probe ranks the other way round
                 probe_sparsemax_accuracy=1.9 - r["probe_accuracy"], probe_sparsemax_classes=1.5,
                 # like a KL-SAE, whose sub-threshold units also reconstruct
                 fvu_at_l0=r["fvu"] + (0.5 if r["kind"] == "kl" else 0.0))
    return aggregate.results_frame(records)


def summary(rows):
    return aggregate.summarize_seeds(results(rows))
