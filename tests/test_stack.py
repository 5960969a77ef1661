"""Stacks: runs trained together (``sae.runner.stack``) give what each run gives alone, and each
member's folder is a run folder like any other."""

import csv
import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch
from cli_helpers import QUICK, assert_one_line_error, cli_env, run_cli
from sweep_helpers import write_yaml

import sae
from sae.runner import command, stack
from sae.settings.config import MODELS
from sae.training import runfolder

COMMON = [*QUICK, "--epochs", "2", "--no-figures", "--no-features", "--no-report",
          "--progress", "off"]
# two members of each mechanism that differ in λ, learning rate, width and initialisation
OTHER = ["--lambda", "0.02", "--lr", "0.002", "--hidden", "48", "--k", "6", "--init", "data"]


class Said:
    """What the runs printed (pytest's capture), read as one text."""

    def __init__(self, capsys):
        self.capsys, self.text = capsys, ""

    def getvalue(self) -> str:
        out, err = self.capsys.readouterr()
        self.text += out + err
        return self.text


@pytest.fixture
def quiet(monkeypatch, data_dir, capsys):
    monkeypatch.setenv("SAE_DATA_DIR", str(data_dir))
    monkeypatch.setenv("SAE_OFFLINE", "1")
    return Said(capsys)


def _weights(folder, name="last.ckpt"):
    return torch.load(folder / "checkpoints" / name, weights_only=True)


def _assert_same_model(a, b):
    wa, wb = _weights(a), _weights(b)
    assert sorted(wa["state_dict"]) == sorted(wb["state_dict"])
    for key, value in wa["state_dict"].items():
        assert torch.equal(value, wb["state_dict"][key]), key
    assert wa["global_step"] == wb["global_step"] and wa["epoch"] == wb["epoch"]


@pytest.mark.slow
@pytest.mark.parametrize("model", MODELS)
def test_a_stacked_member_is_the_run_trained_alone(tmp_path, quiet, model):
    first = [*COMMON, "--model", model, "--lambda", "0.05"]
    second = [*COMMON, "--model", model, *OTHER]
    assert command.main([*second, "--out", str(tmp_path / "alone")]) == 0
    runfolder.release(tmp_path / "alone")
    codes = stack.main([[*first, "--out", str(tmp_path / "m0")],
                        [*second, "--out", str(tmp_path / "m1")]])
    assert codes == [0, 0], quiet.getvalue()[-2000:]
    _assert_same_model(tmp_path / "alone", tmp_path / "m1")
    # the optimiser state a resume reads is the member's own, as alone
    alone, member = _weights(tmp_path / "alone"), _weights(tmp_path / "m1")
    for (i, s), (j, t) in zip(alone["optimizer_states"][0]["state"].items(),
                              member["optimizer_states"][0]["state"].items(), strict=True):
        assert i == j and all(torch.equal(s[k], t[k]) for k in s)


@pytest.mark.slow
def test_a_member_folder_is_read_like_any_run(tmp_path, quiet):
    argv = [a for a in COMMON if a not in ("--no-features", "--no-report")]
    codes = stack.main([[*argv, "--model", "sparsemax", "--out", str(tmp_path / "m0")],
                        [*argv, "--model", "topk", "--out", str(tmp_path / "m1")]])
    assert codes == [0, 0], quiet.getvalue()[-2000:]
    for name in ("m0", "m1"):
        folder = tmp_path / name
        assert (folder / "report.html").is_file() and (folder / "features.html").is_file()
        assert (folder / "metrics.json").is_file() and (folder / "metrics.csv").is_file()
        rows = (folder / "metrics.csv").read_text().splitlines()
        assert "val/fvu" in rows[0] and len(rows) == 5  # a train and a val row per epoch
        model = sae.load(folder)
        x = torch.rand(4, 784)
        assert model.encode(x).shape == (4, 64)
        exported = sae.export(folder, tmp_path / f"{name}-export")
        assert exported.exists()
    assert sae.load(tmp_path / "m1").config.model == "topk"


DRIVER = ("import json, sys; from sae.runner.stack import main; "
          "sys.exit(max(main(json.loads(sys.argv[1]))))")


