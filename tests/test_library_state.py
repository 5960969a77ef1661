"""The library keeps no state between calls: one ``sae.train`` never decides where the next one
writes, switches are booleans, and a run that did not finish says why in its exception."""

import os

import pytest
from test_api import quick_settings

import sae
from sae.system.process import RUN_ENV


@pytest.mark.slow
def test_a_second_train_writes_its_own_folder_and_keeps_the_first(tmp_path, monkeypatch,
                                                                   data_dir):
    monkeypatch.chdir(tmp_path)
    for name in RUN_ENV:
        monkeypatch.delenv(name, raising=False)
    first = sae.train(model="topk", data_dir=str(data_dir), **quick_settings())
    assert not any(name in os.environ for name in RUN_ENV), "a run's folder outlived its call"
    kept = (first / "metrics.json").read_bytes()
    second = sae.train(model="l1", data_dir=str(data_dir), overwrite=True,
                       **quick_settings(lam=0.1))
    assert second != first
    assert (first / "metrics.json").read_bytes() == kept
    assert sae.load(first).__class__.__name__ != sae.load(second).__class__.__name__


def test_the_callers_own_run_variables_come_back(tmp_path, monkeypatch, data_dir):
    monkeypatch.setenv(RUN_ENV[0], str(tmp_path / "the-callers"))
    with pytest.raises(ValueError):
        sae.train(hidden=0, out=str(tmp_path / "x"))
    assert os.environ[RUN_ENV[0]] == str(tmp_path / "the-callers")


@pytest.mark.parametrize("value", ["false", "no", 0, 1, None.__class__])
def test_a_switch_that_is_not_a_boolean_is_refused(tmp_path, value):
    with pytest.raises(ValueError, match="overwrite must be True or False"):
        sae.train(model="topk", overwrite=value, out=str(tmp_path / "x"))
    assert not (tmp_path / "x").exists()


def test_resume_is_a_path_last_or_a_boolean(tmp_path):
    with pytest.raises(ValueError, match="resume must be"):
        sae.train(model="topk", resume=3, out=str(tmp_path / "x"))
    # True is the folder's last checkpoint: this one has none, which the command says
    with pytest.raises(ValueError, match="cannot resume"):
        sae.train(model="topk", resume=True, out=str(tmp_path / "x"))
    assert not (tmp_path / "x").exists()


def test_a_positional_model_name_is_one_clear_error():
    with pytest.raises(ValueError, match="by keyword"):
        sae.train("topk")


def test_a_failed_run_carries_its_reason(tmp_path, data_dir):
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "notes.txt").write_text("mine")
    with pytest.raises(sae.TrainingFailed) as failed:
        sae.train(model="topk", data_dir=str(data_dir), out=str(tmp_path / "x"),
                  **quick_settings())
    assert failed.value.exit_code == 2
    assert failed.value.reason.startswith("error: ") and failed.value.reason in str(failed.value)
    assert (tmp_path / "x" / "notes.txt").read_text() == "mine"
