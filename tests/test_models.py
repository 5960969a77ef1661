"""The SAE variants: shapes, the science traps, training controls, and λ controlling L0."""

import math

import lightning.pytorch as L
import pytest
import torch

from sae import metrics
from sae.models import (
    MODELS,
    NonFiniteLossError,
    SAEConfig,
    SparsemaxSAE,
    build_model,
    encode_dataset,
)


def small_model(name: str, hidden: int = 32, **kw) -> torch.nn.Module:
    torch.manual_seed(0)
    config = SAEConfig(model=name, input_dim=20, hidden=hidden, k=4, **kw)
    return build_model(config, mean_image=torch.rand(20), data_var=2.0)


def quiet_trainer(**kw) -> L.Trainer:
    kw.setdefault("logger", False)
    kw.setdefault("enable_checkpointing", False)
    return L.Trainer(accelerator="cpu", devices=1, enable_progress_bar=False,
                     enable_model_summary=False, num_sanity_val_steps=0, **kw)


@pytest.mark.parametrize("name", MODELS)
def test_shapes_and_unit_norm_init(name):
    model = small_model(name)
    x = torch.rand(5, 20)
    x_hat, h, _ = model(x)
    assert x_hat.shape == (5, 20) and h.shape == (5, 32)
    torch.testing.assert_close(model.W_dec.norm(dim=0), torch.ones(32))
    assert (h >= 0).all()


def test_topk_keeps_at_most_k():
    model = small_model("topk")
    h = model.encode(torch.rand(50, 20))
    assert ((h > 0).sum(-1) <= 4).all()


def test_sparsemax_code_carries_magnitude_and_penalty_is_not_constant():
    model = small_model("sparsemax", groups=4)
    x = torch.rand(8, 20)
    a, x_c = model.pre_activations(x)
    h, extras = model.code(a, x_c)
    p = extras["p"].view(8, 4, 8)
    torch.testing.assert_close(p.sum(-1), torch.ones(8, 4))  # each head on the simplex
    r = torch.nn.functional.softplus(model.scale_head(x_c))
    torch.testing.assert_close(h.view(8, 4, 8).sum(-1), r)  # the magnitude is carried by r
    # ‖p‖₁ ≡ 1 would give a zero gradient: the effective-support penalty must not
    a = a.detach().requires_grad_(True)
    h, extras = model.code(a, x_c)
    model.penalty(h, extras).backward()
    assert a.grad.abs().sum() > 0
    # uniform on k units costs exactly k per head
    uniform = torch.zeros(1, 32)
    uniform[0, :3], uniform[0, 8:10] = 1 / 3, 1 / 2
    uniform[0, 16], uniform[0, 24:28] = 1.0, 1 / 4
    # the ε that keeps gradients finite costs under 1 %
    assert float(model.penalty(uniform, {"p": uniform})) == pytest.approx((3 + 2 + 1 + 4) / 5,
                                                                          rel=1e-2)


def test_sparsemax_code_is_an_adaptive_threshold_relu():
    model = small_model("sparsemax")
    x = torch.rand(6, 20)
    a, x_c = model.pre_activations(x)
    h, extras = model.code(a, x_c)
    p = extras["p"]
    # on the support p_j = a_j / T - τ with one τ per row
    scores = a / model.log_temperature.exp()
    tau = (scores - p)[p > 0]
    rows = (p > 0).nonzero()[:, 0]
    for i in rows.unique():
        t = tau[rows == i]
        torch.testing.assert_close(t, t[0].expand_as(t))


def test_l1_penalty_weighted_by_decoder_norm():
    model = small_model("l1")
    h = torch.rand(4, 32)
    base = float(model.penalty(h, {}).detach())
    with torch.no_grad():
        model.W_dec.mul_(2.0)  # grow decoder columns, shrink codes: same reconstruction
    assert float(model.penalty(h / 2, {}).detach()) == pytest.approx(base, rel=1e-6)


