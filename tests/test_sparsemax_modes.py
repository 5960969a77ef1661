"""The Sparsemax-SAE's temperature modes and values modes: their math, the straight-through
gate's gradient, λ controlling L0 in each, units returning to the support, exact resampling."""

from dataclasses import asdict

import lightning.pytorch as L
import pytest
import torch
import yaml

from sae import metrics
from sae.models import SAEConfig, build_model, encode_dataset
from sae.models import sparsemax as sparsemax_module
from sae.models.gates import rectangle_kernel, support_gate
from sae.models.losses import fvu_term
from sae.training.module import SAETraining

TEMPERATURES = ("global", "learned", "normalized", "energy")


def model64(temperature="global", values="shrunk", name="sparsemax", hidden=32, groups=1,
            seed=0, **kw):
    """A small float64 model whose learned temperature head (if any) is not zero."""
    torch.manual_seed(seed)
    config = SAEConfig(model=name, input_dim=20, hidden=hidden, groups=groups,
                       temperature=temperature, values=values, **kw)
    model = build_model(config, mean_image=torch.rand(20), data_var=2.0).double()
    if temperature == "learned":
        with torch.no_grad():
            model.temperature_head.weight.normal_(0, 0.3)
    if temperature == "energy":
        with torch.no_grad():
            model.energy_exponent.normal_(0, 0.7)
    return model


def moderate(model, x, fraction=0.25):
    """Shift the scores up (sparsemax ignores it; ReLU values need positive scores near the
    threshold) and set T so that about ``fraction`` of the units are on the support of x."""
    with torch.no_grad():
        model.b_enc += 1.0
        base = model.log_temperature.clone()

        def support(shift):
            model.log_temperature.copy_(base + shift)
            return (model.code(*model.pre_activations(x))[1]["p"] > 0).double().mean()

        # a coarse grid, not a bisection, which would stop where a unit sits on the threshold
        shifts = torch.arange(-8.0, 8.0, 0.25, dtype=torch.float64)
        support(min(shifts, key=lambda t: abs(support(t) - fraction)))


def margins(model, a, x_centred):
    """(scores s, p, u = s − τ) [B, G, n] of the model's sparsemax on its scores."""
    s = model.scores(a, x_centred)
    p = model.support_map(s.reshape(len(a), -1)).view_as(s)
    size = (p > 0).sum(-1, keepdim=True)
    tau = ((s - p) * (p > 0)).sum(-1, keepdim=True) / size
    return s, p, s - tau


# ---- the temperature modes -------------------------------------------------------------------

def test_learned_temperature_starts_exactly_as_the_global_one():
    # on the same support: auto would give the global temperature the batch support (the
    # default) and the learned one each input's own, which agree only while every unit is on
    x = torch.rand(16, 20, dtype=torch.float64)
    torch.manual_seed(0)
    glob = build_model(SAEConfig(input_dim=20, hidden=32, temperature="global", support="input"),
                       torch.rand(20), 2.0).double()
    torch.manual_seed(0)
    learned = build_model(SAEConfig(input_dim=20, hidden=32, temperature="learned",
                                    support="input"), torch.rand(20), 2.0).double()
    assert torch.equal(glob.forward_pass(x)[1], learned.forward_pass(x)[1])
    # and the head learns: the reconstruction's gradient reaches u
    x_hat, h, extras = learned.forward_pass(x)
    (fvu_term(x, x_hat, learned.data_var) + learned.penalty(h, extras)).backward()
    assert learned.temperature_head.weight.grad.abs().sum() > 0


@pytest.mark.parametrize("groups", [1, 4])
def test_learned_temperature_is_T_times_exp_of_the_input_head(groups):
    model = model64("learned", groups=groups)
    x = torch.rand(5, 20, dtype=torch.float64)
    a, x_c = model.pre_activations(x)
    u = model.temperature_head.weight  # [G, D]
    expected = model.log_temperature.exp() * torch.exp(x_c @ u.t())
    torch.testing.assert_close(model.temperature(a, x_c), expected)


