"""The energy rule given to the baselines: TopK keeps round(k · e(x)^γ / E[e^γ]) units of an
input, BatchTopK and JumpReLU scale their thresholds by e(x)^−γ, e(x) = ‖x − b_dec‖ / √v."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from sae.activations.thresholds import rows_topk_relu, topk_relu
from sae.models import SAEConfig, build_model


@settings(deadline=None, max_examples=40)
@given(b=st.integers(1, 6), h=st.integers(2, 20), seed=st.integers(0, 2**16))
def test_each_row_keeps_its_own_k_largest(b, h, seed):
    gen = torch.Generator().manual_seed(seed)
    a = torch.randn(b, h, generator=gen, dtype=torch.float64)
    k = torch.randint(1, h + 1, (b,), generator=gen)
    out = rows_topk_relu(a, k)
    for row in range(b):
        assert torch.equal(out[row], topk_relu(a[row:row + 1], int(k[row]))[0])


def _model(model, gamma, bias=0.0, **kw):
    config = SAEConfig(model=model, input_dim=8, hidden=32, k=4, energy_rule=gamma,
                       dead_guard="none", **kw)
    config.validate()
    torch.manual_seed(0)
    sae = build_model(config, torch.zeros(8), 2.0)
    with torch.no_grad():
        sae.b_dec.zero_()
        sae.b_enc.fill_(bias)
    return sae.eval()


def test_topk_keeps_round_k_e_gamma_over_its_running_mean():
    sae = _model("topk", 1.5, bias=100.0)  # every pre-activation positive: the budget decides
    sae.energy_mean.fill_(1.3)
    x = torch.randn(64, 8) * torch.linspace(0.1, 3, 64)[:, None]
    e = x.norm(dim=1) / math.sqrt(2.0)
    want = torch.round(4 * e ** 1.5 / 1.3).clamp(1, 32)
    assert torch.equal((sae.encode(x) > 0).sum(1).float(), want)


def test_topk_learns_the_mean_of_e_gamma_in_training():
    sae = _model("topk", 1.0).train()
    x = torch.randn(256, 8) * 2
    for _ in range(3):
        sae.forward_pass(x)
    e = (x.norm(dim=1) / math.sqrt(2.0)).mean()
    assert sae.energy_mean.item() == pytest.approx(e.item(), rel=1e-5)
    assert int(sae.energy_batches) == 3
    before = sae.energy_mean.clone()
    sae.eval().encode(x * 5)  # inference leaves it alone
    assert torch.equal(sae.energy_mean, before)


@pytest.mark.parametrize("model", ["batchtopk", "jumprelu"])
def test_a_thresholds_scales_with_the_inputs_energy(model):
    sae = _model(model, 1.0)
    theta = sae.thresholds() if model == "jumprelu" else sae.threshold.fill_(3.0)
    x = torch.randn(1, 8) * torch.linspace(0.2, 4, 50)[:, None]  # one direction, 50 norms
    a, centred = sae.pre_activations(x)
    e = centred.norm(dim=1, keepdim=True) / math.sqrt(2.0)
    want = a * (a > theta / e).to(a.dtype)
    assert torch.allclose(sae.encode(x), want, atol=1e-6)
    l0 = (sae.encode(x) > 0).sum(1).float()
    assert l0[-10:].mean() > l0[:10].mean()  # more energy, more units


def test_the_rule_is_refused_where_it_does_not_apply():
    with pytest.raises(ValueError, match="--energy-rule"):
        SAEConfig(model="l1", energy_rule=1.0).validate()
    with pytest.raises(ValueError, match="exclude each other"):
        SAEConfig(model="batchtopk", energy_rule=1.0, batchtopk_gate="ste").validate()


@pytest.mark.slow
@pytest.mark.parametrize("model", ["topk", "batchtopk", "jumprelu"])
def test_a_baseline_with_the_energy_rule_trains_saves_and_loads(tmp_path, data_dir, model):
    """A short MNIST run with the rule: it finishes, its checkpoint loads as the model it was,
    and the test codes' L0 follows the inputs' energy."""
    from cli_helpers import QUICK, run_cli

    import sae

    out = tmp_path / "run"
    result = run_cli([*QUICK, "--model", model, "--energy-rule", "1", "--lambda", "0.01",
                      "--max-steps", "40", "--no-figures", "--no-features", "--no-report",
                      "--progress", "off", "--out", out], tmp_path, data_dir)
    assert result.returncode == 0, result.stderr
    loaded = sae.load(out)
    assert loaded.config.energy_rule == 1.0
    from sae.data.images import ImageDataModule

    dm = ImageDataModule("mnist", str(data_dir), batch_size=256, val_size=256, limit_train=1024,
                         limit_test=256)
    dm.setup()
    x = torch.cat([b[0] for b in dm.test_dataloader()])
    with torch.no_grad():
        l0 = (loaded.encode(x) > 0).sum(1).double()
    energy = (x - loaded.b_dec).norm(dim=1).double()
    from sae import metrics
    assert metrics.adaptivity(l0, energy) > 0.3
