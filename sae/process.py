"""What every ``python -m sae.*`` command shares as a process: its exit codes, SIGTERM as an
exception that unwinds like Ctrl-C, which process of a multi-process (DDP) run is the primary one,
the environment variable that hands a run folder to the processes a run starts, and the one that
ties a sweep's runs to the sweep's life. No torch, no Lightning.

Exit codes: 0 done, 1 failed, 2 bad input (one ``error:`` line), 130 interrupted (Ctrl-C), 143
terminated (SIGTERM), the shell's conventions for the last two.
"""

from __future__ import annotations

import os
import signal
import sys
from contextlib import contextmanager

__all__ = ["EXIT_FAILED", "EXIT_INTERRUPTED", "EXIT_TERMINATED", "EXIT_USAGE", "PARENT_ENV",
           "RUN_DIR_ENV", "STOPS", "Terminated", "interrupted", "interruptible",
           "is_primary_process", "raise_terminated", "stop_code", "stop_with_parent", "stop_word"]

EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130
EXIT_TERMINATED = 143
RUN_DIR_ENV = "SAE_RUN_DIR"  # the run folder, for the processes a run starts (DDP workers)
PARENT_ENV = "SAE_STOP_WITH_PARENT"  # a sweep's pid: stop (SIGTERM) when that process dies


class Terminated(BaseException):
    """SIGTERM: stop as for Ctrl-C, with the conventional exit code 143.

    Not a KeyboardInterrupt: Lightning turns a KeyboardInterrupt inside training into its own
    graceful shutdown, while this one reaches the command, which says which signal stopped it.
    """


STOPS = (KeyboardInterrupt, Terminated)  # what stops a command from outside


def raise_terminated(signum, frame):
    """A SIGTERM handler: raise :class:`Terminated` where the program is."""
    raise Terminated


@contextmanager
def interruptible():
    """Inside the block SIGTERM raises :class:`Terminated` (Ctrl-C raises KeyboardInterrupt as
    always); the previous SIGTERM handler is restored after it."""
    previous = signal.signal(signal.SIGTERM, raise_terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def stop_code(exc: BaseException) -> int:
    """The exit code of a command stopped by ``exc`` (one of :data:`STOPS`)."""
    return EXIT_TERMINATED if isinstance(exc, Terminated) else EXIT_INTERRUPTED


def stop_word(exc: BaseException) -> str:
    """How a stopped command says what stopped it: ``terminated`` or ``interrupted``."""
    return "terminated" if isinstance(exc, Terminated) else "interrupted"


def interrupted(exc: BaseException, note: str = "nothing was written") -> int:
    """One line for a stopped command on stderr; its exit code."""
    print(f"{stop_word(exc)}; {note}", file=sys.stderr)
    return stop_code(exc)


def is_primary_process() -> bool:
    """False in the worker processes that Lightning or torchrun start for DDP."""
    return all(int(os.environ.get(name, 0)) == 0 for name in ("RANK", "LOCAL_RANK", "NODE_RANK"))


def stop_with_parent() -> None:
    """On Linux, ask for SIGTERM when the sweep that started this process dies (even by
    kill -9), so that no orphaned training goes on writing its run folder."""
    parent = os.environ.pop(PARENT_ENV, None)  # not inherited by DDP workers
    if not parent or not sys.platform.startswith("linux"):
        return
    import ctypes

    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if str(os.getppid()) != parent:  # it died before the request took effect
        os.kill(os.getpid(), signal.SIGTERM)
