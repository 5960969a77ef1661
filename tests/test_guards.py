"""The training guards (sae.models.guards): dead-unit resampling and the non-finite-loss stop, as
callbacks on real short trainings."""

import lightning.pytorch as L
import pytest
import torch
import torch.nn.functional as F
from lightning.pytorch.callbacks import ModelCheckpoint

from sae import metrics
from sae.models import SAEConfig, encode_dataset
from sae.training.guards import (
    DeadUnitResampler,
    NonFiniteLossError,
    NonFiniteLossGuard,
    reset_moments,
    training_callbacks,
)
from sae.training.module import training_module


def quiet_trainer(**kw) -> L.Trainer:
    kw.setdefault("logger", False)
    kw.setdefault("enable_checkpointing", False)
    return L.Trainer(accelerator="cpu", devices=1, enable_progress_bar=False,
                     enable_model_summary=False, num_sanity_val_steps=0, **kw)


def test_training_callbacks_follow_the_dead_guard():
    def kinds(**kw):
        return [type(c) for c in training_callbacks(SAEConfig(**kw))]

    assert kinds(model="l1") == [NonFiniteLossGuard, DeadUnitResampler]
    assert kinds(model="sparsemax", dead_guard="resample") == [NonFiniteLossGuard,
                                                                DeadUnitResampler]
    assert kinds(model="topk") == [NonFiniteLossGuard]  # auxk: in the loss, not a callback
    assert kinds(model="l1", dead_guard="none") == [NonFiniteLossGuard]
    assert kinds(model="l1", arch="mlp") == [NonFiniteLossGuard]  # auto: none for mlp
    resampler = training_callbacks(SAEConfig(resample_every=7, resample_until=0.3))[1]
    assert (resampler.every, resampler.until) == (7, 0.3)


# ---- dead-unit resampling ------------------------------------------------------------------

def trained_with_dead_units(dm, name="l1", steps=6):
    """A model trained a few steps (so Adam has moments), then with units 0..15 dead."""
    torch.manual_seed(0)
    config = SAEConfig(model=name, hidden=64, dead_window=256)
    model = training_module(config, dm.train_mean, data_var=50.0)
    trainer = quiet_trainer(max_steps=steps, limit_val_batches=0)
    trainer.fit(model, datamodule=dm)
    with torch.no_grad():
        model.sae.b_enc[:16] = -1e4  # these units can never fire
    model.samples_since_fired[:16] = config.dead_window
    model.samples_since_fired[16:] = 0
    return model, trainer


def test_resample_follows_the_recipe_and_resets_only_the_touched_adam_rows(mnist_small):
    model, trainer = trained_with_dead_units(mnist_small)
    (opt,) = trainer.optimizers
    params = {"W_dec": model.sae.W_dec, "W_enc": model.sae.W_enc, "b_enc": model.sae.b_enc}
    before = {k: p.detach().clone() for k, p in params.items()}
    moments = {k: {m: opt.state[p][m].clone() for m in ("exp_avg", "exp_avg_sq")}
               for k, p in params.items()}
    b_dec_moments = {m: opt.state[model.sae.b_dec][m].clone() for m in ("exp_avg", "exp_avg_sq")}
    alive_norm = float(model.sae.W_enc[16:].detach().norm(dim=-1).mean())
    x = mnist_small.train_x[:128]

    n = DeadUnitResampler(every=1).resample(model, x, trainer.optimizers)

    assert n == 16
    dead, alive = slice(0, 16), slice(16, None)
    # decoder columns: unit-norm, centred training inputs of this batch
    centred = F.normalize(x - model.sae.b_dec.detach(), dim=-1)  # [B, D]
    cosine = centred @ model.sae.W_dec[:, dead]  # [B, 16]
    assert (cosine.max(0).values > 1 - 1e-5).all()
    # encoder rows: the same direction, at 0.2 x the mean alive encoder-row norm
    torch.testing.assert_close(model.sae.W_enc[dead],
                               model.sae.W_dec[:, dead].t() * 0.2 * alive_norm)
    assert (model.sae.b_enc[dead] == 0).all()
    assert (model.samples_since_fired[dead] == 0).all()
    # the other units' weights and every moment outside the touched rows are untouched
    torch.testing.assert_close(model.sae.W_dec[:, alive], before["W_dec"][:, alive], rtol=0, atol=0)
    torch.testing.assert_close(model.sae.W_enc[alive], before["W_enc"][alive], rtol=0, atol=0)
    torch.testing.assert_close(model.sae.b_enc[alive], before["b_enc"][alive], rtol=0, atol=0)
    for m in ("exp_avg", "exp_avg_sq"):
        w_dec, w_enc, b_enc = (opt.state[params[k]][m] for k in ("W_dec", "W_enc", "b_enc"))
        assert (w_dec[:, dead] == 0).all() and (w_enc[dead] == 0).all() and \
            (b_enc[dead] == 0).all()
        assert (moments["W_dec"][m][:, dead] != 0).any()  # there was something to reset
        assert torch.equal(w_dec[:, alive], moments["W_dec"][m][:, alive])
        assert torch.equal(w_enc[alive], moments["W_enc"][m][alive])
        assert torch.equal(b_enc[alive], moments["b_enc"][m][alive])
        assert torch.equal(opt.state[model.sae.b_dec][m], b_dec_moments[m])
    # they come back: each resampled unit fires on the input it was copied from
    assert (metrics.active(model.sae.encode(x))[:, dead].any(0)).all()


