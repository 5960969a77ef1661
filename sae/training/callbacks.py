"""Lightning callbacks: figures of what the SAE learned, rendered from validation statistics, the
per-epoch seed that makes a resumed run train as an uninterrupted one (:class:`EpochSeed`), and
the stop on Ctrl-C or SIGTERM after the step in progress (:class:`StopOnSignal`), and the stop
of ``--until-converged`` (:class:`StopWhenSettled`). What a run prints while it trains is
:mod:`sae.training.progress`.

Statistics are gathered on the device during validation from the tensors that
``SparseAutoencoder.validation_step`` returns (no host synchronisation in the training step),
summed / gathered across DDP ranks at the end of the validation epoch, and plotted on rank 0 only.
Every validation epoch also sends two cheap histograms of those statistics to TensorBoard
(per-input L0, log10 firing frequency of the live units); :func:`log_test_hparams` records a
run's settings with its final test metrics for TensorBoard's HParams view.
"""

from __future__ import annotations

import signal
import threading
import warnings
from contextlib import contextmanager
from pathlib import Path

import lightning.pytorch as L
import numpy as np
import torch
import torch.nn.functional as F
from lightning.pytorch.loggers import TensorBoardLogger

from sae import figures, metrics
from sae.data.images import EpochShuffle
from sae.models import encode_dataset
from sae.settings.config import SAEConfig
from sae.settings.variants import variant
from sae.system import io as sae_io
from sae.training.checkpoints import model_from_checkpoint, read_checkpoint
from sae.training.convergence import last_epoch_change, read_validation
from sae.training.runfolder import RunFolder


def write_png(rgb: np.ndarray, path: Path) -> None:
    """Write an RGB array [H, W, 3] as a PNG, atomically (readers never see half a file), in
    full colour: a page that embeds it makes it a palette PNG only where that is lossless
    (``sae.pages.html.palette_png``)."""
    sae_io.write_png(path, rgb)


@contextmanager
def _silent(label: str):
    yield


