"""Lightning callbacks: figures of what the SAE learned, rendered from validation statistics, and
the per-epoch seed that makes a resumed run train as an uninterrupted one (:class:`EpochSeed`).

Statistics are gathered on the device during validation from the tensors that
``SparseAutoencoder.validation_step`` returns (no host synchronisation in the training step),
summed / gathered across DDP ranks at the end of the validation epoch, and plotted on rank 0 only.
Every validation epoch also sends two cheap histograms of those statistics to TensorBoard
(per-input L0, log10 firing frequency of the live units); :func:`log_test_hparams` records a
run's settings with its final test metrics for TensorBoard's HParams view.
"""

from __future__ import annotations

from pathlib import Path

import lightning.pytorch as L
import numpy as np
import torch
import torch.nn.functional as F
from lightning.pytorch.loggers import TensorBoardLogger

from sae import figures, metrics
from sae import io as sae_io
from sae.config import FIXED_BUDGET


def write_png(rgb: np.ndarray, path: Path) -> None:
    """Write an RGB array [H, W, 3] as a PNG, atomically (readers never see half a file)."""
    sae_io.write_png(path, rgb)


class FigureCallback(L.Callback):
    """Save ``<out_dir>/<kind>/epoch_<E>.png`` every ``every_n_epochs`` epochs and at the end.

    ``every_n_epochs = 0`` renders only once, after training, from the last validation. Figures
    also go to TensorBoard when that logger is active.
    """

    def __init__(self, out_dir: str | Path, every_n_epochs: int = 0,
                 class_names: list[str] | None = None, n_atoms: int = 64, n_examples: int = 16):
        self.out_dir = Path(out_dir)
        self.every_n_epochs = every_n_epochs
        self.class_names = class_names or [str(i) for i in range(10)]
        self.n_atoms, self.n_examples = n_atoms, n_examples
        self.stats: dict | None = None  # last validation's statistics (rank 0, numpy)
        self.rendered_epochs: set[int] = set()
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
            "epoch": trainer.current_epoch,
            "step": trainer.global_step,
            "freq": (class_fires.sum(0) / n).cpu().numpy(),
            "class_freq": (class_fires / class_count.clamp_min(1)[:, None]).cpu().numpy(),
            "l0": l0.cpu().numpy(),
            "labels": labels.cpu().numpy(),
            "x": self._examples[0].float().cpu().numpy(),
            "x_hat": self._examples[1].float().cpu().numpy(),
            "atoms": pl_module.atoms().float().cpu().numpy(),
        }
        self._histograms(trainer)
        epoch = trainer.current_epoch
        if self.every_n_epochs and (epoch + 1) % self.every_n_epochs == 0:
            self.render(trainer)

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
                self.render(trainer)

    def render(self, trainer) -> list[Path]:
        """Plot the last statistics; write PNGs and send them to TensorBoard."""
        paths = render_figures(self.stats, self.out_dir, self.label, self.class_names,
                               self.n_atoms, _tensorboards(trainer))
        self.rendered_epochs.add(self.stats["epoch"])
        return paths


def render_figures(stats: dict, out_dir: Path, label: str, class_names: list[str],
                   n_atoms: int = 64, tensorboards=()) -> list[Path]:
    """Plot a run's statistics (as :class:`FigureCallback` gathers them) to
    ``<out_dir>/<kind>/epoch_<E>.png``, and to each TensorBoard logger given.

    Every figure's title starts with the run's dataset, model and sparsity setting
    (:func:`run_label`), so a PNG shown alone (the gallery) says what it is.
    """
    s = stats
    n_shown = len(s["x"])
    made = {
        "decoder_atoms": figures.decoder_atoms(s["atoms"], s["freq"], n=n_atoms),
        "reconstructions": figures.reconstructions(
            s["x"], s["x_hat"], source=f"the first {n_shown} validation inputs"),
        "sparsity_histogram": figures.sparsity_histogram(s["l0"], s["labels"], class_names),
        "activation_frequency": figures.activation_frequency_curve(s["freq"]),
        "class_unit_heatmap": figures.class_unit_heatmap(s["class_freq"], class_names),
        "feature_density": figures.feature_density_histogram(s["freq"]),
    }
    paths = []
    for kind, fig in made.items():
        if label:
            fig.suptitle(f"{label}\n{fig.get_suptitle()}")
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
    from sae.models import encode_dataset

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
    from sae.checkpoints import model_from_checkpoint, read_checkpoint
    from sae.cli import defaults, read_settings_file
    from sae.config import SAEConfig
    from sae.convergence import read_validation
    from sae.data import ImageDataModule

    run_dir = Path(run_dir)
    settings = {**defaults(), **read_settings_file(run_dir / "config.yaml")}
    state = read_checkpoint(run_dir / "checkpoints" / "last.ckpt")
    model = model_from_checkpoint(state)
    dm = ImageDataModule(settings["dataset"], settings.get("data_dir"),
                         val_size=settings["val_size"], limit_train=settings.get("limit_train"),
                         limit_test=settings.get("limit_test"))
    dm.setup()
    # named after the last validated epoch, as the callback would have named them
    validated = read_validation(run_dir / "metrics.csv")
    epoch = validated[-1]["epoch"] if validated else int(state.get("epoch", 0))
    stats = validation_stats(model, dm.val_x, dm.val_y, len(dm.class_names), epoch=epoch,
                             step=int(state.get("global_step", 0)))
    config = SAEConfig.from_dict(state["hyper_parameters"]["config"])
    return render_figures(stats, run_dir / "figures", run_label(config, settings["dataset"]),
                          dm.class_names)


