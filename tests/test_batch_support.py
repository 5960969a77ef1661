"""The Sparsemax-SAE's batch support (``--support batch``): the batch's scores projected onto the
scaled simplex at once, its gate's gradient, its threshold at inference, units returning, exact
resampling, and λ controlling L0."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from test_sparsemax_modes import _l0_after_training, ramp_forward, train_unit

from sae.activations import sparsemax
from sae.models import SAEConfig, build_model
from sae.models import sparsemax as sparsemax_module
from sae.models.losses import fvu_term
from sae.training.checkpoints import expected_state
from sae.training.module import SAETraining


def batch_model(hidden=32, groups=1, seed=0, **kw):
    """A small float64 batch-support model, in training mode."""
    torch.manual_seed(seed)
    config = SAEConfig(input_dim=20, hidden=hidden, groups=groups, support="batch", **kw)
    config.validate()
    model = build_model(config, mean_image=torch.rand(20), data_var=2.0).double()
    with torch.no_grad():
        model.b_enc += 1.0  # positive scores near the threshold, so that ReLU values are not 0
    return model.train()


def projection_reference(s: torch.Tensor, mass: float) -> torch.Tensor:
    """The Euclidean projection of a vector s onto {p >= 0, Σ p = mass}, by sorting."""
    z = s.sort(descending=True).values
    cumulative = z.cumsum(0) - mass
    k = torch.arange(1, len(z) + 1, dtype=s.dtype)
    size = int((z - cumulative / k > 0).sum())
    return (s - cumulative[size - 1] / size).clamp_min(0)


@settings(max_examples=40, deadline=None)
@given(B=st.integers(1, 6), G=st.sampled_from([1, 2]), n=st.integers(2, 9),
       seed=st.integers(0, 2**16))
def test_the_batch_projection_is_one_projection_of_all_the_batchs_scores(B, G, n, seed):
    model = batch_model(hidden=G * n, groups=G)
    s = torch.randn(B, G, n, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    p = model.project(s)
    for g in range(G):
        torch.testing.assert_close(p[:, g].flatten(), projection_reference(s[:, g].flatten(), B))
        torch.testing.assert_close(p[:, g].sum(), torch.tensor(B, dtype=torch.float64))
        tau = (s[:, g] - p[:, g])[p[:, g] > 0]  # one threshold for the whole batch
        torch.testing.assert_close(tau, tau[:1].expand_as(tau))
    # each input's own projection would give every input mass 1; the batch's does not
    assert torch.equal(p, B * sparsemax(s.transpose(0, 1).reshape(G, -1) / B).view(
        G, B, n).transpose(0, 1))


def test_an_input_with_higher_scores_takes_more_of_the_batchs_units():
    model = batch_model(hidden=16)
    s = torch.randn(2, 1, 16, dtype=torch.float64)
    s[1] = 2 * s[0] + 1.0  # the second input: the first's scores, stretched and raised
    on = (model.project(s) > 0).sum((1, 2))
    own = (model.support_map(s.view(2, -1) / 1.0) > 0).sum(-1)
    assert on[1] > on[0]
    assert own[1] <= own[0]  # one input's own projection gives the stretched scores fewer


@pytest.mark.parametrize("groups", [1, 2])
def test_the_batch_gate_gradient_is_the_stated_pseudo_derivative(monkeypatch, groups):
    # h = r·ReLU(s)·H(s − τ_g), H'(u) := K(u/ε)/ε with ε = κ·B/|S_g| (the mean active share of
    # the batch) and τ_g the batch's threshold (∂τ_g/∂s = 1/|S_g| on the batch's support): with
    # the gate's forward swapped for the ramp whose derivative is K/ε, float64 gradcheck
    # compares the model's backward with finite differences
    model = batch_model(hidden=32, groups=groups)
    with torch.no_grad():
        model.scale_head.weight.normal_(0, 0.3)  # r depends on x
    x = torch.rand(6, 20, dtype=torch.float64)
    a, x_c = model.pre_activations(x)
    s = model.scores(a, x_c)
    p = model.project(s)
    size = (p > 0).sum((0, 2), keepdim=True)
    tau = ((s - p) * (p > 0)).sum((0, 2), keepdim=True) / size
    eps = model.GATE_BANDWIDTH * len(x) / size
    u = s - tau
    assert ((u < 0) & (u > -eps / 2)).sum() >= 3 and ((u > 0) & (u < eps / 2)).sum() >= 3
    monkeypatch.setattr(sparsemax_module, "support_gate", ramp_forward)
    a, x_c = a.detach().requires_grad_(True), x_c.detach().requires_grad_(True)
    with torch.no_grad():
        model.inference_threshold.zero_()  # the running mean is updated in each call
    assert torch.autograd.gradcheck(lambda a_, x_: model.code(a_, x_)[0], (a, x_c))


def test_inference_uses_the_running_batch_threshold_and_needs_no_batch():
    model = batch_model(hidden=32, groups=2)
    model.BATCH_THRESHOLD_RATE = 1.0  # θ = the last training batch's T·τ
    x = torch.rand(64, 20, dtype=torch.float64)
    h_train = model.forward_pass(x)[1].detach()
    a, x_c = model.pre_activations(x)
    s = model.scores(a, x_c)
    p = model.project(s)
    tau = ((s - p) * (p > 0)).sum((0, 2)) / (p > 0).sum((0, 2))
    torch.testing.assert_close(model.inference_threshold, tau * model.log_temperature.exp())
    assert int(model.threshold_batches) == 1
    model.eval()
    h_eval = model.forward_pass(x)[1].detach()
    # the batch's own threshold at inference: the same units, the same values (ties at the
    # threshold aside, which random scores do not have)
    assert torch.equal(h_eval > 0, h_train > 0)
    torch.testing.assert_close(h_eval, h_train)
    # an input's code does not depend on the rest of its batch, and eval leaves θ alone
    torch.testing.assert_close(model.encode(x[:5]), h_eval[:5])
    assert int(model.threshold_batches) == 1
    # a change of T (which learns faster than the encoder) leaves the threshold on a in place:
    # the same units fire (their values, r·ReLU(a/T), change with T)
    with torch.no_grad():
        model.log_temperature += 0.3
    assert torch.equal(model.encode(x) > 0, h_eval > 0)


def test_a_unit_just_outside_the_batch_support_returns():
    model = batch_model(hidden=32, seed=1)
    x = torch.rand(1, 20, dtype=torch.float64) + 0.05 * torch.rand(64, 20, dtype=torch.float64)
    j = 5
    with torch.no_grad():
        direction = torch.nn.functional.normalize((x - model.forward_pass(x)[0]).mean(0), dim=0)
        model.W_dec[:, j] = direction
        model.W_enc[j] = direction
        T = float(model.log_temperature.exp())
        for _ in range(50):  # a fixed point: unit j's scores move the batch threshold
            a, x_c = model.pre_activations(x)
            s = model.scores(a, x_c)
            p = model.project(s)
            size = (p > 0).sum()
            tau = float(((s - p) * (p > 0)).sum() / size)
            eps = model.GATE_BANDWIDTH * len(x) / float(size)
            # every input's score on unit j a tenth of the window below the batch threshold
            model.b_enc[j] += T * (tau - 0.1 * eps) - float(a[:, j].max())
    h = model.forward_pass(x)[1]
    assert (h[:, j] == 0).all()
    before = float(fvu_term(x, model.forward_pass(x)[0], model.data_var).detach())
    train_unit(model, x, j)  # the reconstruction's gradient, through the gate, on unit j only
    assert float((model.forward_pass(x)[1][:, j] > 0).float().mean()) == 1
    assert float(fvu_term(x, model.forward_pass(x)[0], model.data_var).detach()) < before


@pytest.mark.parametrize("groups", [1, 4])
def test_resampled_units_enter_the_batch_support_at_the_intended_margin(groups):
    model = batch_model(hidden=64, groups=groups)
    model.forward_pass(torch.rand(32, 20, dtype=torch.float64))  # a training step's forward sets θ
    idx = torch.tensor([3, 17, 30, 41])
    inputs = torch.rand(4, 20, dtype=torch.float64)
    with torch.no_grad():
        model.W_enc[idx] = 0.5 * torch.nn.functional.normalize(
            torch.randn(4, 20, dtype=torch.float64), dim=1)
        model.b_enc[idx] = -10.0
    model.after_resample(idx, inputs)
    a, x_c = model.pre_activations(inputs)
    s = model.scores(a, x_c)
    theta = model.batch_threshold()  # [G]
    others = torch.nn.functional.relu(s - theta[:, None])
    others.view(4, -1)[:, idx] = 0
    share = others.pow(2).sum(-1) / others.sum(-1)
    rows, group = torch.arange(4), idx // (64 // groups)
    torch.testing.assert_close(s.view(4, -1)[rows, idx],
                               theta[group] + model.ADMISSION_SHARE * share[rows, group],
                               rtol=1e-9, atol=1e-9)
    model.eval()
    assert (model.encode(inputs)[rows, idx] > 0).all()  # each on its source input


@pytest.mark.slow
def test_lambda_lowers_l0_with_the_batch_support(mnist_small):
    l0s = [_l0_after_training(mnist_small, 400, lam=lam, support="batch")
           for lam in (0.001, 0.01, 0.03)]
    assert l0s[0] > 1.15 * l0s[1] > 1.15 * 1.15 * l0s[2] and l0s[2] > 1.5, l0s


def test_the_batch_support_settings_and_what_a_checkpoint_holds():
    config = SAEConfig(input_dim=20, hidden=32, support="batch")
    config.validate()
    assert (config.resolved_temperature(), config.resolved_values(),
            config.resolved_inference()) == ("global", "unshrunk-ste", "sparsemax")
    pinned = config.pinned()
    assert (pinned.support, pinned.temperature) == ("batch", "global")
    model = build_model(config, torch.rand(20), 2.0)
    assert set(expected_state(pinned.__dict__, "ckpt")) == set(SAETraining(model).state_dict())
    assert {"inference_threshold", "threshold_batches"} <= set(model.state_dict())
    # the default is each input's own support, whatever the other settings, and a
    # configuration saved before the setting existed keeps the support it had
    default = SAEConfig(input_dim=20)
    assert (default.resolved_support(), default.resolved_temperature()) == ("input", "energy")
    assert SAEConfig(temperature="global").resolved_support() == "input"
    for kw in ({"values": "shrunk"}, {"values": "unshrunk"}, {"temperature": "energy"},
               {"temperature": "normalized"}, {"inference": "threshold"}, {"support": "input"},
               {"energy_power": 1.5}, {"energy_power_mode": "fixed"}):
        config = SAEConfig(**kw)
        config.validate()
        assert config.resolved_support() == "input", kw
    assert SAEConfig(support="input").resolved_temperature() == "energy"
    assert SAEConfig.from_dict({"model": "sparsemax"}).resolved_support() == "input"
    assert SAEConfig(model="entmax").resolved_support() == "input"
    for kw, message in (({"model": "entmax"}, "--support batch applies to --model sparsemax"),
                        ({"values": "shrunk"}, "--support batch needs --values unshrunk-ste"),
                        ({"temperature": "energy"}, "--support batch has one temperature"),
                        ({"inference": "threshold"}, "--support batch infers with")):
        with pytest.raises(ValueError, match=message):
            SAEConfig(support="batch", **kw).validate()
