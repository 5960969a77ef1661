"""``sae.train``: one training run from Python, exactly as ``python -m sae.run`` makes it.

    folder = sae.train(model="topk", k=16, epochs=5, out="runs/topk-16")
    model = sae.load(folder)

The keywords are the command's settings by field name (``lam`` for ``--lambda``, ``max_steps``
for ``--max-steps``; ``python -m sae.run --help`` lists them), or a ready
``sae.settings.config.RunConfig``. They are checked as the command checks its flags, the
run prints what the command prints, and the run folder (``out``, or a new folder under
``runs/``) is returned.
"""

from __future__ import annotations

import signal
from pathlib import Path

from sae.data.streamed import register_python_source, release_python_source
from sae.runner.command import main  # the command itself: one code path for both
from sae.settings.cli import SETTINGS, UsageError, run_config, to_argv
from sae.settings.config import RunConfig
from sae.training.runfolder import release


class TrainingFailed(RuntimeError):
    """A run that did not finish (stopped, diverged, or refused its data or folder); its lines
    were printed as the command prints them, and ``exit_code`` is the command's."""

    def __init__(self, message: str, exit_code: int):
        super().__init__(message)
        self.exit_code = exit_code


def train(config: RunConfig | None = None, **settings) -> Path:
    """Train one SAE; returns its run folder.

    ``settings``: ``python -m sae.run``'s settings by field name (``model``, ``hidden``,
    ``lam``, ``k``, ``epochs``, ``dataset`` or ``data``, ``out``, ``resume``, ...); ``config``:
    a ``RunConfig`` instead (keywords given beside it replace its values). ``source`` may
    also be a ``(model, dataset)`` pair, with ``hook`` the layer to read while the model runs
    (``sae.data.streamed``); resume such a run with the same pair and ``resume="last"``. A
    bad setting raises ``ValueError`` with the command's one-line message; a run that does not
    finish raises ``TrainingFailed``.
    """
    given = {**(config.settings() if config is not None else {}), **settings}
    if given.get("source") is not None and not isinstance(given["source"], str):
        given["source"] = register_python_source(given["source"])  # a (model, dataset)
    unknown = sorted(name for name in given if name not in SETTINGS)
    if unknown:
        raise ValueError(f"unknown setting{'s' if len(unknown) > 1 else ''} "
                         f"{', '.join(unknown)}; see python -m sae.run --help")
    try:
        argv = to_argv(given)
        out = Path(run_config(argv).folder.out)  # the folder chosen now, named to the run
    except UsageError as e:
        raise ValueError(str(e)) from None
    # the command sets its own SIGINT and SIGTERM handlers; the caller's come back after it
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        code = main([*argv, *([] if given.get("out") else ["--out", str(out)])])
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
        release(out)  # the folder's lock: this process may resume or read it next
        release_python_source()
    if code != 0:
        raise TrainingFailed(f"training did not finish (exit {code}); see the lines above",
                             code)
    return out
