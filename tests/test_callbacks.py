"""The figure callback on a short real run beside the training guards: every kind, every cadence,
CSV logger only."""

import lightning.pytorch as L
import pytest
from lightning.pytorch.loggers import CSVLogger

from sae.models import SAEConfig
from sae.pages.report import FIGURE_KINDS
from sae.training.callbacks import FigureCallback
from sae.training.guards import training_callbacks
from sae.training.module import training_module

pytestmark = pytest.mark.slow  # each case trains a short real run

PNG = b"\x89PNG\r\n\x1a\n"


def test_figures_every_epoch_and_at_the_end_with_csv_logger_only(mnist_small, tmp_path):
    config = SAEConfig(model="sparsemax", hidden=32)
    model = training_module(config, mnist_small.train_mean, 50.0)
    callback = FigureCallback(tmp_path / "figures", every_n_epochs=2,
                              class_names=mnist_small.class_names, n_atoms=16)
    trainer = L.Trainer(max_epochs=3, limit_train_batches=2, limit_val_batches=2,
                        accelerator="cpu", devices=1, logger=CSVLogger(tmp_path),
                        callbacks=[callback, *training_callbacks(config)],
                        enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False,
                        num_sanity_val_steps=0)
    trainer.fit(model, datamodule=mnist_small)
    drawn = [k for k in FIGURE_KINDS if k != "code_embedding"]  # the feature browser's
    assert sorted(p.name for p in (tmp_path / "figures").iterdir()) == sorted(drawn)
    for kind in drawn:
        files = sorted(p.name for p in (tmp_path / "figures" / kind).iterdir())
        # epochs counted from 1: epoch 2 by the cadence (every 2nd epoch), epoch 3 because
        # training ended there
        assert files == ["epoch_2.png", "epoch_3.png"], (kind, files)
        assert (tmp_path / "figures" / kind / "epoch_3.png").read_bytes().startswith(PNG)
    stats = callback.stats
    assert stats["class_freq"].shape == (10, 32) and stats["atoms"].shape == (784, 32)
    assert len(stats["l0"]) == len(stats["labels"]) == 2 * mnist_small.batch_size


def test_no_figures_before_the_end_by_default(mnist_small, tmp_path):
    model = training_module(SAEConfig(model="l1", hidden=16), mnist_small.train_mean, 50.0)
    callback = FigureCallback(tmp_path, class_names=mnist_small.class_names, n_atoms=4)
    trainer = L.Trainer(max_epochs=2, limit_train_batches=2, limit_val_batches=1,
                        accelerator="cpu", devices=1, logger=False, callbacks=[callback],
                        enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, num_sanity_val_steps=0)
    trainer.fit(model, datamodule=mnist_small)
    assert sorted(p.name for p in (tmp_path / "decoder_atoms").iterdir()) == ["epoch_2.png"]


def test_every_figure_names_the_run_and_the_validation_set(mnist_small, tmp_path, monkeypatch):
    """The report's headline is the test set's; each figure says it is the validation set's."""
    from sae import figures
    from sae.training import callbacks

    model = training_module(SAEConfig(model="l1", hidden=16), mnist_small.train_mean, 50.0)
    stats = callbacks.validation_stats(model.sae, mnist_small.val_x[:300], mnist_small.val_y[:300],
                                       len(mnist_small.class_names), epoch=3, step=645)
    titles, draw = [], figures.figure_to_rgb
    monkeypatch.setattr(figures, "figure_to_rgb",
                        lambda fig: titles.append(fig.get_suptitle()) or draw(fig))
    callbacks.render_figures(stats, tmp_path, "mnist · l1 λ=0.01 · 16 units",
                             mnist_small.class_names)
    assert len(titles) == len(FIGURE_KINDS) - 1  # all but the feature browser's embedding
    header = "mnist · l1 λ=0.01 · 16 units · validation set (300 images) · epoch 3, step 645\n"
    assert all(title.startswith(header) for title in titles), titles


def event_files(folder) -> list:
    return sorted(str(p) for p in folder.rglob("events.out.tfevents.*"))


def test_tensorboard_histograms_every_validation_and_test_metrics_as_hparams(mnist_small,
                                                                           tmp_path):
    from lightning.pytorch.loggers import TensorBoardLogger
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.backend.event_processing.plugin_event_accumulator import (
        EventAccumulator as PluginEvents,
    )
    from tensorboard.plugins.hparams import plugin_data_pb2

    from sae.training.callbacks import log_test_hparams, run_label

    config = SAEConfig(model="l1", hidden=16)
    model = training_module(config, mnist_small.train_mean, 50.0)
    callback = FigureCallback(tmp_path / "figures", every_n_epochs=0,
                              class_names=mnist_small.class_names, n_atoms=4)
    tb = TensorBoardLogger(tmp_path, name="tb", version="", default_hp_metric=False)
    trainer = L.Trainer(max_epochs=2, limit_train_batches=2, limit_val_batches=2,
                        accelerator="cpu", devices=1, logger=[tb], callbacks=[callback],
                        enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, num_sanity_val_steps=0)
    trainer.fit(model, datamodule=mnist_small)
    assert callback.label == run_label(config, "mnist") == "mnist · l1 λ=0.01 · 16 units"
    logged = log_test_hparams([tb], {"model": "l1", "lam": 0.01, "max_steps": None},
                              {"fvu": 0.25, "l0_mean": 7.0, "model": "l1", "adaptivity": None,
                               "ok": True, "lam": 0.01, "support_fvu": float("nan")})
    assert logged == {"test/fvu": 0.25, "test/l0_mean": 7.0}  # finite numbers, no settings

    histograms, hparams, scalars = {}, [], set()
    for path in event_files(tmp_path / "tb"):
        events = EventAccumulator(path, size_guidance={"histograms": 0, "tensors": 0})
        events.Reload()
        for tag in events.Tags()["histograms"]:
            histograms[tag] = histograms.get(tag, []) + events.Histograms(tag)
        scalars |= set(events.Tags()["scalars"])
        plugin = PluginEvents(path)
        plugin.Reload()
        content = (plugin.PluginTagToContent("hparams")
                   if "hparams" in plugin.ActivePlugins() else {})
        if "_hparams_/session_start_info" in content:
            hparams.append(content["_hparams_/session_start_info"])
    steps = [e.step for e in histograms["val/l0_per_input"]]
    assert len(steps) == 2 and steps == sorted(steps)  # one per validation epoch
    assert len(histograms["val/log10_firing_frequency"]) == 2
    first = histograms["val/l0_per_input"][0].histogram_value
    assert first.num == 2 * mnist_small.batch_size  # every validation input's L0
    assert first.max <= 16
    assert {"test/fvu", "test/l0_mean"} <= scalars
    starts = [plugin_data_pb2.HParamsPluginData.FromString(c).session_start_info
              for c in hparams]
    assert any(s.hparams["model"].string_value == "l1"
               and s.hparams["max_steps"].string_value == "None" for s in starts)
