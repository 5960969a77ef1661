"""What a run says while it trains: the progress bar of a terminal, a line per validation, and
off a terminal a progress line every half minute.

:class:`ProgressBar` is Lightning's tqdm bar as a terminal should show it (epochs counted from
1, the last validation's numbers, redrawn through slow steps, closed at once on a stop);
:class:`EpochLines` prints each validation's line (:func:`epoch_line`), and where no bar moves a
:func:`progress_line` every :data:`PROGRESS_LINE_S` seconds; its first step ends the start-up's
status lines (:mod:`sae.system.status`).
"""

from __future__ import annotations

import csv
import math
import sys
import threading
import time
from pathlib import Path

import lightning.pytorch as L
import torch
from lightning.pytorch.callbacks import TQDMProgressBar
from lightning.pytorch.callbacks.progress.tqdm_progress import Tqdm
from tqdm import tqdm

from sae.system import status
from sae.system.process import line_ended, stop_signals_to_main_thread

__all__ = ["PROGRESS_LINE_S", "EpochLines", "ProgressBar", "epoch_line", "epoch_text",
           "epochs_of", "last_step", "last_validation", "progress_line"]


def epochs_of(trainer) -> int | None:
    """The epochs a fit runs: ``max_epochs``, or fewer when ``max_steps`` ends it first."""
    total = trainer.max_epochs if trainer.max_epochs is not None and trainer.max_epochs > 0 \
        else None
    per_epoch = trainer.num_training_batches
    if trainer.max_steps > 0 and isinstance(per_epoch, int) and per_epoch > 0:
        by_steps = math.ceil(trainer.max_steps / per_epoch)
        total = by_steps if total is None else min(total, by_steps)
    return total


def epoch_text(trainer) -> str:
    """``3/10``: the epoch in progress counted from 1, of the fit's epochs."""
    total = epochs_of(trainer)
    return f"{trainer.current_epoch + 1}" + (f"/{total}" if total else "")


# (metric, its name on screen, format, scale): the validation metrics after each validation
VALIDATION_SHOWN = (("val/fvu", "val FVU", ".4f", 1), ("val/l0", "L0", ".1f", 1),
                    ("val/dead_fraction", "dead", ".1f", 100))


def _scalars(metrics) -> dict[str, float]:
    return {k: float(v) for k, v in metrics.items()
            if not isinstance(v, torch.Tensor) or v.numel() == 1}


def last_step(trainer) -> int:
    """The index of the last step trained, counted from 0 as ``metrics.csv`` and TensorBoard
    count steps (Lightning's loggers): the step a validation's row is logged at. Every step the
    terminal names is this index; a count of steps done says ``done``."""
    return max(0, trainer.global_step - 1)


def epoch_line(trainer) -> str:
    """``epoch 3/10 · step 644 · loss 0.1523 · val FVU 0.1498 · L0 31.2 · dead 0.4 %``: what a
    validation says, as :class:`EpochLines` prints it (the step as metrics.csv logs the
    validation: :func:`last_step`)."""
    m = _scalars(trainer.callback_metrics)
    parts = [f"epoch {epoch_text(trainer)}", f"step {last_step(trainer)}"]
    for key, text, fmt, scale in (("train/loss", "loss", ".4f", 1), *VALIDATION_SHOWN):
        if key in m:
            parts.append(f"{text} {scale * m[key]:{fmt}}" + (" %" if scale == 100 else ""))
    return " · ".join(parts)


REFRESH_S = 0.2  # the training bar is redrawn after the first step that ends this long after
TICK_S = 0.5  # and by a thread when nothing drew it for this long (a slow step, figures)


ERASE_TO_END = "\x1b[K"  # ANSI: clear the line from the cursor on


class _Bar(Tqdm):
    """Lightning's tqdm bar, three columns narrower than the terminal (a ``^C`` the terminal
    echoes after it does not wrap to the next line), each drawing ending by clearing the rest
    of its line: the ``^C`` echoed where the cursor stood, after the bar, is wiped by the
    drawing at the stop, and what the run says next starts on a line of its own."""

    @property
    def format_dict(self):
        d = super().format_dict
        if d.get("ncols"):
            d["ncols"] = max(10, d["ncols"] - 3)
        return d

    def __str__(self) -> str:  # tqdm measures a drawing without its escape sequences
        return super().__str__() + ERASE_TO_END


def last_validation(metrics_csv: Path, before_step: int) -> dict[str, float]:
    """The validation metrics of :data:`VALIDATION_SHOWN` in the last validation row of a run's
    ``metrics.csv`` logged before step ``before_step``: what a resumed run's bar shows until
    its first validation (Lightning keeps no metrics in a checkpoint); {} without one."""
    keys = [key for key, *_ in VALIDATION_SHOWN]
    found: dict[str, float] = {}
    try:
        with open(metrics_csv, newline="", encoding="utf-8") as fh:
            for row in csv.DictReader(fh):
                try:
                    step, values = int(float(row.get("step") or "")), \
                        {k: float(row[k]) for k in keys if row.get(k)}
                except ValueError:
                    continue
                if step < before_step and "val/fvu" in values:
                    found = values
    except (OSError, UnicodeDecodeError, csv.Error):
        return {}
    return {k: v for k, v in found.items() if math.isfinite(v)}


