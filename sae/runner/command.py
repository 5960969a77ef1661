"""python -m sae.run: train one SAE and write its run folder.

    python -m sae.run --model sparsemax --lambda 0.01
    python -m sae.run --data acts.npy --model sparsemax --lambda 0.01   (activations,
        sae.data.matrix)

Run folder::

    config.yaml          resolved settings (re-usable with --config)
    data.json            with --data: each matrix's path, shape, dtype and SHA-256
        (sae.data.rundata)
    metrics.csv          per-step training and per-epoch validation metrics (all sessions)
    logs/session_<n>/    each session's own metrics.csv (the first run, then each --resume)
    metrics.json         final test-set metrics (written when training completes)
    checkpoints/         last.ckpt (after every validation), best.ckpt (lowest val/loss)
    tensorboard/         TensorBoard logs
    figures/<kind>/      PNGs (see sae.training.callbacks)
    report.html          self-contained report

Settings are layered: defaults < --config FILE < (on --resume) the run's config.yaml < flags
(:mod:`sae.settings.cli`). Every value is checked before any work starts; bad input is one line on
stderr
and exit code 2. Exit codes: 0 done, 1 training failed (non-finite loss, disk full), 2 bad input,
130 interrupted (Ctrl-C), 143 terminated (SIGTERM).
"""

from __future__ import annotations

import os
import shlex
import signal
import sys
import traceback
from contextlib import contextmanager, nullcontext
from pathlib import Path

from sae.data.rundata import DataCheck, check_data, check_split, header_record, write_record
from sae.runner.hooks import run_hooks
from sae.settings.cli import (
    UsageError,
    build_parser,
    run_config,
    unused_flags,
    write_config,
)
from sae.settings.config import RunConfig
from sae.settings.metric_defs import summary_line
from sae.settings.sizes import check_model
from sae.system import status
from sae.system.process import (
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_TERMINATED,
    EXIT_USAGE,
    RUN_DIR_ENV,
    Terminated,
    end_process,
    exit_now,
    importing,
    is_primary_process,
    line_ended,
    new_line_after_ctrl_c,
    raise_terminated,
    running_as,
    stop_with_parent,
)
from sae.system.process import signals_held as _signals_held
from sae.training import runfolder

__all__ = ["EXIT_USAGE", "UsageError", "build_parser", "main"]


def check_devices(config: RunConfig, on_stop=None) -> None:
    """Whether the device kind asked for is here (imports torch: after the checks of the
    settings, still before the run folder is claimed; ``on_stop``: see :func:`_importing`)."""
    accelerator, precision = config.hardware.accelerator, config.hardware.precision
    needs_cuda = accelerator == "cuda" or precision.startswith("transformer-engine")
    if not (needs_cuda or accelerator in ("gpu", "mps")):
        return
    with _importing(on_stop):
        import torch  # only for a run that asks for a GPU

    cuda, mps = torch.cuda.is_available(), torch.backends.mps.is_available()
    if needs_cuda and not cuda:
        what = f"--precision {precision}" if accelerator != "cuda" else "--accelerator cuda"
        raise UsageError(f"{what} needs a CUDA GPU, and torch sees none here")
    if accelerator == "gpu" and not (cuda or mps):
        raise UsageError("--accelerator gpu: torch sees no CUDA or MPS device here; use "
                         "--accelerator cpu or auto")
    if accelerator == "mps" and not mps:
        raise UsageError("--accelerator mps: torch sees no MPS device here (Apple silicon "
                         "only); use --accelerator cpu or auto")


# set when a stop left nothing to write (before the claim, or a start undone): the command-line
# process then ends at once (sae.system.process.exit_now) instead of tearing torch and Lightning
# down,
# which takes a second or more
QUICK_EXIT = False


@contextmanager
def _importing(on_stop):
    """:func:`sae.system.process.importing`, ending the process at once only as the command
    (``python -m sae.run``), not in a process that calls :func:`main` and goes on; a start-up
    task meanwhile (:mod:`sae.system.status`)."""
    with importing(on_stop if running_as("sae.run") else None), \
            status.task("importing torch and Lightning"):
        _announce()
        yield


def _announce() -> None:
    """The start-up's status line at once, the first time torch is imported (seconds): the
    command's first line says what it waits for, before the run folder's."""
    global _ANNOUNCED
    live = status.running()
    if live is not None and not _ANNOUNCED:
        _ANNOUNCED = True
        line = live.line()
        if line is not None:
            live.write(line)