def test_more_dead_units_than_inputs_take_one_input_each_and_the_rest_wait(mnist_small):
    model, trainer = trained_with_dead_units(mnist_small)
    model.samples_since_fired[:40] = model.config.dead_window  # 40 dead, 12 inputs
    x = mnist_small.train_x[:12]
    resampler = DeadUnitResampler(every=1)
    assert resampler.resample(model, x, trainer.optimizers) == 12
    # twelve distinct inputs, one unit each: no two new decoder columns are the same input
    cosine = F.normalize(x - model.sae.b_dec.detach(), dim=-1) @ model.sae.W_dec[:, :12]  # [12, 12]
    assert sorted(cosine.argmax(0).tolist()) == list(range(12))
    assert (model.samples_since_fired[:12] == 0).all()
    assert model.dead_mask()[12:40].all() and not model.dead_mask()[40:].any()
    # the batch's reconstruction stays bounded (copies of one input would add up on it)
    x_hat, _, _ = model(x)
    assert float(((x - x_hat).pow(2).sum(-1) / x.pow(2).sum(-1)).max()) < 10
    assert resampler.resample(model, x, trainer.optimizers) == 12  # the next twelve


def test_resample_with_no_dead_unit_changes_nothing(mnist_small):
    model, trainer = trained_with_dead_units(mnist_small)
    model.samples_since_fired.zero_()
    state = {k: v.clone() for k, v in model.state_dict().items()}
    assert DeadUnitResampler(every=1).resample(model, mnist_small.train_x[:64],
                                               trainer.optimizers) == 0
    assert all(torch.equal(v, state[k]) for k, v in model.state_dict().items())


def test_reset_moments_creates_no_state_for_parameters_without_any():
    w = torch.nn.Parameter(torch.ones(3, 2))
    opt = torch.optim.Adam([w])
    reset_moments([opt], [(w, slice(None))])
    assert w not in opt.state


class KillUnitZero(L.Callback):
    """Marks unit 0 dead after every step, so that each resampling check finds one dead unit."""

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        pl_module.samples_since_fired[0] = pl_module.config.dead_window


def test_resampler_runs_every_n_steps_until_its_fraction_of_training(mnist_small):
    config = SAEConfig(model="l1", hidden=32, dead_window=10**9)
    model = training_module(config, mnist_small.train_mean, data_var=50.0)
    resampler = DeadUnitResampler(every=4, until=0.5)
    quiet_trainer(max_steps=16, limit_val_batches=0,
                  callbacks=[KillUnitZero(), resampler]).fit(model, datamodule=mnist_small)
    assert resampler.history == [(4, 1), (8, 1)]  # not at step 0, not after step 16 · 0.5


def test_resampling_revives_dead_units(mnist_small):
    config = SAEConfig(model="l1", hidden=64, lam=0.01, dead_window=256, resample_every=4,
                       resample_until=1.0)
    model = training_module(config, mnist_small.train_mean, data_var=50.0)
    with torch.no_grad():
        model.sae.b_enc[:16] = -1e4  # these units can never fire
    before = metrics.firing_frequency(encode_dataset(model.sae, mnist_small.val_x)[1])
    assert (before[:16] == 0).all()
    trainer = quiet_trainer(max_steps=9, limit_val_batches=0,
                            callbacks=training_callbacks(config))
    trainer.fit(model, datamodule=mnist_small)
    after = metrics.firing_frequency(encode_dataset(model.sae, mnist_small.val_x)[1])
    assert (after[:16] > 0).float().mean() >= 0.75
    assert float(model.sae.b_enc[:16].min()) > -1.0


