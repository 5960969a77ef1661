"""JumpReLU's straight-through gradients and batch top-k."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from sae.activations import kernels
from sae.activations.thresholds import batch_topk, jumprelu, step_l0, threshold_code, topk_relu


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


# ---- the compiled top-k selection against the torch.topk formulation ----------------------------

def torch_topk_relu(a: torch.Tensor, k: int) -> torch.Tensor:
    """The previous formulation: ReLU of torch.topk's values scattered into zeros."""
    values, index = torch.topk(a, k, dim=-1)
    return torch.zeros_like(a).scatter_(-1, index, torch.relu(values))


def torch_batch_topk(a: torch.Tensor, k: int):
    flat = torch.relu(a).flatten()
    values, index = torch.topk(flat, min(k * a.shape[0], flat.numel()), sorted=False)
    positive = values[values > 0]
    smallest = positive.min() if positive.numel() else values.new_zeros(())
    return torch.zeros_like(flat).scatter_(0, index, values).view_as(a), smallest


@pytest.fixture(params=["kernels", "torch"])
def selection(request, monkeypatch):
    """Run a test on the compiled CPU selection and on the torch.topk path."""
    if request.param == "torch":
        monkeypatch.setattr(kernels, "_ENABLED", False)
    return request.param


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("width,k", [(1, 1), (7, 3), (40, 40), (512, 32), (600, 256), (4096, 32)])
def test_topk_relu_equals_the_torch_topk_formulation(selection, dtype, width, k):
    g = torch.Generator().manual_seed(width + k)
    a = torch.randn(33, width, generator=g, dtype=dtype).requires_grad_()
    a.data[3, : width // 2] = -torch.inf  # -inf entries are never kept over finite ones
    a.data[4] = -1.0 - torch.rand(width, generator=g, dtype=dtype)  # nothing positive
    up = torch.randn(33, width, generator=g, dtype=dtype)
    h = topk_relu(a, k)
    (grad,) = torch.autograd.grad(h, a, up)
    a_ref = a.detach().clone().requires_grad_()
    h_ref = torch_topk_relu(a_ref, k)
    (grad_ref,) = torch.autograd.grad(h_ref, a_ref, up)
    assert torch.equal(h, h_ref) and torch.equal(grad, grad_ref)
    assert ((h != 0).sum(-1) <= k).all()


def test_topk_relu_keeps_exactly_k_among_ties(selection):
    a = torch.randint(-2, 4, (64, 50), generator=torch.Generator().manual_seed(0)).float()
    a[0] = 1.0  # all tied
    h = topk_relu(a, 10)
    # the kept values are those of torch.topk (which of the tied positions may differ)
    assert torch.equal(h.sort(-1).values, torch_topk_relu(a, 10).sort(-1).values)
    assert ((h > 0).sum(-1) <= 10).all() and int((h[0] > 0).sum()) == 10


def test_topk_relu_with_a_nan_takes_the_torch_path(selection):
    a = torch.randn(4, 30)
    a[2, 5] = torch.nan
    h = topk_relu(a, 3)
    assert h[2, 5].isnan() and torch.equal(h[[0, 1, 3]], torch_topk_relu(a, 3)[[0, 1, 3]])


def test_topk_relu_gradcheck_in_float64(selection):
    g = torch.Generator().manual_seed(1)
    a = torch.randn(5, 12, generator=g, dtype=torch.float64)
    a = (a + torch.sign(a) * 0.1).requires_grad_()  # no entry near 0, distinct values
    assert torch.autograd.gradcheck(lambda v: topk_relu(v, 4), (a,))
    assert torch.autograd.gradcheck(lambda v: batch_topk(v, 3)[0], (a,))


@pytest.mark.parametrize("batch,width,k", [(1, 5, 2), (16, 64, 8), (256, 512, 32), (3, 4, 9)])
def test_batch_topk_equals_the_torch_topk_formulation(selection, batch, width, k):
    g = torch.Generator().manual_seed(batch * width)
    a = torch.randn(batch, width, generator=g).requires_grad_()
    up = torch.randn(batch, width, generator=g)
    h, smallest = batch_topk(a, k)
    (grad,) = torch.autograd.grad(h, a, up)
    a_ref = a.detach().clone().requires_grad_()
    h_ref, smallest_ref = torch_batch_topk(a_ref, k)
    (grad_ref,) = torch.autograd.grad(h_ref, a_ref, up)
    assert torch.equal(h, h_ref) and torch.equal(grad, grad_ref)
    assert smallest == smallest_ref and not smallest.requires_grad
    none_positive, zero = batch_topk(-torch.rand(4, 6), 2)
    assert not none_positive.any() and zero == 0
