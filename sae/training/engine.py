"""One training run from checked settings: data, model, Lightning Trainer, test-set metrics.

Called by ``python -m sae.run`` (:mod:`sae.runner.command`, which then writes the pages) once the
settings are checked and the run folder is claimed; everything heavy (torch, Lightning) is
imported here, at the top, not there: the command imports this module only once its settings are
checked.
"""

from __future__ import annotations

import logging
import math
import os
import signal
import sys
import threading
import time
import warnings
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

import lightning.pytorch as L
import torch
from lightning.fabric.utilities.exceptions import MisconfigurationException
from lightning.pytorch.callbacks import ModelCheckpoint, Timer
from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger

from sae.data.images import DataSourceError
from sae.data.matrix import MatrixError
from sae.data.matrixdata import train_moments
from sae.data.modules import data_module
from sae.data.streamed import SourceError
from sae.settings.config import RunConfig
from sae.system.io import write_json
from sae.system.process import SESSION_ENV, Terminated, is_primary_process, line_ended
from sae.system.status import task
from sae.training import guards, runfolder
from sae.training.callbacks import (
    EpochSeed,
    FigureCallback,
    StopOnSignal,
    StopRequested,
    StopWhenSettled,
    log_test_hparams,
)
from sae.training.checkpoints import SafeCheckpointIO, read_checkpoint
from sae.training.convergence import final_validation, last_epoch_change, read_validation
from sae.training.evaluate import evaluate
from sae.training.module import training_module
from sae.training.progress import EpochLines, ProgressBar
from sae.training.resumable import check_compatible

__all__ = ["Terminated", "Trained", "TrainingSetupError", "quiet_lightning", "train"]


class TrainingSetupError(Exception):
    """Settings that only fail once Lightning or torch sees them (device, strategy, memory)."""


def quiet_lightning() -> None:
    """Keep the terminal for what matters: Lightning's banners and known-harmless warnings off."""
    for name in ("lightning.pytorch", "lightning.fabric"):
        logging.getLogger(name).setLevel(logging.WARNING)
    for message in (".*exists and is not empty.*", ".*does not have many workers.*",
                    ".*LeafSpec.*", ".*is an invalid version and will not be supported.*",
                    # a run that stops mid-epoch (--max-steps) has no validation at its end
                    ".*could not find the monitored key in the returned metrics.*"):
        warnings.filterwarnings("ignore", message=message)


LOGGER_CLOSE_S = 5.0  # the longest a run waits for TensorBoard's writer when it ends


def bounded_tensorboard_logger(out: Path):
    """The run's TensorBoard logger (``<out>/tensorboard``), whose closing never blocks the
    run's exit for long (:func:`_bounded_logger_class`)."""
    cls = __getattr__("BoundedTensorBoardLogger")
    return cls(out, name="tensorboard", version="", default_hp_metric=False)


def _bounded_logger_class():
    """Lightning's TensorBoard logger, closed in a daemon thread waited for at most
    :data:`LOGGER_CLOSE_S` seconds.

    TensorBoard's event writer closes by joining its writer thread without a timeout; after the
    process is signalled mid-write that join can wait forever, and a run that never exits keeps
    its run folder locked. Events not yet written when the wait ends are lost; the run's
    checkpoint and metrics are not. After a successful fit the writer stays open until
    :meth:`close`, so that the test metrics logged after it go to the same event file. Made on
    first use (module ``__getattr__``), so that importing
    this module does not import Lightning, while the class still pickles by name (DDP spawn).
    """
    class BoundedTensorBoardLogger(TensorBoardLogger):
        def finalize(self, status: str) -> None:
            if status == "success":  # the run logs its test metrics next; then close()
                self.experiment.flush()
                return
            self.close()

        def close(self) -> None:
            closing = threading.Thread(target=super().finalize, args=("success",), daemon=True)
            closing.start()
            closing.join(LOGGER_CLOSE_S)

    BoundedTensorBoardLogger.__module__ = __name__
    BoundedTensorBoardLogger.__qualname__ = "BoundedTensorBoardLogger"
    return BoundedTensorBoardLogger


