"""Crafted checkpoints: a checkpoint changed in any part of its contents, with or without its
checksum, is refused in one ``error:`` line by every command that reads one, with the run folder
byte-identical."""

import math
import shutil
import zipfile

import pytest
import torch
from hostile_helpers import copy_run, edit_checkpoint, one_line, resume, snapshot, train_template

from sae.training.checkpoints import CheckpointError, checksum, read_checkpoint


@pytest.fixture(scope="module")
def trained(tmp_path_factory, data_dir):
    """A finished tiny run: the template every case of this file copies."""
    return train_template(tmp_path_factory, data_dir)


# --------------------------------------------------------------------------- crafted checkpoints


def nested(depth):
    value = 1
    for _ in range(depth):
        value = [value]
    return value


CRAFTED = {
    "wrong W_dec shape": (lambda s: s["state_dict"].__setitem__("W_dec", torch.zeros(784, 65)),
                          "W_dec"),
    "missing key": (lambda s: s["state_dict"].pop("b_enc"), "lacks b_enc"),
    "extra key": (lambda s: s["state_dict"].__setitem__("evil", torch.zeros(1)), "unknown evil"),
    "wrong dtype": (lambda s: s["state_dict"].__setitem__(
        "samples_since_fired", s["state_dict"]["samples_since_fired"].float()),
        "samples_since_fired"),
    "weights not floating": (lambda s: s["state_dict"].__setitem__(
        "b_enc", s["state_dict"]["b_enc"].int()), "b_enc"),
    "state_dict not a dict": (lambda s: s.__setitem__("state_dict", [1, 2]), "state_dict"),
    "epoch not an integer": (lambda s: s.__setitem__("epoch", "2"), "epoch"),
    "global_step a float": (lambda s: s.__setitem__("global_step", 8.5), "global_step"),
    "deep nesting": (lambda s: s.__setitem__("hparams_name", nested(200)), "nested"),
    "huge hidden": (lambda s: s["hyper_parameters"]["config"].__setitem__("hidden", 10**7),
                    "hidden"),
    "model foo": (lambda s: s["hyper_parameters"]["config"].__setitem__("model", "foo"),
                  "model settings"),
    "data_var text": (lambda s: s["hyper_parameters"].__setitem__("data_var", "abc"),
                      "data variance"),
    "optimizer state of another shape": (
        lambda s: s["optimizer_states"][0]["state"][1].__setitem__("exp_avg", torch.zeros(3)),
        "optimizer"),
    "loop counter a string": (
        lambda s: s["loops"]["fit_loop"]["epoch_progress"]["total"].__setitem__("ready", "x"),
        "training state"),
    "timer not a number": (
        lambda s: s["callbacks"]["Timer"]["time_elapsed"].__setitem__("train", "x"),
        "callback"),
}


@pytest.mark.parametrize("case", sorted(CRAFTED))
def test_a_crafted_checkpoint_is_refused_before_the_folder_changes(trained, tmp_path, capsys,
                                                                   case):
    run = copy_run(trained, tmp_path)
    change, words = CRAFTED[case]
    edit_checkpoint(run, change)
    before = snapshot(run)
    assert resume(run) == 2
    one_line(capsys, words)
    assert snapshot(run) == before  # no session folder, no TensorBoard file, nothing


def test_a_huge_stride_zero_tensor_is_refused_unexpanded(trained, tmp_path, capsys):
    run = copy_run(trained, tmp_path)
    # 10^12 elements that cost one float on disk (and a checksum that is never reached)
    edit_checkpoint(run, lambda s: s.__setitem__("extra", torch.zeros(1).expand(10**12)),
                    keep_checksum=True)
    before = snapshot(run)
    assert resume(run) == 2
    one_line(capsys, "elements")
    assert snapshot(run) == before


def test_a_deflated_zip_bomb_is_refused_before_loading(trained, tmp_path, capsys):
    run = copy_run(trained, tmp_path)
    path = run / "checkpoints" / "last.ckpt"
    shutil.copy(path, tmp_path / "plain.zip")
    with zipfile.ZipFile(tmp_path / "plain.zip") as src, \
            zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as dst:
        for info in src.infolist():
            dst.writestr(info.filename, src.read(info.filename))
        dst.writestr("archive/data/bomb", bytes(20 * 2**20))  # 20 MiB of zeros, ~20 kB on disk
    with zipfile.ZipFile(path) as z:
        assert sum(i.file_size for i in z.infolist()) > path.stat().st_size + 19 * 2**20
    before = snapshot(run)
    assert resume(run) == 2
    one_line(capsys, "compressed")
    assert snapshot(run) == before


