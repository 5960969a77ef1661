"""A run's start on a large activation matrix against the same run on a small one.

    python benchmarks/bench_startup.py [--rows 6000000] [--small-rows 100000] [--dim 128]
                                       [--steps 3000] [--repeats 3] [--folder DIR] [--keep]

Writes two float32 ``.npy`` files of rank-32 rows (:func:`bench_matrix.write_matrix`): by default
6 000 000 x 128 (3.07 GB) and 100 000 x 128 (51 MB), into a new temporary folder (``--folder``:
beside it), after checking the disk holds them, and reads each once so that the page cache is
warm. For each file, ``python -m sae.run --data FILE --model l1`` is then run as a user runs it:

- ``--repeats`` times with ``--max-steps 1``: the time from the command's start to its first
  validation line (which follows the first step at once), and the longest stretch without a
  line on stdout or stderr before it;
- once with ``--max-steps --steps``: the peak resident memory of the process over the whole run
  (sampled every 50 ms from ``/proc``, Linux only), training, test metrics and pages included.

Prints the medians and the targets: the first step within 10 s on the large file, no silence
over 5 s before it, and a peak memory at most 1.5 GB above the small file's. The files are
deleted at the end unless ``--keep``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from bench_matrix import write_matrix


def rss_bytes(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def run(path: Path, steps: int, out: Path) -> dict:
    """One ``sae.run`` on ``path``: each output line's time, the first step's, the peak RSS."""
    shutil.rmtree(out, ignore_errors=True)
    start = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "sae.run", "--data", str(path), "--model",
                             "l1", "--max-steps", str(steps), "--no-figures", "--out", str(out)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=dict(os.environ, PYTHONUNBUFFERED="1"))
    peak = [0]

    def sample() -> None:
        while proc.poll() is None:
            peak[0] = max(peak[0], rss_bytes(proc.pid))
            time.sleep(0.05)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    stamps, first_step = [], None
    for line in proc.stdout:
        now = time.perf_counter() - start
        stamps.append(now)
        if first_step is None and line.startswith("epoch 1/1 · step"):
            first_step = now
    if proc.wait() != 0:
        raise SystemExit(f"sae.run on {path} failed with exit code {proc.returncode}")
    sampler.join()
    before = [0.0] + [t for t in stamps if first_step is None or t <= first_step]
    silence = max(b - a for a, b in zip(before, before[1:], strict=False))
    return {"first_step": first_step, "silence": silence, "peak": peak[0]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=6_000_000)
    parser.add_argument("--small-rows", type=int, default=100_000)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--folder", type=Path, default=None)
    parser.add_argument("--keep", action="store_true")
    args = parser.parse_args()

    folder = Path(tempfile.mkdtemp(prefix="bench-startup-", dir=args.folder))
    need = (args.rows + args.small_rows) * args.dim * 4
    if shutil.disk_usage(folder).free < 2 * need:
        raise SystemExit(f"{folder}: {need * 2 >> 30} GiB free needed")
    try:
        files = {}
        for name, rows in (("large", args.rows), ("small", args.small_rows)):
            path = files[name] = folder / f"{name}.npy"
            write_matrix(path, rows, args.dim)
            with open(path, "rb") as f:  # a warm page cache, as after writing it
                while f.read(64 << 20):
                    pass
            print(f"{name}: {rows:,} x {args.dim} float32, {path.stat().st_size / 1e9:.2f} GB",
                  flush=True)
        results = {}
        for name, path in files.items():
            starts = [run(path, 1, folder / "run") for _ in range(args.repeats)]
            trained = run(path, args.steps, folder / "run")
            results[name] = (statistics.median(r["first_step"] for r in starts),
                             max(r["silence"] for r in starts), trained["peak"])
            first, silence, peak = results[name]
            print(f"{name:>6}: first step at {first:.1f} s (median of {args.repeats}), longest "
                  f"silence before it {silence:.1f} s, peak RSS over {args.steps} steps "
                  f"{peak / 1e9:.2f} GB", flush=True)
        large, small = results["large"], results["small"]
        print(f"first step on the large file: {large[0]:.1f} s (target <= 10 s); "
              f"{large[0] / small[0]:.2f} x the small file's")
        print(f"longest silence before the first step: {large[1]:.1f} s (target <= 5 s)")
        print(f"peak RSS, large - small: {(large[2] - small[2]) / 1e9:.2f} GB (target <= 1.5 GB)")
    finally:
        if not args.keep:
            shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
