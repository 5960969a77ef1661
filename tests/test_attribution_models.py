"""The published Sparsemax-SAE (sparsemax-attention), and the variants that tell what the batch
support owes to sparsemax: JumpReLU with one shared threshold (and a per-input gain), BatchTopK
with the batch support's straight-through gate."""

import pytest
import torch
import torch.nn.functional as F

from sae.models import build_model
from sae.settings.config import SAEConfig
from tests.test_default_sparsemax import simplex_projection


def attention(**kw):
    torch.manual_seed(0)
    config = SAEConfig(model="sparsemax-attention", input_dim=10, hidden=24, **kw)
    config.validate()
    return build_model(config, torch.zeros(10), 1.0).double()


def test_the_published_mechanism_matches_its_equations():
    model = attention()
    x = torch.rand(16, 10, dtype=torch.float64) * 3
    C, K, V = model.concepts, model.key, model.value
    assert C.shape == (24, 10) and K.shape == (10, 10) and V.shape == (10, 10)
    model.eval()
    with torch.no_grad():
        x_hat, h, _ = model.forward_pass(x)
        for n in range(len(x)):
            norm = x[n].norm()
            s = (C @ K) @ (x[n] / norm)
            support = simplex_projection(s) > 0
            code = norm * s * support
            assert torch.allclose(h[n], code, atol=1e-12)
            assert torch.allclose(x_hat[n], (C @ V).T @ code, atol=1e-12)  # no decoder bias
    assert (h != 0).sum(1).min() >= 1
    # a linear decoder of the code: every measure of one applies
    atoms, offset = model.linear_decoder()
    assert torch.allclose(atoms, (C @ V).T) and not offset.any()


def test_the_frequency_mask_keeps_frequent_units_out():
    model = attention(frequency_mask=0.1)
    model.train()
    x = torch.rand(64, 10, dtype=torch.float64)
    model.forward_pass(x)
    assert int(model.frequency_batches) == 1
    model.eval()
    with torch.no_grad():
        h = model.forward_pass(x)[1]
    assert not h[:, model.firing_frequency > 0.1].any()  # masked units never fire
    # the running frequency is the mean over batches, every batch weighing the same
    off = attention(frequency_mask=0.0)
    off.train()
    shares = []
    for i in range(3):
        batch = torch.rand(32, 10, dtype=torch.float64, generator=torch.Generator().manual_seed(i))
        shares.append((off.forward_pass(batch)[1] > 0).double().mean(0))
    assert torch.allclose(off.firing_frequency, torch.stack(shares).mean(0))


def test_the_attention_settings_change_what_they_say():
    low = attention(attention_rank=3)
    assert low.concepts.shape == (24, 3) and low.key.shape == (3, 10)
    full = attention(attention_factors="full")
    assert {"encoder", "decoder"} <= dict(full.named_parameters()).keys()
    raw = attention(attention_input="raw")
    x = torch.rand(4, 10, dtype=torch.float64)
    a, _ = raw.pre_activations(x)
    assert torch.allclose(a, x @ raw.encoder_rows().T)
    for bad, words in (({"dead_guard": "resample"}, "--dead-guard none"),
                       ({"arch": "mlp"}, "needs --arch linear")):
        with pytest.raises(ValueError, match=words):
            SAEConfig(model="sparsemax-attention", **bad).validate()
    for kw in ({"attention_rank": 3}, {"attention_input": "raw"}, {"frequency_mask": 0.0}):
        with pytest.raises(ValueError, match="applies to --model sparsemax-attention"):
            SAEConfig(model="l1", **kw).validate()


def jumprelu(**kw):
    torch.manual_seed(0)
    config = SAEConfig(model="jumprelu", input_dim=10, hidden=24, **kw)
    config.validate()
    return build_model(config, torch.zeros(10), 1.0).double()


def test_a_shared_threshold_is_one_number_and_the_gain_scales_each_input():
    shared = jumprelu(jumprelu_threshold="shared")
    assert shared.log_threshold.shape == (1,)
    x = torch.rand(32, 10, dtype=torch.float64)
    shared.eval()
    with torch.no_grad():
        a, _ = shared.pre_activations(x)
        h = shared.forward_pass(x)[1]
    assert torch.equal(h > 0, a > shared.thresholds())  # one threshold for every unit
    gained = jumprelu(jumprelu_threshold="shared", jumprelu_gain="input")
    with torch.no_grad():
        gained.gain_head.weight.normal_()
        a, centred = gained.pre_activations(x)
        r = F.softplus(gained.gain_head(centred))
        theta = gained.thresholds()
        assert torch.allclose(gained.forward_pass(x)[1], r * a * (a > theta), atol=1e-12)
    # the gain starts at 1: the same code as without it
    fresh = jumprelu(jumprelu_threshold="shared", jumprelu_gain="input")
    assert torch.allclose(fresh(x)[1], shared.train()(x)[1])
    # and the threshold learns through the L0 price
    shared.train()
    shared.penalty(*shared.code(*shared.pre_activations(x))).backward()
    assert shared.log_threshold.grad is not None