class ProgressBar(TQDMProgressBar):
    """Lightning's progress bars, on stderr (stdout holds the run's lines), as a terminal shows
    them:

    * the training bar reads ``Epoch 3/10`` (counted from 1, of the fit's epochs), also when a
      resumed run goes on mid-epoch, and is redrawn after every step that ends
      :data:`REFRESH_S` or more after the last redraw (and at each epoch's end), and by a
      thread of its own when nothing drew it for :data:`TICK_S` (a slow step, figures being
      drawn), so that it moves at least once a second;
    * its numbers are the training loss and L0 (every ``--log-every`` steps) and, from the
      first validation on, the last validation's FVU, L0 and dead share (``val FVU``, ``val L0``,
      ``dead``), drawn as soon as the validation ends; no ``v_num`` (the logger's version);
    * on a stop (Ctrl-C, an error) the bars are closed at once with the step reached, so
      whatever the run says next starts on a line of its own and no bar is drawn again later.

    It must come first among the run's callbacks: a step's count is drawn before a callback
    after it can stop the run at that step's end.
    """

    def __init__(self):
        super().__init__(refresh_rate=1)
        self._drawn = 0.0  # time.monotonic() of the training bar's last redraw
        self._resumed: dict[str, float] = {}  # a resumed run's last validation, until its next
        self._ticking: threading.Event | None = None  # set to stop the ticking thread

    def __getstate__(self) -> dict:  # no thread or event in a copy (DDP spawn pickles it)
        return {**super().__getstate__(), "_ticking": None}

    def _tick(self, stop: threading.Event) -> None:
        """Redraw the training bar while nothing else does (its clock moves on)."""
        stop_signals_to_main_thread()
        while not stop.wait(TICK_S / 2):
            bar = self._train_progress_bar
            if bar is None or time.monotonic() - self._drawn < TICK_S:
                continue
            with bar.get_lock():  # never after its closing drawing: close() draws under it
                if not bar.disable and not stop.is_set():
                    bar.refresh(nolock=True)
                    self._drawn = time.monotonic()

    def _stop_ticking(self) -> None:
        if self._ticking is not None:
            self._ticking.set()
            self._ticking = None

    def _bar(self, desc: str, position: int, leave: bool, total=None, initial: int = 0):
        return _Bar(desc=desc, position=position, disable=self.is_disabled, leave=leave,
                    dynamic_ncols=True, file=sys.stderr, smoothing=0,
                    bar_format=self.BAR_FORMAT, total=total, initial=initial)

    def init_sanity_tqdm(self):
        return self._bar(self.sanity_check_description, 2 * self.process_position, False)

    def init_train_tqdm(self):
        return self._bar(self.train_description, 2 * self.process_position, True)

    def init_validation_tqdm(self):
        main_bar = self.trainer.state.fn != "validate"
        return self._bar(self.validation_description, 2 * self.process_position + main_bar,
                         not main_bar)

    def get_metrics(self, trainer, pl_module) -> dict:
        bar = _scalars(trainer.progress_bar_metrics)
        # the last step's index, as metrics.csv and TensorBoard name it (the bar's n/N counts
        # the epoch's steps done)
        items = {"step": str(last_step(trainer))} if trainer.global_step > 0 else {}
        for key, text in (("train/loss", "loss"), ("train/l0", "L0")):
            if key in bar:
                items[text] = f"{bar[key]:.4g}"
        validated = {**self._resumed, **_scalars(trainer.callback_metrics)}
        for key, text, fmt, scale in VALIDATION_SHOWN:
            if key in validated:
                text = "val L0" if text == "L0" else text
                items[text] = f"{scale * validated[key]:{fmt}}" + (" %" if scale == 100 else "")
        return items

    def on_train_start(self, trainer, pl_module) -> None:
        # drawn first as the epoch it starts in: a run resumed mid-epoch goes on without a new
        # epoch (no on_train_epoch_start), where the checkpoint's step is in its epoch
        if trainer.global_step > 0:  # resumed: the validation before the stop, until the next
            self._resumed = last_validation(Path(trainer.default_root_dir) / "metrics.csv",
                                            trainer.global_step)
        total = trainer.num_training_batches
        total = total if isinstance(total, int) and total > 0 else None
        done = min(max(trainer.global_step - trainer.current_epoch * total, 0), total) \
            if total else 0
        self.train_progress_bar = self._bar(f"Epoch {epoch_text(trainer)}",
                                            2 * self.process_position, True, total, done)
        self.train_progress_bar.set_postfix(self.get_metrics(trainer, pl_module))
        self._drawn = time.monotonic()
        if self.is_enabled and self._ticking is None:
            self._ticking = threading.Event()
            threading.Thread(target=self._tick, args=(self._ticking,), daemon=True,
                             name="progress bar").start()

    def on_train_end(self, trainer, pl_module) -> None:
        self._stop_ticking()
        super().on_train_end(trainer, pl_module)

    def on_train_epoch_start(self, trainer, pl_module) -> None:
        bar = self.train_progress_bar
        total = trainer.num_training_batches
        bar.set_description(f"Epoch {epoch_text(trainer)}", refresh=False)
        bar.set_postfix(self.get_metrics(trainer, pl_module), refresh=False)
        bar.reset(total=total if isinstance(total, int) else None)  # drawn
        self._drawn = time.monotonic()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        bar = self._train_progress_bar
        if bar is None or bar.disable:
            return
        bar.n = batch_idx + 1  # drawn now or later: a stop closes the bar with this count
        now = time.monotonic()
        if now - self._drawn >= REFRESH_S or bar.n == bar.total:
            bar.set_postfix(self.get_metrics(trainer, pl_module), refresh=False)
            bar.refresh()
            self._drawn = now

    def on_validation_batch_start(self, trainer, pl_module, batch, batch_idx,
                                  dataloader_idx: int = 0) -> None:
        if not self.has_dataloader_changed(dataloader_idx):
            return
        bar = self.val_progress_bar  # one loader: "Validation", without "DataLoader 0"
        total = self.total_val_batches_current_dataloader
        bar.set_description(self.sanity_check_description if trainer.sanity_checking
                            else self.validation_description, refresh=False)
        bar.reset(total=total if isinstance(total, int) else None)  # drawn

    def on_validation_end(self, trainer, pl_module) -> None:
        super().on_validation_end(trainer, pl_module)  # its metrics in the bar, drawn now
        self._drawn = time.monotonic()

    def close_bars(self) -> bool:
        """Close the bars still open (validation first), each drawn one last time; whether
        there was one."""
        self._stop_ticking()
        closed = False
        for name in ("_val_progress_bar", "_train_progress_bar", "_test_progress_bar",
                     "_predict_progress_bar"):
            bar = getattr(self, name)
            if bar is not None and not bar.disable:
                bar.close()
                closed = True
        return closed

    def on_exception(self, trainer, pl_module, exception) -> None:
        if self.close_bars():  # the training bar is kept: its line ends with it
            line_ended()

    def teardown(self, trainer, pl_module, stage: str) -> None:
        self.close_bars()


