"""python -m sae.run: train one SAE and write its run folder.

    python -m sae.run --model sparsemax --lambda 0.01

Run folder::

    config.yaml          resolved settings (re-usable with --config)
    metrics.csv          per-step training and per-epoch validation metrics (all sessions)
    logs/session_<n>/    each session's own metrics.csv (the first run, then each --resume)
    metrics.json         final test-set metrics (written when training completes)
    checkpoints/         last.ckpt (after every validation), best.ckpt (lowest val/loss)
    tensorboard/         TensorBoard logs
    figures/<kind>/      PNGs (see sae.callbacks)
    report.html          self-contained report

Settings are layered: defaults < --config FILE < (on --resume) the run's config.yaml < flags
(:mod:`sae.cli`). Every value is checked before any work starts; bad input is one line on stderr
and exit code 2. Exit codes: 0 done, 1 training failed (non-finite loss, disk full), 2 bad input,
130 interrupted (Ctrl-C), 143 terminated (SIGTERM).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from dataclasses import fields
from pathlib import Path

from sae.cli import UsageError, build_parser, config_file_dict, resolve_settings
from sae.config import SAEConfig

__all__ = ["EXIT_USAGE", "UsageError", "build_parser", "check_settings", "main", "model_config",
           "resolve_settings"]

EXIT_USAGE = 2
EXIT_FAILED = 1
EXIT_INTERRUPTED = 130
EXIT_TERMINATED = 143
PARENT_ENV = "SAE_STOP_WITH_PARENT"  # a sweep's pid: stop (SIGTERM) when that process dies


def is_primary_process() -> bool:
    """False in the worker processes that Lightning or torchrun start for DDP."""
    return all(int(os.environ.get(name, 0)) == 0 for name in ("RANK", "LOCAL_RANK", "NODE_RANK"))


def model_config(args: argparse.Namespace) -> SAEConfig:
    names = {f.name for f in fields(SAEConfig)}
    config = SAEConfig(**{k: v for k, v in vars(args).items() if k in names})
    try:
        config.validate()
    except ValueError as e:
        raise UsageError(str(e)) from None
    return config


def check_settings(args: argparse.Namespace) -> None:
    """Cross-field checks that the parser cannot do alone."""
    if args.resume is not None and args.overwrite:
        raise UsageError("--resume and --overwrite exclude each other")
    if args.data_dir is not None and not Path(args.data_dir).is_dir():
        raise UsageError(f"--data-dir {args.data_dir} is not a folder")
    if args.resume not in (None, "last"):
        if not Path(args.resume).is_file():
            raise UsageError(f"--resume checkpoint {args.resume} does not exist")
    if args.resume == "last":
        last = Path(args.out) / "checkpoints" / "last.ckpt"
        if not last.is_file():
            raise UsageError(f"cannot resume: no checkpoint at {last}")


def write_config(args: argparse.Namespace, path: Path) -> None:
    import yaml

    from sae.io import write_text

    write_text(path, yaml.safe_dump(config_file_dict(vars(args)), sort_keys=False))


def stop_with_parent() -> None:
    """On Linux, ask for SIGTERM when the sweep that started this run dies (even by kill -9),
    so that no orphaned training goes on writing its run folder."""
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


def _raise_terminated(signum, frame):
    from sae.training import Terminated

    raise Terminated


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    # Ctrl-C (and a sweep's SIGINT) always interrupts, even when started from a shell that
    # ignores SIGINT for its background jobs (the ignored disposition would be inherited)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    primary = is_primary_process()
    say = (lambda line: print(line, file=sys.stderr)) if primary else (lambda line: None)
    try:
        args = resolve_settings(argv)
        config = model_config(args)
        check_settings(args)
    except UsageError as e:
        say(f"error: {e}")
        return EXIT_USAGE
    out, created = Path(args.out), False
    try:
        if primary:
            from sae import runfolder

            mode = "resume" if args.resume is not None else \
                "overwrite" if args.overwrite else "new"
            created = runfolder.claim(out, mode)
            if args.resume is None:
                write_config(args, out / "config.yaml")
            os.environ["SAE_RUN_DIR"] = str(out)  # DDP workers re-run this CLI: same folder
    except UsageError as e:
        say(f"error: {e}")
        return EXIT_USAGE
    except KeyboardInterrupt:
        say("interrupted before training started")
        return EXIT_INTERRUPTED
    signal.signal(signal.SIGTERM, _raise_terminated)
    if primary:
        stop_with_parent()
    return _train(args, config, out, created, primary, say)


def _train(args, config, out: Path, created: bool, primary: bool, say) -> int:
    try:
        from sae.checkpoints import CheckpointError
        from sae.data import DataSourceError
        from sae.models import NonFiniteLossError
        from sae.training import Terminated, TrainingSetupError, train
    except KeyboardInterrupt:
        return _stopped(args, out, created, primary, say, "interrupted", EXIT_INTERRUPTED)
    try:
        result = train(args, config)
    except KeyboardInterrupt:
        return _stopped(args, out, created, primary, say, "interrupted", EXIT_INTERRUPTED)
    except Terminated:
        return _stopped(args, out, created, primary, say, "terminated", EXIT_TERMINATED)
    except (DataSourceError, TrainingSetupError, CheckpointError) as e:
        if args.resume is None:
            _undo_start(out, created, primary)
        say(f"error: {e}")
        return EXIT_USAGE
    except NonFiniteLossError as e:
        last = out / "checkpoints" / "last.ckpt"
        kept = f"last good checkpoint kept at {last}" if last.is_file() else "no checkpoint yet"
        say(f"error: training stopped: {e}; {kept}")
        return EXIT_FAILED
    except OSError as e:
        say(f"error: cannot write to the run folder {out}: {e.strerror or e}")
        return EXIT_FAILED
    if result:
        print(f"run folder: {args.out}")
        print(" ".join(f"{k}={result[k]:.4g}" for k in
                       ("mse", "fvu", "l0_mean", "l0_std", "dead_fraction", "dense_fraction",
                        "wall_time_s") if isinstance(result.get(k), int | float)))
        if result.get("converged") is False:
            print(f"note: validation FVU moved {100 * result['val_fvu_change']:.1f} % and L0 "
                  f"{100 * result['val_l0_change']:.1f} % in the last epoch: not converged "
                  "(train longer for settled numbers)")
    return 0


def _undo_start(out: Path, created: bool, primary: bool) -> None:
    """A fresh run that failed before its first checkpoint leaves no half-made folder."""
    if primary:
        from sae import runfolder

        runfolder.remove_unfinished(out, created)


def _stopped(args, out: Path, created: bool, primary: bool, say, what: str, code: int) -> int:
    if (out / "checkpoints" / "last.ckpt").is_file() or args.resume is not None:
        say(f"{what}; continue with: python -m sae.run --out {out} --resume")
    else:
        _undo_start(out, created, primary)
        say(f"{what} before the first checkpoint; nothing was kept")
    return code


if __name__ == "__main__":
    sys.exit(main())