def test_the_uncompressed_size_is_bounded_from_the_zip_directory(trained, monkeypatch):
    from sae.training import checkpoints

    monkeypatch.setattr(checkpoints, "MAX_BYTES", 1000)
    loads = []
    monkeypatch.setattr(torch, "load", lambda *a, **k: loads.append(a))
    with pytest.raises(CheckpointError, match="uncompressed"):
        read_checkpoint(trained / "checkpoints" / "last.ckpt")
    assert loads == []


def test_the_checksum_is_required(trained, tmp_path, capsys):
    run = copy_run(trained, tmp_path)
    edit_checkpoint(run, lambda s: s.pop("sae_checksum"))
    before = snapshot(run)
    assert resume(run) == 2
    one_line(capsys, "no checksum")
    assert snapshot(run) == before


CHANGES = {
    "config": lambda s: s["hyper_parameters"]["config"].__setitem__("lam", 0.5),
    "data_var": lambda s: s["hyper_parameters"].__setitem__("data_var", 1.0),
    "learning rate": lambda s: s["optimizer_states"][0]["param_groups"][0].__setitem__("lr",
                                                                                       0.5),
    "epoch": lambda s: s.__setitem__("epoch", s["epoch"] + 1),
    "global_step": lambda s: s.__setitem__("global_step", s["global_step"] - 1),
    "callback": lambda s: s["callbacks"]["Timer"]["time_elapsed"].__setitem__("train", 99.0),
}


@pytest.mark.parametrize("what", sorted(CHANGES))
def test_a_changed_value_that_is_not_a_tensor_is_refused(trained, tmp_path, capsys, what):
    run = copy_run(trained, tmp_path)
    edit_checkpoint(run, CHANGES[what], keep_checksum=True)
    before = snapshot(run)
    assert resume(run) == 2
    one_line(capsys, "checksum")
    assert snapshot(run) == before


def leaves(obj, path=()):
    """(path, value) of every value in a checkpoint that is not a container or a tensor."""
    if isinstance(obj, dict):
        for k, v in obj.items():
            if k != "sae_checksum":
                yield from leaves(v, (*path, k))
    elif isinstance(obj, list | tuple):
        for i, v in enumerate(obj):
            yield from leaves(v, (*path, i))
    elif not isinstance(obj, torch.Tensor):
        yield path, obj


def set_at(root, path, value):
    """``root`` with ``value`` at ``path`` (tuples on the way are rebuilt)."""
    new = value if len(path) == 1 else set_at(root[path[0]], path[1:], value)
    if isinstance(root, tuple):
        return (*root[:path[0]], new, *root[path[0] + 1:])
    root[path[0]] = new
    return root


def different(value):
    if isinstance(value, bool):
        return not value
    if value is None:
        return "x"
    if isinstance(value, str):
        return value + "x"
    return value + 1 if math.isfinite(value) else 0


def test_the_checksum_covers_every_value_that_is_not_a_tensor(trained):
    state = torch.load(trained / "checkpoints" / "last.ckpt", weights_only=True)
    reference = checksum(state)
    assert reference == state["sae_checksum"]
    found = list(leaves(state))
    assert len(found) > 100
    for path, value in found:
        state = set_at(state, path, different(value))
        assert checksum(state) != reference, path
        state = set_at(state, path, value)
    state["epoch"] = float(state["epoch"])  # the same number, another type
    assert checksum(state) != reference
    state["epoch"] = int(state["epoch"])
    assert checksum(state) == reference


def test_a_checkpoint_of_an_earlier_version_needs_the_explicit_switch(trained, tmp_path,
                                                                     monkeypatch):
    from sae.training.checkpoints import tensors_checksum

    path = tmp_path / "old.ckpt"
    state = torch.load(trained / "checkpoints" / "last.ckpt", weights_only=True)
    state["sae_checksum"] = tensors_checksum(state)  # what earlier versions wrote
    torch.save(state, path)
    with pytest.raises(CheckpointError, match="SAE_LEGACY_CHECKPOINTS=1"):
        read_checkpoint(path)
    monkeypatch.setenv("SAE_LEGACY_CHECKPOINTS", "1")
    assert read_checkpoint(path)["global_step"] == state["global_step"]
    state["state_dict"]["b_enc"] += 1  # its tensors are still verified
    torch.save(state, path)
    with pytest.raises(CheckpointError, match="damaged"):
        read_checkpoint(path)
