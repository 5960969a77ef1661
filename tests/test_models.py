"""The SAE variants: shapes, the science traps, the loss terms, training controls, the logging
cadence, checkpoint compatibility, and λ controlling L0."""

import json
import warnings

import lightning.pytorch as L
import pytest
import torch
from cli_helpers import QUICK
from hypothesis import given, settings
from hypothesis import strategies as st
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import CSVLogger

from sae import metrics
from sae.models import (
    L1SAE,
    MODELS,
    SAEConfig,
    SparseAutoencoder,
    build_model,
    encode_dataset,
    model_class,
)
from sae.models import losses as LS
from sae.models.losses import fvu_term
from sae.settings.variants import VARIANTS, Variant, register
from sae.training.checkpoints import load_checkpoint, write_checkpoint
from sae.training.module import SAETraining, training_module


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
    x_hat, h, _ = model.forward_pass(x)
    assert x_hat.shape == (5, 20) and h.shape == (5, 32)
    if name != "sparsemax-attention":  # the published model's atoms have free lengths
        torch.testing.assert_close(model.W_dec.norm(dim=0), torch.ones(32))
    assert (h >= 0).all()


def test_topk_keeps_at_most_k():
    model = small_model("topk")
    h = model.encode(torch.rand(50, 20))
    assert ((h > 0).sum(-1) <= 4).all()


# the shrunk design of the Sparsemax-SAE with its global temperature (the other values and
# temperatures are tested in test_sparsemax_modes.py)
SHRUNK = {"values": "shrunk", "temperature": "global"}


def test_sparsemax_code_carries_magnitude_and_penalty_is_not_constant():
    model = small_model("sparsemax", groups=4, **SHRUNK)
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
    model = small_model("sparsemax", **SHRUNK)
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
    module = training_module(SAEConfig(model="l1", hidden=64, lam=0.01), mnist_small.train_mean,
                             data_var=50.0)
    trainer = quiet_trainer(max_steps=5, limit_val_batches=0)
    trainer.fit(module, datamodule=mnist_small)
    model = module.sae
    torch.testing.assert_close(model.W_dec.norm(dim=0), torch.ones(64), atol=1e-5, rtol=0)
    g = torch.randn_like(model.W_dec)
    model.W_dec.grad = g.clone()
    module.on_before_optimizer_step(None)
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
    model = training_module(SAEConfig(model="sparsemax", hidden=64), mnist_small.train_mean, 50.0)
    recorder = GradNormRecorder()
    trainer = quiet_trainer(max_steps=4, limit_val_batches=0, callbacks=[recorder],
                            gradient_clip_val=clip, gradient_clip_algorithm="norm")
    trainer.fit(model, datamodule=mnist_small)
    if clip is None:
        assert max(recorder.norms) > 1e-2  # unclipped gradients are far above the clip
    else:
        assert max(recorder.norms) <= clip * 1.0001


@pytest.mark.parametrize("groups", [1, 4])
def test_sparsemax_admission_puts_each_unit_in_the_support_of_its_input(groups):
    # the new units' encoder rows are nearly equal here, so they compete on every input; the
    # admission is exact against the other, old units (each mode: test_sparsemax_modes.py)
    model = small_model("sparsemax", hidden=32, groups=groups, **SHRUNK)
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


# ---- λ must measurably control sparsity ------------------------------------------------------

def mean_l0_after_training(dm, name: str, lam: float, k: int = 32, steps: int = 240,
                           **settings) -> float:
    torch.manual_seed(0)
    config = SAEConfig(model=name, hidden=128, lam=lam, k=k, lambda_warmup=0.1, **settings)
    data_var = float((dm.train_x - dm.train_mean).pow(2).sum(-1).mean())
    model = build_model(config, dm.train_mean, data_var)
    quiet_trainer(max_steps=steps, limit_val_batches=0).fit(SAETraining(model), datamodule=dm)
    _, codes = encode_dataset(model, dm.val_x)
    return float(metrics.l0(codes, model.fire_threshold).mean())