@pytest.mark.parametrize("groups", [1, 4])
def test_energy_temperature_is_the_normalized_one_times_a_power_of_the_input_norm(groups):
    x = 3.0 * torch.rand(16, 20, dtype=torch.float64)
    models = {}
    for temperature in ("normalized", "energy"):
        torch.manual_seed(0)
        config = SAEConfig(input_dim=20, hidden=32, groups=groups, temperature=temperature)
        models[temperature] = build_model(config, torch.rand(20), 2.0).double()
    normalized, energy = models["normalized"], models["energy"]
    # γ starts at 0: exactly normalized
    assert torch.equal(normalized.forward_pass(x)[1], energy.forward_pass(x)[1])
    with torch.no_grad():
        energy.energy_exponent.copy_(torch.linspace(-0.5, 1.5, groups, dtype=torch.float64))
    a, x_c = energy.pre_activations(x)
    norm = x_c.norm(dim=-1, keepdim=True) / 2.0**0.5  # ν = sqrt(v), v = 2
    torch.testing.assert_close(energy.temperature(a, x_c),
                               normalized.temperature(a, x_c) * norm ** energy.energy_exponent)
    # the support still ignores the scores' scale, and now grows with the input's energy (γ > 0)
    with torch.no_grad():
        energy.energy_exponent.fill_(1.0)
    torch.testing.assert_close(energy.code(3.0 * a + 0.7, x_c)[1]["p"], energy.code(a, x_c)[1]["p"])
    small, large = (energy.code(a, c * x_c)[1]["p"] > 0 for c in (0.5, 2.0))
    assert large.sum() > small.sum()
    # and γ learns: the loss's gradient reaches it
    x_hat, h, extras = energy.forward_pass(x)
    (fvu_term(x, x_hat, energy.data_var) + energy.penalty(h, extras)).backward()
    assert energy.energy_exponent.grad.abs().sum() > 0


def test_the_energy_power_starts_where_it_is_set_and_stays_there_when_fixed():
    from sae.training.checkpoints import expected_state

    x = 3.0 * torch.rand(16, 20, dtype=torch.float64)
    models = {}
    for mode in ("learn", "fixed"):
        torch.manual_seed(0)
        config = SAEConfig(input_dim=20, hidden=32, groups=2, temperature="energy",
                           energy_power=1.5, energy_power_mode=mode)
        config.validate()
        models[mode] = build_model(config, torch.rand(20), 2.0).double()
        assert torch.equal(models[mode].energy_exponent, torch.full((2,), 1.5, dtype=torch.float64))
        # either way γ is saved with the weights, and a checkpoint of either mode loads
        assert "energy_exponent" in models[mode].state_dict()
        saved = models[mode].settings["config"]  # what its checkpoint holds
        assert set(expected_state(saved, "ckpt")) == set(SAETraining(models[mode]).state_dict())
    learned, fixed = models["learn"], models["fixed"]
    # the same model until training moves γ
    assert torch.equal(learned.forward_pass(x)[1], fixed.forward_pass(x)[1])
    names = {name for name, _ in fixed.named_parameters()}
    assert "energy_exponent" not in names and "energy_exponent" in dict(learned.named_parameters())
    for model in (learned, fixed):
        optimizer = SAETraining(model).configure_optimizers()["optimizer"]
        for _ in range(3):
            optimizer.zero_grad()
            x_hat, h, extras = model.forward_pass(x)
            (fvu_term(x, x_hat, model.data_var) + model.penalty(h, extras)).backward()
            optimizer.step()
    assert not torch.equal(learned.energy_exponent, fixed.energy_exponent)
    assert torch.equal(fixed.energy_exponent, torch.full((2,), 1.5, dtype=torch.float64))
    # the power only means something to the energy temperature
    for kw in ({"temperature": "normalized", "energy_power": 1.0},
               {"model": "entmax", "energy_power_mode": "fixed"}):
        with pytest.raises(ValueError, match="apply to --model sparsemax with the energy"):
            SAEConfig(**kw).validate()


