"""python -m sae.run: train one SAE and write its run folder.

    python -m sae.run --model sparsemax --lambda 0.01
    python -m sae.run --data acts.npy --model sparsemax --lambda 0.01   (activations, sae.matrix)

Run folder::

    config.yaml          resolved settings (re-usable with --config)
    data.json            with --data: each matrix's path, shape, dtype and SHA-256 (sae.rundata)
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
import shlex
import signal
import sys
import traceback
from contextlib import contextmanager
from dataclasses import fields
from importlib.util import find_spec
from pathlib import Path

from sae.cli import (
    UsageError,
    build_parser,
    config_file_dict,
    resolve_settings,
    unused_flags,
)
from sae.config import SAEConfig
from sae.process import (
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_TERMINATED,
    EXIT_USAGE,
    RUN_DIR_ENV,
    Terminated,
    is_primary_process,
    raise_terminated,
)

__all__ = ["EXIT_USAGE", "UsageError", "build_parser", "check_settings", "main", "model_config",
           "resolve_settings"]

PARENT_ENV = "SAE_STOP_WITH_PARENT"  # a sweep's pid: stop (SIGTERM) when that process dies
# set by the launchers that start a run on several machines (torchrun, SLURM, MPI, LSF); without
# one, each machine waits for the others forever
LAUNCHER_ENV = ("WORLD_SIZE", "SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "LSB_JOBID")
# weights held in 16 bits: the models here diverge in float16 and evaluate in float32
HALF_WEIGHTS = ("16-true", "bf16-true")
NEEDS_PACKAGE = {"tpu": "torch_xla", "transformer-engine": "transformer_engine",
                 "transformer-engine-float16": "transformer_engine"}


def model_config(args: argparse.Namespace) -> SAEConfig:
    names = {f.name for f in fields(SAEConfig)}
    config = SAEConfig(**{k: v for k, v in vars(args).items() if k in names})
    model_config_checked(config)
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
    if args.num_nodes > 1 and not any(os.environ.get(name) for name in LAUNCHER_ENV):
        raise UsageError(f"--num-nodes {args.num_nodes} needs a launcher that starts the run on "
                         f"every machine (torchrun, SLURM; none of {', '.join(LAUNCHER_ENV)} "
                         "is set); on one machine use --num-nodes 1")
    if args.precision in HALF_WEIGHTS:
        raise UsageError(f"--precision {args.precision} keeps the weights in 16 bits, which "
                         "these models cannot train or be evaluated in; use "
                         f"{args.precision.replace('true', 'mixed')}")
    for flag, value in (("--accelerator", args.accelerator), ("--precision", args.precision)):
        if value in NEEDS_PACKAGE and find_spec(NEEDS_PACKAGE[value]) is None:
            raise UsageError(f"{flag} {value} needs the {NEEDS_PACKAGE[value]} package, which "
                             "is not installed")


def check_devices(args: argparse.Namespace) -> None:
    """Whether the device kind asked for is here (imports torch: after the checks above, still
    before the run folder is claimed)."""
    needs_cuda = args.accelerator == "cuda" or args.precision.startswith("transformer-engine")
    if not (needs_cuda or args.accelerator in ("gpu", "mps")):
        return
    with _signals_held():
        import torch

    cuda, mps = torch.cuda.is_available(), torch.backends.mps.is_available()
    if needs_cuda and not cuda:
        what = (f"--precision {args.precision}" if args.accelerator != "cuda"
                else "--accelerator cuda")
        raise UsageError(f"{what} needs a CUDA GPU, and torch sees none here")
    if args.accelerator == "gpu" and not (cuda or mps):
        raise UsageError("--accelerator gpu: torch sees no CUDA or MPS device here; use "
                         "--accelerator cpu or auto")
    if args.accelerator == "mps" and not mps:
        raise UsageError("--accelerator mps: torch sees no MPS device here (Apple silicon "
                         "only); use --accelerator cpu or auto")


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


_STOP_SIGNALS = {signal.SIGINT, signal.SIGTERM}


@contextmanager
def _signals_held():
    """Ctrl-C and SIGTERM wait while something that must not be cut short runs (the run folder
    being made, an import): one that arrives meanwhile is raised at the end of the block, when
    what was made is known and can be undone."""
    signal.pthread_sigmask(signal.SIG_BLOCK, _STOP_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, _STOP_SIGNALS)


def _checked(argv: list[str]) -> tuple[argparse.Namespace, SAEConfig]:
    args = resolve_settings(argv)
    config = model_config(args)
    check_settings(args)
    check_devices(args)
    if args.data:  # every file read and checked, and on resume compared with the run's
        from sae.rundata import check_data

        with _signals_held():  # imports numpy (and, for image rows, torch)
            args.data_record = check_data(args)
        config.input_dim = int(args.data_record["train"]["shape"][1])
        model_config_checked(config)
    elif args.resume is not None:
        from sae.rundata import check_data

        check_data(args)
    return args, config


def model_config_checked(config: SAEConfig) -> None:
    try:
        config.validate()
    except ValueError as e:
        raise UsageError(str(e)) from None


def _import_training() -> None:
    """Import torch, Lightning and the training modules. A signal raised in the middle of an
    import leaves half-made modules that fail in odd ways later, so this runs with the stop
    signals held: a Ctrl-C or SIGTERM then takes effect the moment the imports are done."""
    import lightning.pytorch.loggers  # noqa: F401

    import sae.checkpoints
    import sae.data
    import sae.evaluate
    import sae.models
    import sae.training  # noqa: F401


def _start(args: argparse.Namespace, out: Path, primary: bool) -> bool:
    """Claim the run folder and write its settings; returns whether the folder was made now.
    A failure undoes what it made and raises (UsageError, OSError)."""
    if not primary:
        return False
    from sae import runfolder

    mode = "resume" if args.resume is not None else "overwrite" if args.overwrite else "new"
    created = runfolder.claim(out, mode)
    if args.resume is None:
        try:
            write_config(args, out / "config.yaml")
            if getattr(args, "data_record", None) is not None:
                from sae.rundata import write_record

                write_record(out, args.data_record)
        except OSError:
            runfolder.remove_unfinished(out, created)
            raise
    os.environ[RUN_DIR_ENV] = str(out)  # DDP workers re-run this CLI: same folder
    return created


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    # Ctrl-C (and a sweep's SIGINT) always interrupts, even when started from a shell that
    # ignores SIGINT for its background jobs (the ignored disposition would be inherited);
    # SIGTERM is one line and exit 143 from here on, during the imports too
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, raise_terminated)
    primary = is_primary_process()
    say = (lambda line: print(line, file=sys.stderr)) if primary else (lambda line: None)
    try:
        args, config = _checked(argv)
    except UsageError as e:
        say(f"error: {e}")
        return EXIT_USAGE
    except (KeyboardInterrupt, Terminated) as e:
        stopped = "terminated" if isinstance(e, Terminated) else "interrupted"
        say(f"{stopped} before training started; nothing was written")
        return EXIT_TERMINATED if isinstance(e, Terminated) else EXIT_INTERRUPTED
    out, created, claimed = Path(args.out), False, False
    try:
        with _signals_held():
            created = _start(args, out, primary)
            claimed = True
            if primary:  # within a second of the command: torch is not imported yet
                print(f"run folder: {out}" + (" (resuming)" if args.resume is not None else ""),
                      flush=True)
                for note in unused_flags(argv, args):  # beside the run's other notes
                    print(note, flush=True)
            _import_training()
    except UsageError as e:
        say(f"error: {e}")
        return EXIT_USAGE
    except OSError as e:
        say(f"error: cannot write to the run folder {out}: {e.strerror or e}")
        return EXIT_FAILED
    except (KeyboardInterrupt, Terminated) as e:
        stopped = "terminated" if isinstance(e, Terminated) else "interrupted"
        code = EXIT_TERMINATED if isinstance(e, Terminated) else EXIT_INTERRUPTED
        if not claimed:  # the folder is not this run's: nothing of it is touched
            say(f"{stopped} before training started; nothing was written")
            return code
        return _stopped(args, out, created, primary, say, stopped, code)
    if primary:
        stop_with_parent()
    return _train(args, config, out, created, primary, say)


def _written_by(e: BaseException, function) -> bool:
    """Whether ``function`` is on ``e``'s traceback (a checkpoint write, not a read, failed)."""
    return any(frame.f_code is function.__code__ for frame, _ in traceback.walk_tb(e.__traceback__))


