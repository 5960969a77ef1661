"""A sweep's line at least every half minute: while its runs train (a run of minutes says
nothing until it ends) and while its tables are written, a line says what is going on::

    … 1:00 elapsed · 0 of 2 runs done · mnist/kl/lambda0.1/seed0: epoch 1/2 · step 120 of 250

:class:`Heartbeat` wraps the sweep's ``say``: a thread writes the line of ``status()`` once
nothing was said for :data:`EVERY` seconds. :func:`sweep_status` makes that line from the run
folders and the runs' logs (each run's own progress lines, ``sae.training.progress``), so it
needs nothing from the process that trains them (a worker, a subprocess, a Ray task).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

from sae.sweep.launch import log_path, run_state
from sae.system.process import stop_signals_to_main_thread

__all__ = ["EVERY", "STARTING_EVERY", "Heartbeat", "clock", "starting_line", "sweep_status"]

EVERY = 25.0  # seconds of silence before a line: under the half minute a user waits at most


def clock(seconds: float) -> str:
    m, s = divmod(int(seconds), 60)
    return f"{m // 60}:{m % 60:02d}:{s:02d}" if m >= 60 else f"{m}:{s:02d}"


class Heartbeat:
    """``say`` for the sweep's lines, and a line of ``status()`` (None: nothing to say) from a
    thread whenever nothing was said for ``every`` seconds; a context manager."""

    def __init__(self, say: Callable[[str], None], status: Callable[[], str | None],
                 every: float = EVERY):
        self._say, self.status, self.every = say, status, every
        self._lock = threading.Lock()
        self._last = time.monotonic()
        self._stopped = threading.Event()
        self._stopped.set()  # no thread until a block starts one

    def say(self, line: str) -> None:
        with self._lock:
            self._say(line)
            self._last = time.monotonic()

    def _beat(self, stopped: threading.Event) -> None:
        stop_signals_to_main_thread()
        while not stopped.wait(min(1.0, self.every / 4)):
            if time.monotonic() - self._last < self.every:
                continue
            try:
                line = self.status()
                if line and not stopped.is_set():
                    self.say(line)
            except (OSError, ValueError):  # a log being rewritten, a closed stream: next time
                self._last = time.monotonic()

    def __enter__(self) -> Heartbeat:
        self._last = time.monotonic()
        self._stopped = threading.Event()  # each block its own thread
        threading.Thread(target=self._beat, args=(self._stopped,), name="sweep heartbeat",
                         daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def stop(self) -> None:
        """No more lines from the thread (idempotent)."""
        self._stopped.set()


STARTING_EVERY = 4.0  # before the sweep's first line: a user waits 5 s at most for news


def starting_line(started: float) -> str:
    """What a sweep does before its first line (``started``: ``time.time()`` of the command):
    its checks (every data file is read) and the start of its job slots (Ray's, seconds)."""
    return (f"starting ({time.time() - started:.0f} s): checking the sweep, its run folders "
            "and data files, and starting its job slots")


def _last_line(log: Path) -> str | None:
    """The last line a run's log holds (its latest progress line), None once the run ended
    (the pool's ``# exit code`` line) or before it wrote any."""
    try:
        with open(log, "rb") as f:
            f.seek(0, 2)
            f.seek(max(0, f.tell() - 4096))
            lines = [ln.strip() for ln in f.read().decode("utf-8", "replace").splitlines()
                     if ln.strip()]
    except OSError:
        return None
    if not lines or lines[-1].startswith("# exit code"):
        return None
    return lines[-1][:160]


def sweep_status(sweep_dir: Path, runs: list, start: float, doing: str | None = None) -> str:
    """``… 1:00 elapsed · 0 of 2 runs done · <run>: <its log's last line>`` for each run whose
    log was written since ``start`` (``time.time()``) and that has not ended; ``doing`` in
    their place once no run trains (``writing the tables``)."""
    done, training = 0, []
    for run in runs:
        folder = sweep_dir / run.rel
        if run_state(folder) == "done":
            done += 1
            continue
        log = log_path(sweep_dir, run)
        try:
            fresh = log.stat().st_mtime >= start
        except OSError:
            continue
        line = _last_line(log) if fresh else None
        if line is not None:
            training.append(f"{run.rel.relative_to('runs')}: "
                            f"{'starting' if line.startswith('$ ') else line}")
    parts = [f"… {clock(time.time() - start)} elapsed", f"{done} of {len(runs)} runs done"]
    parts += training or [doing or "starting the runs"]
    return " · ".join(parts)