def test_kl_penalty_zero_at_target_and_positive_elsewhere():
    model = small_model("kl", rho=0.1)
    assert float(model.penalty(torch.full((10, 32), 0.1), {})) == pytest.approx(0, abs=1e-6)
    assert float(model.penalty(torch.full((10, 32), 0.5), {})) > 1.0


def test_decoder_stays_unit_norm_and_radial_gradient_removed(mnist_small):
    model = build_model(SAEConfig(model="l1", hidden=64, lam=0.01), mnist_small.train_mean,
                        data_var=50.0)
    trainer = quiet_trainer(max_steps=5, limit_val_batches=0)
    trainer.fit(model, datamodule=mnist_small)
    torch.testing.assert_close(model.W_dec.norm(dim=0), torch.ones(64), atol=1e-5, rtol=0)
    g = torch.randn_like(model.W_dec)
    model.W_dec.grad = g.clone()
    model.on_before_optimizer_step(None)
    radial = (model.W_dec.grad * model.W_dec).sum(0)
    assert radial.abs().max() < 1e-5
    # the projection records no autograd history on .grad (a graph there chained every step's
    # to the next one and leaked memory)
    assert model.W_dec.grad.grad_fn is None and not model.W_dec.grad.requires_grad


class GradNormRecorder(L.Callback):
    def __init__(self):
        self.norms = []

    def on_before_zero_grad(self, trainer, pl_module, optimizer):
        # called before each step's backward: the grads are the previous step's, after clipping
        grads = [p.grad for p in pl_module.parameters() if p.grad is not None]
        if grads:
            self.norms.append(float(torch.linalg.vector_norm(torch.stack(
                [torch.linalg.vector_norm(g) for g in grads]))))


@pytest.mark.parametrize("clip", [None, 1e-3])
def test_gradient_clipping_acts(mnist_small, clip):
    model = build_model(SAEConfig(model="sparsemax", hidden=64), mnist_small.train_mean, 50.0)
    recorder = GradNormRecorder()
    trainer = quiet_trainer(max_steps=4, limit_val_batches=0, callbacks=[recorder],
                            gradient_clip_val=clip, gradient_clip_algorithm="norm")
    trainer.fit(model, datamodule=mnist_small)
    if clip is None:
        assert max(recorder.norms) > 1e-2  # unclipped gradients are far above the clip
    else:
        assert max(recorder.norms) <= clip * 1.0001


def test_resampling_revives_dead_units(mnist_small):
    config = SAEConfig(model="l1", hidden=64, lam=0.01, dead_window=256, resample_every=4,
                       resample_until=1.0)
    model = build_model(config, mnist_small.train_mean, data_var=50.0)
    with torch.no_grad():
        model.b_enc[:16] = -1e4  # these units can never fire
    before = metrics.firing_frequency(encode_dataset(model, mnist_small.val_x)[1])
    assert (before[:16] == 0).all()
    trainer = quiet_trainer(max_steps=9, limit_val_batches=0)
    trainer.fit(model, datamodule=mnist_small)
    after = metrics.firing_frequency(encode_dataset(model, mnist_small.val_x)[1])
    assert (after[:16] > 0).float().mean() >= 0.75
    assert float(model.b_enc[:16].min()) > -1.0


def test_resampled_sparsemax_units_enter_the_support(mnist_small):
    config = SAEConfig(model="sparsemax", hidden=64, dead_window=256, resample_every=4,
                       resample_until=1.0)
    model = build_model(config, mnist_small.train_mean, data_var=50.0)
    with torch.no_grad():
        model.b_enc[:16] = -1e4  # out-scored by every other unit on every input
    quiet_trainer(max_steps=5, limit_val_batches=0).fit(model, datamodule=mnist_small)
    # resampled at step 4 from one input each: each must be in the support on its input, so
    # it fires on the training images and receives gradient from then on
    after = metrics.firing_frequency(encode_dataset(model, mnist_small.train_x)[1])
    assert (after[:16] > 0).all()