def _train(args, config, out: Path, created: bool, primary: bool, say) -> int:
    from sae.checkpoints import CheckpointError, write_checkpoint
    from sae.data import DataSourceError
    from sae.models import NonFiniteLossError
    from sae.training import TrainingSetupError, train

    try:
        result = train(args, config)
    except KeyboardInterrupt:
        return _stopped(args, out, created, primary, say, "interrupted", EXIT_INTERRUPTED)
    except Terminated:
        return _stopped(args, out, created, primary, say, "terminated", EXIT_TERMINATED)
    except (DataSourceError, TrainingSetupError, CheckpointError) as e:
        failed_write = isinstance(e, CheckpointError) and _written_by(e, write_checkpoint)
        if args.resume is None:
            _undo_start(out, created, primary)
        say(f"error: {e}")
        return EXIT_FAILED if failed_write else EXIT_USAGE
    except NonFiniteLossError as e:
        last = out / "checkpoints" / "last.ckpt"
        if last.is_file():
            kept = f"last good checkpoint kept at {last}"
        elif args.resume is None:
            _undo_start(out, created, primary)
            kept = "no checkpoint yet, nothing was kept"
        else:
            kept = "no checkpoint yet"
        say(f"error: training stopped: {e}; {kept}")
        return EXIT_FAILED
    except OSError as e:
        if args.resume is None:
            _undo_start(out, created, primary)
        say(f"error: cannot write to the run folder {out}: {e.strerror or e}")
        return EXIT_FAILED
    if result:
        print(" ".join(f"{k}={result[k]:.4g}" for k in
                       ("mse", "fvu", "l0_mean", "l0_std", "dead_fraction", "dense_fraction",
                        "wall_time_s") if isinstance(result.get(k), int | float)))
        if result.get("converged") is False:
            print(f"note: validation FVU moved {100 * result['val_fvu_change']:.1f} % and L0 "
                  f"{100 * result['val_l0_change']:.1f} % in the last epoch: not converged "
                  "(train longer for settled numbers)")
        for name in ("report.html", "features.html"):
            if (out / name).is_file():
                print(f"{name.split('.')[0]}: {out / name}")
    return 0


