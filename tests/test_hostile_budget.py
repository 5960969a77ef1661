"""Checkpoints and exported folders are checked within a fixed memory budget, in bytes: a small
crafted file that would expand while being checked (a string referenced many times through the
pickle memo, a stride-0 view far larger than its storage) is refused in one line, quickly and
under an address-space limit; a damaged or edited exported folder, a float8 weight, a planted
link, a FIFO or a folder where a file belongs, a SAELens folder or an unknown device are each one
line that names the cause."""

import hashlib
import json
import os
import subprocess
import sys
import time

import pytest
import torch
from cli_helpers import cli_env
from hostile_helpers import copy_run, edit_checkpoint, train_template

import sae
from sae.models import SAEConfig, build_model
from sae.training import checkpoints

# the hostile load runs in a child process whose address space may grow by this much beyond
# what importing the package took: a check that expands a crafted file fails, a bounded one
# does not come near it
HEADROOM = 1536 * 2**20

BUDGETED = """
import resource, sys, time
from sae.api.export import main

def mapped():
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmSize"))

limit = mapped() + {headroom}
resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
start = time.monotonic()
code = main(sys.argv[1:])
print(f"seconds {{time.monotonic() - start:.2f}}")
sys.exit(code)
"""


@pytest.fixture(scope="module")
def trained(tmp_path_factory, data_dir):
    """A finished tiny run: the template every case of this file copies."""
    return train_template(tmp_path_factory, data_dir)


def export_budgeted(source, target, cwd, data_dir):
    """``python -m sae.export source target`` under an address-space limit: (result, seconds)."""
    result = subprocess.run(
        [sys.executable, "-c", BUDGETED.format(headroom=HEADROOM), str(source), str(target)],
        cwd=cwd, env=cli_env(cwd, data_dir), capture_output=True, text=True, timeout=300)
    lines = result.stdout.strip().splitlines()
    seconds = float(lines[-1].split()[1]) if lines and lines[-1].startswith("seconds") else None
    return result, seconds


def assert_refused(result, seconds, *words):
    assert result.returncode == 2, result.stderr[-2000:]
    err = result.stderr.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: "), result.stderr[-2000:]
    for word in words:
        assert word in err[0], err[0]
    assert seconds is not None and seconds < 20, seconds


# --------------------------------------------------------------------------- H3: expansion


@pytest.mark.slow
def test_a_legitimate_checkpoint_exports_under_the_same_limit(trained, tmp_path, data_dir):
    result, _ = export_budgeted(trained / "checkpoints" / "last.ckpt", tmp_path / "out", tmp_path,
                                data_dir)
    assert result.returncode == 0, result.stderr[-2000:]
    assert (tmp_path / "out" / "model.safetensors").is_file()


@pytest.mark.slow
def test_a_string_referenced_through_the_memo_is_refused_within_the_budget(trained, tmp_path,
                                                                           data_dir):
    run = copy_run(trained, tmp_path)
    text = "x" * 2**20  # one object: pickle writes it once and refers to it 100 000 times
    edit_checkpoint(run, lambda s: s.__setitem__("notes", [text] * 100_000), keep_checksum=True)
    path = run / "checkpoints" / "last.ckpt"
    assert path.stat().st_size < 3 * 2**20
    result, seconds = export_budgeted(path, tmp_path / "out", tmp_path, data_dir)
    assert_refused(result, seconds, "text")
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_a_stride_zero_view_larger_than_its_storage_is_refused_within_the_budget(
        trained, tmp_path, data_dir):
    run = copy_run(trained, tmp_path)
    view = torch.zeros(1, dtype=torch.complex128).expand(2**28)  # 4 GiB, one element stored
    edit_checkpoint(run, lambda s: s.__setitem__("extra", view), keep_checksum=True)
    path = run / "checkpoints" / "last.ckpt"
    assert path.stat().st_size < 3 * 2**20
    result, seconds = export_budgeted(path, tmp_path / "out", tmp_path, data_dir)
    assert_refused(result, seconds, "storage")
    assert not (tmp_path / "out").exists()


