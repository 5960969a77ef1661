"""The diagnostic scripts of experiments/: their measures, and as a user runs them."""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from cli_helpers import QUICK, assert_one_line_error, cli_env, run_cli
from hypothesis import given, settings
from hypothesis import strategies as st

SCRIPT = Path(__file__).resolve().parents[1] / "experiments" / "values_parts.py"


def _values_parts():
    spec = importlib.util.spec_from_file_location("values_parts", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


values_parts = _values_parts()


def test_coherence_of_orthogonal_and_of_equal_atoms():
    codes = torch.tensor([[1.0, 2.0, 0.0, 3.0], [0.0, 1.0, 1.0, 0.0]])
    assert values_parts.coherence(codes, torch.eye(4)) == 0.0
    same = torch.ones(5, 4)  # every atom the same direction
    assert values_parts.coherence(codes, same) == pytest.approx(1.0)


def test_coherence_is_the_mean_over_inputs_of_the_mean_pair_cosine():
    # atoms 0 and 1 at cos 0.6, atom 2 orthogonal to both
    atoms = torch.tensor([[1.0, 0.6, 0.0], [0.0, 0.8, 0.0], [0.0, 0.0, 1.0]])
    codes = torch.tensor([[1.0, 1.0, 0.0],   # one pair: 0.6
                          [1.0, 1.0, 1.0],   # pairs 0.6, 0, 0: 0.2
                          [0.0, 0.0, 5.0]])  # one unit: left out
    assert values_parts.coherence(codes, atoms) == pytest.approx((0.6 + 0.2) / 2)
    # a firing threshold counts only the units above it
    assert values_parts.coherence(codes * 0.05, atoms, threshold=0.1) != \
        values_parts.coherence(codes, atoms)


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 2**31 - 1), st.integers(2, 12), st.integers(2, 10))
def test_coherence_ignores_the_atoms_length_and_sign(seed, hidden, dim):
    g = torch.Generator().manual_seed(seed)
    atoms = torch.randn(dim, hidden, generator=g, dtype=torch.float64)
    codes = torch.relu(torch.randn(6, hidden, generator=g, dtype=torch.float64))
    scale = (torch.rand(hidden, generator=g, dtype=torch.float64) + 0.1) * \
        torch.where(torch.rand(hidden, generator=g) < 0.5, -1.0, 1.0).double()
    c = values_parts.coherence(codes, atoms)
    if c == c:  # nan when no input has two active units
        assert 0.0 <= c <= 1.0 + 1e-12
        assert values_parts.coherence(codes, atoms * scale) == pytest.approx(c, abs=1e-12)


@pytest.mark.slow
@pytest.mark.parametrize("model", [["--model", "batchtopk"],
                                   ["--model", "sparsemax", "--lambda", "0.01"]])
def test_values_parts_on_a_trained_run(model, tmp_path, data_dir):
    quick = [a for a in QUICK if a not in ("--k", "8")] if "sparsemax" in model else QUICK
    run = tmp_path / "run"
    trained = run_cli([*model, *quick, "--epochs", "1", "--no-figures", "--no-features",
                       "--no-report", "--out", run], tmp_path, data_dir)
    assert trained.returncode == 0, trained.stderr
    result = subprocess.run([sys.executable, str(SCRIPT), str(run)], cwd=tmp_path,
                            env=cli_env(tmp_path, data_dir), capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr
    header, row = result.stdout.strip().splitlines()
    assert header.split()[1:] == ["L0", "fvu", "support", "lose", "scaled", "share",
                                  "coherence"]
    l0, fvu, support, lose, scaled, share, coherence = map(float, row.split()[1:])
    measured = json.loads((run / "metrics.json").read_text())
    # 256 test images: the published subset is all of them, so the numbers are the run's own
    assert l0 == pytest.approx(measured["l0_mean"], abs=0.05)
    assert fvu == pytest.approx(measured["fvu"], abs=1e-4)
    assert support == pytest.approx(measured["support_fvu"], abs=1e-4)
    assert lose == pytest.approx(fvu - support, abs=2e-4)
    # the best values on the supports beat one best scale per input, which beats none
    assert support - 1e-4 <= scaled <= fvu + 1e-4
    assert 0.0 <= coherence <= 1.0


@pytest.mark.slow
def test_values_parts_refuses_a_folder_without_a_checkpoint(tmp_path, data_dir):
    result = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path)], cwd=tmp_path,
                            env=cli_env(tmp_path, data_dir), capture_output=True, text=True,
                            timeout=120)
    assert_one_line_error(result)
    assert "checkpoints/last.ckpt" in result.stderr
