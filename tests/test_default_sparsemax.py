"""The Sparsemax-SAE's default is what its name promises: each input's support is the support of
the sparsemax of that input's own scores, in training and at inference."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from sae.models import build_model
from sae.settings.config import SAEConfig


def simplex_projection(z: torch.Tensor) -> torch.Tensor:
    """sparsemax of one vector z [n] by its textbook definition (Martins & Astudillo 2016):
    sort, find the support size k(z) = max{k : 1 + k z_(k) > Σ_{j<=k} z_(j)}, threshold
    τ = (Σ_{j<=k} z_(j) − 1) / k, p = (z − τ)₊."""
    s, _ = torch.sort(z, descending=True)
    cumulative = torch.cumsum(s, 0)
    k = torch.arange(1, len(z) + 1, dtype=z.dtype)
    size = int((1 + k * s > cumulative).sum())
    tau = (cumulative[size - 1] - 1) / size
    return (z - tau).clamp_min(0)


def default_model(seed: int = 0, hidden: int = 48, dim: int = 12):
    torch.manual_seed(seed)
    config = SAEConfig(input_dim=dim, hidden=hidden)
    assert config.resolved_support() == "input"  # the default, not asked for
    inputs = torch.rand(64, dim, dtype=torch.float64)
    model = build_model(config, inputs.mean(0).float(), float(inputs.var(0).sum()),
                        init_inputs=inputs.float()).double()
    with torch.no_grad():  # a model some way into training: scores of every size
        model.W_enc.add_(0.3 * torch.randn_like(model.W_enc))
        model.b_enc.add_(0.1 * torch.randn_like(model.b_enc))
        if hasattr(model, "energy_exponent"):
            model.energy_exponent.fill_(0.7)
    return model, inputs


def own_code(model, x: torch.Tensor) -> torch.Tensor:
    """The code of one input x [D] from its own scores alone: r(x) · ReLU(value score) on the
    support of sparsemax(scores), nothing else."""
    a, centred = model.pre_activations(x[None])
    scores = model.scores(a, centred)[0, 0]
    support = simplex_projection(scores) > 0
    values = model.unshrunk_values(a, centred)[0, 0]
    return values * support


@pytest.mark.parametrize("mode", ["train", "eval"])
def test_the_default_code_of_an_input_is_the_sparsemax_of_its_own_scores(mode):
    model, inputs = default_model()
    model.train(mode == "train")
    with torch.no_grad():
        _, batch_codes, _ = model.forward_pass(inputs)
        for i in range(len(inputs)):
            alone = model.forward_pass(inputs[i:i + 1])[1][0]
            # no other input changes it (the same units, values up to the rounding of a
            # matrix product of another shape)
            assert torch.equal(batch_codes[i] > 0, alone > 0)
            assert torch.allclose(batch_codes[i], alone, rtol=0, atol=1e-12)
            assert torch.allclose(alone, own_code(model, inputs[i]), atol=1e-12)
    l0 = (batch_codes > 0).sum(1)
    assert l0.min() >= 1 and len(set(l0.tolist())) > 3  # supports of many sizes


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), others=st.integers(1, 20))
def test_the_batch_around_an_input_never_changes_its_code(seed, others):
    model, inputs = default_model(seed % 7)
    g = torch.Generator().manual_seed(seed)
    x = inputs[:1]
    crowd = torch.rand(others, inputs.shape[1], generator=g, dtype=torch.float64) * 3
    for mode in (True, False):
        model.train(mode)
        with torch.no_grad():
            alone = model.forward_pass(x)[1]
            mixed = model.forward_pass(torch.cat([crowd[: others // 2], x, crowd[others // 2:]]))[1]
        assert torch.equal(mixed[others // 2] > 0, alone[0] > 0)
        assert torch.allclose(mixed[others // 2], alone[0], rtol=0, atol=1e-12)


def test_the_batch_support_is_a_shared_threshold_at_inference():
    """The variant the default is not: at inference every input's support is {j: a_j > θ},
    one θ for all inputs, whatever its own scores' distribution."""
    torch.manual_seed(0)
    model = build_model(SAEConfig(input_dim=12, hidden=48, support="batch"),
                        torch.zeros(12), 1.0).double()
    model.train()
    x = torch.rand(256, 12, dtype=torch.float64)
    model.forward_pass(x)  # one training batch moves the running threshold
    model.eval()
    with torch.no_grad():
        a, _ = model.pre_activations(x)
        h = model.forward_pass(x)[1]
    theta = float(model.inference_threshold[0])
    assert torch.equal(h > 0, a > theta)
