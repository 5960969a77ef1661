"""SAELens both ways: every mechanism exports to SAELens' layout, SAELens loads it (with
``import sae.saelens`` for the toolkit's own architectures) and computes the toolkit's codes and
reconstructions; ``sae.load`` reads SAELens folders, SAELens' own among them, to the same codes;
cfg.json carries what the run recorded of its data; a bad folder is one line. The tests that
need SAELens skip where it is not installed (``pip install 'sae[saelens]'``)."""

import importlib.util
import json
import re
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from test_api import small
from test_streamed import SOURCE_MODULE

import sae
from sae.api.saelens_format import NATIVE

HAS_SAELENS = importlib.util.find_spec("sae_lens") is not None
needs_saelens = pytest.mark.skipif(not HAS_SAELENS,
                                   reason="SAELens is not installed (pip install 'sae[saelens]')")
DOCS = Path(__file__).resolve().parents[1] / "docs" / "library.md"

MECHANISMS = [("l1", {}), ("kl", {}), ("sparsemax", {}), ("sparsemax", {"support": "batch"}),
              ("sparsemax", {"temperature": "learned", "values": "shrunk"}),
              ("sparsemax", {"inference": "threshold", "values": "unshrunk"}),
              ("entmax", {}), ("topk", {}), ("topk", {"energy_rule": 0.5}), ("batchtopk", {}),
              ("jumprelu", {}), ("jumprelu", {"jumprelu_gain": "input"}),
              ("sparsemax-attention", {}), ("l1", {"arch": "mlp", "mlp_width": 16})]


def mechanism_id(value):
    return value if isinstance(value, str) else "-".join(map(str, value.values())) or "default"


def saelens_sae():
    """SAELens' ``SAE`` class, with the toolkit's architectures registered (``sae.saelens``
    first: it imports SAELens without its dependencies' deprecation warnings)."""
    importlib.import_module("sae.saelens")
    return importlib.import_module("sae_lens").SAE


def one_line_load_error(folder) -> str:
    with pytest.raises(sae.LoadError) as info:
        sae.load(folder)
    message = str(info.value)
    assert "\n" not in message and "Traceback" not in message
    return message


@pytest.mark.skipif(HAS_SAELENS, reason="SAELens is installed")
def test_the_saelens_module_without_saelens_names_the_extra_in_one_line():
    with pytest.raises(ImportError) as info:
        import sae.saelens  # noqa: F401
    assert str(info.value) == "sae.saelens needs SAELens: pip install 'sae[saelens]'"


@needs_saelens
@pytest.mark.parametrize("name, kw", MECHANISMS, ids=mechanism_id)
def test_every_mechanism_round_trips_through_saelens(tmp_path, name, kw):
    SAE = saelens_sae()
    model = small(name, **kw)
    folder = sae.export(model, tmp_path / "lens", format="saelens")
    lens = SAE.load_from_disk(str(folder))
    back = sae.load(folder)
    x = torch.rand(40, 12) * 2
    with torch.no_grad():
        codes = model.encode(x)
        assert (codes != 0).any()
        if name not in ("kl", "entmax"):  # the sigmoid, and entmax untrained, are dense
            assert (codes == 0).any()  # a sparse code, not a trivial one
        torch.testing.assert_close(lens.encode(x), codes, rtol=0, atol=1e-6)
        torch.testing.assert_close(lens.decode(codes), model.decode(codes), rtol=0, atol=1e-6)
        torch.testing.assert_close(lens(x), model(x), rtol=0, atol=1e-6)
        torch.testing.assert_close(back.encode(x), codes, rtol=0, atol=1e-6)
        torch.testing.assert_close(back(x), model(x), rtol=0, atol=1e-6)
        # SAELens' [batch, sequence, d_in] activations: each position coded on its own
        torch.testing.assert_close(lens.encode(x.view(4, 10, 12)), codes.view(4, 10, -1),
                                   rtol=0, atol=1e-6)


def saelens_own(architecture: str, **cfg):
    """A SAELens model of SAELens' own ``architecture`` with random weights (positive
    thresholds), as SAELens builds and saves one."""
    SAE = saelens_sae()
    torch.manual_seed(1)
    sae_cls = SAE.get_sae_class_for_architecture(architecture)
    config_cls = SAE.get_sae_config_class_for_architecture(architecture)
    config = config_cls.from_dict({"architecture": architecture, "d_in": 12, "d_sae": 24, **cfg})
    lens = sae_cls(config)
    with torch.no_grad():
        for name, p in lens.named_parameters():
            # pre-activations of order 1, where float32 rounds to 1e-7
            p.copy_(torch.rand_like(p) * 0.2 if name == "threshold"
                    else torch.randn_like(p) * 0.3)
    return lens


@needs_saelens
@pytest.mark.parametrize("architecture, cfg", [
    ("standard", {}), ("standard", {"apply_b_dec_to_input": False}), ("topk", {"k": 5}),
    ("topk", {"k": 5, "rescale_acts_by_decoder_norm": True}), ("jumprelu", {})],
    ids=["standard", "standard-uncentred", "topk", "topk-rescaled", "jumprelu"])