@pytest.mark.parametrize("values", ["unshrunk", "unshrunk-ste"])
def test_the_energy_power_sizes_the_support_and_leaves_unshrunk_values_alone(values):
    # unshrunk values are r·ReLU(a / (T σ(a))) on the support, the normalized model's values: if
    # the power also divided them, γ would learn the values' scale through it, not the support
    x = 3.0 * torch.rand(16, 20, dtype=torch.float64)
    models = {}
    for temperature in ("normalized", "energy"):
        models[temperature] = model64(temperature, values=values, groups=2)
        moderate(models[temperature], x)
    normalized, energy = models["normalized"], models["energy"]
    with torch.no_grad():
        energy.load_state_dict(normalized.state_dict(), strict=False)
        energy.energy_exponent.copy_(torch.tensor([0.8, -0.4], dtype=torch.float64))
    h_norm, h_energy = normalized.encode(x), energy.encode(x)
    both = (h_norm > 0) & (h_energy > 0)
    assert not torch.equal(h_norm > 0, h_energy > 0)  # the power moved the support ...
    assert both.sum() > 10
    torch.testing.assert_close(h_energy[both], h_norm[both])  # ... and no value on it
    # no gradient reaches γ but through the support's gate
    a, x_c = energy.pre_activations(x)
    s, p, _ = margins(energy, a, x_c)
    values_only = energy.value_scores(a, x_c, s).relu() * (p > 0)
    values_only.sum().backward()
    assert energy.energy_exponent.grad is None or not energy.energy_exponent.grad.any()


@pytest.mark.parametrize("groups", [1, 4])
def test_normalized_support_ignores_the_scores_scale_and_shift(groups):
    # the global temperature's fault: scores twice as large give a smaller support
    x = torch.rand(8, 20, dtype=torch.float64)
    for temperature, invariant in (("global", False), ("normalized", True)):
        model = model64(temperature, groups=groups)
        a, x_c = model.pre_activations(x)
        p = model.code(a, x_c)[1]["p"]
        p_scaled = model.code(3.0 * a + 0.7, x_c)[1]["p"]
        if invariant:
            torch.testing.assert_close(p_scaled, p)
        else:
            assert (p_scaled > 0).sum() < (p > 0).sum()
    # each group's spread is its own: T(x) = T · std over the group's units
    a, x_c = model.pre_activations(x)
    spread = a.view(8, groups, -1).std(-1, correction=0)
    torch.testing.assert_close(model.temperature(a, x_c), model.log_temperature.exp() * spread)


@pytest.mark.parametrize("temperature", TEMPERATURES)
@pytest.mark.parametrize("name", ["sparsemax", "entmax"])
def test_every_temperature_works_with_groups_and_entmax(name, temperature):
    model = model64(temperature, name=name, groups=4)
    x = torch.rand(6, 20, dtype=torch.float64)
    x_hat, h, extras = model.forward_pass(x)
    torch.testing.assert_close(extras["p"].view(6, 4, 8).sum(-1),
                               torch.ones(6, 4, dtype=torch.float64))
    (fvu_term(x, x_hat, model.data_var) + model.penalty(h, extras)).backward()
    assert model.log_temperature.grad.abs().sum() > 0
    keys = set(model.state_dict())
    assert ("temperature_head.weight" in keys) == (temperature == "learned")


def test_temperature_applies_to_sparsemax_and_entmax_only():
    with pytest.raises(ValueError, match="--temperature learned applies to --model sparsemax"):
        SAEConfig(model="l1", temperature="learned").validate()
    SAEConfig(model="entmax", temperature="normalized").validate()


# ---- the straight-through gate ---------------------------------------------------------------

def ramp(u, eps):
    """The piecewise-linear step whose derivative is the gate's pseudo-derivative K(u/ε)/ε."""
    return (u / eps + 0.5).clamp(0, 1)


def ramp_forward(u, on, eps):
    """The gate's backward under the ramp's forward: what gradcheck can compare numerically."""
    gate = support_gate(u, on, eps)
    return ramp(u, eps).detach() + gate - gate.detach()


def test_support_gate_is_the_support_forward_and_the_kernel_backward():
    u = torch.tensor([-0.3, -0.04, -0.01, 0.0, 0.02, 0.06, 0.5], dtype=torch.float64,
                     requires_grad=True)
    on = u.detach() > 0
    gate = support_gate(u, on, 0.1)
    assert torch.equal(gate, on.double())
    g = torch.arange(1.0, 8.0, dtype=torch.float64)
    (grad,) = torch.autograd.grad(gate, u, g)
    expected = g * torch.tensor([0, 1, 1, 1, 1, 0, 0], dtype=torch.float64) / 0.1
    torch.testing.assert_close(grad, expected)
    torch.testing.assert_close(rectangle_kernel(u.detach(), 0.1), expected / g)
    # the pseudo-derivative is the exact derivative of the ramp (away from its two kinks)
    assert torch.autograd.gradcheck(lambda v: ramp_forward(v, v.detach() > 0, 0.1), (u,))


