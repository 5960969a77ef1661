"""Time of what a run does after its last training step, step by step.

    python benchmarks/bench_finish.py [--repeats 3] [--max-steps 20] [--hidden 512] [--model M]

Trains one short run (MNIST, the full 10 000-image test set, default settings but --max-steps)
without its pages, then times each finishing step --repeats times on it, as ``sae.run`` runs them
(``sae.training.finish``): the test metrics (with the training split's principal components,
recomputed each repeat as a fresh run does), the feature browser (encoding, statistics, the code
embedding, the page) and the report. It prints the median seconds of each and of their sum, and
the code embedding alone at the current setting against the former one (2 000 codes, Barnes-Hut
angle 0.5) with their ratio. The first repeat pays the imports (scikit-learn, pandas) as a run
does; the median mostly does not.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--max-steps", type=int, default=20)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--model", default="sparsemax")
    parser.add_argument("--data-dir", default=os.environ.get("SAE_DATA_DIR"))
    args = parser.parse_args()

    from sae import data, runfolder
    from sae import run as sae_run
    from sae.checkpoints import read_checkpoint
    from sae.evaluate import evaluate
    from sae.features import build_features
    from sae.figures.embedding import embed_codes
    from sae.models import encode_dataset, model_from_checkpoint
    from sae.report import write_report

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "run"
        argv = ["--out", str(out), "--model", args.model, "--hidden", str(args.hidden),
                "--max-steps", str(args.max_steps), "--no-features", "--no-report",
                "--progress", "off"] + (["--data-dir", args.data_dir] if args.data_dir else [])
        if sae_run.main(argv) != 0:
            raise SystemExit("the training run failed")
        runfolder.release(out)
        model = model_from_checkpoint(read_checkpoint(out / "checkpoints" / "last.ckpt"))
        dm = data.ImageDataModule("mnist", args.data_dir)
        dm.load()
        _, codes = encode_dataset(model, dm.test_x)
        codes = codes.numpy()

        def metrics():
            data._PCA.clear()  # a fresh run computes the training split's components once
            evaluate(model, dm.test_x, dm.train_pca(), dm.train_mean)

        steps = {"test metrics": metrics,
                 "feature browser": lambda: build_features(out, data_dir=args.data_dir),
                 "report": lambda: write_report(out)}
        embeddings = {"embedding now": lambda: embed_codes(codes),
                      "embedding before": lambda: embed_codes(codes, 2000, angle=0.5)}
        times: dict[str, list[float]] = {name: [] for name in [*steps, *embeddings]}
        for _ in range(args.repeats):  # interleaved: load from other processes hits all alike
            for name, fn in {**steps, **embeddings}.items():
                times[name].append(timed(fn))
                print(f"  {name}: {times[name][-1]:.2f} s", flush=True)

    median = {name: statistics.median(t) for name, t in times.items()}
    print(f"\nmedian of {args.repeats} ({args.model}, {args.hidden} units, 10 000 test images):")
    for name in steps:
        print(f"  {name:<16} {median[name]:6.2f} s")
    print(f"  {'total':<16} {sum(median[n] for n in steps):6.2f} s")
    print(f"  code embedding: {median['embedding now']:.2f} s now, "
          f"{median['embedding before']:.2f} s before "
          f"(x{median['embedding before'] / median['embedding now']:.1f} faster)")


if __name__ == "__main__":
    main()
