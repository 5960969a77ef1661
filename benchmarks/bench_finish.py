"""Time of what a run does after its last training step, step by step.

    python benchmarks/bench_finish.py [--repeats 3] [--max-steps 20] [--hidden 512] [--model M]

Trains one short run (MNIST, the full 10 000-image test set, default settings but --max-steps)
without its pages, then times each finishing step --repeats times on it, as ``sae.run`` runs them
(``sae.training.engine.finish``): the test metrics (with the training split's principal components,
recomputed each repeat as a fresh run does), the feature browser (from the model, data and test
codes in memory: statistics, the probe on training codes, the code and pixel embeddings, the
page) and the report. It prints the median wall-clock and CPU seconds of each and of their sum:
on a machine shared with other work the CPU seconds (all threads of this process) are the
steadier measure, and with one thread (``OMP_NUM_THREADS=1``) they bound the wall-clock time on
an idle core. Then the code embedding alone against the codes' and pixels' embeddings side by
side (two threads). The first repeat pays the imports (scikit-learn, pandas) as a run does; the
median mostly does not.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path


def timed(fn) -> tuple[float, float]:
    """(wall-clock, CPU) seconds of ``fn()``."""
    wall, cpu = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - wall, time.process_time() - cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--max-steps", type=int, default=20)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--model", default="sparsemax")
    parser.add_argument("--data-dir", default=os.environ.get("SAE_DATA_DIR"))
    args = parser.parse_args()

    from sae.data import images as data
    from sae.figures.embedding import embed_codes, embed_many
    from sae.pages.features.build import write_features
    from sae.pages.report import write_report
    from sae.runner import command as sae_run
    from sae.training import runfolder
    from sae.training.checkpoints import model_from_checkpoint, read_checkpoint
    from sae.training.evaluate import evaluate

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
        _, codes = evaluate(model, dm.test_x, dm.train_pca(), dm.train_mean)
        pixels = dm.test_x.numpy()

        def metrics():
            data._PCA.clear()  # a fresh run computes the training split's components once
            evaluate(model, dm.test_x, dm.train_pca(), dm.train_mean)

        steps = {"test metrics": metrics,
                 "feature browser": lambda: write_features(out, model, dm, test_codes=codes),
                 "report": lambda: write_report(out)}
        embeddings = {"codes alone": lambda: embed_codes(codes.numpy()),
                      "codes + pixels": lambda: embed_many([codes.numpy(), pixels])}
        times: dict[str, list[tuple[float, float]]] = {n: [] for n in [*steps, *embeddings]}
        for _ in range(args.repeats):  # interleaved: load from other processes hits all alike
            for name, fn in {**steps, **embeddings}.items():
                times[name].append(timed(fn))
                wall, cpu = times[name][-1]
                print(f"  {name}: {wall:.2f} s wall, {cpu:.2f} s CPU", flush=True)

    median = {name: tuple(statistics.median(t[i] for t in ts) for i in (0, 1))
              for name, ts in times.items()}
    print(f"\nmedian of {args.repeats} ({args.model}, {args.hidden} units, 10 000 test images, "
          f"{os.environ.get('OMP_NUM_THREADS', 'all')} threads):  wall s   CPU s")
    for name in [*steps, "total", *embeddings]:
        wall, cpu = ((sum(median[n][i] for n in steps) for i in (0, 1)) if name == "total"
                     else median[name])
        print(f"  {name:<16} {wall:8.2f} {cpu:7.2f}")


if __name__ == "__main__":
    main()
