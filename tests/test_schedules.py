import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sae.models.schedules import anneal, lambda_at, lr_factor, ramp, resolve_steps


def test_resolve_steps_fraction_and_steps():
    assert resolve_steps(0.05, 1000) == 50
    assert resolve_steps(0, 1000) == 0
    assert resolve_steps(200, 1000) == 200
    with pytest.raises(ValueError):
        resolve_steps(-1, 10)


@pytest.mark.parametrize("shape", ["linear", "cosine"])
def test_ramp_endpoints(shape):
    assert ramp(0, 100, shape) == 0.0
    assert ramp(100, 100, shape) == 1.0
    assert ramp(10_000, 100, shape) == 1.0
    assert ramp(50, 100, shape) == pytest.approx(0.5)
    assert ramp(5, 0, shape) == 1.0  # no warm-up


def test_cosine_starts_slower_than_linear():
    assert ramp(10, 100, "cosine") < ramp(10, 100, "linear")
    assert ramp(90, 100, "cosine") > ramp(90, 100, "linear")


@given(st.integers(0, 500), st.integers(0, 500), st.sampled_from(["linear", "cosine"]))
def test_ramp_is_monotone_and_bounded(a, b, shape):
    lo, hi = sorted((a, b))
    assert 0.0 <= ramp(lo, 200, shape) <= ramp(hi, 200, shape) <= 1.0


def test_lambda_at_scales_ramp():
    assert lambda_at(25, 0.02, 100) == pytest.approx(0.005)
    assert lambda_at(1000, 0.02, 100) == pytest.approx(0.02)


def test_lr_factor_warmup_then_cosine():
    assert lr_factor(0, 10, 100) == pytest.approx(0.1)
    assert lr_factor(9, 10, 100) == pytest.approx(1.0)
    assert lr_factor(50, 10, 100, "none") == 1.0
    assert lr_factor(10, 10, 100, "cosine") == pytest.approx(1.0)
    assert lr_factor(100, 10, 100, "cosine", final_ratio=0.1) == pytest.approx(0.1)
    mid = lr_factor(55, 10, 100, "cosine", final_ratio=0.0)
    assert mid == pytest.approx(0.5 * (1 + math.cos(math.pi * 0.5)))


def test_anneal():
    assert anneal(0, 1.5, 2.0, 100) == 1.5
    assert anneal(50, 1.5, 2.0, 100) == pytest.approx(1.75)
    assert anneal(500, 1.5, 2.0, 100) == 2.0
