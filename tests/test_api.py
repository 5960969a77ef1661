"""The Python API: sae.train → sae.load → encode / decode reproduces the run's test metrics;
sae.export round-trips (its own format exactly, SAELens' layout to float rounding); bad input is
one line."""

import json
import re
import subprocess
import sys

import pytest
import torch
from cli_helpers import QUICK, cli_env
from safetensors.torch import load_file, save_file

import sae
from sae import metrics
from sae.models import SAEConfig, build_model
from sae.training.runfolder import RunFolder

REPO_README = (__import__("pathlib").Path(__file__).resolve().parents[1] / "README.md")


def quick_settings(**kw) -> dict:
    """QUICK's flags as sae.train keywords (field names)."""
    names = {"--limit-train": "limit_train", "--val-size": "val_size",
             "--limit-test": "limit_test", "--hidden": "hidden", "--batch-size": "batch_size",
             "--k": "k"}
    flags = dict(zip(QUICK[::2], QUICK[1::2], strict=True))
    return {**{names[f]: int(v) for f, v in flags.items()}, "max_steps": 24, "no_figures": True,
            "no_features": True, "no_report": True, "progress": "off", **kw}


@pytest.fixture(scope="module")
def trained(tmp_path_factory, data_dir):
    out = tmp_path_factory.mktemp("api") / "topk"
    folder = sae.train(model="topk", data_dir=str(data_dir), out=str(out), **quick_settings())
    return folder


def test_train_returns_the_run_folder_and_load_reproduces_its_test_metrics(trained, capsys):
    assert trained.is_dir() and (trained / "metrics.json").is_file()
    model = sae.load(trained)
    assert isinstance(model, torch.nn.Module) and not isinstance(model, __import__(
        "lightning").pytorch.LightningModule)
    assert not model.training and model.config.model == "topk"
    dm = RunFolder.open(trained).data_module()
    dm.setup()
    with torch.no_grad():
        codes = model.encode(dm.test_x)
        x_hat = model.decode(codes)
        assert torch.equal(model(dm.test_x), x_hat)
    result = json.loads((trained / "metrics.json").read_text())
    assert float(metrics.fvu(dm.test_x, x_hat, dm.train_mean)) == pytest.approx(result["fvu"],
                                                                               rel=1e-5)
    assert float(metrics.l0(codes, model.fire_threshold).mean()) == pytest.approx(
        result["l0_mean"], rel=1e-6)
    # the same checkpoint file, named directly
    again = sae.load(trained / "checkpoints" / "last.ckpt")
    torch.testing.assert_close(again.encode(dm.test_x[:8]), model.encode(dm.test_x[:8]))


def test_train_checks_settings_as_the_command_does(tmp_path):
    with pytest.raises(ValueError, match=r"unknown setting lamda \(did you mean lam\?\)"):
        sae.train(lamda=0.1)
    with pytest.raises(ValueError, match="--hidden"):
        sae.train(hidden=0, out=str(tmp_path / "x"))
    assert not (tmp_path / "x").exists()