class FigureCallback(L.Callback):
    """Save ``<out_dir>/<kind>/epoch_<E>.png`` every ``every_n_epochs`` epochs and at the end,
    E counted from 1 (``epoch_1.png`` is drawn after the first epoch).

    ``every_n_epochs = 0`` renders only once, after training, from the last validation. Figures
    also go to TensorBoard when that logger is active (tagged by kind, at the validation's step;
    each figure's title names its epoch and step).
    """

    def __init__(self, out_dir: str | Path, every_n_epochs: int = 0,
                 class_names: list[str] | None = None, n_atoms: int = 64, n_examples: int = 16,
                 images: bool = True, announce=None):
        self.out_dir = Path(out_dir)
        # a context manager factory, announce(label), around the drawing after training (a
        # finishing step's status line, sae.training.engine.status); None: drawn silently
        self.announce = announce
        self.images = images  # inputs are 28x28 images (else rows of activations)
        self.every_n_epochs = every_n_epochs
        self.class_names = class_names or [str(i) for i in range(10)]
        self.n_atoms, self.n_examples = n_atoms, n_examples
        self.stats: dict | None = None  # last validation's statistics (rank 0, numpy)
        self.rendered_epochs: set[int] = set()
        self._due = False  # the last validation's figures are to be drawn at its end
        self.label = ""  # run_label of the run, known from the first validation

    def on_validation_epoch_start(self, trainer, pl_module) -> None:
        C, H = len(self.class_names), pl_module.config.hidden
        self._class_fires = torch.zeros(C, H, device=pl_module.device)
        self._class_count = torch.zeros(C, device=pl_module.device)
        self._l0, self._labels, self._examples = [], [], None

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx,
                                dataloader_idx: int = 0) -> None:
        x, y = batch[0], batch[1]
        active = outputs["active"].float()
        onehot = F.one_hot(y, len(self.class_names)).float()
        self._class_fires += onehot.t() @ active
        self._class_count += onehot.sum(0)
        self._l0.append(active.sum(-1))
        self._labels.append(y)
        if self._examples is None:
            self._examples = (x[: self.n_examples].detach(),
                              outputs["x_hat"][: self.n_examples].detach())

    def on_validation_epoch_end(self, trainer, pl_module) -> None:
        if trainer.sanity_checking or not self._l0:
            return
        self.label = run_label(pl_module.config, getattr(trainer.datamodule, "dataset", None))
        strategy = trainer.strategy
        class_fires = strategy.reduce(self._class_fires, reduce_op="sum")
        class_count = strategy.reduce(self._class_count, reduce_op="sum")
        l0 = strategy.all_gather(torch.cat(self._l0)).reshape(-1)
        labels = strategy.all_gather(torch.cat(self._labels)).reshape(-1)
        if not trainer.is_global_zero:
            return
        n = class_count.sum().clamp_min(1)
        self.stats = {
            "epoch": trainer.current_epoch + 1,  # counted from 1, as the terminal counts it
            "step": max(0, trainer.global_step - 1),  # the last step's index, as metrics.csv
            "freq": (class_fires.sum(0) / n).cpu().numpy(),
            "class_freq": (class_fires / class_count.clamp_min(1)[:, None]).cpu().numpy(),
            "l0": l0.cpu().numpy(),
            "labels": labels.cpu().numpy(),
            "x": self._examples[0].float().cpu().numpy(),
            "x_hat": self._examples[1].float().cpu().numpy(),
            "atoms": pl_module.sae.atoms().float().cpu().numpy(),
        }
        self._histograms(trainer)
        epoch = trainer.current_epoch
        # drawn at the validation's end (on_validation_end), after the progress bar and the
        # epoch's line have shown its metrics: drawing takes seconds
        self._due = bool(self.every_n_epochs and (epoch + 1) % self.every_n_epochs == 0)

    def on_validation_end(self, trainer, pl_module) -> None:
        if self._due and trainer.is_global_zero and not trainer.sanity_checking:
            self.render(trainer)
        self._due = False

    def _histograms(self, trainer) -> None:
        """Per-input L0 and log10 firing frequency of the live units, to TensorBoard."""
        s = self.stats
        freq = s["freq"]
        for tb in _tensorboards(trainer):
            tb.experiment.add_histogram("val/l0_per_input", s["l0"], global_step=s["step"])
            live = freq[freq > 0]
            if live.size:
                tb.experiment.add_histogram("val/log10_firing_frequency", np.log10(live),
                                            global_step=s["step"])

    def on_train_end(self, trainer, pl_module) -> None:
        if trainer.is_global_zero and self.stats is not None:
            if self.stats["epoch"] not in self.rendered_epochs:
                with (self.announce or _silent)("figures"):
                    self.render(trainer)

    def render(self, trainer) -> list[Path]:
        """Plot the last statistics; write PNGs and send them to TensorBoard."""
        paths = render_figures(self.stats, self.out_dir, self.label, self.class_names,
                               self.n_atoms, _tensorboards(trainer), images=self.images)
        self.rendered_epochs.add(self.stats["epoch"])
        return paths


def render_figures(stats: dict, out_dir: Path, label: str, class_names: list[str],
                   n_atoms: int = 64, tensorboards=(), images: bool = True) -> list[Path]:
    """Plot a run's statistics (as :class:`FigureCallback` gathers them) to
    ``<out_dir>/<kind>/epoch_<E>.png``, and to each TensorBoard logger given.

    Every figure's title starts with the run's dataset, model and sparsity setting
    (:func:`run_label`), the data it was drawn from (the validation set, while the run's
    metrics are the test set's) and its epoch (from 1) and step, so a PNG shown alone (the
    gallery) or in TensorBoard says what it is. Without
    ``images`` (activations of any D) the reconstructions, drawn as 28x28 pixels, are left out;
    the atoms are drawn as heatmaps of their D values.
    """
    s = stats
    n_shown = len(s["x"])
    when = f"epoch {s['epoch']}, step {s['step']:,}" if s.get("epoch") else ""
    noun = "images" if images else "inputs"
    header = " · ".join(p for p in (label, f"validation set ({len(s['labels']):,} {noun})", when)
                        if p)
    made = {
        "decoder_atoms": figures.decoder_atoms(s["atoms"], s["freq"], n=n_atoms),
        "reconstructions": figures.reconstructions(
            s["x"], s["x_hat"], source=f"the first {n_shown} validation inputs"),
        "sparsity_histogram": figures.sparsity_histogram(s["l0"], s["labels"], class_names),
        "activation_frequency": figures.activation_frequency_curve(s["freq"]),
        "class_unit_heatmap": figures.class_unit_heatmap(s["class_freq"], class_names),
        "feature_density": figures.feature_density_histogram(s["freq"]),
    }
    if not images:
        del made["reconstructions"]
    if len(class_names) < 2:  # data without labels: no classes to draw
        del made["class_unit_heatmap"]
    paths = []
    for kind, fig in made.items():
        fig.suptitle(f"{header}\n{fig.get_suptitle()}")
        path = Path(out_dir) / kind / f"epoch_{s['epoch']}.png"
        rgb = figures.figure_to_rgb(fig)  # draw once, for the PNG and for TensorBoard
        fig.clear()
        write_png(rgb, path)
        for tb in tensorboards:
            tb.experiment.add_image(kind, rgb, global_step=s["step"], dataformats="HWC")
        paths.append(path)
    return paths