def test_sae_load_reads_the_folders_saelens_saves(tmp_path, architecture, cfg):
    lens = saelens_own(architecture, **cfg)
    lens.save_model(tmp_path / "own")
    model = sae.load(tmp_path / "own")
    x = torch.randn(40, 12)
    with torch.no_grad():
        codes = lens.encode(x)
        assert (codes != 0).any() and (codes == 0).any()
        torch.testing.assert_close(model.encode(x), codes, rtol=0, atol=1e-6)
        torch.testing.assert_close(model.decode(codes), lens.decode(codes), rtol=0, atol=1e-6)


@needs_saelens
def test_a_toolkit_architecture_saved_again_by_saelens_reads_back(tmp_path):
    SAE = saelens_sae()
    model = small("sparsemax")
    lens = SAE.load_from_disk(str(sae.export(model, tmp_path / "lens", format="saelens")))
    lens.save_model(tmp_path / "again")  # SAELens' own writer: no settings in the weights file
    x = torch.rand(20, 12)
    with torch.no_grad():
        torch.testing.assert_close(sae.load(tmp_path / "again").encode(x), model.encode(x),
                                   rtol=0, atol=1e-6)
        assert torch.equal(lens.W_dec, model.W_dec.detach().t())


def test_the_export_cfg_carries_the_runs_hook_model_and_normalisation(tmp_path, data_dir,
                                                                   monkeypatch):
    (tmp_path / "mysource.py").write_text(SOURCE_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    run = sae.train(source="mysource:factory", hook="2", model="sparsemax", hidden=16,
                    val_size=100, buffer_rows=64, batch_size=64, epochs=40, max_steps=200,
                    out=str(tmp_path / "run"), no_figures=True, no_features=True,
                    no_report=True, progress="off")
    folder = sae.export(run, tmp_path / "lens", format="saelens")
    cfg = json.loads((folder / "cfg.json").read_text())
    record = json.loads((run / "data.json").read_text())
    assert cfg["architecture"] == "sae.sparsemax"
    assert (cfg["d_in"], cfg["d_sae"], cfg["dtype"]) == (8, 16, "float32")
    assert cfg["normalize_activations"] == "none"
    meta = cfg["metadata"]
    assert (meta["hook_name"], meta["model_name"]) == ("2", "mysource:factory")
    assert meta["sae_data"] == record and meta["sae_lens_version"].startswith("6.")
    assert cfg["sae_settings"] == sae.load(run).settings
    # the checkpoint inside the run folder names the same run
    again = sae.export(run / "checkpoints" / "last.ckpt", tmp_path / "lens2", format="saelens")
    assert json.loads((again / "cfg.json").read_text())["metadata"] == meta
    # a SAELens folder passes its metadata on
    third = sae.export(folder, tmp_path / "lens3", format="saelens")
    assert json.loads((third / "cfg.json").read_text())["metadata"] == meta
    # a model object has no run to tell of
    bare = sae.export(small("topk"), tmp_path / "bare", format="saelens")
    assert json.loads((bare / "cfg.json").read_text())["metadata"]["hook_name"] is None
    if HAS_SAELENS:
        lens = saelens_sae().load_from_disk(str(folder))
        assert (lens.cfg.metadata.hook_name, lens.cfg.metadata.model_name) == (
            "2", "mysource:factory")
        x = torch.randn(30, 8).relu()
        with torch.no_grad():
            torch.testing.assert_close(lens.encode(x), sae.load(run).encode(x), rtol=0,
                                       atol=1e-6)


def test_an_image_run_names_its_dataset(tmp_path, data_dir):
    run = sae.train(model="topk", k=4, hidden=16, limit_train=512, val_size=128,
                    limit_test=128, batch_size=64, max_steps=20, data_dir=str(data_dir),
                    out=str(tmp_path / "run"), no_figures=True, no_features=True,
                    no_report=True, progress="off")
    meta = json.loads((sae.export(run, tmp_path / "lens", format="saelens") / "cfg.json")
                      .read_text())["metadata"]
    assert (meta["model_name"], meta["dataset_path"], meta["hook_name"]) == (
        "mnist", "mnist", None)


def saelens_forward(cfg: dict, w: dict, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """SAELens' inference pass (its StandardSAE, TopKSAE and JumpReLUSAE ``encode`` and
    ``decode``, in float64) from a cfg.json dict and its tensors: (codes, reconstruction)."""
    w = {k: v.double() for k, v in w.items()}
    x = x.double()
    pre = (x - w["b_dec"] * cfg["apply_b_dec_to_input"]) @ w["W_enc"] + w["b_enc"]
    norm = w["W_dec"].norm(dim=-1)
    rescale = cfg.get("rescale_acts_by_decoder_norm", False)
    if cfg["architecture"] == "topk":
        pre = pre * norm if rescale else pre
        top = pre.topk(cfg["k"], dim=-1)
        h = torch.zeros_like(pre).scatter_(-1, top.indices, top.values.relu())
    elif cfg["architecture"] == "jumprelu":
        h = pre.relu() * (pre > w["threshold"])
    else:
        h = pre.relu()
    return h, (h / norm if rescale else h) @ w["W_dec"] + w["b_dec"]


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), architecture=st.sampled_from(NATIVE),
       centred=st.booleans(), rescaled=st.booleans(), scale=st.floats(0.05, 2.0))