@pytest.mark.parametrize("temperature", TEMPERATURES)
def test_unshrunk_ste_gradient_is_the_stated_pseudo_derivative(monkeypatch, temperature):
    # h_j = r·ReLU(s_j)·H(s_j − τ(s)), H'(u) := K(u/ε)/ε, ε = κ/|S|, τ sparsemax's threshold.
    # With the gate's forward swapped for the ramp whose derivative is K/ε, the code is a
    # piecewise-smooth function and float64 gradcheck compares the model's backward (the
    # pseudo-derivative through s, τ, T(x) and r) with finite differences.
    model = model64(temperature, values="unshrunk-ste", groups=2)
    with torch.no_grad():
        model.scale_head.weight.normal_(0, 0.3)  # r depends on x
    x = torch.rand(6, 20, dtype=torch.float64)
    moderate(model, x)
    a, x_c = model.pre_activations(x)
    s, p, u = margins(model, a, x_c)
    eps = model.GATE_BANDWIDTH / (p > 0).sum(-1, keepdim=True)
    # units inside the window on both sides of the threshold: the kernel term is exercised
    assert ((u < 0) & (u > -eps / 2)).sum() >= 3 and ((u > 0) & (u < eps / 2)).sum() >= 3
    monkeypatch.setattr(sparsemax_module, "support_gate", ramp_forward)
    a, x_c = a.detach().requires_grad_(True), x_c.detach().requires_grad_(True)
    assert torch.autograd.gradcheck(lambda a_, x_: model.code(a_, x_)[0], (a, x_c))


def test_unshrunk_ste_forward_is_unshrunk():
    x = torch.rand(9, 20, dtype=torch.float64)
    h = {values: model64("normalized", values=values).encode(x)
         for values in ("unshrunk", "unshrunk-ste")}
    assert torch.equal(h["unshrunk"], h["unshrunk-ste"])


# ---- a unit pushed out of the support comes back ---------------------------------------------

def near_miss(values, temperature):
    """A model with one unit just below the threshold on inputs it would help reconstruct.

    Unit j draws the batch's mean residual and reads it; its bias puts its margin u_j at least a
    tenth of the gate's window below the threshold on every input.
    """
    model = model64(temperature, values=values, seed=1)
    # inputs alike enough that the unit's margin is alike on all of them
    x = torch.rand(1, 20, dtype=torch.float64) + 0.05 * torch.rand(64, 20, dtype=torch.float64)
    moderate(model, x)
    j = 5
    with torch.no_grad():
        direction = torch.nn.functional.normalize((x - model.forward_pass(x)[0]).mean(0), dim=0)
        model.W_dec[:, j] = direction
        model.W_enc[j] = direction
        for _ in range(50):  # a fixed point: the normalized T(x) depends on the bias
            a, x_c = model.pre_activations(x)
            s, p, u = margins(model, a, x_c)
            eps = model.GATE_BANDWIDTH / (p > 0).sum(-1)[:, 0]
            T = model.temperature(a, x_c)[:, 0]
            tau = s[:, 0, j] - u[:, 0, j]
            model.b_enc[j] = (T * (tau - 0.1 * eps) - (a[:, j] - model.b_enc[j])).min()
    return model, x, j


def train_unit(model, x, j, steps=30):
    """Adam on the reconstruction of x for ``steps`` steps, moving unit j's encoder row only."""
    opt = torch.optim.Adam([model.W_enc, model.b_enc], lr=1e-2)
    for _ in range(steps):
        opt.zero_grad()
        fvu_term(x, model.forward_pass(x)[0], model.data_var).backward()
        for param in (model.W_enc, model.b_enc):  # only unit j learns
            keep = torch.zeros_like(param.grad)
            keep[j] = 1
            param.grad.mul_(keep)
        opt.step()