def test_the_tensor_hash_is_the_same_when_read_in_pieces(monkeypatch):
    """The checksum of a tensor hashed a piece at a time is that of its bytes in one piece
    (what earlier checkpoints were written with), for every layout a checkpoint holds."""
    tensors = [torch.randn(5, 7).t(), torch.randn(3, 4, 5).permute(2, 0, 1), torch.tensor(2.5),
               torch.arange(40).reshape(8, 5)[:, 1:4], torch.rand(6) > 0.5, torch.zeros(0, 3)]
    whole = [hashlib.sha256(t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
             .hexdigest() for t in tensors]
    monkeypatch.setattr(checkpoints, "HASH_CHUNK", 8)
    assert [checkpoints.tensor_sha256(t) for t in tensors] == whole


# --------------------------------------------------------------------------- M2: dtypes


def test_float8_weights_in_a_checkpoint_are_one_line(trained, tmp_path):
    run = copy_run(trained, tmp_path)
    edit_checkpoint(run, lambda s: s["state_dict"].__setitem__(
        "W_dec", s["state_dict"]["W_dec"].to(torch.float8_e4m3fn)))
    with pytest.raises(sae.LoadError, match="float8_e4m3fn"):
        sae.load(run)


def test_float8_anywhere_in_a_checkpoint_is_one_line(trained, tmp_path):
    run = copy_run(trained, tmp_path)
    edit_checkpoint(run, lambda s: s.__setitem__("extra", torch.zeros(3, dtype=torch.float8_e5m2)))
    with pytest.raises(sae.LoadError, match="float8_e5m2"):
        sae.load(run)


# --------------------------------------------------------------------------- exported folders


def small_export(tmp_path, name="l1"):
    torch.manual_seed(0)
    config = SAEConfig(model=name, input_dim=12, hidden=24, k=5)
    config.validate()
    model = build_model(config, torch.rand(12), 2.0, init_inputs=torch.rand(24, 12)).eval()
    return sae.export(model, tmp_path / "out")


def rehash(folder):
    """config.json's weights hash made to fit model.safetensors again (the damage is past it)."""
    config = json.loads((folder / "config.json").read_text())
    weights = (folder / "model.safetensors").read_bytes()
    config["weights_sha256"] = hashlib.sha256(weights).hexdigest()
    (folder / "config.json").write_text(json.dumps(config))


def rewrite_weights(folder, change):
    from safetensors import safe_open
    from safetensors.torch import save_file

    with safe_open(str(folder / "model.safetensors"), framework="pt") as f:
        tensors, metadata = {k: f.get_tensor(k) for k in f.keys()}, f.metadata()
    change(tensors)
    save_file(tensors, str(folder / "model.safetensors"), metadata=metadata)
    rehash(folder)


def header_length(data: bytes) -> int:
    return int.from_bytes(data[:8], "little")


DAMAGE = {
    "truncated": (lambda data: data[:-10], "model.safetensors"),
    "bad header length": (lambda data: (2**40).to_bytes(8, "little") + data[8:], "header"),
    "bad offsets": (lambda data: data.replace(b'"data_offsets":[0,', b'"data_offsets":[4,', 1),
                    "model.safetensors"),
    "header not json": (lambda data: data[:8] + b"{" * header_length(data)
                        + data[8 + header_length(data):], "model.safetensors"),
}


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_a_damaged_safetensors_file_is_a_load_error(tmp_path, damage):
    folder = small_export(tmp_path)
    weights = folder / "model.safetensors"
    change, word = DAMAGE[damage]
    damaged = change(weights.read_bytes())
    assert damaged != weights.read_bytes()
    weights.write_bytes(damaged)
    rehash(folder)
    with pytest.raises(sae.LoadError, match=word) as caught:
        sae.load(folder)
    assert "\n" not in str(caught.value)


@pytest.mark.slow
def test_the_export_command_refuses_a_damaged_folder_in_one_line(tmp_path, data_dir):
    folder = small_export(tmp_path)
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-10])
    rehash(folder)
    result, seconds = export_budgeted(folder, tmp_path / "again", tmp_path, data_dir)
    assert_refused(result, seconds, "model.safetensors")


