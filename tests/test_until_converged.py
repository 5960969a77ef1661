"""``--until-converged``: every mechanism trains until the convergence rule says it settled,
``--epochs`` the cap."""

import csv

import pytest
from cli_helpers import QUICK, run_cli


def _epochs(run) -> list[tuple[float, float]]:
    with open(run / "metrics.csv") as f:
        return [(float(r["val/fvu"]), float(r["val/l0"])) for r in csv.DictReader(f)
                if r.get("val/fvu")]


@pytest.mark.slow
@pytest.mark.parametrize("model", ["topk", "l1"])
def test_a_run_stops_once_settled_and_the_cap_holds_otherwise(tmp_path, data_dir, model):
    run = tmp_path / "run"
    common = [*QUICK, "--model", model, "--lambda", "0.01", "--no-figures", "--no-features",
              "--no-report", "--progress", "off"]
    result = run_cli([*common, "--epochs", "40", "--until-converged", "--out", run],
                     tmp_path, data_dir, timeout=600)
    assert result.returncode == 0, result.stderr
    rows = _epochs(run)
    assert 2 <= len(rows) < 40  # stopped before the cap
    (fvu0, l00), (fvu1, l01) = rows[-2:]
    assert abs(fvu1 - fvu0) / fvu0 < 0.01 and abs(l01 - l00) / l00 < 0.02
    for (f0, z0), (f1, z1) in zip(rows[:-2], rows[1:-1], strict=True):  # not settled before
        assert abs(f1 - f0) / f0 >= 0.01 or abs(z1 - z0) / z0 >= 0.02
    capped = tmp_path / "capped"
    result = run_cli([*common, "--epochs", "2", "--until-converged", "--out", capped],
                     tmp_path, data_dir)
    assert result.returncode == 0 and len(_epochs(capped)) <= 2