class EpochLines(L.Callback):
    """One line on stdout per validation, for output that is not a terminal (a log, a pipe):
    ``epoch 3/10 · step 645 · loss 0.1523 · val FVU 0.1498 · L0 31.2 · dead 0.4 %``."""

    def on_validation_end(self, trainer, pl_module) -> None:  # after the model logged
        if trainer.sanity_checking or not trainer.is_global_zero:
            return
        m = {k: float(v) for k, v in trainer.callback_metrics.items() if v.numel() == 1}
        parts = [f"epoch {trainer.current_epoch + 1}/{trainer.max_epochs}",
                 f"step {trainer.global_step}"]
        for key, text, fmt, scale in (("train/loss", "loss", ".4f", 1),
                                      ("val/fvu", "val FVU", ".4f", 1),
                                      ("val/l0", "L0", ".1f", 1),
                                      ("val/dead_fraction", "dead", ".1f", 100)):
            if key in m:
                parts.append(f"{text} {scale * m[key]:{fmt}}" + (" %" if scale == 100 else ""))
        print(" · ".join(parts), flush=True)


class EpochSeed(L.Callback):
    """Seed torch's global generator from (seed, epoch) as each training epoch starts.

    A checkpoint does not hold the generator's state, so without this the randomness of an epoch
    (dead-unit resampling) would depend on whether the run was resumed before it; with it (and
    ``sae.data.EpochShuffle`` for the order of the batches) a run resumed at an epoch boundary
    trains exactly as one never stopped.
    """

    def __init__(self, seed: int):
        self.seed = seed

    def on_train_epoch_start(self, trainer, pl_module) -> None:
        state = np.random.SeedSequence([self.seed, trainer.current_epoch, 1]).generate_state(2)
        torch.manual_seed(int(state[0]) << 32 | int(state[1]))


def _tensorboards(trainer) -> list[TensorBoardLogger]:
    return [lg for lg in trainer.loggers if isinstance(lg, TensorBoardLogger)]


def run_label(config, dataset: str | None = None) -> str:
    """'mnist · sparsemax λ=0.01 · 512 units': what a run's figure shows, for its title."""
    setting = f"k={config.k}" if config.model in FIXED_BUDGET else f"λ={config.lam:g}"
    parts = [dataset, f"{config.model} {setting}", f"{config.hidden} units"]
    return " · ".join(p for p in parts if p)


def _hparam(value: object) -> object:
    """A setting as TensorBoard's HParams view takes it: numbers, text and booleans as they
    are, anything else (None, lists, paths) as text."""
    if isinstance(value, bool | int | float | str):
        return value
    return str(value)


def log_test_hparams(loggers, params: dict, result: dict) -> dict[str, float]:
    """Record a run's settings with its final test metrics for TensorBoard's HParams view.

    Args:
        loggers: the run's loggers; only TensorBoard loggers are written (rank 0 calls this).
        params: the settings, one value per name (nested mappings are not expected).
        result: the final test metrics (metrics.json); its finite numbers become the
            ``test/<name>`` metrics, except entries that are settings (names in ``params``:
            metrics.json repeats λ, the seed, the width).

    Returns:
        The metrics logged, ``{"test/<name>": value}``.
    """
    metrics = {f"test/{k}": float(v) for k, v in result.items()
               if k not in params and isinstance(v, int | float) and not isinstance(v, bool)
               and np.isfinite(v)}
    clean = {k: _hparam(v) for k, v in params.items()}
    for logger in loggers:
        if isinstance(logger, TensorBoardLogger):
            logger.log_hyperparams(clean, metrics)
            logger.experiment.flush()
    return metrics
