"""Several ``python -m sae.run`` commands trained as one stack (:mod:`sae.training.stack`).

``main([argv_1, argv_2, ...])`` does for each argv what ``python -m sae.run ARGV`` does (the same
checks, run folder, settings files, pages and exit codes), but trains the runs together: one pass
over the batches, one backward and one optimiser step a step for all of them. A run whose
settings are invalid gets its usage error and the others train; a stop (Ctrl-C, SIGTERM) stops
them all, each with its checkpoint and the command that resumes it (alone, or all together by
running ``main`` again with ``--resume`` in each argv). Sweeps call this (``--stack``).
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

from sae.runner import command as single
from sae.settings.metric_defs import summary_line
from sae.settings.setting import UsageError
from sae.system.process import (
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_TERMINATED,
    EXIT_USAGE,
    RUN_ENV,
    Terminated,
    raise_terminated,
)
from sae.training import runfolder

__all__ = ["main"]


def say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def main(argvs: list[list[str]]) -> list[int]:
    """Train the runs of ``argvs`` as one stack; their exit codes, in order."""
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, raise_terminated)
    codes: list[int | None] = [None] * len(argvs)
    started = []  # (index, config, out, created)
    try:
        _run(argvs, codes, started)
    except (KeyboardInterrupt, Terminated) as e:
        word = "terminated" if isinstance(e, Terminated) else "interrupted"
        code = EXIT_TERMINATED if isinstance(e, Terminated) else EXIT_INTERRUPTED
        for i, config, out, created in started:
            if codes[i] is None:
                codes[i] = single._stopped(config, out, created, True, say, word, code)
        codes = [code if c is None else c for c in codes]
    finally:
        for _, _, out, _ in started:  # a later run in this process may take these folders
            runfolder.release(out)
        for name in RUN_ENV:
            os.environ.pop(name, None)
    return [int(c) for c in codes]


def _run(argvs: list[list[str]], codes: list, started: list) -> None:
    """Check and claim each run's folder (a run with bad settings gets its error), then train
    the claimed ones."""
    for i, argv in enumerate(argvs):
        try:
            config, record = single._checked(argv)
            with single._signals_held():
                created = single._start(config, record, Path(config.folder.out), True, argv)
        except UsageError as e:
            say(f"error: {e}")
            codes[i] = EXIT_USAGE
            continue
        except OSError as e:
            say(f"error: cannot write to the run folder: {e.strerror or e}")
            codes[i] = EXIT_FAILED
            continue
        out = Path(config.folder.out)
        print(f"run folder: {out}" + (" (resuming)" if config.folder.resume else ""),
              flush=True)
        started.append((i, config, out, created))
    if started:
        _train(started, codes, say)


def _train(started: list, codes: list, say) -> None:
    single._import_training()
    from sae.data.images import DataSourceError  # torch: imported above, not at this import
    from sae.training.checkpoints import CheckpointError  # likewise
    from sae.training.engine import TrainingSetupError  # likewise
    from sae.training.stackrun import train_stack  # likewise

    configs = [config for _, config, _, _ in started]
    try:
        outcomes = train_stack(configs)
    except (DataSourceError, TrainingSetupError, CheckpointError) as e:
        for i, config, out, created in started:
            if config.folder.resume is None:
                single._undo_start(out, created, True)
            codes[i] = EXIT_USAGE
        say(f"error: {e}")
        return
    for (i, config, out, _), outcome in zip(started, outcomes, strict=True):
        if outcome.error is not None:
            last = out / "checkpoints" / "last.ckpt"
            say(f"error: {out}: training stopped: {outcome.error}; last good checkpoint kept "
                f"at {last}" if last.is_file() else f"error: {out}: {outcome.error}")
            codes[i] = EXIT_FAILED
            continue
        single.write_pages(config, outcome.trained)
        print(f"{out}: {summary_line(outcome.trained.metrics)}", flush=True)
        codes[i] = 0


def as_command() -> None:
    """``python -m sae.runner.stack '[[argv...], ...]'``: the runs of a JSON list of argvs as one
    stack (what a sweep's Ray task starts); the exit code is the largest of the runs'."""
    try:
        argvs = json.loads(sys.argv[1]) if len(sys.argv) == 2 else None
    except ValueError:
        argvs = None
    if not (isinstance(argvs, list) and argvs and all(
            isinstance(a, list) and all(isinstance(x, str) for x in a) for a in argvs)):
        say("error: usage: python -m sae.runner.stack '[[\"--model\", \"l1\", ...], ...]'")
        sys.exit(EXIT_USAGE)
    sys.exit(max(main(argvs)))


if __name__ == "__main__":
    as_command()
