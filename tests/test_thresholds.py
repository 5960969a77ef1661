"""JumpReLU's straight-through gradients and batch top-k."""

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from sae.thresholds import batch_topk, jumprelu, step_l0, threshold_code


def test_jumprelu_forward_keeps_values_above_threshold_unshrunk():
    a = torch.tensor([[0.1, 0.5, 2.0, -1.0]])
    theta = torch.tensor([0.2, 0.4, 3.0, 0.1])
    assert torch.equal(jumprelu(a, theta, 0.01), torch.tensor([[0.0, 0.5, 0.0, 0.0]]))
    assert torch.equal(step_l0(a, theta, 0.01), torch.tensor([[0.0, 1.0, 0.0, 0.0]]))


def test_jumprelu_pseudo_derivatives_match_their_definition():
    eps = 0.1
    a = torch.tensor([[0.96, 1.2, 0.5], [1.04, 0.99, 2.0]], dtype=torch.float64,
                     requires_grad=True)
    theta = torch.tensor([1.0, 1.0, 1.0], dtype=torch.float64, requires_grad=True)
    g = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]], dtype=torch.float64)
    (jumprelu(a, theta, eps) * g).sum().backward()
    inside = ((a - theta).abs() < eps / 2).double()
    assert torch.equal(a.grad, g * (a > theta).double())
    assert torch.allclose(theta.grad, -(theta / eps * inside * g).sum(0))
    theta.grad = None
    a.grad = None
    (step_l0(a, theta, eps) * g).sum().backward()
    assert a.grad is None or torch.all(a.grad == 0)
    assert torch.allclose(theta.grad, -(inside * g / eps).sum(0))


def test_the_l0_penalty_raises_thresholds():
    torch.manual_seed(0)
    a = torch.randn(512, 16)
    theta = torch.full((16,), 0.5, requires_grad=True)
    opt = torch.optim.SGD([theta], lr=0.05)
    before = step_l0(a, theta, 0.2).sum(-1).mean().item()
    for _ in range(50):
        opt.zero_grad()
        step_l0(a, theta, 0.2).sum(-1).mean().backward()
        opt.step()
    assert step_l0(a, theta, 0.2).sum(-1).mean().item() < before
    assert bool((theta > 0.5).all())


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 16), st.integers(2, 40), st.integers(1, 8), st.integers(0, 10_000))
def test_batch_topk_keeps_exactly_k_per_input_on_average(batch, width, k, seed):
    k = min(k, width)
    g = torch.Generator().manual_seed(seed)
    a = torch.rand(batch, width, generator=g) + 0.01  # all positive: k·B can always be kept
    h, smallest = batch_topk(a, k)
    assert int((h > 0).sum()) == k * batch  # mean L0 is exactly k
    kept = h[h > 0]
    assert torch.equal(kept.sort().values, a.flatten().topk(k * batch).values.sort().values)
    assert smallest == kept.min()


def test_batch_topk_lets_l0_vary_per_input():
    a = torch.tensor([[5.0, 4.0, 3.0, 2.0], [0.5, 0.4, 0.3, 0.2]])
    h, _ = batch_topk(a, 2)
    assert (h > 0).sum(-1).tolist() == [4, 0]


def test_threshold_code_does_not_depend_on_the_batch():
    torch.manual_seed(1)
    a = torch.randn(64, 32)
    together = threshold_code(a, 0.7)
    alone = torch.cat([threshold_code(a[i:i + 1], 0.7) for i in range(64)])
    assert torch.equal(together, alone)