@pytest.mark.parametrize("temperature", TEMPERATURES)
def test_a_unit_just_outside_the_support_returns_under_unshrunk_ste(temperature):
    fired = {}
    for values in ("unshrunk", "unshrunk-ste"):
        model, x, j = near_miss(values, temperature)
        assert (model.encode(x)[:, j] == 0).all()  # out of the support on every input
        a, x_c = model.pre_activations(x)
        _, p, u = margins(model, a, x_c)
        eps = model.GATE_BANDWIDTH / (p > 0).sum(-1)
        assert (u[:, 0, j] > -eps[:, 0] / 2).float().mean() > 0.3  # but near it
        before = float(fvu_term(x, model.forward_pass(x)[0], model.data_var).detach())
        train_unit(model, x, j)
        fired[values] = float((model.encode(x)[:, j] > 0).float().mean())
        if values == "unshrunk-ste":
            assert float(fvu_term(x, model.forward_pass(x)[0], model.data_var).detach()) < before
    assert fired["unshrunk-ste"] == 1, fired
    if temperature not in ("normalized", "energy"):  # there a unit's score also moves the spread
        # T(x) divides by
        assert fired["unshrunk"] == 0  # no gradient reaches a unit off the support


# ---- resampling is exact in each mode --------------------------------------------------------

@pytest.mark.parametrize("temperature", TEMPERATURES)
@pytest.mark.parametrize("groups", [1, 4])
def test_resampled_units_sit_at_the_intended_margin(temperature, groups):
    model = model64(temperature, hidden=64, groups=groups)
    idx = torch.tensor([3, 17, 30, 41])
    inputs = torch.rand(4, 20, dtype=torch.float64)
    with torch.no_grad():
        model.W_enc[idx] = 0.5 * torch.nn.functional.normalize(
            torch.randn(4, 20, dtype=torch.float64), dim=1)
        model.b_enc[idx] = 0.0
    model.after_resample(idx, inputs)
    a, x_c = model.pre_activations(inputs)
    # under the mode's temperature on the final scores: the unit's score is above the others'
    # threshold τ by ADMISSION_SHARE of their Σ p²
    s = model.scores(a, x_c)
    others = s.clone()
    others.view(4, -1)[:, idx] = float("-inf")
    p = model.support_map(others.view(4, -1)).view_as(s)
    tau = (others - p).masked_fill(p <= 0, float("-inf")).amax(-1)
    share = p.pow(2).sum(-1)
    rows, group = torch.arange(4), idx // (64 // groups)
    torch.testing.assert_close(s.view(4, -1)[rows, idx],
                               (tau + model.ADMISSION_SHARE * share)[rows, group],
                               rtol=1e-9, atol=1e-9)
    for k in range(4):  # so each is in the support on its input beside the old units (the new
        alone = s.clone()  # ones may out-score each other there: their rows are random here)
        alone.view(4, -1)[:, idx[torch.arange(4) != k]] = float("-inf")
        assert model.support_map(alone.view(4, -1))[k, idx[k]] > 0


# ---- λ controls L0 in every mode -------------------------------------------------------------

def _l0_after_training(data, steps, **settings):
    torch.manual_seed(0)
    config = SAEConfig(hidden=128, lambda_warmup=0.1, **settings)
    data_var = float((data.train_x - data.train_mean).pow(2).sum(-1).mean())
    model = build_model(config, data.train_mean, data_var, init_inputs=data.train_x)
    trainer = L.Trainer(accelerator="cpu", devices=1, max_steps=steps, limit_val_batches=0,
                        logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False)
    trainer.fit(SAETraining(model), datamodule=data)
    _, codes = encode_dataset(model, data.val_x)
    return float(metrics.l0(codes, model.fire_threshold).mean())


@pytest.mark.slow
@pytest.mark.parametrize("values", ["shrunk", "unshrunk-ste"])
@pytest.mark.parametrize("temperature", TEMPERATURES)
def test_lambda_lowers_l0_in_every_mode(mnist_small, temperature, values):
    # each training mode with the per-input support it trains with (the threshold rule: the
    # test below; the batch support: test_batch_support.py)
    l0s = [_l0_after_training(mnist_small, 160, lam=lam, temperature=temperature, values=values,
                              inference="sparsemax", support="input") for lam in (0.001, 0.03)]
    assert l0s[0] > 1.3 * l0s[1] and l0s[1] > 1.5, l0s


