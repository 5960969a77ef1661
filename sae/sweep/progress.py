"""A sweep's progress lines: the counts so far, the time left, a run's metrics or its failure's
cause, as each run finishes."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path

from sae.sweep.analysis import run_metrics
from sae.sweep.spec import Run

__all__ = ["Progress", "clock", "last_line", "metrics_note"]

def clock(seconds: float) -> str:
    m, s = divmod(int(seconds), 60)
    return f"{m // 60}:{m % 60:02d}:{s:02d}" if m >= 60 else f"{m}:{s:02d}"


def last_line(path: Path) -> str:
    """The cause of a failed run: its last ``error:`` line, else its last line of output (not the
    ``# exit code`` line the pool appends)."""
    try:
        lines = [ln for ln in path.read_text(errors="replace").splitlines()
                 if ln.strip() and not ln.startswith("# exit code")]
    except OSError:
        return ""
    errors = [ln for ln in lines if ln.startswith("error:")]
    return (errors or lines or [""])[-1][:200]


@dataclass
class Progress:
    """Counts of the sweep so far, and the one line printed as each run finishes.

    Once a run has trained, the line also estimates the time left: the runs still to train
    (``to_train`` less those finished) times the mean seconds a trained run held its slot
    (its training and, in a worker, its analysis), shared among the ``jobs`` slots. It counts
    the running runs as not started, so it errs long by at most one run's time.
    """

    total: int
    jobs: int = 1
    to_train: int = 0
    start: float = field(default_factory=time.perf_counter)
    finished: int = 0
    trained: int = 0
    skipped: int = 0
    failed: int = 0
    trained_seconds: float = 0.0

    def left(self) -> float | None:
        """Estimated seconds until the last run has trained; None before any has."""
        left = self.to_train - self.trained - self.failed
        if self.trained == 0 or left <= 0:
            return None
        return self.trained_seconds / self.trained * math.ceil(left / max(1, self.jobs))

    def line(self, run: Run, status: str, detail: str = "") -> str:
        self.finished += 1
        width = len(str(self.total))
        left = self.left()
        counts = (f"{self.trained} trained, {self.skipped} skipped, {self.failed} failed, "
                  f"{clock(time.perf_counter() - self.start)} elapsed"
                  + (f", about {clock(left)} left" if left is not None else ""))
        text = f"[{self.finished:>{width}}/{self.total}] {run.rel.relative_to('runs')} {status}"
        return f"{text}{' · ' + detail if detail else ''} ({counts})"


def metrics_note(folder: Path, analysis: dict | None) -> str:
    m = run_metrics(folder)
    if m is None:
        return ""
    note = f"fvu {m.get('fvu', float('nan')):.4g} · L0 {m.get('l0_mean', float('nan')):.3g}"
    if analysis and analysis.get("probe_accuracy") is not None:
        note += f" · probe {100 * analysis['probe_accuracy']:.1f}%"
    return note