_ANNOUNCED = False


def _checked(argv: list[str], on_stop=None) -> tuple[RunConfig, dict | None]:
    """The run's checked settings and, with --data, the record of its data (read and checked
    in full, on resume compared with the run's), all before the run folder is touched."""
    config = run_config(argv)
    if config.folder.resume == "last":
        runfolder.check_resume(config.folder.out)
    check_devices(config, on_stop)
    if config.data.source:  # the model's layer: opened and read once, before the folder
        with _importing(on_stop):
            from sae.data.streamed import check_source  # torch: only for --source

            _import_training()
        explicit = "source" in vars(build_parser(suppress=True).parse_args(argv))
        with status.task(f"opening --source {config.data.source} and reading its layer"):
            record = check_source(config, explicit)
        config.sae.input_dim = record["width"]
        check_model(config.sae)
        return config, record
    if not config.data.data:
        check_data(config)  # a resumed --data run needs its data
        _pin_val_size(config, check_split(config.settings()))  # from the training file's header
        with _importing(on_stop):  # before the run folder's line: the first line says it
            _import_training()
        return config, None
    # at once, before torch; its note once the data is read in full, below
    check_split(config.settings(), header_record(config.settings()), note=False)
    # reading and checking every file (seconds for a large one) runs beside the imports, and is
    # not held: Ctrl-C or SIGTERM stops it at once, with nothing written
    pending = DataCheck(config.data.data, config.data.data_dir)
    with _importing(on_stop):
        _import_training()
    record = check_data(config, pending)
    _pin_val_size(config, check_split(config.settings(), record))
    config.sae.input_dim = int(record["train"]["shape"][1])
    check_model(config.sae)
    return config, record


def _pin_val_size(config: RunConfig, rows: int | None) -> None:
    """``--val-size`` as the count of rows it resolved to (a fraction, or the default rule),
    so that ``config.yaml`` and a resume hold the split the run trained with."""
    if rows is not None:
        config.data.val_size = rows


def _import_training() -> None:
    """Import torch, Lightning and the training modules (seconds; see :func:`_importing`)."""
    import lightning.pytorch.loggers  # noqa: F401

    # the training modules: importing them is this function's job, after the checks
    import sae.data.images
    import sae.models  # likewise
    import sae.training.checkpoints  # likewise
    import sae.training.engine  # noqa: F401


def _start(config: RunConfig, record: dict | None, out: Path, primary: bool,
           argv: list[str]) -> bool:
    """Claim the run folder and write its settings (and ``record``, the data's, when given);
    returns whether the folder was made now.
    A failure undoes what it made and raises (UsageError, OSError)."""
    if not primary:
        return False
    folder = config.folder
    mode = "resume" if folder.resume is not None else "overwrite" if folder.overwrite else "new"
    # a start stopped by kill -9 is started again by the same command with --overwrite (the
    # same sae.train call with overwrite=True for a (model, dataset) no command can name)
    if config.data.source == "python":  # sae.data.streamed.PYTHON_SOURCE
        again = (f"sae.train(source=(model, dataset), hook={config.data.hook!r}, "
                 f"out={str(out)!r}, overwrite=True)")
    else:
        again = shlex.join([sys.executable, "-m", "sae.run", *argv,
                            *([] if "--out" in argv else ["--out", str(out)]), "--overwrite"])
    created = runfolder.claim(out, mode, again)
    if folder.resume is None:
        try:
            write_config(config, out / "config.yaml")
            if record is not None:
                write_record(out, record)
        except OSError:
            runfolder.remove_unfinished(out, created)
            raise
    os.environ[RUN_DIR_ENV] = str(out)  # DDP workers re-run this CLI: same folder
    return created


def main(argv: list[str] | None = None) -> int:
    """``python -m sae.run ARGV``: the exit code (0 trained, 2 usage, 130 / 143 stopped, 1
    failed). Until the first training step, a status line every few seconds names what the
    start-up is doing (:mod:`sae.system.status`)."""
    argv = sys.argv[1:] if argv is None else argv
    several = run_hooks(argv, main)  # --hook a,b,c: a run per layer, this command each
    if several is not None:
        return several
    with status.StartupStatus() if is_primary_process() else nullcontext():
        return _main(argv)