@pytest.mark.slow
@pytest.mark.parametrize("name, settings", [
    ("l1", {}), ("kl", {}), ("sparsemax", {}), ("sparsemax", {"values": "unshrunk"}),
    ("entmax", {}), ("jumprelu", {})], ids=lambda v: v if isinstance(v, str) else
    "-".join(map(str, v.values())))
def test_lambda_controls_l0(mnist_small, name, settings):
    default = SAEConfig().lam
    l0s = [mean_l0_after_training(mnist_small, name, default * f, **settings)
           for f in (0.1, 1.0, 10.0)]
    assert l0s[0] > l0s[1] > l0s[2], l0s
    assert l0s[1] > 1.5  # the default is not a one-hot quantiser


@pytest.mark.slow
@pytest.mark.parametrize("name", ["topk", "batchtopk"])
def test_k_controls_l0(mnist_small, name):
    l0s = [mean_l0_after_training(mnist_small, name, 0.0, k=k, steps=60) for k in (64, 32, 8)]
    assert l0s[0] > l0s[1] > l0s[2], l0s
    # batchtopk's inference threshold, a running mean, lags early in training: L0 is near k,
    # not equal to it
    assert l0s[2] <= 8 if name == "topk" else l0s[2] < 4 * 8


# ---- BatchTopK and JumpReLU ------------------------------------------------------------------

def test_batchtopk_training_codes_have_mean_l0_exactly_k(mnist_small):
    config = SAEConfig(model="batchtopk", hidden=64, k=7)
    model = build_model(config, mnist_small.train_mean, 50.0).train()
    x = mnist_small.train_x[:100]
    _, h, _ = model.forward_pass(x)
    assert int((h > 0).sum()) == 7 * 100  # k·B kept over the batch
    assert (h > 0).sum(-1).float().std() > 0  # but not k for every input
    assert float(model.threshold) > 0  # the training forward pass updated θ


def test_batchtopk_eval_codes_do_not_depend_on_the_batch(mnist_small):
    config = SAEConfig(model="batchtopk", hidden=64, k=7)
    model = build_model(config, mnist_small.train_mean, 50.0).train()
    for i in range(5):
        model.forward_pass(mnist_small.train_x[i * 100:(i + 1) * 100])
    model.eval()
    a, x_centred = model.pre_activations(mnist_small.val_x[:50])
    together, _ = model.code(a, x_centred)
    alone = torch.cat([model.code(a[i:i + 1], x_centred[i:i + 1])[0] for i in range(50)])
    assert torch.equal(together, alone)
    assert 0 < int((together > 0).sum(-1).float().mean()) < 64
    assert "threshold" in model.state_dict()  # θ travels with the checkpoint


def test_batchtopk_threshold_is_a_running_mean_of_the_smallest_kept_value():
    model = small_model("batchtopk").train()
    x = torch.rand(16, 20)
    with torch.no_grad():  # a resampling pass: no update
        model.forward_pass(x)
    assert float(model.threshold) == 0
    model.forward_pass(x)
    first = float(model.threshold)
    a, _ = model.pre_activations(x)
    a = a.detach()
    kept = torch.relu(a).flatten().topk(4 * 16).values
    assert first == pytest.approx(float(kept[kept > 0].min()), rel=1e-6)


def test_jumprelu_thresholds_get_gradient_and_values_are_unshrunk():
    model = small_model("jumprelu", jumprelu_bandwidth=5.0)  # a wide window: some inputs in it
    x = torch.rand(64, 20)
    x_hat, h, extras = model.forward_pass(x)
    a, _ = model.pre_activations(x)
    on = h != 0
    assert torch.equal(h[on], a[on])  # active values are the pre-activations themselves
    loss = fvu_term(x, x_hat, model.data_var) + model.penalty(h, extras)
    loss.backward()
    assert model.log_threshold.grad is not None
    assert model.log_threshold.grad.abs().sum() > 0


# ---- the registry and checkpoint compatibility ----------------------------------------------

