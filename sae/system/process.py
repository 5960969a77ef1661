"""What every ``python -m sae.*`` command shares as a process: its exit codes, SIGTERM as an
exception that unwinds like Ctrl-C, stop signals held or ending the process at once while torch
and Lightning are imported (:func:`importing`), which process of a multi-process (DDP) run is
the primary one, the environment variable that hands a run folder to the processes a run
starts, and the one that ties a sweep's runs to the sweep's life. No torch, no Lightning.

Exit codes: 0 done, 1 failed, 2 bad input (one ``error:`` line), 130 interrupted (Ctrl-C), 143
terminated (SIGTERM), the shell's conventions for the last two.
"""

from __future__ import annotations

import atexit
import os
import signal
import sys
import threading
from contextlib import contextmanager

__all__ = ["EXIT_FAILED", "EXIT_INTERRUPTED", "EXIT_TERMINATED", "EXIT_USAGE", "PARENT_ENV",
           "RUN_DIR_ENV", "RUN_ENV", "SESSION_ENV", "STOPS", "STOP_SIGNALS", "Terminated",
           "end_process", "exit_now",
           "importing", "interrupted", "interruptible", "is_primary_process", "line_ended",
           "new_line_after_ctrl_c", "raise_terminated", "running_as", "signals_held",
           "stop_code", "stop_signals_to_main_thread", "stop_with_parent", "stop_word"]

EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130
EXIT_TERMINATED = 143
RUN_DIR_ENV = "SAE_RUN_DIR"  # the run folder, for the processes a run starts (DDP workers)
SESSION_ENV = "SAE_SESSION"  # DDP workers log under the session their rank 0 opened
RUN_ENV = (RUN_DIR_ENV, SESSION_ENV)  # what a run leaves in its process's environment
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


STOP_SIGNALS = {signal.SIGINT, signal.SIGTERM}


def stop_signals_to_main_thread() -> None:
    """Called first in a thread of the toolkit's own: Ctrl-C and SIGTERM are then never handed
    to it, only to the main thread. A stop signal the kernel hands to any thread runs the main
    thread's Python handler, whatever the main thread blocks, so one thread that does not block
    them would let a stop through :func:`signals_held` (a run folder half claimed, a start half
    undone). Also a ``ThreadPoolExecutor``'s ``initializer``. Never in a thread that starts
    processes: they would inherit the blocked signals and ignore a stop."""
    if hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)


@contextmanager
def signals_held(drop: bool = False):
    """Ctrl-C and SIGTERM wait while something that must not be cut short runs (a folder being
    made, an import): one that arrives meanwhile is raised at the end of the block, when what
    was made is known and can be undone; with ``drop`` (the command is stopping already) it is
    dropped instead.

    Blocking the signals in this thread is not enough: the kernel hands a stop to any thread
    that does not block it (numpy's and torch's own threads among them), and Python then runs
    the main thread's handler at once. So, in the main thread, the block's handlers only note a
    stop, which is raised again once the block ends."""
    main = threading.current_thread() is threading.main_thread()
    noted: list[int] = []
    previous = {s: signal.signal(s, lambda signum, frame: noted.append(signum))
                for s in STOP_SIGNALS} if main else {}
    signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        yield
    finally:
        if drop:
            while signal.sigtimedwait(STOP_SIGNALS, 0) is not None:
                pass
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)  # a blocked one arrives here
        if noted and not drop:
            signal.raise_signal(noted[0])


@contextmanager
def importing(on_stop=None):
    """Around imports of torch and Lightning (seconds). A Ctrl-C or SIGTERM raised inside one
    can abort the process (an exception thrown through torch's C++ import code), so it never
    raises there. With ``on_stop`` (a command, whose process ends with the stop) the process
    ends at once instead: ``on_stop(stop)`` says what stopped it, undoes what was made and
    returns the exit code, then :func:`exit_now`. Without it (a process that goes on) the
    signals are held until the imports are done."""
    if on_stop is None:
        with signals_held():
            yield
        return

    def stop(signum, frame):
        signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
        exit_now(on_stop(Terminated() if signum == signal.SIGTERM else KeyboardInterrupt()))

    previous = {s: signal.signal(s, stop) for s in STOP_SIGNALS}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


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


def exit_now(code: int):
    """End the process with ``code`` now, stdout and stderr flushed, without the interpreter's
    shutdown: for a command stopped with nothing left to write, where tearing down torch and
    Lightning (a second or more, and modules an interrupted import left half-made) would only
    delay the exit that the signal asked for."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


def end_process(code: int):
    """End a command that has said its last line, with ``code``, within a fraction of a second:
    threads that must finish are waited for (and named on stderr: the process says what it
    waits for), the ``atexit`` handlers run, the streams are flushed, and the process ends
    without the interpreter's teardown of torch and Lightning, which costs 2 to 4 s after the
    last line on a loaded 2-core machine and does nothing a finished command needs."""
    waiting = [t for t in threading.enumerate()
               if t is not threading.main_thread() and not t.daemon and t.is_alive()]
    if waiting:
        names = ", ".join(t.name for t in waiting)
        print(f"waiting for {len(waiting)} thread{'s' * (len(waiting) > 1)} to end ({names})",
              file=sys.stderr, flush=True)
        for thread in waiting:
            thread.join()
    run_exit_functions = getattr(atexit, "_run_exitfuncs", None)
    if run_exit_functions is not None:
        run_exit_functions()
    exit_now(code)


_line_ended = False  # whether the terminal's line was ended since the stop


def line_ended(ended: bool = True) -> None:
    """Note that what was written last ended the terminal's line after a stop (the progress bar
    closed at the stop, a status line's "stopped"), so that :func:`new_line_after_ctrl_c`
    writes no empty line; ``False`` as a command starts."""
    global _line_ended
    _line_ended = ended


def new_line_after_ctrl_c() -> None:
    """Ctrl-C makes a terminal echo ``^C`` where its cursor is: start a new line on stderr, so
    that the messages that follow are not glued to it, unless the line was ended since
    (:func:`line_ended`)."""
    if not _line_ended:
        try:
            if sys.stderr.isatty():
                sys.stderr.write("\n")
                sys.stderr.flush()
        except (OSError, ValueError):
            pass
    line_ended()


def running_as(module: str) -> bool:
    """Whether this process is ``python -m module`` (a command whose process ends with it), not
    one that calls the command's ``main`` and goes on (a test, a notebook)."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    return spec is not None and spec.name in (module, f"{module}.__main__")


def is_primary_process() -> bool:
    """False in the worker processes that Lightning or torchrun start for DDP."""
    return all(int(os.environ.get(name, 0)) == 0 for name in ("RANK", "LOCAL_RANK", "NODE_RANK"))


def stop_with_parent() -> None:
    """On Linux, ask for SIGTERM when the sweep that started this process dies (even by
    kill -9), so that no orphaned training goes on writing its run folder."""
    parent = os.environ.pop(PARENT_ENV, None)  # not inherited by DDP workers
    if not parent or not sys.platform.startswith("linux"):
        return
    import ctypes  # only on Linux, in a sweep's runs: not at every command's start

    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if str(os.getppid()) != parent:  # it died before the request took effect
        os.kill(os.getpid(), signal.SIGTERM)
