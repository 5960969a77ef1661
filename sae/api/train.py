"""``sae.train``: one training run from Python, exactly as ``python -m sae.run`` makes it.

    folder = sae.train(model="topk", k=16, epochs=5, out="runs/topk-16")
    model = sae.load(folder)

The keywords are the command's settings by field name (``lam``, or ``lambda_``, for
``--lambda``; ``max_steps`` for ``--max-steps``; the API reference and ``python -m sae.run
--help`` list them; a misspelt one names the closest), or a ready
``sae.settings.config.RunConfig``. They are checked as the command checks its flags, the
run prints what the command prints, and the run folder (``out``, or a new folder under
``runs/``) is returned.
"""

from __future__ import annotations

import os
import signal
import sys
from contextlib import contextmanager
from pathlib import Path

from sae.data.streamed import register_python_source, release_python_source
from sae.runner.command import main  # the command itself: one code path for both
from sae.settings.cli import SETTINGS, UsageError, run_config, to_argv
from sae.settings.config import RunConfig
from sae.settings.setting import did_you_mean
from sae.system.process import RUN_ENV
from sae.training.runfolder import release


class TrainingFailed(RuntimeError):
    """A run that did not finish (stopped, diverged, or refused its data or folder); its lines
    were printed as the command prints them, and ``exit_code`` is the command's."""

    def __init__(self, message: str, exit_code: int, reason: str = ""):
        super().__init__(message)
        self.exit_code = exit_code
        self.reason = reason  # the command's last line: why it ended


class _LastLine:
    """stderr as it is, remembering the last non-empty line written to it (the command's one
    line that says why a run ended), so :class:`TrainingFailed` can carry it."""

    def __init__(self, stream):
        self.stream, self.last, self._pending = stream, "", ""

    def write(self, text: str) -> int:
        lines = (self._pending + text).split("\n")
        self._pending = lines.pop()[-1000:]
        for line in lines:
            if line.strip():
                self.last = line.strip()[:1000]
        return self.stream.write(text)

    def line(self) -> str:
        return self._pending.strip() or self.last

    def __getattr__(self, name):  # flush, fileno, isatty, encoding...: the real stream's
        return getattr(self.stream, name)


@contextmanager
def _own_environment():
    """The variables a run sets for the processes it starts (its folder, its session) are this
    call's only: the caller's values come back after it, so no run leaks into the next."""
    saved = {name: os.environ.get(name) for name in RUN_ENV}
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _checked_types(given: dict) -> dict:
    """Switches are booleans (``overwrite="false"`` would be true) and ``resume`` is a
    checkpoint path, ``"last"``, or a boolean (True: the folder's last checkpoint)."""
    for name, value in given.items():
        if SETTINGS[name].type == "bool" and value is not None and not isinstance(value, bool):
            raise ValueError(f"{name} must be True or False, got {value!r:.40}")
    resume = given.get("resume")
    if isinstance(resume, bool):
        given["resume"] = "last" if resume else None
    elif resume is not None and not isinstance(resume, str | os.PathLike):
        raise ValueError(f"resume must be a checkpoint path, 'last' or True, got {resume!r:.40}")
    return given


# keywords that name a setting whose field name Python will not take (``lambda``)
SYNONYMS = {"lambda_": "lam"}


def _known_names(given: dict) -> dict:
    """``given`` with each synonym under its field name (``lambda_=`` is ``lam``); an unknown
    name is a one-line ValueError naming the closest setting (``lamda``: ``lam``)."""
    for synonym, name in SYNONYMS.items():
        if synonym in given:
            if name in given:
                raise ValueError(f"{synonym} and {name} are the same setting; give one")
            given = {(name if k == synonym else k): v for k, v in given.items()}
    unknown = sorted(name for name in given if name not in SETTINGS)
    if unknown:
        named = []
        for name in unknown:
            hint = did_you_mean(name, SETTINGS)  # "; did you mean lam?"
            named.append(f"{name} ({hint[2:]})" if hint else name)
        raise ValueError(f"unknown setting{'s' if len(unknown) > 1 else ''} {', '.join(named)}"
                         "; see help(sae.train) or python -m sae.run --help")
    return given


def train(config: RunConfig | None = None, **settings) -> Path | list[Path]:
    """Train one SAE; returns its run folder.

    ``settings``: ``python -m sae.run``'s settings by field name (``model``, ``hidden``,
    ``lam`` or ``lambda_``, ``k``, ``epochs``, ``dataset`` or ``data``, ``out``, ``resume``,
    ...; the API reference's table lists them all); an unknown keyword is a one-line
    ``ValueError`` naming the closest (``lamda``: did you mean ``lam``?); ``config``:
    a ``RunConfig`` instead (keywords given beside it replace its values). ``source`` may
    also be a ``(model, dataset)`` pair, with ``hook`` the layer to read while the model runs
    (``sae.data.streamed``); resume such a run with the same pair and ``resume="last"``.
    ``hook=["a", "b"]`` trains one SAE per layer from shared forward passes and returns their
    folders, ``out/a`` and ``out/b`` (:mod:`sae.runner.hooks`). A
    bad setting raises ``ValueError`` with the command's one-line message; a run that does not
    finish raises ``TrainingFailed``.
    """
    if config is not None and not isinstance(config, RunConfig):
        raise ValueError(f"sae.train takes settings by keyword (sae.train(model=\"topk\", "
                         f"k=16)) or a RunConfig, got {config!r:.40}")
    # a RunConfig's settings (not its fields set from the data, input_dim, or fixed, aux_coef)
    given = {**({k: v for k, v in config.settings().items() if k in SETTINGS}
                if config is not None else {}), **settings}
    if given.get("source") is not None and not isinstance(given["source"], str):
        given["source"] = register_python_source(given["source"])  # a (model, dataset)
    hooks = given.get("hook")
    if isinstance(hooks, list | tuple):  # several layers: a run folder each, under out
        given["hook"] = ",".join(map(str, hooks))
    given = _checked_types(_known_names(given))
    try:
        argv = to_argv(given)
        out = Path(run_config(argv).folder.out)  # the folder chosen now, named to the run
    except UsageError as e:
        raise ValueError(str(e)) from None
    # the command sets its own SIGINT and SIGTERM handlers; the caller's come back after it
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    stderr = sys.stderr
    sys.stderr = lines = _LastLine(stderr)
    try:
        with _own_environment():
            code = main([*argv, *([] if given.get("out") else ["--out", str(out)])])
    finally:
        sys.stderr = stderr
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
        release(out)  # the folder's lock: this process may resume or read it next
        release_python_source()
    if code != 0:
        reason = lines.line()
        raise TrainingFailed(f"training did not finish (exit {code}): {reason}" if reason else
                             f"training did not finish (exit {code})", code, reason)
    return [out / hook for hook in hooks] if isinstance(hooks, list | tuple) else out
