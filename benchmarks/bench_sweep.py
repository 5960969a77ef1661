"""Where a sweep's time goes: training against everything else.

Runs a 10-run sweep (l1, sparsemax, topk, batchtopk and jumprelu at two sparsity levels each, 512
units, MNIST, one epoch, ``--jobs 2`` by default) in a fresh folder and prints, per run, its
training seconds (``wall_time_s`` of metrics.json), the rest of its ``sae.run`` (set-up, test
metrics, writing the folder), its analysis (probes, dynamic-sparsity measures) and the seconds
its slot was busy; then the sweep's ratio

    slot-seconds / training-seconds = jobs × sweep wall time / Σ runs' training seconds

(1.0 would be a sweep that does nothing but train). ``--epochs 20`` makes it a fixed fraction of
a converged preset (ten of its runs at its length), the measure to compare engines on.
``--engine processes`` times the way of
earlier versions (every run its own ``python -m sae.run`` process), ``--engine ray`` the runs as
tasks of a local Ray instance (its start included); ``--pages`` keeps the
per-run figures, feature browser and report on, as sweeps wrote them before; ``--cold`` gives
the sweep an empty data cache folder (``SAE_CACHE_DIR``), as on a machine that has not yet
computed the training split's principal components and raw-pixel probes.

    SAE_DATA_DIR=../shared/datasets python benchmarks/bench_sweep.py [--jobs 2] [--epochs 1]
        [--engine workers|processes|ray ...] [--pages] [--cold] [--keep DIR]

Several engines are timed one after the other, each in its own fresh folder, and the script
ends with each one's wall time against the first's (``--epochs 20 --engine workers ray``: Ray
against the local engine).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml


def sweep_file(epochs: int, pages: bool) -> dict:
    common = {"hidden": 512, "epochs": epochs, "batch_size": 256, "val_size": 5000}
    if pages:
        common.update(no_figures=False, no_features=False, no_report=False)
    return {
        "description": "benchmark: 10 runs, 512 units, MNIST",
        "datasets": ["mnist"],
        "seeds": [0],
        "common": common,
        "models": {"l1": {"lambda": [0.003, 0.03]}, "sparsemax": {"lambda": [0.003, 0.03]},
                   "topk": {"k": [16, 32]}, "batchtopk": {"k": [16, 32]},
                   "jumprelu": {"lambda": [0.01, 0.1]}},
    }


def _seconds(log: Path, pattern: str) -> float:
    found = re.findall(pattern, log.read_text(errors="replace")) if log.is_file() else []
    return float(found[-1]) if found else float("nan")


def time_sweep(engine: str, args: argparse.Namespace) -> float | None:
    """Run the benchmark sweep on ``engine`` in a fresh folder and print where its time went;
    its wall time in seconds (None when the sweep failed)."""
    keep = Path(args.keep) / engine if args.keep else None
    root = keep or Path(tempfile.mkdtemp(prefix="bench-sweep-"))
    if root.exists():
        shutil.rmtree(root)
    root.mkdir(parents=True)
    (root / "bench.yaml").write_text(yaml.safe_dump(sweep_file(args.epochs, args.pages),
                                                    sort_keys=False))
    env = dict(os.environ)
    if args.cold:
        env["SAE_CACHE_DIR"] = str(root / "cache")
    start = time.perf_counter()
    result = subprocess.run([sys.executable, "-m", "sae.compare", str(root / "bench.yaml"),
                             "--out", str(root / "sweep"), "--jobs", str(args.jobs),
                             "--engine", engine], capture_output=True, text=True, env=env)
    wall = time.perf_counter() - start
    if result.returncode != 0:
        print(result.stdout[-2000:], result.stderr[-2000:], sep="\n")
        return None
    slot_of = {m.group(1): float(m.group(2)) for m in
               re.finditer(r"\] (\S+) trained in ([\d.]+) s", result.stdout)}
    print(f"{'run':<34} {'train s':>8} {'sae.run other s':>16} {'analysis s':>11} "
          f"{'slot s':>8}")
    total_train = total_slot = 0.0
    for rel, slot in slot_of.items():
        run_dir = root / "sweep" / "runs" / rel
        log = (root / "sweep" / "logs" / rel).with_suffix(".log")
        train = json.loads((run_dir / "metrics.json").read_text())["wall_time_s"]
        run_total = _seconds(log, r"# exit code 0 after ([\d.]+) s")
        analysis = _seconds(log, r"# analysed in ([\d.]+) s")
        total_train, total_slot = total_train + train, total_slot + slot
        print(f"{rel:<34} {train:8.1f} {run_total - train:16.1f} {analysis:11.1f} {slot:8.1f}")
    print(f"\nengine {engine}, pages {'on' if args.pages else 'off'}, "
          f"data cache {'empty' if args.cold else 'as it is'}, jobs {args.jobs}, "
          f"{len(slot_of)} runs of {args.epochs} epoch(s): sweep wall {wall:.0f} s, "
          f"training {total_train:.0f} s, runs' slot time {total_slot:.0f} s")
    print(f"slot-seconds / training-seconds = {args.jobs} × {wall:.0f} / {total_train:.0f} = "
          f"{args.jobs * wall / total_train:.2f}  (busy slots only: "
          f"{total_slot / total_train:.2f})\n")
    if not keep:
        shutil.rmtree(root, ignore_errors=True)
    return wall


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--engine", nargs="+", choices=("workers", "processes", "ray"),
                   default=["workers"], help="one or more, timed one after the other")
    p.add_argument("--pages", action="store_true", help="per-run figures, browser and report")
    p.add_argument("--cold", action="store_true", help="an empty data cache folder")
    p.add_argument("--keep", default=None, help="folder to keep each engine's sweep in "
                   "(default: temp folders)")
    args = p.parse_args()

    walls = {engine: time_sweep(engine, args) for engine in args.engine}
    if None in walls.values():
        return 1
    first, *others = args.engine
    for engine in others:  # each engine's wall time against the first's, as the docs quote it
        print(f"wall time {engine} / {first} = {walls[engine]:.0f} / {walls[first]:.0f} = "
              f"{walls[engine] / walls[first]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
