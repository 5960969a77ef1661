"""A status line at least every few seconds while a command gets ready to train.

Before the first training step a run imports torch and Lightning, reads and checks its data (a
pass over a 3 GB matrix takes seconds), computes the data's moments and starts Lightning; none of
that has a progress bar, and in a log a silent minute looks like a hung process. While a
:class:`StartupStatus` runs, a thread writes one line every :data:`EVERY` seconds naming what is
in progress and how far it got::

    starting (5 s): importing torch and Lightning; checking x.npy, 1.21 of 3.07 GB read

The work declares itself with :func:`task` (a block) or :func:`note` (a task's progress, from any
thread); both do nothing while no status runs (a process that calls the command's code and has
its own output), so library code can declare its work unconditionally.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from contextlib import contextmanager

from sae.system.process import stop_signals_to_main_thread

__all__ = ["EVERY", "StartupStatus", "note", "running", "stop", "task"]

EVERY = 4.0  # seconds between two status lines at most (a user waits 5 s at most for news)

_current: StartupStatus | None = None


class StartupStatus:
    """Writes ``starting (N s): <the tasks in progress>`` every ``every`` seconds (to stdout, with
    the run's other lines, unless ``write`` says otherwise; stderr keeps a failure's one line)
    from :meth:`start` until :meth:`stop`; a context manager
    that installs itself as the process's status for :func:`task` and :func:`note`."""

    def __init__(self, every: float | None = None, write: Callable[[str], None] | None = None):
        self.every = EVERY if every is None else every
        self.write = write or (lambda line: print(line, file=sys.stdout, flush=True))
        self.tasks: dict[str, str] = {}  # what is in progress -> how far it got
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None
        self._start = time.monotonic()

    def line(self) -> str | None:
        """The status line now; None while nothing declared is in progress."""
        with self._lock:
            parts = [f"{what}, {done}" if done else what for what, done in self.tasks.items()]
        if not parts:
            return None
        return f"starting ({time.monotonic() - self._start:.0f} s): {'; '.join(parts)}"

    def _beat(self) -> None:
        stop_signals_to_main_thread()
        while not self._stopped.wait(self.every):
            line = self.line()
            if line is not None:
                try:
                    self.write(line)
                except (OSError, ValueError):  # the stream went away: nothing to tell
                    return

    def start(self) -> StartupStatus:
        global _current
        self._start = time.monotonic()
        _current = self
        self._thread = threading.Thread(target=self._beat, name="startup-status", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """No more lines (training has started, or the command ends); idempotent."""
        global _current
        self._stopped.set()
        if _current is self:
            _current = None

    def __enter__(self) -> StartupStatus:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def running() -> StartupStatus | None:
    """The process's status while one runs, else None."""
    return _current


@contextmanager
def task(what: str):
    """Declare ``what`` in progress for the block (named in the status lines meanwhile)."""
    status = _current
    if status is None:
        yield
        return
    with status._lock:
        status.tasks[what] = ""
    try:
        yield
    finally:
        with status._lock:
            status.tasks.pop(what, None)


def note(what: str, done: str) -> None:
    """How far the task ``what`` got (e.g. ``"1.21 of 3.07 GB read"``); from any thread."""
    status = _current
    if status is not None:
        with status._lock:
            if what in status.tasks:
                status.tasks[what] = done


def stop() -> None:
    """End the process's status, if one runs (the first training step is under way)."""
    if _current is not None:
        _current.stop()