@torch.no_grad()
def validation_stats(model, x: torch.Tensor, y: torch.Tensor, n_classes: int,
                     n_examples: int = 16, epoch: int = 0, step: int = 0) -> dict:
    """The statistics :class:`FigureCallback` gathers during a validation epoch, computed in one
    pass over x [N, D] with labels y [N] (for a run whose figures were not drawn in training)."""
    x_hat, codes = encode_dataset(model, x)
    active = metrics.active(codes, model.fire_threshold).float()
    onehot = F.one_hot(y.long(), n_classes).float()
    class_fires, class_count = onehot.t() @ active, onehot.sum(0)
    return {
        "epoch": epoch, "step": step,
        "freq": (class_fires.sum(0) / max(len(x), 1)).numpy(),
        "class_freq": (class_fires / class_count.clamp_min(1)[:, None]).numpy(),
        "l0": active.sum(-1).numpy(),
        "labels": y.numpy(),
        "x": x[:n_examples].float().numpy(),
        "x_hat": x_hat[:n_examples].numpy(),
        "atoms": model.atoms().float().cpu().numpy(),
    }


def figures_from_checkpoint(run_dir: str | Path) -> list[Path]:
    """Draw a finished run's figures from its ``checkpoints/last.ckpt`` on its own validation
    split (what a sweep run skips while the sweep trains); returns the PNGs written."""
    run = RunFolder(Path(run_dir))
    run_dir, settings = run.path, run.settings()
    state = read_checkpoint(run.checkpoint)
    model = model_from_checkpoint(state)
    dm = run.data_module()
    dm.setup()
    # named after the last validated epoch (counted from 1; metrics.csv, as Lightning writes
    # it, from 0), as the callback would have named them
    validated = read_validation(run_dir / "metrics.csv")
    epoch = validated[-1]["epoch"] + 1 if validated else max(1, int(state.get("epoch", 0)))
    stats = validation_stats(model, dm.val_x, dm.val_y, len(dm.class_names), epoch=epoch,
                             step=max(0, int(state.get("global_step", 0)) - 1))
    config = SAEConfig.from_dict(state["hyper_parameters"]["config"])
    return render_figures(stats, run_dir / "figures", run_label(config, dm.dataset),
                          dm.class_names, images=not settings.get("data"))