def test_every_model_the_cli_offers_has_its_class():
    assert list(MODELS) == list(VARIANTS) and len(MODELS) == 8
    for name in MODELS:
        cls = model_class(name)
        assert issubclass(cls, SparseAutoencoder)
        assert type(small_model(name)) is cls
    with pytest.raises(ValueError, match="unknown model 'pca'"):
        build_model(SAEConfig(model="pca"))
    with pytest.raises(ValueError, match="registered already"):
        register(Variant("l1", L1SAE))


class FixedThresholdSAE(SparseAutoencoder):
    """A toy variant: a ReLU code that fires only above a fixed threshold of 0.1, L1-penalised."""

    def code(self, a, x_centred):
        return torch.relu(a - 0.1), {}

    def penalty(self, h, extras):
        return h.sum(-1).mean()


@pytest.fixture
def toy_variant():
    """The toy model registered through the registry alone, removed again afterwards."""
    v = register(Variant("relu-fixed", FixedThresholdSAE, settings=("kl_threshold",)))
    yield v
    del VARIANTS[v.name]


@pytest.mark.slow
def test_a_model_registered_in_the_registry_alone_parses_and_trains(toy_variant, data_dir,
                                                                    tmp_path, monkeypatch):
    from sae.pages.report import relevant_settings
    from sae.runner import command as run
    from sae.settings.cli import build_parser
    from sae.training import runfolder

    assert build_parser().parse_args(["--model", "relu-fixed"]).model == "relu-fixed"
    config = SAEConfig(model="relu-fixed", kl_threshold=0.2)
    config.validate()  # its own setting applies; the others' are refused as for any model
    assert config.resolved_init() == "random" and config.resolved_dead_guard() == "resample"
    with pytest.raises(ValueError, match="--values unshrunk applies to --model sparsemax$"):
        SAEConfig(model="relu-fixed", values="unshrunk").validate()
    assert set(relevant_settings({"model": "relu-fixed", "lambda": 0.1, "k": 8, "rho": 0.1,
                                  "kl_threshold": 0.2})) == {"model", "lambda", "kl_threshold"}
    monkeypatch.setenv("SAE_DATA_DIR", str(data_dir))
    monkeypatch.setenv("SAE_OFFLINE", "1")
    out = tmp_path / "run"
    rc = run.main(["--model", "relu-fixed", *QUICK, "--max-steps", "6", "--no-figures",
                   "--no-features", "--no-report", "--progress", "off", "--out", str(out)])
    runfolder.release(out)
    assert rc == 0
    model = load_checkpoint(out / "checkpoints" / "last.ckpt")
    assert type(model) is FixedThresholdSAE
    result = json.loads((out / "metrics.json").read_text())
    assert result["model"] == "relu-fixed" and result["steps"] == 6 and 0 < result["fvu"] < 2


SHARED_KEYS = ["b_dec", "W_dec", "W_enc", "b_enc", "data_var", "code_scale", "mean_image",
               "samples_since_fired", "nonfinite_loss"]  # the last two: the training module's
MLP_KEYS = ["enc_in.0.weight", "enc_in.0.bias", "dec_out.1.weight", "dec_out.1.bias"]
SUPPORT_KEYS = ["log_temperature", "scale_head.weight", "scale_head.bias"]


@pytest.mark.parametrize("arch", ["linear", "mlp"])
@pytest.mark.parametrize("name", MODELS)
def test_state_dict_keys_are_those_of_saved_checkpoints(name, arch):
    # checkpoints already written must keep loading: these names may not change
    expected = SHARED_KEYS + (MLP_KEYS if arch == "mlp" else [])
    if name in ("sparsemax", "entmax"):
        expected += SUPPORT_KEYS
    if name == "sparsemax":  # the default energy temperature's learned power γ
        expected += ["energy_exponent"]
    if name == "entmax":
        expected += ["entmax.alpha_raw"]
    if name == "batchtopk":
        expected += ["threshold", "threshold_batches"]
    if name == "jumprelu":
        expected += ["log_threshold"]
    if name == "sparsemax-attention":  # its own dictionary: concepts, key and value
        if arch == "mlp":
            return  # one linear layer each way only
        expected = [k for k in expected if k not in ("b_dec", "W_dec", "W_enc", "b_enc")] + [
            "concepts", "key", "value", "firing_frequency", "frequency_batches"]
    model = small_model(name, arch=arch, mlp_width=8, dead_guard="none")
    assert sorted(SAETraining(model).state_dict()) == sorted(expected)
    assert sorted(model.state_dict()) == sorted(set(expected) - {"samples_since_fired",
                                                                 "nonfinite_loss"})


