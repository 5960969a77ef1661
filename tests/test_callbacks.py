"""The figure callback on a short real run beside the training guards: every kind, every cadence,
CSV logger only."""

import lightning.pytorch as L
from lightning.pytorch.loggers import CSVLogger

from sae.callbacks import FIGURE_KINDS, FigureCallback
from sae.models import SAEConfig, build_model, training_callbacks

PNG = b"\x89PNG\r\n\x1a\n"


def test_figures_every_epoch_and_at_the_end_with_csv_logger_only(mnist_small, tmp_path):
    config = SAEConfig(model="sparsemax", hidden=32)
    model = build_model(config, mnist_small.train_mean, 50.0)
    callback = FigureCallback(tmp_path / "figures", every_n_epochs=2,
                              class_names=mnist_small.class_names, n_atoms=16)
    trainer = L.Trainer(max_epochs=3, limit_train_batches=2, limit_val_batches=2,
                        accelerator="cpu", devices=1, logger=CSVLogger(tmp_path),
                        callbacks=[callback, *training_callbacks(config)],
                        enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False,
                        num_sanity_val_steps=0)
    trainer.fit(model, datamodule=mnist_small)
    for kind in FIGURE_KINDS:
        files = sorted(p.name for p in (tmp_path / "figures" / kind).iterdir())
        # epoch 1 by the cadence (every 2nd epoch), epoch 2 because training ended there
        assert files == ["epoch_1.png", "epoch_2.png"], (kind, files)
        assert (tmp_path / "figures" / kind / "epoch_2.png").read_bytes().startswith(PNG)
    stats = callback.stats
    assert stats["class_freq"].shape == (10, 32) and stats["atoms"].shape == (784, 32)
    assert len(stats["l0"]) == len(stats["labels"]) == 2 * mnist_small.batch_size


def test_no_figures_before_the_end_by_default(mnist_small, tmp_path):
    model = build_model(SAEConfig(model="l1", hidden=16), mnist_small.train_mean, 50.0)
    callback = FigureCallback(tmp_path, class_names=mnist_small.class_names, n_atoms=4)
    trainer = L.Trainer(max_epochs=2, limit_train_batches=2, limit_val_batches=1,
                        accelerator="cpu", devices=1, logger=False, callbacks=[callback],
                        enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, num_sanity_val_steps=0)
    trainer.fit(model, datamodule=mnist_small)
    assert sorted(p.name for p in (tmp_path / "decoder_atoms").iterdir()) == ["epoch_1.png"]