class EpochSeed(L.Callback):
    """Seed torch's global generator from (seed, epoch) as each training epoch starts.

    A checkpoint does not hold the generator's state, so without this the randomness of an epoch
    (dead-unit resampling) would depend on whether the run was resumed before it; with it (and
    ``sae.data.images.EpochShuffle`` for the order of the batches) a run resumed at an epoch
    boundary trains exactly as one never stopped. Its state in a checkpoint is the epoch, the
    batches of it done and the generator's state: resumed mid-epoch (a run stopped by a signal,
    :class:`StopOnSignal`), the epoch goes on from that generator state and the rest of the
    epoch's data order instead of starting over from the epoch's seed.
    """

    def __init__(self, seed: int):
        self.seed = seed
        self.epoch, self.batches = 0, 0  # the epoch in progress and its completed batches
        self._resume: tuple[int, torch.Tensor] | None = None  # (epoch, generator state)
        self._continued: int | None = None  # the epoch a mid-epoch resume went on with

    def on_train_start(self, trainer, pl_module) -> None:
        # resumed mid-epoch: the generator and the data order go on where they stopped. Done
        # here, once the checkpoint is read and before the first batch is drawn: Lightning does
        # not start a resumed epoch again (no on_train_epoch_start), and restores a loader's
        # own position only when the loader is made after the checkpoint is read (the models
        # make it earlier, to count the run's steps)
        resume, self._resume = self._resume, None
        if resume is None or resume[0] != trainer.current_epoch:
            return
        torch.set_rng_state(resume[1])
        loader = trainer.train_dataloader
        sampler = getattr(loader, "sampler", None)
        if isinstance(sampler, EpochShuffle):
            sampler.load_state_dict({"epoch": resume[0],
                                     "served": self.batches * loader.batch_size})
            # the resume is exact: Lightning, which sees a loader without a state of its own,
            # would warn that it is not resumable
            warnings.filterwarnings("ignore", message=".*your dataloader is not resumable.*")
        self._continued = resume[0]

    def on_train_epoch_start(self, trainer, pl_module) -> None:
        epoch = trainer.current_epoch
        if self._continued == epoch:  # in case Lightning starts the resumed epoch after all
            self._continued = None
            return
        state = np.random.SeedSequence([self.seed, epoch, 1]).generate_state(2)
        torch.manual_seed(int(state[0]) << 32 | int(state[1]))
        self.epoch, self.batches = epoch, 0

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.batches = batch_idx + 1

    def state_dict(self) -> dict:
        # the generator's state matters only mid-epoch: at an epoch's end the next epoch seeds
        return {"epoch": self.epoch, "batches": self.batches, "rng": torch.get_rng_state()}

    def load_state_dict(self, state: dict) -> None:
        rng, epoch, batches = state.get("rng"), state.get("epoch"), state.get("batches")
        reference = torch.get_rng_state()
        if (isinstance(rng, torch.Tensor) and rng.dtype == reference.dtype
                and rng.shape == reference.shape and isinstance(epoch, int)
                and isinstance(batches, int) and batches > 0):
            self._resume = (epoch, rng.clone())
            self.epoch, self.batches = epoch, batches


class StopWhenSettled(L.Callback):
    """``--until-converged``: stop at the end of the first epoch whose validation FVU and L0 moved
    less than the convergence rule's tolerances (:mod:`sae.training.convergence`, the rule every
    comparison flags runs by), so every mechanism trains until it has settled, ``--epochs``
    being the cap. With ``--target-l0`` only epochs trained with λ held count (a λ still moving
    is not a settled model). A resumed run measures from its own epochs on."""

    def __init__(self) -> None:
        self.rows: list[dict[str, float]] = []

    def on_validation_end(self, trainer, pl_module) -> None:
        if trainer.sanity_checking:
            return
        fvu, l0 = trainer.callback_metrics.get("val/fvu"), trainer.callback_metrics.get("val/l0")
        if fvu is None or l0 is None:
            return
        if getattr(pl_module, "controls_l0", False) and pl_module.in_control_window():
            self.rows = []  # λ still moves: nothing has settled yet
            return
        self.rows.append({"fvu": float(fvu), "l0": float(l0)})
        if last_epoch_change(self.rows[-2:])["converged"]:
            trainer.should_stop = True