def _main(argv: list[str]) -> int:
    # Ctrl-C (and a sweep's SIGINT) always interrupts, even when started from a shell that
    # ignores SIGINT for its background jobs (the ignored disposition would be inherited);
    # SIGTERM is one line and exit 143 from here on, during the imports too
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, raise_terminated)
    line_ended(False)
    primary = is_primary_process()
    say = (lambda line: print(line, file=sys.stderr)) if primary else (lambda line: None)
    try:
        config, record = _checked(argv, on_stop=lambda e: _stopped_early(e, say))
        # inside the try: a signal between the checks and the claim below is one line too
        out, created, claimed = Path(config.folder.out), False, False
        resuming = config.folder.resume is not None
    except UsageError as e:
        say(f"error: {e}")
        return EXIT_USAGE
    except (KeyboardInterrupt, Terminated) as e:
        return _stopped_early(e, say)
    try:
        with _signals_held():  # the folder is claimed and its settings written whole
            created = _start(config, record, out, primary, argv)
            claimed = True
            if primary:  # after the imports' status line (torch and Lightning are loaded)
                print(f"run folder: {out}" + (" (resuming)" if resuming else ""), flush=True)
                for note in unused_flags(argv, config):  # beside the run's other notes
                    print(note, flush=True)

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
            return _stopped_early(e, say)
        return _stopped(config, out, created, primary, say, stopped, code)
    if primary:
        stop_with_parent()
    return _train(config, out, created, primary, say)


def _stopped_early(e: BaseException, say) -> int:
    """A stop before the run folder is claimed: one line, nothing written, a quick exit."""
    global QUICK_EXIT
    with _signals_held(drop=True):
        QUICK_EXIT = True
        if isinstance(e, KeyboardInterrupt):
            new_line_after_ctrl_c()
        say(f"{'terminated' if isinstance(e, Terminated) else 'interrupted'} before training "
            "started; nothing was written")
    return EXIT_TERMINATED if isinstance(e, Terminated) else EXIT_INTERRUPTED


def _written_by(e: BaseException, function) -> bool:
    """Whether ``function`` is on ``e``'s traceback (a checkpoint write, not a read, failed)."""
    return any(frame.f_code is function.__code__ for frame, _ in traceback.walk_tb(e.__traceback__))


def _train(config: RunConfig, out: Path, created: bool, primary: bool, say) -> int:
    # torch and Lightning, already loaded by _import_training: not at this module's import
    from sae.data.images import DataSourceError
    from sae.training.checkpoints import CheckpointError, write_checkpoint  # likewise
    from sae.training.engine import TrainingSetupError, train  # likewise
    from sae.training.guards import NonFiniteLossError  # likewise

    try:
        trained = train(config)
        if trained is not None:
            write_pages(config, trained)
    except KeyboardInterrupt:
        return _stopped(config, out, created, primary, say, "interrupted", EXIT_INTERRUPTED)
    except Terminated:
        return _stopped(config, out, created, primary, say, "terminated", EXIT_TERMINATED)
    except (DataSourceError, TrainingSetupError, CheckpointError) as e:
        failed_write = isinstance(e, CheckpointError) and _written_by(e, write_checkpoint)
        if config.folder.resume is None:
            _undo_start(out, created, primary)
        say(f"error: {e}")
        return EXIT_FAILED if failed_write else EXIT_USAGE
    except NonFiniteLossError as e:
        last = out / "checkpoints" / "last.ckpt"
        if last.is_file():
            kept = f"last good checkpoint kept at {last}"
        elif config.folder.resume is None:
            _undo_start(out, created, primary)
            kept = "no checkpoint yet, nothing was kept"
        else:
            kept = "no checkpoint yet"
        say(f"error: training stopped: {e}; {kept}")
        return EXIT_FAILED
    except OSError as e:
        if config.folder.resume is None:
            _undo_start(out, created, primary)
        say(f"error: cannot write to the run folder {out}: {e.strerror or e}")
        return EXIT_FAILED
    result = trained.metrics if trained is not None else {}
    if result:
        print(summary_line(result))
        if result.get("converged") is False:
            print(f"note: validation FVU moved {100 * result['val_fvu_change']:.1f} % and L0 "
                  f"{100 * result['val_l0_change']:.1f} % in the last epoch: not converged "
                  "(train longer for settled numbers)")
        for name in ("report.html", "features.html"):
            if (out / name).is_file():
                print(f"{name.split('.')[0]}: {out / name}")
    return 0



