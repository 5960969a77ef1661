"""Checkpoints are untrusted input: safe loading, checksums, atomic writes."""

import os

import pytest
import torch

from sae.training.checkpoints import (
    CheckpointError,
    read_checkpoint,
    write_checkpoint,
)
from sae.training.resumable import check_compatible


class Poison:
    """A pickle that runs a command when loaded without weights_only."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def poisoned_checkpoint(path, marker):
    torch.save({"state_dict": {"w": torch.zeros(2)}, "hyper_parameters": {"x": Poison(marker)}},
               path)
    return path


def a_checkpoint():
    """The model part of a checkpoint as sae.run writes it (a small l1 SAE)."""
    from sae.models import build_model
    from sae.settings.config import SAEConfig
    from sae.training.module import SAETraining

    model = SAETraining(build_model(SAEConfig(model="l1", hidden=16), data_var=52.0))
    return {"state_dict": model.state_dict(), "hyper_parameters": dict(model.hparams),
            "global_step": 7, "epoch": 1}


def test_a_poisoned_checkpoint_runs_nothing(tmp_path):
    marker = tmp_path / "owned"
    path = poisoned_checkpoint(tmp_path / "evil.ckpt", marker)
    with pytest.raises(CheckpointError, match="refusing") as e:
        read_checkpoint(path)
    assert "\n" not in str(e.value)
    assert not marker.exists()


def test_round_trip_and_no_temp_file_left(tmp_path):
    path = tmp_path / "ck" / "last.ckpt"
    state = a_checkpoint()
    write_checkpoint(state, path)
    loaded = read_checkpoint(path)
    assert torch.equal(loaded["state_dict"]["W_dec"], state["state_dict"]["W_dec"])
    assert sorted(p.name for p in path.parent.iterdir()) == ["last.ckpt"]


def test_damaged_checkpoints_are_refused(tmp_path):
    path = tmp_path / "last.ckpt"
    write_checkpoint(a_checkpoint(), path)
    data = bytearray(path.read_bytes())
    # flip bytes inside the largest tensor's storage (the middle of the file)
    middle = len(data) // 2
    data[middle:middle + 64] = bytes(64)
    path.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="damaged|cannot be read"):
        read_checkpoint(path)
    path.write_bytes(b"not a checkpoint at all")
    with pytest.raises(CheckpointError, match="cannot be read"):
        read_checkpoint(path)
    with pytest.raises(CheckpointError, match="does not exist"):
        read_checkpoint(tmp_path / "missing.ckpt")


def test_non_finite_weights_are_refused(tmp_path):
    state = a_checkpoint()
    state["state_dict"]["b_dec"][3] = float("nan")  # a view of the parameter's storage
    write_checkpoint(state, tmp_path / "nan.ckpt")
    with pytest.raises(CheckpointError, match="non-finite"):
        read_checkpoint(tmp_path / "nan.ckpt")


def test_a_checkpoint_of_another_model_is_refused(tmp_path):
    state = a_checkpoint()
    with pytest.raises(CheckpointError, match="hidden"):
        check_compatible(state, {"model": "l1", "hidden": 32, "input_dim": 784}, "x.ckpt")
    with pytest.raises(CheckpointError, match="model"):
        check_compatible(state, {"model": "topk", "hidden": 16}, "x.ckpt")
    check_compatible(state, {"model": "l1", "hidden": 16, "input_dim": 784}, "x.ckpt")


def test_a_failed_write_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    path = tmp_path / "last.ckpt"
    write_checkpoint(a_checkpoint(), path)
    before = path.read_bytes()

    def full_disk(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", full_disk)
    with pytest.raises(CheckpointError, match="No space left"):
        write_checkpoint({**a_checkpoint(), "global_step": 9}, path)
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.ckpt"]


def test_a_preloaded_checkpoint_is_not_read_again(tmp_path, monkeypatch):
    from sae.training import checkpoints

    path = tmp_path / "last.ckpt"
    write_checkpoint(a_checkpoint(), path)
    state = read_checkpoint(path)
    reads = []
    monkeypatch.setattr(checkpoints, "read_checkpoint",
                        lambda p, map_location="cpu": reads.append(p) or read_checkpoint(p))
    io = checkpoints.SafeCheckpointIO(preloaded=(tmp_path / "." / "last.ckpt", state))
    assert io.load_checkpoint(str(path)) is state and reads == []  # the same file: no read
    again = io.load_checkpoint(path)  # only once: a later load reads the file
    assert reads == [path] and again is not state and again.keys() == state.keys()
    plain = checkpoints.SafeCheckpointIO()
    plain.load_checkpoint(path)
    assert reads == [path, path]