class StopRequested(BaseException):  # noqa: N818 (a request, like KeyboardInterrupt)
    """Raised by :class:`StopOnSignal` once the run's state is saved; ``signum`` says which."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


class StopOnSignal(L.Callback):
    """Ctrl-C (SIGINT) or SIGTERM during training: finish the training step in progress, save
    ``checkpoint`` (the state after that step, data position and generator included) and stop
    by raising :class:`StopRequested`, so that ``--resume`` goes on exactly from there. It must
    be the last of the run's callbacks: their work at the step's end is part of the step.

    A signal that arrives while the last step of an epoch or its validation runs lets that
    validation finish (and its checkpoint be written) before the stop, as a checkpoint taken
    mid-validation would resume into a second validation of the same step. A second signal
    stops at once, as without this callback (the handlers in place before training run).
    """

    def __init__(self, checkpoint: Path):
        self.checkpoint = Path(checkpoint)
        self.signum: int | None = None  # the first signal received
        self._previous: dict = {}
        self._saved_step = -1  # the step of the last checkpoint written

    def _handle(self, signum, frame) -> None:
        if self.signum is not None:  # a second signal: the usual, immediate stop
            previous = self._previous.get(signum)
            signal.signal(signum, previous)
            if callable(previous):
                previous(signum, frame)
            raise KeyboardInterrupt
        self.signum = signum

    def on_train_start(self, trainer, pl_module) -> None:
        # after Lightning installed its own SIGTERM handler (after on_fit_start), which would
        # stop mid-validation
        if threading.current_thread() is not threading.main_thread():
            return
        for signum in (signal.SIGINT, signal.SIGTERM):
            self._previous[signum] = signal.signal(signum, self._handle)

    def teardown(self, trainer, pl_module, stage: str) -> None:
        for signum, previous in self._previous.items():
            if previous is not None:
                signal.signal(signum, previous)
        self._previous = {}

    def on_save_checkpoint(self, trainer, pl_module, checkpoint) -> None:
        self._saved_step = trainer.global_step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if self.signum is None:
            return
        last_of_epoch = batch_idx + 1 >= trainer.num_training_batches
        last_of_run = 0 < trainer.max_steps <= trainer.global_step
        if last_of_epoch or last_of_run:  # validation (and its checkpoint) or the end follows
            return
        # Lightning steps per-step learning-rate schedules after this hook: do it first, so
        # that the checkpoint holds the state the next step would have started from
        for config in trainer.lr_scheduler_configs:
            if (config.interval == "step" and not config.reduce_on_plateau
                    and (batch_idx + 1) % config.frequency == 0):
                pl_module.lr_scheduler_step(config.scheduler, None)
        trainer.save_checkpoint(self.checkpoint)
        raise StopRequested(self.signum)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        # a stop put off by a validation: its checkpoint (written at the validation's or the
        # epoch's end) is of the last step; otherwise the step runs and its end stops
        if self.signum is not None and self._saved_step == trainer.global_step:
            raise StopRequested(self.signum)


def _tensorboards(trainer) -> list[TensorBoardLogger]:
    return [lg for lg in trainer.loggers if isinstance(lg, TensorBoardLogger)]


def run_label(config, dataset: str | None = None) -> str:
    """'mnist · sparsemax λ=0.01 · 512 units': what a run's figure shows, for its title."""
    setting = {"fixed": f" k={config.k}", "penalty": f" λ={config.lam:g}"}.get(
        variant(config.model).budget, "")
    parts = [dataset, f"{config.model}{setting}", f"{config.hidden} units"]
    return " · ".join(p for p in parts if p)


def _hparam(value: object) -> object:
    """A setting as TensorBoard's HParams view takes it: numbers, text and booleans as they
    are, anything else (None, lists, paths) as text."""
    if isinstance(value, bool | int | float | str):
        return value
    return str(value)


# numbers of metrics.json that describe the run or the measurement, not the model's quality
NOT_METRICS = frozenset({"steps", "epochs", "n_units", "n_samples", "n_inputs", "adaptivity_m",
                         "fire_threshold"})


def log_test_hparams(loggers, params: dict, result: dict, step: int = 0) -> dict[str, float]:
    """Record a run's settings with its final test metrics for TensorBoard's HParams view.

    Args:
        loggers: the run's loggers; only TensorBoard loggers are written (rank 0 calls this).
        params: the settings, one value per name (nested mappings are not expected).
        result: the final test metrics (metrics.json); its finite numbers become the
            ``test/<name>`` metrics, except entries that are settings (names in ``params``:
            metrics.json repeats λ, the seed, the width) and counts that are no measure of
            the model (:data:`NOT_METRICS`: steps, units, inputs, the firing threshold).
        step: the training step the metrics belong to (the run's last), so that they sit at
            the end of the training curves.

    Returns:
        The metrics logged, ``{"test/<name>": value}``.
    """
    metrics = {f"test/{k}": float(v) for k, v in result.items()
               if k not in params and k not in NOT_METRICS and isinstance(v, int | float)
               and not isinstance(v, bool) and np.isfinite(v)}
    clean = {k: _hparam(v) for k, v in params.items()}
    for logger in loggers:
        if isinstance(logger, TensorBoardLogger):
            logger.log_hyperparams(clean, metrics, step=step)
            logger.experiment.flush()
    return metrics