def test_a_threshold_at_inference_saves_its_running_mean_with_the_weights():
    # the per-input support (the default) with the energy temperature has its power and no
    # threshold; a threshold at inference (the default before that) adds
    # its running mean (a checkpoint saved before the rule existed loads without these, with
    # its own support at inference)
    own = small_model("sparsemax", dead_guard="none", support="input")
    assert "energy_exponent" in own.state_dict()
    assert "inference_threshold" not in own.state_dict()
    model = small_model("sparsemax", dead_guard="none", support="input", inference="threshold")
    assert sorted(model.state_dict()) == sorted(
        [*own.state_dict(), "inference_threshold", "threshold_batches"])


@pytest.mark.parametrize("name", ["sparsemax", "topk"])
def test_load_checkpoint_rebuilds_the_model_from_the_saved_format(name, tmp_path):
    model = small_model(name, dead_guard="none")
    with torch.no_grad():
        model.b_enc.normal_()
    # the layout sae.run writes; "train_seconds" is what earlier versions kept there
    module = SAETraining(model)
    write_checkpoint({"hyper_parameters": dict(module.hparams), "state_dict": module.state_dict(),
                      "train_seconds": 12.5}, tmp_path / "last.ckpt")
    loaded = load_checkpoint(tmp_path / "last.ckpt")
    assert type(loaded) is type(model) and not loaded.training
    x = torch.rand(7, 20)
    model.eval()
    torch.testing.assert_close(loaded.forward_pass(x)[0], model.forward_pass(x)[0], rtol=0, atol=0)


# ---- pure loss terms --------------------------------------------------------------------------

def test_fvu_term_is_one_at_the_mean_and_zero_for_a_perfect_reconstruction():
    x = torch.randn(64, 10, dtype=torch.float64)
    mean = x.mean(0, keepdim=True)
    v = (x - mean).pow(2).sum(-1).mean()
    assert float(LS.fvu_term(x, mean.expand_as(x), v)) == pytest.approx(1.0)
    assert float(LS.fvu_term(x, x, v)) == 0.0


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(1, 12), min_size=1, max_size=4), st.integers(0, 2**16))
def test_effective_support_counts_units_of_a_uniform_code(ks, seed):
    width = 12
    p = torch.zeros(1, len(ks) * width, dtype=torch.float64)
    g = torch.Generator().manual_seed(seed)
    for group, k in enumerate(ks):
        units = torch.randperm(width, generator=g)[:k] + group * width
        p[0, units] = 1.0 / k
    # exactly k per group up to the ε that keeps gradients finite
    assert float(LS.effective_support(p, groups=len(ks))) == pytest.approx(sum(ks), rel=1e-2)


def test_loss_terms_gradcheck_in_float64():
    torch.manual_seed(0)
    h = torch.rand(5, 6, dtype=torch.float64, requires_grad=True)
    W = torch.randn(4, 6, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda h, W: LS.decoder_weighted_l1(h, W, 0.7), (h, W))
    probs = (0.05 + 0.9 * torch.rand(5, 6, dtype=torch.float64)).requires_grad_(True)
    assert torch.autograd.gradcheck(lambda h: LS.kl_sparsity(h, 0.1), (probs,))
    p = torch.softmax(torch.randn(5, 6, dtype=torch.float64), -1).requires_grad_(True)
    assert torch.autograd.gradcheck(lambda p: LS.effective_support(p, groups=2), (p,))
    e = torch.randn(5, 4, dtype=torch.float64)
    a = torch.randn(5, 6, dtype=torch.float64)
    dead = torch.tensor([True, False, True, True, False, True])
    assert torch.autograd.gradcheck(lambda W: LS.auxk_term(e, a, dead, W, 2, 3.0), (W,))