@pytest.mark.slow
def test_lambda_lowers_l0_with_the_inference_threshold(mnist_small):
    # θ is a running mean (rate 0.01) that lags while L0 falls early in training, so this
    # trains long enough for it to settle
    l0s = [_l0_after_training(mnist_small, 400, lam=lam, inference="threshold")
           for lam in (0.001, 0.01, 0.03)]
    assert l0s[0] > 1.15 * l0s[1] > 1.15 * 1.15 * l0s[2] and l0s[2] > 1.5, l0s


# ---- what starts and learns differently --------------------------------------------------------

@pytest.mark.parametrize("temperature", TEMPERATURES)
def test_unshrunk_values_start_with_the_shrunk_codes_mass(temperature):
    inputs = torch.rand(40, 20)
    masses = {}
    for values in ("shrunk", "unshrunk", "unshrunk-ste"):
        torch.manual_seed(0)
        config = SAEConfig(input_dim=20, hidden=32, groups=2, temperature=temperature,
                           values=values)
        model = build_model(config, torch.rand(20), 2.0, init_inputs=inputs)
        masses[values] = model.encode(inputs).view(40, 2, 16).sum(-1).mean(0)
    torch.testing.assert_close(masses["unshrunk"], masses["unshrunk-ste"])
    # the shrunk code's mass is r₀ = sqrt(v) per group
    torch.testing.assert_close(masses["unshrunk"], torch.full((2,), 2.0**0.5), rtol=1e-4, atol=0)
    torch.testing.assert_close(masses["shrunk"], torch.full((2,), 2.0**0.5), rtol=1e-4, atol=0)


@pytest.mark.parametrize("temperature, values, scaled", [
    ("global", "shrunk", False), ("learned", "shrunk", False), ("normalized", "shrunk", True),
    ("energy", "shrunk", True),
    ("global", "unshrunk-ste", True), ("learned", "unshrunk-ste", True)])
def test_log_temperature_learns_faster_where_it_sizes_the_support(temperature, values, scaled):
    model = model64(temperature, values=values)
    groups = SAETraining(model).configure_optimizers()["optimizer"].param_groups
    lr = {id(p): g["lr"] for g in groups for p in g["params"]}
    assert sum(len(g["params"]) for g in groups) == len(list(model.parameters()))
    factor = model.TEMPERATURE_LR_SCALE if scaled else 1.0
    assert lr[id(model.log_temperature)] == pytest.approx(model.config.lr * factor)
    if temperature == "energy":  # γ sizes every input's support as T does
        assert lr[id(model.energy_exponent)] == pytest.approx(model.config.lr * factor)
    assert lr[id(model.W_enc)] == pytest.approx(model.config.lr)


# ---- the default and configurations saved before it ------------------------------------------

def test_the_default_is_each_inputs_own_support_with_values_that_grow_back():
    default = SAEConfig()
    assert (default.resolved_support(), default.resolved_temperature(),
            default.resolved_values()) == ("input", "energy", "unshrunk-ste")
    # the batch support is a named variant, with the global temperature
    batch = SAEConfig(support="batch")
    assert (batch.resolved_temperature(), batch.resolved_values()) == (
        "global", "unshrunk-ste")
    entmax = SAEConfig(model="entmax")
    assert (entmax.resolved_temperature(), entmax.resolved_values()) == ("global", "shrunk")
    for name in ("l1", "topk"):  # auto is valid for every model; a named mode is not
        SAEConfig(model=name).validate()
        with pytest.raises(ValueError, match="applies to --model sparsemax"):
            SAEConfig(model=name, values="unshrunk").validate()