def write_pages(config: RunConfig, trained) -> None:
    """A finished run's pages, each with a status line: the feature browser (from the model, data
    and test codes in memory, :class:`sae.training.engine.Trained`) and the report."""
    from sae.training.engine import status  # loaded with the training, not at import

    out = Path(config.folder.out)
    if not config.output.no_features:
        from sae.pages.features.build import write_features  # plotting: only when it is made

        with status("feature browser"):
            write_features(out, trained.model, trained.datamodule, test_codes=trained.test_codes,
                           data_dir=config.data.data_dir)
    if not config.output.no_report:
        from sae.pages.report import write_report  # jinja2: only when it is made

        with status("report"):
            write_report(out)

def _interrupted_report(out: Path, command: str) -> None:
    """report.html of what an interrupted run has, saying how it goes on; a second signal or a
    failure while it is written leaves the run as it is, without a report."""
    try:
        with _signals_held():  # no half-imported plotting modules; the signal waits a moment
            from sae.pages.report import write_report  # jinja2: only when it is made
            from sae.training.engine import status  # loaded with the training, not at import
        with status("report"):  # seconds: named as it starts, as a finished run's steps are
            write_report(out, resume_command=command)
    except (KeyboardInterrupt, Terminated, Exception):  # noqa: BLE001 (the stop goes on)
        return
    print(f"report: {out / 'report.html'}", flush=True)


def _undo_start(out: Path, created: bool, primary: bool) -> None:
    """A fresh run that failed before its first checkpoint leaves no half-made folder."""
    if primary:
        runfolder.remove_unfinished(out, created)


def resume_command(config: RunConfig, out: Path) -> str:
    """What continues a stopped run: the command, with a streamed run's --source and --hook
    (a run folder never names code to import); for a (model, dataset) handed to sae.train,
    which no command can name, that call with resume="last"."""
    data = config.data
    if data.source == "python":  # sae.data.streamed.PYTHON_SOURCE (that module imports torch)
        return (f"sae.train(source=(model, dataset), hook={data.hook!r}, out={str(out)!r}, "
                "resume='last')")
    source = ["--source", data.source, "--hook", data.hook] if data.source else []
    return shlex.join([sys.executable, "-m", "sae.run", "--out", str(out), "--resume", *source])


def _stopped(config: RunConfig, out: Path, created: bool, primary: bool, say, what: str,
             code: int, report: bool = True) -> int:
    global QUICK_EXIT
    if code == EXIT_INTERRUPTED and primary:
        new_line_after_ctrl_c()  # the report's line and the resume command start a line
    has_checkpoint = (out / "checkpoints" / "last.ckpt").is_file()
    if has_checkpoint or config.folder.resume is not None:
        command = resume_command(config, out)
        if primary and not config.output.no_report and has_checkpoint and report:
            _interrupted_report(out, command)
        say(f"{what}; continue with: {command}")
    else:
        with _signals_held(drop=True):  # a second signal does not cut the undoing in half
            _undo_start(out, created, primary)
            say(f"{what} before the first checkpoint; nothing was kept")
            QUICK_EXIT = True
    return code


class _LinesMayGoUnread:
    """A standard stream whose reader may go away (``python -m sae.run ... | head -n 1``): once
    a write or flush finds its pipe closed, the stream's descriptor is pointed at /dev/null and
    what the run says from then on is dropped. The run goes on to the end: what it makes is its
    folder, and its lines only tell of it, so a closed pipe is neither a run-folder error nor a
    reason to lose the training done."""

    def __init__(self, stream):
        self._stream = stream

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except BrokenPipeError:
            self._drop()
            return len(text)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except BrokenPipeError:
            self._drop()

    def _drop(self) -> None:
        devnull = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(devnull, self._stream.fileno())
        finally:
            os.close(devnull)
        try:  # what was buffered for the closed pipe goes too
            self._stream.flush()
        except (OSError, ValueError):
            pass

    def __getattr__(self, name: str):
        return getattr(self._stream, name)


def as_command() -> None:
    """Run as ``python -m sae.run``: exit with :func:`main`'s code. A closed stdout or stderr
    drops the lines written to it (:class:`_LinesMayGoUnread`)."""
    sys.stdout, sys.stderr = _LinesMayGoUnread(sys.stdout), _LinesMayGoUnread(sys.stderr)
    code = main()
    if QUICK_EXIT:
        exit_now(code)
    end_process(code)  # within a fraction of a second of the last line