def _interrupted_report(out: Path, command: str) -> None:
    """report.html of what an interrupted run has, saying how it goes on; a second signal or a
    failure while it is written leaves the run as it is, without a report."""
    try:
        with _signals_held():  # no half-imported plotting modules; the signal waits a moment
            from sae.report import write_report
        write_report(out, resume_command=command)
    except (KeyboardInterrupt, Terminated, Exception):  # noqa: BLE001 (the stop goes on)
        return
    print(f"report: {out / 'report.html'}", flush=True)


def _undo_start(out: Path, created: bool, primary: bool) -> None:
    """A fresh run that failed before its first checkpoint leaves no half-made folder."""
    if primary:
        from sae import runfolder

        runfolder.remove_unfinished(out, created)


def _stopped(args, out: Path, created: bool, primary: bool, say, what: str, code: int) -> int:
    if (out / "checkpoints" / "last.ckpt").is_file() or args.resume is not None:
        command = shlex.join([sys.executable, "-m", "sae.run", "--out", str(out), "--resume"])
        if primary and not args.no_report and (out / "checkpoints" / "last.ckpt").is_file():
            _interrupted_report(out, command)
        say(f"{what}; continue with: {command}")
    else:
        _undo_start(out, created, primary)
        say(f"{what} before the first checkpoint; nothing was kept")
    return code


if __name__ == "__main__":
    sys.exit(main())