def test_a_run_saves_the_mode_auto_resolved_to_and_a_saved_auto_keeps_its_meaning(tmp_path):
    from sae.settings.cli import config_file_dict, resolve_settings, run_config
    from sae.settings.config import pin_auto

    # a new run pins auto: its config.yaml and checkpoint name the mode, not auto
    for model, expected in (("sparsemax", ("energy", "unshrunk-ste")),
                            ("entmax", ("global", "auto")), ("l1", ("auto", "auto"))):
        sae = run_config(["--model", model, "--out", str(tmp_path / model)]).sae
        assert (sae.temperature, sae.values) == expected, model
        sae.validate()
    # so does a model built from the Python API: its checkpoint names the modes
    built = build_model(SAEConfig(input_dim=20, hidden=32), torch.rand(20), 2.0)
    assert built.settings["config"]["support"] == "input"
    assert built.settings["config"]["temperature"] == "energy"
    assert built.settings["config"]["values"] == "unshrunk-ste"
    assert run_config(["--support", "input", "--out", str(tmp_path / "own")]).sae.temperature \
        == "energy"
    assert pin_auto({"model": "sparsemax", "temperature": "learned", "values": "auto"}) == {
        "model": "sparsemax", "temperature": "learned", "values": "unshrunk-ste"}
    # a checkpoint saved with auto was saved when auto meant the normalized temperature
    saved = {**asdict(SAEConfig(input_dim=20, hidden=32)), "temperature": "auto", "values": "auto"}
    old = SAEConfig.from_dict(saved)
    assert (old.resolved_temperature(), old.resolved_values()) == ("normalized", "unshrunk-ste")
    model = build_model(old, torch.rand(20), 2.0)
    assert model.temperature_mode == "normalized" and not hasattr(model, "energy_exponent")
    assert SAEConfig.from_dict({**saved, "model": "entmax"}).resolved_temperature() == "global"
    # and so is a run folder's config.yaml read back by --resume
    folder = tmp_path / "old-run"
    folder.mkdir()
    settings = {**vars(resolve_settings(["--model", "sparsemax", "--out", str(folder)])),
                "temperature": "auto", "values": "auto"}
    (folder / "config.yaml").write_text(yaml.safe_dump(config_file_dict(settings)))
    resumed = resolve_settings(["--out", str(folder), "--resume"])
    assert (resumed.temperature, resumed.values) == ("normalized", "unshrunk-ste")
    # a flag given with --resume still wins
    assert resolve_settings(["--out", str(folder), "--resume", "--temperature",
                             "global"]).temperature == "global"


def test_the_default_inference_is_the_supports_own_rule_and_a_run_keeps_the_rule_it_saved():
    from sae.settings.cli import run_config
    from sae.settings.config import pin_auto
    from sae.settings.variants import variant

    # the default rule, whatever the values: the support's own (the per-input support's
    # projection, or the batch support's running threshold), never the threshold setting
    for values in ("auto", "unshrunk-ste", "unshrunk", "shrunk"):
        assert SAEConfig(values=values).resolved_inference() == "sparsemax"
        assert variant("sparsemax").resolved("inference", {"values": values}) == "sparsemax"
        assert pin_auto({"model": "sparsemax", "values": values, "inference": "auto"})[
            "inference"] == "sparsemax"
    assert SAEConfig(model="l1").resolved_inference() == "sparsemax"
    assert pin_auto({"model": "l1", "inference": "auto"})["inference"] == "auto"
    assert run_config(["--model", "sparsemax"]).sae.inference == "sparsemax"
    # with the per-input support (the default), nothing to track; the batch support infers
    # with the running mean of its batch threshold, which its checkpoint holds
    built = build_model(SAEConfig(input_dim=20, hidden=32), torch.rand(20), 2.0)
    assert built.settings["config"]["inference"] == "sparsemax" and built.inference == "sparsemax"
    assert "inference_threshold" not in dict(built.named_buffers())
    batch = build_model(SAEConfig(input_dim=20, hidden=32, support="batch"), torch.rand(20),
                        2.0)
    assert batch.settings["config"]["inference"] == "sparsemax"
    assert "inference_threshold" in dict(batch.named_buffers())
    # the threshold is asked for by name, and needs unshrunk values
    SAEConfig(inference="threshold").validate()
    with pytest.raises(ValueError, match="--inference threshold applies"):
        SAEConfig(values="shrunk", inference="threshold").validate()
    # a run saved while the threshold was the default kept its rule, and is rebuilt with it
    saved = asdict(SAEConfig(input_dim=20, hidden=32))
    kept = SAEConfig.from_dict({**saved, "temperature": "energy", "values": "unshrunk-ste",
                                "inference": "threshold"})
    assert kept.resolved_inference() == "threshold"
    model = build_model(kept, torch.rand(20), 2.0)
    assert model.inference == "threshold" and "inference_threshold" in dict(
        model.named_buffers())
    # a checkpoint saved before the setting existed was trained and scored with its own support
    old = SAEConfig.from_dict({k: v for k, v in saved.items() if k != "inference"}
                              | {"temperature": "energy", "values": "unshrunk-ste"})
    assert old.resolved_inference() == "sparsemax"
    model = build_model(old, torch.rand(20), 2.0)
    assert model.inference == "sparsemax" and "inference_threshold" not in dict(
        model.named_buffers())