def test_auxk_term_uses_only_the_largest_dead_units():
    W = torch.eye(4)  # unit j draws pixel j
    a = torch.tensor([[5.0, 3.0, 2.0, -1.0]])
    residual = torch.tensor([[5.0, 3.0, 2.0, 0.0]])
    dead = torch.tensor([False, True, True, True])
    # unit 0 is alive, k = 1: only unit 1 (the largest dead) explains its pixel
    assert float(LS.auxk_term(residual, a, dead, W, 1, 1.0)) == pytest.approx(25.0 + 4.0)
    assert float(LS.auxk_term(residual, a, dead, W, 3, 1.0)) == pytest.approx(25.0)


# ---- the logging cadence ----------------------------------------------------------------------

class EveryStepProbe(L.Callback):
    """Logs a value after every step: Lightning writes it only at the steps it chooses."""

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        pl_module.log("probe", float(trainer.global_step))


def logged_steps(csv_dir, column: str) -> list[int]:
    import pandas as pd

    history = pd.read_csv(csv_dir / "metrics.csv")
    return sorted(int(s) for s in history.dropna(subset=[column])["step"])


def test_training_metrics_are_logged_exactly_at_lightnings_steps(mnist_small, tmp_path):
    # 5 batches an epoch, so the cadence runs across epoch ends; then resumed from a
    # checkpoint written at a mid-epoch validation
    config = SAEConfig(model="entmax", hidden=16, dead_guard="none")
    ckpt = ModelCheckpoint(dirpath=tmp_path / "ckpt", save_last=True)

    def fit(steps, log_dir, resume=None):
        model = training_module(config, mnist_small.train_mean, 50.0)
        trainer = quiet_trainer(max_steps=steps, limit_train_batches=5, limit_val_batches=1,
                                val_check_interval=3, log_every_n_steps=4,
                                logger=CSVLogger(log_dir, name="", version=""),
                                enable_checkpointing=True, callbacks=[EveryStepProbe(), ckpt])
        trainer.fit(model, datamodule=mnist_small, ckpt_path=resume)
        return trainer

    first = fit(13, tmp_path / "first")
    assert logged_steps(tmp_path / "first", "train/loss") == [3, 7, 11]  # (step + 1) % 4 == 0
    for column in ("probe", "train/l0", "train/alpha"):
        assert logged_steps(tmp_path / "first", column) == [3, 7, 11], column
    resumed_at = torch.load(tmp_path / "ckpt" / "last.ckpt", weights_only=False)["global_step"]
    assert resumed_at == first.global_step == 13
    fit(24, tmp_path / "second", resume=str(tmp_path / "ckpt" / "last.ckpt"))
    assert logged_steps(tmp_path / "second", "probe") == [15, 19, 23]
    assert logged_steps(tmp_path / "second", "train/loss") == [15, 19, 23]


def test_logging_is_skipped_between_logged_steps(mnist_small):
    calls = []

    class Counting(SAETraining):
        def log(self, name, *args, **kwargs):
            calls.append((self.global_step, name))

    model = Counting(L1SAE(SAEConfig(model="l1", hidden=8, dead_guard="none"),
                           mnist_small.train_mean))
    quiet_trainer(max_steps=6, limit_val_batches=0, log_every_n_steps=3).fit(
        model, datamodule=mnist_small)
    assert sorted({step for step, _ in calls}) == [2, 5]  # no self.log call on the other steps
    assert model.logs_this_step() is False  # step 6: 7 % 3 != 0


# ---- faster forms of the loss terms equal the previous ones -------------------------------------