def test_batchtopk_with_the_gate_keeps_its_code_and_gains_gradients_near_the_cut():
    torch.manual_seed(0)
    plain = build_model(SAEConfig(model="batchtopk", input_dim=10, hidden=24, k=4), torch.zeros(10),
                        1.0).double().train()
    gated = build_model(SAEConfig(model="batchtopk", input_dim=10, hidden=24, k=4,
                                  batchtopk_gate="ste", lam=0.01), torch.zeros(10),
                        1.0).double().train()
    gated.load_state_dict(plain.state_dict())
    x = torch.rand(16, 10, dtype=torch.float64)
    a = plain.pre_activations(x)[0].detach().requires_grad_(True)
    centred = x - plain.b_dec
    h_plain, _ = plain.code(a, centred)
    h_gated, extras = gated.code(a, centred)
    assert torch.equal(h_plain, h_gated)  # the same entries, the same values
    assert float(gated.penalty(h_gated, extras)) == pytest.approx(4 / 10)  # k per input, λ/10
    target = torch.randn_like(h_gated)
    (grad_plain,) = torch.autograd.grad((h_plain * target).sum(), a)
    (grad_gated,) = torch.autograd.grad((h_gated * target).sum(), a)
    off = h_plain == 0
    assert not grad_plain[off].any()  # plain: nothing outside the kept entries
    assert grad_gated[off & (a > 0)].any()  # gated: units just below the cut learn
    with pytest.raises(ValueError, match="--batchtopk-gate"):
        SAEConfig(model="topk", batchtopk_gate="ste").validate()


def test_batchtopk_gate_takes_back_from_the_kept_units_what_it_pushes_near_the_cut():
    """The cut is differentiated as sparsemax's threshold (1/|S| on each kept entry): the L0
    price moves no pre-activation on the whole (a shift of every a changes neither the kept
    set nor the margins), while it lowers the units near the cut against the others. Without
    it the price pushed every unit near the cut down, and MNIST runs at k 16 lost half their
    units in 20 epochs."""
    torch.manual_seed(1)
    gated = build_model(SAEConfig(model="batchtopk", input_dim=10, hidden=24, k=4,
                                  batchtopk_gate="ste", lam=0.01), torch.zeros(10),
                        1.0).double().train()
    x = torch.rand(16, 10, dtype=torch.float64)
    a = gated.pre_activations(x)[0].detach().requires_grad_(True)
    h, extras = gated.code(a, x - gated.b_dec)
    (grad,) = torch.autograd.grad(gated.penalty(h, extras), a)
    near = grad > 0  # pushed down: the units within the window of the cut
    assert near.any() and (grad < 0).any()  # and the kept ones pulled up in return
    assert float(grad.sum()) == pytest.approx(0.0, abs=1e-12)
    # the same for the reconstruction's gradient through the gate
    target = torch.randn_like(h)
    (g_value,) = torch.autograd.grad((F.relu(a) * (h > 0) * target).sum(), a)
    (g_all,) = torch.autograd.grad((gated.code(a, x - gated.b_dec)[0] * target).sum(), a)
    assert float((g_all - g_value).sum()) == pytest.approx(0.0, abs=1e-10)


def test_lambda_is_noted_as_unused_only_where_it_is(tmp_path):
    from sae.settings.cli import run_config, unused_flags

    def notes(*argv):
        argv = [*argv, "--out", str(tmp_path / "r")]
        return unused_flags(argv, run_config(argv))

    assert any("--lambda is ignored" in n for n in notes("--model", "batchtopk", "--lambda",
                                                         "0.1"))
    assert not notes("--model", "batchtopk", "--batchtopk-gate", "ste", "--lambda", "0.1")
    assert any("its own (no λ or k)" in n for n in notes("--model", "sparsemax-attention",
                                                         "--lambda", "0.1"))


def test_a_sweep_entry_of_the_published_model_has_no_grid(tmp_path):
    from sae.settings.cli import UsageError
    from sae.sweep import spec

    path = tmp_path / "s.yaml"
    path.write_text("datasets: [mnist]\nseeds: [0, 1]\nmodels:\n  sparsemax-attention: {}\n")
    runs = spec.plan(spec.load_sweep(path))
    assert [(r.param, r.value) for r in runs] == [("none", 0), ("none", 0)]
    assert str(runs[0].rel) == "runs/mnist/sparsemax-attention/none0/seed0"
    path.write_text("datasets: [mnist]\nseeds: [0]\nmodels:\n"
                    "  sparsemax-attention: {lambda: [0.1, 0.2]}\n")
    with pytest.raises(UsageError, match="no λ or k to sweep"):
        spec.plan(spec.load_sweep(path))