def __getattr__(name: str):
    if name == "BoundedTensorBoardLogger":
        if name not in globals():
            globals()[name] = _bounded_logger_class()
        return globals()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def run_loggers(config: RunConfig, out: Path, session: str) -> list:
    """The fit's loggers: the session's CSV log always (``metrics.csv`` is merged from it, and
    the pages, a resume and sweeps read that), then ``--logger``'s: TensorBoard in
    ``<out>/tensorboard``, nothing more (``csv``), or Weights & Biases (``wandb``: one wandb run
    per session, named after the run folder and grouped by it; wandb keeps its own files where
    ``WANDB_DIR`` says, not in the run folder, whose layout stays the tool's)."""
    loggers: list = [CSVLogger(out, name="logs", version=session)]
    if config.output.logger == "tensorboard":
        loggers.append(bounded_tensorboard_logger(out))
    elif config.output.logger == "wandb":
        from lightning.pytorch.loggers import WandbLogger  # wandb: an optional extra

        # Lightning's save_dir (default ".") would override wandb's own WANDB_DIR
        loggers.append(WandbLogger(name=f"{out.name}/{session}", group=out.name,
                                   save_dir=os.environ.get("WANDB_DIR", "."),
                                   project=os.environ.get("WANDB_PROJECT", "sae"),
                                   config=config.settings()))
    return loggers


def checkpoint_to_resume(config: RunConfig) -> Path:
    resume = config.folder.resume
    if resume in (None, "last"):
        return Path(config.folder.out) / "checkpoints" / "last.ckpt"
    return Path(resume)


def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split())[:300] or type(e).__name__


def build_trainer(config: RunConfig, out: Path, steps_per_epoch: int, callbacks: list,
                  loggers: list, preloaded: tuple[Path, dict] | None = None,
                  checkpoint_io=None):
    training, hw, progress = config.train, config.hardware, config.output.progress
    val_interval, val_every_epochs = 1.0, 1
    if training.max_steps is not None and training.max_steps < steps_per_epoch:
        # still validate (and checkpoint) before stopping; counted in steps across epochs, as
        # DDP ranks see shorter epochs
        val_interval, val_every_epochs = training.max_steps, None
    show_progress = progress == "on" or (progress == "auto" and sys.stderr.isatty())
    # a line per validation always (stdout); on a terminal a bar too (stderr); both first
    # among the callbacks: a step is drawn before a later one can stop the run at its end, and
    # a validation's metrics are shown before the figures of it are drawn (seconds)
    callbacks = [*([ProgressBar()] if show_progress else []), EpochLines(), *callbacks]
    try:
        return L.Trainer(
            max_epochs=training.epochs, max_steps=training.max_steps or -1,
            accelerator=hw.accelerator,
            devices=hw.devices, strategy=hw.strategy, num_nodes=hw.num_nodes,
            precision=hw.precision, gradient_clip_val=training.grad_clip or None,
            gradient_clip_algorithm="norm", logger=loggers, callbacks=callbacks,
            plugins=[checkpoint_io or SafeCheckpointIO(preloaded)],
            log_every_n_steps=min(config.output.log_every, steps_per_epoch),
            val_check_interval=val_interval, check_val_every_n_epoch=val_every_epochs,
            num_sanity_val_steps=0, enable_progress_bar=show_progress,
            enable_model_summary=False, default_root_dir=out)
    except (MisconfigurationException, ValueError, RuntimeError, TypeError) as e:
        raise TrainingSetupError(f"cannot set up training with --accelerator {hw.accelerator} "
                                 f"--devices {hw.devices} --strategy {hw.strategy}: "
                                 f"{_one_line(e)}") from None


def train(config: RunConfig) -> Trained | None:
    """Fit and evaluate; returns the test metrics and what the pages are made from (None on DDP
    ranks other than 0).

    Reads top to bottom: the checkpoint to resume (checked before anything changes), data,
    model, callbacks and loggers, the fit, then :func:`finish` (test metrics), one status
    line per step. A Ctrl-C or SIGTERM during the fit stops after the training step in progress
    with that step's checkpoint (:class:`sae.training.callbacks.StopOnSignal`).
    """
    out, seed = Path(config.folder.out), config.train.seed
    quiet_lightning()
    L.seed_everything(seed, workers=True, verbose=False)

    # resume: the checkpoint is read and checked in full (its archive, checksum, schema, and the
    # optimiser, loop and callback states Lightning will restore) before anything in the folder
    # changes: a checkpoint that fails any check costs no session folder and no log file
    with task("reading the checkpoint to resume"):
        ckpt, state, start_step, legacy_seconds = checked_resume(config)
    with task("loading the data"):
        dm = load_data(config)
    with task("building the model"):
        module = new_module(config, dm)

    if is_primary_process():
        os.environ[SESSION_ENV] = runfolder.new_session(out, start_step)
    session = os.environ.get(SESSION_ENV, "session_0")
    last = out / "checkpoints" / "last.ckpt"
    timer, stop = Timer(), StopOnSignal(last)
    callbacks = [*run_callbacks(config, dm, timer), stop]  # stop last: after the others' work
    loggers = run_loggers(config, out, session)
    steps_per_epoch = math.ceil(len(dm.train_x) / config.train.batch_size)
    # the checkpoint read and checked above is the one Lightning restores: not read twice
    trainer = build_trainer(config, out, steps_per_epoch, callbacks, loggers,
                            preloaded=(ckpt, state) if ckpt else None)
    state = None
    fit_model = torch.compile(module) if config.hardware.compile else module
    try:  # the start-up's status lines end with the first step (EpochLines)
        with task("starting the fit"):
            fit(trainer, fit_model, dm, ckpt)
    finally:
        if trainer.is_global_zero:
            runfolder.merge_history(out)
    wall = legacy_seconds + timer.time_elapsed("train")
    # the last validation's checkpoint can be behind when --max-steps ends mid-epoch
    trainer.save_checkpoint(last)
    if stop.signum is not None:  # arrived during the last validation: training is complete
        raise Terminated if stop.signum == signal.SIGTERM else KeyboardInterrupt
    if not trainer.is_global_zero:
        return None
    held = float(module.lambda_full()) if module.controls_l0 else None
    return finish(config, module.sae, dm, wall, int(trainer.global_step),
                  int(trainer.current_epoch), trainer.loggers, lambda_held=held)