def test_load_refuses_what_is_not_a_trained_sae(tmp_path, trained):
    with pytest.raises(sae.LoadError, match="not found"):
        sae.load(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(sae.LoadError, match="no config.yaml"):
        sae.load(tmp_path / "empty")
    crafted = tmp_path / "crafted.ckpt"
    state = torch.load(trained / "checkpoints" / "last.ckpt", weights_only=True)
    state["state_dict"]["W_dec"] = state["state_dict"]["W_dec"] * 2  # the checksum no longer fits
    torch.save(state, crafted)
    with pytest.raises(sae.LoadError, match="checksum"):
        sae.load(crafted)


def small(name: str, **kw):
    """A small model of ``name`` with weights as training leaves them: random biases, and a
    threshold where the mechanism has one."""
    torch.manual_seed(0)
    config = SAEConfig(model=name, input_dim=12, hidden=24, k=5, **kw)
    config.validate()
    model = build_model(config, torch.rand(12), 2.0, init_inputs=torch.rand(24, 12)).eval()
    with torch.no_grad():
        model.b_enc.normal_(0, 0.3) if hasattr(model, "b_enc") else None
        if name == "batchtopk":
            model.threshold.fill_(0.2)
        if name == "jumprelu":
            model.log_threshold.copy_(torch.linspace(-3, -1, len(model.log_threshold)))
    return model


@pytest.mark.parametrize("name, kw", [
    ("l1", {}), ("kl", {}), ("sparsemax", {}), ("sparsemax", {"support": "batch"}),
    ("entmax", {}), ("topk", {}), ("batchtopk", {}), ("jumprelu", {}),
    ("sparsemax-attention", {}), ("l1", {"arch": "mlp", "mlp_width": 16})],
    ids=lambda v: v if isinstance(v, str) else "-".join(map(str, v.values())))
def test_the_own_format_round_trips_every_mechanism_exactly(tmp_path, name, kw):
    model = small(name, **kw)
    folder = sae.export(model, tmp_path / "out", format="sae")
    loaded = sae.load(folder)
    assert type(loaded) is type(model) and loaded.settings == model.settings
    x = torch.rand(40, 12)
    with torch.no_grad():
        torch.testing.assert_close(loaded.encode(x), model.encode(x), rtol=0, atol=1e-6)
        torch.testing.assert_close(loaded(x), model(x), rtol=0, atol=1e-6)


def saelens_reference(folder):
    """SAELens' inference forward pass, as its documentation and code state it, from the
    exported files alone: (codes, reconstruction) of x."""
    cfg = json.loads((folder / "cfg.json").read_text())
    w = load_file(folder / "sae_weights.safetensors")
    assert cfg["apply_b_dec_to_input"] and cfg["normalize_activations"] == "none"
    assert w["W_enc"].shape == (cfg["d_in"], cfg["d_sae"])
    assert w["W_dec"].shape == (cfg["d_sae"], cfg["d_in"])

    def run(x):
        pre = (x - w["b_dec"]) @ w["W_enc"] + w["b_enc"]
        if cfg["architecture"] == "standard":
            h = torch.relu(pre)
        elif cfg["architecture"] == "topk":
            top = pre.topk(cfg["k"], dim=-1)
            h = torch.zeros_like(pre).scatter_(-1, top.indices, torch.relu(top.values))
        else:
            assert cfg["architecture"] == "jumprelu"
            h = torch.relu(pre) * (pre > w["threshold"])
        return h, h @ w["W_dec"] + w["b_dec"]
    return run


@pytest.mark.parametrize("name, kw", [("l1", {}), ("topk", {}), ("batchtopk", {}),
                                      ("jumprelu", {}), ("jumprelu",
                                                         {"jumprelu_threshold": "shared"})],
                         ids=["l1", "topk", "batchtopk", "jumprelu", "jumprelu-shared"])
def test_the_saelens_layout_gives_the_same_codes_and_reconstructions(tmp_path, name, kw):
    model = small(name, **kw)
    folder = sae.export(model, tmp_path / "lens", format="saelens")
    x = torch.rand(64, 12)
    codes, x_hat = saelens_reference(folder)(x)
    with torch.no_grad():
        torch.testing.assert_close(codes, model.encode(x), rtol=0, atol=1e-6)
        torch.testing.assert_close(x_hat, model(x), rtol=0, atol=1e-6)
    assert (codes > 0).any() and (codes == 0).any()  # a sparse code, not a trivial one


@pytest.mark.skipif(__import__("importlib").util.find_spec("sae_lens") is None,
                    reason="SAELens is not installed (pip install 'sae[saelens]')")
def test_saelens_itself_loads_the_export(tmp_path):
    __import__("sae.saelens")  # SAELens, imported without its dependencies' warnings
    sae_lens = __import__("sae_lens")
    model = small("topk")
    folder = sae.export(model, tmp_path / "lens", format="saelens")
    lens = sae_lens.SAE.load_from_disk(str(folder))
    x = torch.rand(16, 12)
    with torch.no_grad():
        torch.testing.assert_close(lens(x), model(x), rtol=0, atol=1e-6)


def test_an_exported_folder_that_was_changed_is_refused(tmp_path):
    folder = sae.export(small("l1"), tmp_path / "out")
    weights = folder / "model.safetensors"
    tensors = load_file(weights)
    tensors["W_dec"] = tensors["W_dec"][:, :5].contiguous()
    save_file(tensors, weights)
    with pytest.raises(sae.LoadError, match="does not match the hash"):
        sae.load(folder)
    config = json.loads((folder / "config.json").read_text())
    config["weights_sha256"] = __import__("hashlib").sha256(weights.read_bytes()).hexdigest()
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(sae.LoadError, match="W_dec has shape"):
        sae.load(folder)


def test_export_refuses_a_pair_it_cannot_write_and_overwrites_nothing(tmp_path):
    with pytest.raises(sae.ExportError, match="unknown format 'onnx'"):
        sae.export(small("l1"), tmp_path / "b", format="onnx")
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "notes.txt").write_text("mine")
    with pytest.raises(sae.ExportError, match="already exists"):
        sae.export(small("l1"), tmp_path / "c")
    assert [p.name for p in (tmp_path / "c").iterdir()] == ["notes.txt"]


def test_sae_export_stays_the_function_when_the_command_module_is_imported(tmp_path):
    with pytest.raises(ImportError, match=r"^sae.export is the command python -m sae.export; "
                                          r"in Python call the function sae.export\(\.\.\.\)"):
        __import__("sae.export")  # the command module, which only python -m runs
    from sae import export

    assert export is sae.export and callable(sae.export)
    with pytest.raises(sae.ExportError, match="unknown format 'onnx'"):
        sae.export(small("l1"), tmp_path / "b", format="onnx")


@pytest.mark.slow
def test_the_export_command_as_a_user_calls_it(tmp_path, trained, data_dir):
    env = cli_env(tmp_path, data_dir)
    ok = subprocess.run([sys.executable, "-m", "sae.export", str(trained), str(tmp_path / "lens"),
                         "--format", "saelens"], capture_output=True, text=True, env=env,
                        cwd=tmp_path)
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.strip() == f"exported (saelens): {tmp_path / 'lens'}"
    assert json.loads((tmp_path / "lens" / "cfg.json").read_text())["k"] == 8
    bad = subprocess.run([sys.executable, "-m", "sae.export", str(tmp_path / "nothing"),
                          str(tmp_path / "out")], capture_output=True, text=True, env=env,
                         cwd=tmp_path)
    assert bad.returncode == 2 and bad.stdout == ""
    assert re.fullmatch(r"error: run folder not found: \S+\n", bad.stderr)
    assert not (tmp_path / "out").exists()


def test_the_readme_python_example_runs(tmp_path, monkeypatch, data_dir, mnist_small):
    readme = REPO_README.read_text(encoding="utf-8")
    block = re.search(r"```python\n(import sae\n.*?)```", readme, re.S).group(1)
    import sae.api

    real_train = sae.api.train
    monkeypatch.setattr(sae.api, "train", lambda **kw: real_train(
        **{**kw, **quick_settings(data_dir=str(data_dir))}))
    monkeypatch.chdir(tmp_path)
    namespace = {"images": mnist_small.test_x[:32]}
    exec(compile(block, "README.md", "exec"), namespace)
    assert namespace["codes"].shape == (32, 64)
    assert (tmp_path / "exported").is_dir()