def test_sae_load_computes_saelens_codes_from_any_native_folder(tmp_path_factory, seed,
                                                               architecture, centred,
                                                               rescaled, scale):
    from safetensors.torch import save_file

    g = torch.Generator().manual_seed(seed)
    D, H = 10, 20
    w = {"W_enc": torch.randn(D, H, generator=g) * scale, "b_enc": torch.randn(H, generator=g),
         "W_dec": torch.randn(H, D, generator=g) * scale, "b_dec": torch.randn(D, generator=g)}
    if architecture == "jumprelu":
        w["threshold"] = torch.rand(H, generator=g) + 1e-3
    cfg = {"architecture": architecture, "d_in": D, "d_sae": H, "apply_b_dec_to_input": centred,
           "metadata": {"sae_lens_version": "6.5.0"}}
    if architecture == "topk":
        cfg.update(k=4, rescale_acts_by_decoder_norm=rescaled)
    folder = tmp_path_factory.mktemp("native")
    (folder / "cfg.json").write_text(json.dumps(cfg))
    save_file(w, folder / "sae_weights.safetensors")
    x = torch.randn(32, D, generator=g)
    codes, x_hat = saelens_forward(cfg, w, x)
    model = sae.load(folder)
    with torch.no_grad():
        got = model.encode(x).double()
        # the same units fire (a tie within float32 rounding at the k-th value or a threshold
        # has probability near 1e-6 here), with the same values to float32 rounding
        assert torch.equal(got != 0, codes != 0)
        assert (got - codes).abs().max() <= 1e-5 * (1 + codes.abs().max())
        assert (model.decode(codes.float()).double() - x_hat).abs().max() <= 1e-5 * (
            1 + x_hat.abs().max())


def test_a_bad_saelens_folder_is_one_line(tmp_path):
    folder = sae.export(small("sparsemax"), tmp_path / "lens", format="saelens")
    cfg_path = folder / "cfg.json"
    cfg = json.loads(cfg_path.read_text())

    def with_cfg(text: str) -> str:
        cfg_path.write_text(text)
        return one_line_load_error(folder)

    assert re.search(r"cannot read \S+cfg.json", with_cfg("{not json"))
    assert "not a SAELens config" in with_cfg("[1, 2]")
    assert "d_sae must be a positive integer" in with_cfg(json.dumps({**cfg, "d_sae": "24"}))
    assert "SAELens architecture 'gated' has no form here" in with_cfg(
        json.dumps({**cfg, "architecture": "gated"}))
    assert "is not the model its settings describe" in with_cfg(
        json.dumps({**cfg, "architecture": "sae.kl"}))
    assert "run-time normalisation" in with_cfg(
        json.dumps({**cfg, "normalize_activations": "layer_norm"}))
    edited = {**cfg, "sae_settings": {**cfg["sae_settings"], "config": {
        **cfg["sae_settings"]["config"], "hidden": 12}}}
    message = with_cfg(json.dumps(edited))
    assert "tensor" in message or "settings are not those" in message
    cfg_path.unlink()
    assert re.fullmatch(r"SAELens folder \S+ has no cfg.json", one_line_load_error(folder))
    cfg_path.write_text(json.dumps(cfg))
    (folder / "sae_weights.safetensors").unlink()
    assert re.fullmatch(r"SAELens folder \S+ has no sae_weights.safetensors",
                        one_line_load_error(folder))


def test_a_model_in_another_dtype_is_refused_before_anything_is_written(tmp_path):
    with pytest.raises(sae.ExportError, match=r"tensor \S+ is torch.float64, and sae.load "
                                              r"reads torch.float32"):
        sae.export(small("sparsemax").double(), tmp_path / "lens", format="saelens")
    assert not (tmp_path / "lens").exists()


def test_a_saelens_jumprelu_with_a_threshold_at_zero_is_refused_in_one_line(tmp_path):
    from safetensors.torch import load_file, save_file

    folder = sae.export(small("jumprelu"), tmp_path / "lens", format="saelens")
    weights = folder / "sae_weights.safetensors"
    tensors = load_file(weights)
    tensors["threshold"][3] = 0.0
    save_file(tensors, weights)
    assert "threshold is not positive" in one_line_load_error(folder)


def docs_example() -> str:
    """The code block of docs/library.md's SAELens section."""
    text = DOCS.read_text(encoding="utf-8")
    section = text[text.index("\n## SAELens\n"):]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


@needs_saelens
def test_the_documented_saelens_example_runs(tmp_path, data_dir, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SAE_DATA_DIR", str(data_dir))
    exec(compile(docs_example(), str(DOCS), "exec"), {})  # noqa: S102 - the docs' own code
    assert (tmp_path / "exported" / "sparsemax-lens" / "cfg.json").is_file()