def fit(trainer, model, dm, ckpt: Path | None) -> None:
    """``trainer.fit`` from ``ckpt`` (or afresh), a stop raised as the interruption it is:
    KeyboardInterrupt for Ctrl-C, ``Terminated`` for SIGTERM."""
    try:
        trainer.fit(model, datamodule=dm, ckpt_path=str(ckpt) if ckpt else None,
                    weights_only=True)
    except StopRequested as e:  # the step's checkpoint is written
        raise (Terminated if e.signum == signal.SIGTERM else KeyboardInterrupt) from None
    except SystemExit:
        # Lightning turns a second Ctrl-C into a graceful shutdown and sys.exit(1), and SIGTERM
        # into SIGTERMException (a SystemExit); report each as the interruption it is
        if trainer.received_sigterm:
            raise Terminated from None
        if trainer.interrupted:
            raise KeyboardInterrupt from None
        raise


def new_module(config: RunConfig, dm):
    """The training module of a new model of ``config`` for the data ``dm``: its decoder bias
    and loss normaliser from the training rows, its decoder columns seeded from them with
    ``init: data`` (the same rows for the same --seed)."""
    sae, seed = config.sae, config.train.seed
    mean, data_var = train_moments(dm)
    init_inputs = None
    if sae.resolved_init() == "data":
        pick = torch.randperm(len(dm.train_x), generator=torch.Generator().manual_seed(seed))
        init_inputs = dm.train_x[pick[: sae.hidden]]
    try:
        return training_module(sae, mean, data_var, init_inputs)
    except (RuntimeError, MemoryError) as e:
        raise TrainingSetupError(f"cannot build the model (--hidden {sae.hidden}): "
                                 f"{_one_line(e)}") from None


def run_callbacks(config: RunConfig, dm, timer) -> list:
    """The fit's callbacks but the stop on a signal: checkpoints (best and a true last after
    every validation), ``timer``, the epoch seed, the model's guards and the figures."""
    out = Path(config.folder.out)
    callbacks = [
        ModelCheckpoint(dirpath=out / "checkpoints", filename="best", monitor="val/loss",
                        mode="min", save_top_k=1, enable_version_counter=False),
        # a true last.ckpt after every validation, whether or not it improved
        ModelCheckpoint(dirpath=out / "checkpoints", filename="last", monitor=None,
                        save_top_k=1, enable_version_counter=False),
        timer,
        EpochSeed(config.train.seed),  # an epoch's randomness does not depend on a resume
        *guards.training_callbacks(config.sae),  # looked up at each run: one may add its own
    ]
    if config.train.until_converged:
        callbacks.append(StopWhenSettled())
    if not config.output.no_figures:
        callbacks.append(FigureCallback(out / "figures", every_n_epochs=config.output.figure_every,
                                        class_names=dm.class_names,
                                        images=not (config.data.data or config.data.source),
                                        announce=status))
    return callbacks