def test_column_norms_equal_the_norm_and_its_gradient():
    g = torch.Generator().manual_seed(0)
    W = torch.randn(7, 5, generator=g, dtype=torch.float64)
    W[:, 2] = 0.0  # a zero column: gradient 0, as W.norm(dim=0) gives it
    W.requires_grad_()
    up = torch.randn(5, generator=g, dtype=torch.float64)
    (grad,) = torch.autograd.grad(LS.column_norms(W), W, up)
    W_ref = W.detach().clone().requires_grad_()
    (grad_ref,) = torch.autograd.grad(W_ref.norm(dim=0), W_ref, up)
    torch.testing.assert_close(LS.column_norms(W), W.norm(dim=0), rtol=1e-15, atol=0)
    torch.testing.assert_close(grad, grad_ref, rtol=1e-14, atol=0)
    assert torch.autograd.gradcheck(LS.column_norms, (torch.randn(6, 4, dtype=torch.float64,
                                                                  requires_grad=True),))


def test_decoder_weighted_l1_equals_its_definition():
    g = torch.Generator().manual_seed(1)
    h = torch.rand(9, 6, generator=g, dtype=torch.float64, requires_grad=True)
    W = torch.randn(4, 6, generator=g, dtype=torch.float64, requires_grad=True)
    got = LS.decoder_weighted_l1(h, W, 0.7)
    want = (h * W.norm(dim=0)).sum(-1).mean() / 0.7
    torch.testing.assert_close(got, want, rtol=1e-14, atol=0)
    for a, b in zip(torch.autograd.grad(got, (h, W)), torch.autograd.grad(want, (h, W)),
                    strict=True):
        torch.testing.assert_close(a, b, rtol=1e-13, atol=1e-15)


@pytest.mark.parametrize("n_dead", [0, 3, 40])
def test_auxk_on_the_dead_columns_equals_the_masked_form(n_dead):
    g = torch.Generator().manual_seed(n_dead)
    e = torch.randn(16, 10, generator=g, dtype=torch.float64)
    a = torch.randn(16, 64, generator=g, dtype=torch.float64, requires_grad=True)
    W = torch.randn(10, 64, generator=g, dtype=torch.float64, requires_grad=True)
    dead = torch.zeros(64, dtype=torch.bool)
    dead[torch.randperm(64, generator=g)[:n_dead]] = True
    values, grads = [], []
    for compact in (True, False):
        term = LS.auxk_term(e, a, dead, W, 8, 3.0, compact=compact)
        values.append(term)
        grads.append(torch.autograd.grad(term, (a, W)))
    torch.testing.assert_close(values[0], values[1], rtol=1e-14, atol=0)
    for a_grad, b_grad in zip(*grads, strict=True):
        torch.testing.assert_close(a_grad, b_grad, rtol=1e-13, atol=1e-15)
    assert torch.autograd.gradcheck(
        lambda A, V: LS.auxk_term(e, A, dead, V, 8, 3.0, compact=True), (a, W))


def test_topk_with_no_dead_unit_adds_a_zero_auxk_term():
    module = SAETraining(small_model("topk"))
    model = module.sae
    x = torch.rand(8, 20)
    x_hat, h, extras = model.forward_pass(x)
    extras["dead"] = module.dead_mask(reduce=False)
    assert float(model.extra_loss(x, x_hat, h, extras)) == 0.0
    module.samples_since_fired[:5] = model.config.dead_window
    extras["dead"] = module.dead_mask(reduce=False)
    assert float(model.extra_loss(x, x_hat, h, extras)) > 0.0


@pytest.mark.parametrize("mode", ["learn", "anneal", "fixed"])
def test_entmax_reports_its_alpha_without_a_warning(mode):
    # a learned alpha is a tensor that requires grad: read as a float it warned in every run
    model = small_model("entmax", alpha_mode=mode)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        alpha = model.result_extras()["alpha"]
    assert isinstance(alpha, float) and 1.5 <= alpha <= 2.0