def test_a_configuration_saved_before_the_modes_existed_keeps_its_design():
    saved = {k: v for k, v in asdict(SAEConfig(input_dim=20, hidden=32)).items()
             if k not in ("temperature", "values")}
    old = SAEConfig.from_dict(saved)
    assert (old.resolved_temperature(), old.resolved_values()) == ("global", "shrunk")
    # and a model built from it has the previous design's parameters: no extra head
    model = build_model(old, torch.rand(20), 2.0)
    assert model.temperature_mode == "global" and model.values_mode == "shrunk"


def test_the_inference_threshold_trains_as_sparsemax_and_keeps_as_many_units_at_inference():
    from sae.training.checkpoints import expected_state

    x = 3.0 * torch.rand(64, 20, dtype=torch.float64)
    models = {}
    for rule in ("sparsemax", "threshold"):
        torch.manual_seed(0)
        config = SAEConfig(input_dim=20, hidden=32, inference=rule, support="input")
        config.validate()
        models[rule] = build_model(config, torch.rand(20), 2.0, init_inputs=x[:32]).double()
    own, thr = models["sparsemax"], models["threshold"]
    # training is the same: the same codes and the same updates, step after step
    steps = []
    for model in (own, thr):
        model.train()
        optimizer = SAETraining(model).configure_optimizers()["optimizer"]
        codes = []
        for _ in range(3):
            optimizer.zero_grad()
            x_hat, h, extras = model.forward_pass(x)
            (fvu_term(x, x_hat, model.data_var) + model.penalty(h, extras)).backward()
            optimizer.step()
            codes.append(h.detach())
        steps.append(codes)
    assert all(torch.equal(a, b) for a, b in zip(*steps, strict=True))
    assert all(torch.equal(p, q) for p, q in zip(own.parameters(), thr.parameters(), strict=True))
    assert int(thr.threshold_batches) == 3 and "inference_threshold" not in dict(own.state_dict())
    # θ with rate 1 is the batch's |S|-th largest value, |S| the units sparsemax kept
    thr.THRESHOLD_RATE = 1.0
    h_train = thr.forward_pass(x)[1].detach()  # with gradients: a training step's forward
    kept = int((h_train > 0).sum())
    a, x_centred = thr.pre_activations(x)
    s = thr.scores(a, x_centred)
    r = torch.nn.functional.softplus(thr.scale_head(x_centred))
    v = (torch.relu(thr.value_scores(a, x_centred, s)) * r[..., None]).view_as(a).detach()
    assert torch.equal(thr.unshrunk_values(a, x_centred).view_as(a).detach(), v)
    assert float(thr.inference_threshold) == pytest.approx(float(v.flatten().sort().values[-kept]))
    # at inference: the same number of units, each with the value it carries on the support
    thr.eval()
    h_eval = thr.forward_pass(x)[1].detach()
    assert int((h_eval > 0).sum()) == kept - 1  # v > θ: all but the one at θ (no ties)
    on = h_eval > 0
    assert torch.equal(h_eval[on], v[on]) and bool((v[~on] <= thr.inference_threshold).all())
    # θ is saved with the weights; a checkpoint of either rule loads
    assert set(expected_state(thr.settings["config"], "ckpt")) == set(SAETraining(thr).state_dict())
    assert set(expected_state(own.settings["config"], "ckpt")) == set(SAETraining(own).state_dict())
    for kw in ({"model": "l1"}, {"model": "entmax"}, {"values": "shrunk"}):
        with pytest.raises(ValueError, match="--inference threshold applies to --model sparsemax"):
            SAEConfig(inference="threshold", **kw).validate()