@pytest.mark.slow
@pytest.mark.parametrize("how", ["SIGINT", "SIGKILL"])
def test_a_stopped_stack_ends_as_a_run_never_stopped(tmp_path, quiet, data_dir, how):
    """Stopped mid-training (Ctrl-C, or kill -9 after a checkpoint), the stack resumes together
    (Ctrl-C) or a member resumes alone as a single run (kill -9), ending bit for bit as the
    run trained alone without a stop."""
    long = [*COMMON, "--limit-train", "4096", "--epochs", "4"]
    members = [["--model", "l1", "--lambda", "0.05"], ["--model", "sparsemax", *OTHER]]
    assert command.main([*long, *members[1], "--out", str(tmp_path / "alone")]) == 0
    runfolder.release(tmp_path / "alone")
    argvs = [[*long, *m, "--out", str(tmp_path / f"m{i}")] for i, m in enumerate(members)]
    proc = subprocess.Popen([sys.executable, "-c", DRIVER, json.dumps(argvs)],
                            env=cli_env(tmp_path, data_dir), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    first = tmp_path / "m1" / "checkpoints" / "last.ckpt"
    while not first.exists() and proc.poll() is None:
        time.sleep(0.01)
    os.kill(proc.pid, getattr(signal, how))
    assert proc.wait(timeout=120) != 0  # stopped before the end
    stopped_at = _weights(tmp_path / "m1")["global_step"]
    assert 0 < stopped_at < 4 * 32
    if how == "SIGINT":
        codes = stack.main([[*argv, "--resume"] for argv in argvs])
        assert codes == [0, 0], quiet.getvalue()[-2000:]
    else:
        assert command.main([*argvs[1], "--resume"]) == 0
        runfolder.release(tmp_path / "m1")
    _assert_same_model(tmp_path / "alone", tmp_path / "m1")


@pytest.mark.slow
def test_a_bad_member_gets_its_error_and_the_others_train(tmp_path, quiet):
    codes = stack.main([[*COMMON, "--model", "l1", "--out", str(tmp_path / "good")],
                        [*COMMON, "--model", "nope", "--out", str(tmp_path / "bad")]])
    assert codes == [0, 2]
    assert "--model: must be one of" in quiet.getvalue()
    assert (tmp_path / "good" / "metrics.json").is_file() and not (tmp_path / "bad").exists()


def test_runs_that_do_not_share_their_batches_are_refused(tmp_path, quiet):
    codes = stack.main([[*COMMON, "--model", "l1", "--out", str(tmp_path / "a")],
                        [*COMMON, "--model", "l1", "--seed", "3", "--out", str(tmp_path / "b")]])
    assert codes == [2, 2]
    assert "cannot share a stack" in quiet.getvalue()
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


TINY_SWEEP = {
    "description": "stacks", "datasets": ["mnist"], "seeds": [0],
    "common": {"hidden": 16, "k": 4, "limit_train": 400, "val_size": 100, "limit_test": 200,
               "batch_size": 64, "epochs": 2, "no_figures": True, "no_report": True,
               "no_features": True},
    "models": {"kl": {"lambda": [0.1, 0.05]}, "topk": {"k": [4, 8]}},
}


@pytest.mark.slow
def test_a_sweep_of_stacks_gives_the_tables_of_runs_alone(tmp_path, data_dir):
    sweep = write_yaml(tmp_path / "tiny.yaml", TINY_SWEEP)
    tables = {}
    for stack_arg in ("auto", "off"):
        result = run_cli([sweep, "--out", tmp_path / stack_arg, "--jobs", "2", "--stack",
                          stack_arg], tmp_path, data_dir, module="sae.compare", timeout=600)
        assert result.returncode == 0, result.stderr[-2000:]
        assert ("(a stack of 2)" in result.stdout) == (stack_arg == "auto")
        with open(tmp_path / stack_arg / "results.csv") as f:
            tables[stack_arg] = [{k: v for k, v in row.items() if k != "wall_time_s"}
                                 for row in csv.DictReader(f)]
    assert len(tables["auto"]) == 4 and tables["auto"] == tables["off"]
    log = (tmp_path / "auto" / "logs" / "mnist" / "topk" / "k8" / "seed0.log").read_text()
    assert "a stack of 2 runs" in log and "exit codes [0, 0]" in log


@pytest.mark.parametrize("value", ["0", "65", "many", "-1"])
def test_a_bad_stack_size_is_one_line(tmp_path, data_dir, value):
    sweep = write_yaml(tmp_path / "tiny.yaml", TINY_SWEEP)
    result = run_cli([sweep, "--out", tmp_path / "out", "--stack", value], tmp_path, data_dir,
                     module="sae.compare")
    assert_one_line_error(result)
    assert "--stack must be auto, off or an integer from 1 to 64" in result.stderr
    assert not (tmp_path / "out").exists()