PROGRESS_LINE_S = 30.0  # off a terminal, a progress line this often during training


def progress_line(trainer, step_s: float) -> str:
    """``epoch 1/2 · step 1199 · 1200 of 46798 done · 4.1 ms a step · about 3:08 left``: a
    training step's progress as a log shows it (off a terminal, where there is no bar); the step
    is the last one trained (:func:`last_step`, from 0), then how many are done."""
    total = trainer.estimated_stepping_batches
    done = trainer.global_step
    of = f" of {int(total)}" if math.isfinite(total) else ""
    parts = [f"epoch {epoch_text(trainer)}", f"step {last_step(trainer)}", f"{done}{of} done",
             f"{1000 * step_s:.1f} ms a step"]
    if math.isfinite(total) and total > done:
        left = round((total - done) * step_s)
        parts.append(f"about {left // 3600}:{left // 60 % 60:02d}:{left % 60:02d} left"
                     if left >= 3600 else f"about {left // 60}:{left % 60:02d} left")
    return " · ".join(parts)


class EpochLines(L.Callback):
    """One line on stdout per validation (:func:`epoch_line`), kept: in a log or a pipe, and on
    a terminal above the progress bar (written through tqdm, which clears and redraws it). Off
    a terminal, where no bar moves, a :func:`progress_line` every
    :data:`PROGRESS_LINE_S` seconds of training. The first step ends the start-up's status
    lines (:mod:`sae.system.status`)."""

    def __init__(self, every: float = PROGRESS_LINE_S):
        self.every = every
        self._since: tuple[float, int] | None = None  # (time, step) of the last progress line

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if self._since is None:
            status.stop()
            self._since = (time.monotonic(), trainer.global_step)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        now = time.monotonic()
        then, before = self._since
        if now - then < self.every:  # most steps: the clock alone says nothing is due
            return
        bar = trainer.progress_bar_callback
        if not trainer.is_global_zero or (isinstance(bar, ProgressBar) and bar.is_enabled):
            return
        step = trainer.global_step
        if step > before:
            print(progress_line(trainer, (now - then) / (step - before)), flush=True)
            self._since = (now, step)

    def on_validation_end(self, trainer, pl_module) -> None:  # after the model logged
        if trainer.sanity_checking or not trainer.is_global_zero:
            return
        line = epoch_line(trainer)
        bar = trainer.progress_bar_callback
        if isinstance(bar, ProgressBar) and bar.is_enabled:
            tqdm.write(line, file=sys.stdout)
            sys.stdout.flush()
        else:
            print(line, flush=True)