@pytest.mark.parametrize("dtype", [torch.float16, torch.float64, torch.int32, torch.bool,
                                   torch.complex64, torch.float8_e4m3fn])
def test_an_exported_tensor_of_another_dtype_is_refused(tmp_path, dtype):
    folder = small_export(tmp_path)
    rewrite_weights(folder, lambda t: t.__setitem__("W_dec", t["W_dec"].to(dtype)))
    with pytest.raises(sae.LoadError, match="W_dec"):
        sae.load(folder)


def edit_config(folder, change):
    config = json.loads((folder / "config.json").read_text())
    change(config)
    (folder / "config.json").write_text(json.dumps(config))


def test_an_exported_version_must_be_an_integer(tmp_path):
    folder = small_export(tmp_path)
    edit_config(folder, lambda c: c.__setitem__("version", True))
    with pytest.raises(sae.LoadError, match="version"):
        sae.load(folder)


def test_edited_exported_settings_are_refused(tmp_path):
    folder = small_export(tmp_path, "l1")  # TopK's tensors have the same names and shapes
    edit_config(folder, lambda c: c["settings"]["config"].__setitem__("model", "topk"))
    with pytest.raises(sae.LoadError, match="settings"):
        sae.load(folder)


def test_both_exported_files_have_the_same_mode(tmp_path):
    folder = small_export(tmp_path)
    umask = os.umask(0)
    os.umask(umask)
    modes = {(folder / name).stat().st_mode & 0o777 for name in ("config.json",
                                                                 "model.safetensors")}
    assert modes == {0o666 & ~umask}


# --------------------------------------------------------------------------- what a path is


def test_a_fifo_or_folder_as_the_checkpoint_is_named(trained, tmp_path):
    run = copy_run(trained, tmp_path)
    checkpoint = run / "checkpoints" / "last.ckpt"
    checkpoint.unlink()
    os.mkfifo(checkpoint)
    start = time.monotonic()
    with pytest.raises(sae.LoadError, match="FIFO"):
        sae.load(run)
    assert time.monotonic() - start < 10
    checkpoint.unlink()
    checkpoint.mkdir()
    with pytest.raises(sae.LoadError, match="folder"):
        sae.load(run)


def test_a_device_named_as_a_checkpoint_is_named(tmp_path):
    with pytest.raises(sae.LoadError, match="device"):
        sae.load("/dev/zero")


def test_a_saelens_folder_is_read_as_one(tmp_path):
    torch.manual_seed(0)
    config = SAEConfig(model="topk", input_dim=12, hidden=24, k=5)
    config.validate()
    model = build_model(config, torch.rand(12), 2.0, init_inputs=torch.rand(24, 12))
    folder = sae.export(model, tmp_path / "lens", format="saelens")
    (folder / "cfg.json").unlink()
    with pytest.raises(sae.LoadError, match=r"SAELens folder \S+ has no cfg.json$"):
        sae.load(folder)


@pytest.mark.parametrize("entry", ["checkpoints/last.ckpt", "config.yaml"])
def test_a_link_in_a_run_folder_is_refused(trained, tmp_path, entry):
    run = copy_run(trained, tmp_path)
    real = tmp_path / "elsewhere"
    (run / entry).rename(real)
    (run / entry).symlink_to(real)
    with pytest.raises(sae.LoadError, match="link"):
        sae.load(run)
    with pytest.raises(sae.LoadError, match="link"):
        sae.export(run, tmp_path / "out")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("entry", ["model.safetensors", "config.json"])
def test_a_link_in_an_exported_folder_is_refused(tmp_path, entry):
    folder = small_export(tmp_path)
    real = tmp_path / "elsewhere"
    (folder / entry).rename(real)
    (folder / entry).symlink_to(real)
    with pytest.raises(sae.LoadError, match="link"):
        sae.load(folder)


def test_an_unknown_device_is_one_line(trained):
    with pytest.raises(sae.LoadError, match="nonsense"):
        sae.load(trained, device="nonsense")