@pytest.mark.parametrize("groups", [1, 4])
def test_sparsemax_admission_puts_each_unit_in_the_support_of_its_input(groups):
    model = small_model("sparsemax", hidden=32, groups=groups)
    idx = torch.tensor([3, 17, 30])
    inputs = torch.rand(3, 20)
    with torch.no_grad():
        model.W_enc[idx] = 0.01 * torch.randn(3, 20)
        model.b_enc[idx] = -1e4
    model.after_resample(idx, inputs)
    p = model.code(*model.pre_activations(inputs))[1]["p"]
    share = p[torch.arange(3), idx]
    assert (share > 0).all()
    assert torch.isfinite(model.b_enc).all()


def test_resampling_off_leaves_dead_units_dead(mnist_small):
    config = SAEConfig(model="l1", hidden=64, lam=0.01, dead_guard="none")
    model = build_model(config, mnist_small.train_mean, data_var=50.0)
    with torch.no_grad():
        model.b_enc[:16] = -1e4
    quiet_trainer(max_steps=9, limit_val_batches=0).fit(model, datamodule=mnist_small)
    after = metrics.firing_frequency(encode_dataset(model, mnist_small.val_x)[1])
    assert (after[:16] == 0).all()


class PoisonWeights(L.Callback):
    def on_train_epoch_start(self, trainer, pl_module):
        if trainer.current_epoch == 1:
            with torch.no_grad():
                pl_module.W_enc.fill_(float("nan"))


def test_non_finite_loss_stops_and_keeps_last_good_checkpoint(mnist_small, tmp_path):
    from lightning.pytorch.callbacks import ModelCheckpoint

    model = build_model(SAEConfig(model="l1", hidden=32), mnist_small.train_mean, 50.0)
    ckpt = ModelCheckpoint(dirpath=tmp_path, save_last=True, monitor="val/loss")
    trainer = quiet_trainer(max_epochs=3, limit_train_batches=3, limit_val_batches=2,
                            enable_checkpointing=True, callbacks=[PoisonWeights(), ckpt])
    with pytest.raises(NonFiniteLossError):
        trainer.fit(model, datamodule=mnist_small)
    state = torch.load(tmp_path / "last.ckpt", weights_only=False)
    assert state["epoch"] == 0
    assert all(torch.isfinite(t).all() for t in state["state_dict"].values()
               if t.is_floating_point())


# ---- λ must measurably control sparsity ------------------------------------------------------

def mean_l0_after_training(dm, name: str, lam: float, k: int = 32, steps: int = 240) -> float:
    torch.manual_seed(0)
    config = SAEConfig(model=name, hidden=128, lam=lam, k=k, lambda_warmup=0.1)
    data_var = float((dm.train_x - dm.train_mean).pow(2).sum(-1).mean())
    model = build_model(config, dm.train_mean, data_var)
    quiet_trainer(max_steps=steps, limit_val_batches=0).fit(model, datamodule=dm)
    _, codes = encode_dataset(model, dm.val_x)
    return float(metrics.l0(codes, model.fire_threshold).mean())


@pytest.mark.slow
@pytest.mark.parametrize("name", ["l1", "kl", "sparsemax", "entmax"])
def test_lambda_controls_l0(mnist_small, name):
    default = SAEConfig().lam
    l0s = [mean_l0_after_training(mnist_small, name, default * f) for f in (0.1, 1.0, 10.0)]
    assert l0s[0] > l0s[1] > l0s[2], l0s
    assert l0s[1] > 1.5  # the default is not a one-hot quantiser


@pytest.mark.slow
def test_k_controls_l0(mnist_small):
    l0s = [mean_l0_after_training(mnist_small, "topk", 0.0, k=k, steps=60) for k in (64, 32, 8)]
    assert l0s[0] > l0s[1] > l0s[2], l0s
    assert l0s[2] <= 8


def test_sparsemax_is_an_sae_subclass():
    assert issubclass(SparsemaxSAE, L.LightningModule)
    assert math.isclose(SAEConfig().lam, 0.01)