@pytest.mark.parametrize("support", ["input", "batch"])
def test_resampled_sparsemax_units_enter_the_support(mnist_small, support):
    # early in training the batch support's θ is still near 0 and can be negative, where a
    # unit admitted just above it carried ReLU(score) = 0 and stayed dead
    torch.manual_seed(0)
    config = SAEConfig(model="sparsemax", hidden=64, dead_window=256, resample_every=4,
                       resample_until=1.0, support=support)
    model = training_module(config, mnist_small.train_mean, data_var=50.0)
    with torch.no_grad():
        model.sae.b_enc[:16] = -1e4  # out-scored by every other unit on every input
    quiet_trainer(max_steps=5, limit_val_batches=0,
                  callbacks=training_callbacks(config)).fit(model, datamodule=mnist_small)
    # resampled at step 4 from one input each: each must be in the support on its input, so
    # it fires on the training images and receives gradient from then on
    after = metrics.firing_frequency(encode_dataset(model.sae, mnist_small.train_x)[1])
    assert (after[:16] > 0).all()


def test_resampling_off_leaves_dead_units_dead(mnist_small):
    config = SAEConfig(model="l1", hidden=64, lam=0.01, dead_guard="none")
    model = training_module(config, mnist_small.train_mean, data_var=50.0)
    with torch.no_grad():
        model.sae.b_enc[:16] = -1e4
    quiet_trainer(max_steps=9, limit_val_batches=0,
                  callbacks=training_callbacks(config)).fit(model, datamodule=mnist_small)
    after = metrics.firing_frequency(encode_dataset(model.sae, mnist_small.val_x)[1])
    assert (after[:16] == 0).all()


# ---- the non-finite-loss guard -------------------------------------------------------------

class PoisonWeights(L.Callback):
    """Fills W_enc with NaN before the training batch ``at`` (counted over the whole fit)."""

    def __init__(self, at: int):
        self.at = at

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if trainer.global_step == self.at:
            with torch.no_grad():
                pl_module.sae.W_enc.fill_(float("nan"))


def test_non_finite_loss_stops_and_keeps_last_good_checkpoint(mnist_small, tmp_path):
    config = SAEConfig(model="l1", hidden=32)
    model = training_module(config, mnist_small.train_mean, 50.0)
    ckpt = ModelCheckpoint(dirpath=tmp_path, save_last=True, monitor="val/loss")
    trainer = quiet_trainer(max_epochs=3, limit_train_batches=3, limit_val_batches=2,
                            enable_checkpointing=True,
                            callbacks=[PoisonWeights(at=3), ckpt, *training_callbacks(config)])
    with pytest.raises(NonFiniteLossError, match="non-finite or diverging loss at step 4"):
        trainer.fit(model, datamodule=mnist_small)  # on CPU: stopped right after the bad step
    state = torch.load(tmp_path / "last.ckpt", weights_only=False)
    assert state["epoch"] == 0
    assert all(torch.isfinite(t).all() for t in state["state_dict"].values()
               if t.is_floating_point())


def test_without_the_guard_training_runs_on_with_a_nan_loss(mnist_small):
    config = SAEConfig(model="l1", hidden=32)
    model = training_module(config, mnist_small.train_mean, 50.0)
    quiet_trainer(max_steps=4, limit_val_batches=0,
                  callbacks=[PoisonWeights(at=1)]).fit(model, datamodule=mnist_small)
    assert bool(model.nonfinite_loss)  # the flag is set in the step; stopping is the guard's


def test_guard_refuses_to_write_a_checkpoint_after_a_non_finite_loss(mnist_small, tmp_path):
    config = SAEConfig(model="l1", hidden=32)
    model = training_module(config, mnist_small.train_mean, 50.0)
    trainer = quiet_trainer(max_steps=2, limit_val_batches=0, callbacks=[NonFiniteLossGuard()])
    trainer.fit(model, datamodule=mnist_small)
    trainer.save_checkpoint(tmp_path / "good.ckpt")  # a finite run saves normally
    model.nonfinite_loss.fill_(True)  # as if a step after the last check had gone bad
    with pytest.raises(NonFiniteLossError, match="step 2"):
        trainer.save_checkpoint(tmp_path / "bad.ckpt")
    assert (tmp_path / "good.ckpt").is_file() and not (tmp_path / "bad.ckpt").exists()