def checked_resume(config: RunConfig):
    """(checkpoint path, its checked state, its step, an earlier version's training seconds)
    of ``--resume``; (None, None, 0, 0.0) for a fresh run."""
    if config.folder.resume is None:
        return None, None, 0, 0.0
    ckpt = checkpoint_to_resume(config)
    state = read_checkpoint(ckpt)
    check_compatible(state, asdict(config.sae), ckpt)
    epochs = config.train.epochs
    if int(state.get("epoch", 0)) > epochs:
        raise TrainingSetupError(f"--epochs {epochs} is below the epoch of checkpoint "
                                 f"{ckpt} ({state['epoch']}); give at least that many")
    legacy_seconds = 0.0
    if not any(str(k).startswith("Timer") for k in state.get("callbacks", {})):
        legacy_seconds = float(state.get("train_seconds", 0.0))  # an earlier version's
    return ckpt, state, int(state.get("global_step", 0)), legacy_seconds


def load_data(config: RunConfig):
    """The run's data module, loaded and checked (at least 2 images, not all the same)."""
    dm = data_module(config.settings(), batch_size=config.train.batch_size,
                     shuffle_seed=config.train.seed)
    what = "rows" if config.data.data or config.data.source else "images"
    try:
        dm.load()
    except (MatrixError, SourceError) as e:
        raise DataSourceError(str(e)) from None
    if len(dm.train_x) < 2:
        raise DataSourceError(f"training needs at least 2 {what}, got {len(dm.train_x)} "
                              "(--limit-train)")
    variance = train_moments(dm)[1]
    if not variance <= F32_MAX:  # inf or NaN too: training computes in float32
        raise DataSourceError(f"the training {what}' variance ({variance:.3g}) is beyond the "
                              f"float32 range (±{F32_MAX:.3g}) that training computes in: "
                              "numeric overflow; scale the data down")
    if not variance > 0:
        raise DataSourceError(f"the training {what} are all the same: their variance is 0")
    return dm


F32_MAX = 3.4028234663852886e38  # the largest float32: a loss or variance beyond it is inf


@contextmanager
def status(label: str):
    """A finishing step's line on stdout: its label as it starts (so a finished progress bar is
    never the last word while work goes on), its time when it ends. A terminal shows one line,
    ``label …`` completed in place (``label … 2.1 s``); a pipe or a log, which sees a line only
    once it ends, gets ``label …`` as the step starts and ``label … 2.1 s`` as it ends."""
    terminal = sys.stdout.isatty()
    print(f"{label} …", end="" if terminal else "\n", flush=True)
    start = time.perf_counter()
    try:
        yield
    except BaseException:
        # the error or interruption follows on its own line
        print(" stopped" if terminal else f"{label} … stopped", flush=True)
        line_ended()
        raise
    took = f"{time.perf_counter() - start:.1f} s"
    print(f" {took}" if terminal else f"{label} … {took}", flush=True)


@dataclass
class Trained:
    """A completed fit on rank 0: its test metrics (as in ``metrics.json``), the model, its data
    module and the test set's codes, from which the run's pages are made
    (:func:`sae.runner.command.write_pages`) without reading anything back."""

    metrics: dict
    model: object
    datamodule: object
    test_codes: object


def finish(config: RunConfig, model, dm, wall: float, steps: int, epochs: int, loggers: list,
           lambda_held: float | None = None) -> Trained:
    """After a completed fit (rank 0): test metrics to ``metrics.json`` and the ``loggers``, with
    a status line; returns them with what the pages are made from. ``steps`` and ``epochs`` are
    where training ended, ``lambda_held`` the λ a ``--target-l0`` run ended with."""
    out, sae, training = Path(config.folder.out), config.sae, config.train
    with status("test metrics"):
        truth = getattr(dm, "truth", None)  # data made with known features
        result, codes = evaluate(model, dm.test_x, dm.train_pca(), dm.train_mean, truth,
                                 dm.val_x if truth is not None else None)
        validation = read_validation(out / "metrics.csv")
        result.update(**final_validation(validation), **last_epoch_change(validation))
        result.update(wall_time_s=wall, steps=steps, epochs=epochs, model=sae.model,
                      lam=sae.lam, dataset=dm.dataset, seed=training.seed, hidden=sae.hidden,
                      fire_threshold=float(model.fire_threshold), **model.result_extras())
        if lambda_held is not None:  # --target-l0: the λ the run ended with
            result["lambda_held"] = lambda_held
        write_json(out / "metrics.json", result)
        params = {**asdict(sae), "dataset": dm.dataset, "seed": training.seed,
                  "epochs": training.epochs, "max_steps": training.max_steps,
                  "batch_size": training.batch_size}
        tested = log_test_hparams(loggers, params, result, step=steps)
        for logger in loggers:
            if type(logger).__name__ == "WandbLogger":  # its test metrics; then its run ends
                logger.log_metrics(tested, step=steps)
                logger.experiment.finish()
        for logger in loggers:
            closing = getattr(logger, "close", None)
            if closing is not None:
                closing()
    return Trained(result, model, dm, codes)
