"""SAEs on a sequence model's layer (--hook on a [B, T, D] output): one row per position, the
same SAE as on the layer's activations dumped to .npy, --positions last and mask, several hooks
from shared passes, sae.layer_activations, and bad input as one line."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from cli_helpers import cli_env
from hypothesis import given, settings
from hypothesis import strategies as st
from sequence_net import VOCAB, D, T, Tiny, padded, tokens
from torch.utils.data import TensorDataset

import sae
from sae.data.matrixdata import BLOCK_BYTES, BlockShuffle
from sae.data.streamed import StreamedDataModule, register_python_source, release_python_source
from sae.data.tokens import RowLayout, TokenShuffle

HOOK = "encoder.layers.0"
SETTINGS = {"hidden": 32, "model": "topk", "k": 4, "batch_size": 32, "no_figures": True,
            "no_features": True, "no_report": True, "progress": "off"}


def streamed(source, hook=HOOK, **kw) -> StreamedDataModule:
    register_python_source(source)
    dm = StreamedDataModule("python", hook, **{"val_size": 40, "batch_size": 32,
                                               "buffer_rows": 256, **kw})
    dm.setup()
    return dm


def test_a_sequence_layer_is_one_row_per_position_shuffled_across_inputs():
    net, x = Tiny(), tokens()
    try:
        dm = streamed((net, TensorDataset(x)))
        n = len(dm.train_index)
        assert dm.train_x.shape == (n * T, D) and dm.val_x.shape == (40 * T, D)
        # rows are numbered input by input, position by position: sae.layer_activations' rows
        torch.testing.assert_close(dm.train_x.fetch(np.arange(n * T)),
                                   sae.layer_activations(net, HOOK, x[dm.train_index]))
        order = dm.sampler(n * T).epoch_order(0)
        assert sorted(order.tolist()) == list(range(n * T))
        first = order[:32] // T  # the inputs of the first batch: mixed, not one input's T rows
        assert len(set(first.tolist())) > 16
        # served from the chunk computed for it: the rows of the order's positions
        torch.testing.assert_close(dm.train_x[order[100:164]],
                                   dm.train_x.fetch(order[100:164]))
        assert dm.test_texts[0].startswith(f"input {dm.test_row_numbers[0]} · position 0: [")
    finally:
        release_python_source()


def test_the_hooked_sae_is_the_sae_of_the_layers_npy_dump(tmp_path):
    """The same rows, the same first epoch's batches: the .npy file is laid out so that its
    data module carves the hook's validation rows and serves the hook's batches in order."""
    net, x, test = Tiny(), tokens(), tokens(60, seed=2)
    source = (net, {"train": TensorDataset(x), "test": TensorDataset(test)})
    try:
        dm = streamed(source)
        index, order = dm.train_index, dm.sampler(len(dm.train_x)).epoch_order(0)
        val_inputs = np.setdiff1d(np.arange(len(x)), index)
    finally:
        release_python_source()
    train_rows = sae.layer_activations(net, HOOK, x[index]).numpy()
    val_rows = sae.layer_activations(net, HOOK, x[val_inputs]).numpy()
    n_file = len(train_rows) + len(val_rows)
    perm = torch.randperm(n_file, generator=torch.Generator().manual_seed(0)).numpy()
    file_val, file_train = np.sort(perm[:len(val_rows)]), np.sort(perm[len(val_rows):])
    served = list(BlockShuffle(len(file_train), 0, BLOCK_BYTES // (D * 4)))
    rows = np.empty((n_file, D), np.float32)
    rows[file_val] = val_rows
    rows[file_train[served]] = train_rows[order]
    np.save(tmp_path / "train.npy", rows)
    np.save(tmp_path / "test.npy", sae.layer_activations(net, HOOK, test).numpy())
    (tmp_path / "acts.json").write_text(json.dumps({"format": "sae-activations/1",
                                                    "train": {"x": "train.npy"},
                                                    "test": {"x": "test.npy"}}))
    hooked = sae.train(source=source, hook=HOOK, out=str(tmp_path / "hook"), epochs=1,
                       val_size=40, buffer_rows=256, **SETTINGS)
    dumped = sae.train(data=str(tmp_path / "acts.json"), out=str(tmp_path / "npy"), epochs=1,
                       val_size=len(val_rows), **SETTINGS)
    a, b = sae.load(hooked), sae.load(dumped)
    assert a.config.input_dim == D
    for name, tensor in a.state_dict().items():
        torch.testing.assert_close(b.state_dict()[name], tensor, rtol=1e-4, atol=1e-5)
    ma, mb = (json.loads((f / "metrics.json").read_text()) for f in (hooked, dumped))
    assert ma["steps"] == mb["steps"] == -(-len(train_rows) // 32)
    assert ma["fvu"] == pytest.approx(mb["fvu"], rel=1e-4)


def test_positions_last_and_mask():
    net, data = Tiny(), padded()
    mask = data.tensors[1]
    try:
        dm = streamed((net, data), positions="mask")
        real = int(mask[dm.train_index].sum())
        assert len(dm.train_x) == real < len(dm.train_index) * T
        torch.testing.assert_close(
            dm.train_x.fetch(np.arange(real)),
            sae.layer_activations(net, HOOK, data.tensors[0][dm.train_index],
                                  positions="mask", mask=mask[dm.train_index]))
        order = dm.sampler(real).epoch_order(0)
        torch.testing.assert_close(dm.train_x[order[:64]], dm.train_x.fetch(order[:64]))
        release_python_source()
        dm = streamed((net, data), positions="last")
        assert len(dm.train_x) == len(dm.train_index)
        # the last real position of each input (a tuple's mask picks rows; the model runs on
        # the tokens alone)
        full = net.encoder.layers[0](net.embed(data.tensors[0][dm.train_index[:5]]))
        last = mask[dm.train_index[:5]].sum(1) - 1
        torch.testing.assert_close(dm.train_x.fetch(np.arange(5)),
                                   full[torch.arange(5), last].detach())
    finally:
        release_python_source()


def test_dict_items_pass_the_mask_to_the_model():
    net, data = Tiny(), padded(40)
    items = [{"tokens": t, "attention_mask": m, "label": i % 3}
             for i, (t, m) in enumerate(zip(*data.tensors, strict=True))]
    rows = sae.layer_activations(net, HOOK, items, positions="mask")
    mask = data.tensors[1]
    full = net.encoder.layers[0](net.embed(data.tensors[0]), src_key_padding_mask=~mask)
    torch.testing.assert_close(rows, full[mask].detach())


def test_several_hooks_share_passes_and_each_run_is_that_hooks_alone(tmp_path):
    net, data = Tiny(), TensorDataset(tokens())
    settings = {**SETTINGS, "epochs": 2, "val_size": 40, "limit_test": 40, "buffer_rows": 256}
    calls = []
    net.embed.register_forward_hook(lambda *a: calls.append(1))
    both = sae.train(source=(net, data), hook=[HOOK, "encoder.layers.1"],
                     out=str(tmp_path / "both"), **settings)
    assert both == [tmp_path / "both" / HOOK, tmp_path / "both" / "encoder.layers.1"]
    assert sorted(p.name for p in (tmp_path / "both").iterdir()) == [HOOK, "encoder.layers.1"]
    shared = len(calls)
    assert shared <= 3 + 300 // (256 // T) + 2  # probes, then one pass per batch for both
    alone = sae.train(source=(net, data), hook="encoder.layers.1",
                      out=str(tmp_path / "alone"), **settings)
    assert len(calls) - shared > shared  # one layer alone runs the net every chunk, per epoch
    for name, tensor in sae.load(alone).state_dict().items():
        torch.testing.assert_close(sae.load(both[1]).state_dict()[name], tensor, rtol=0,
                                   atol=1e-6)
    record = json.loads((both[0] / "data.json").read_text())
    assert (record["hook"], record["positions"], record["sequence"], record["width"]) == \
        (HOOK, "all", T, D)


@pytest.mark.parametrize("args, message", [
    (["--hook", HOOK, "--positions", "first"],
     "--positions: must be one of all, last, mask, got 'first'"),
    (["--hook", "embed.weight_x"], "has no layer 'embed.weight_x'"),
    (["--hook", "summary", "--positions", "last"],
     "--positions last: --hook summary's outputs have shape (1, 16), no positions"),
    (["--hook", "pool", "--source", "sequence_net:flat_factory"],
     "--hook pool: the layer's outputs have shape (1,); an SAE reads [B, D]"),
    (["--hook", HOOK, "--positions", "mask"], "--positions mask: the dataset gives no mask"),
    (["--hook", HOOK, "--source", "sequence_net:short_mask_factory"],
     "the dataset's mask has shape (5,) per input, the layer's outputs 8 positions"),
    (["--hook", f"{HOOK},{HOOK}"], f"--hook {HOOK},{HOOK}: name each layer once"),
    (["--hook", f"{HOOK},nope"], "has no layer 'nope'"),
    (["--hook", f"{HOOK},summary", "--strategy", "ddp"], "one --hook per command"),
])
def test_bad_input_is_one_line_before_any_folder(tmp_path, data_dir, args, message):
    done = cli(tmp_path, data_dir, [*args, "--out", str(tmp_path / "run"), "--epochs", "1"])
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], lines
    assert not (tmp_path / "run").exists()


def cli(tmp_path, data_dir, args):
    path = os.pathsep.join([str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")])
    return subprocess.run([sys.executable, "-m", "sae.run", "--source", "sequence_net:factory",
                           *args], capture_output=True, text=True,
                          env=cli_env(tmp_path, data_dir, PYTHONPATH=path), cwd=tmp_path,
                          timeout=600)


def test_the_command_trains_several_hooks_into_a_folder_each(tmp_path, data_dir):
    done = cli(tmp_path, data_dir, ["--hook", f"{HOOK},encoder.layers.1", "--out", "runs/both",
                                    "--epochs", "1", "--val-size", "40", "--limit-test", "40",
                                    "--hidden", "32", "--model", "topk", "--k", "4",
                                    "--no-figures", "--no-features", "--no-report"])
    assert done.returncode == 0, done.stderr
    assert "reading 2 layers in one pass over the inputs" in done.stdout
    both = tmp_path / "runs" / "both"
    assert sorted(p.name for p in both.iterdir()) == [HOOK, "encoder.layers.1"]  # no row files
    for hook in (HOOK, "encoder.layers.1"):
        record = json.loads((both / hook / "data.json").read_text())
        assert (record["hook"], record["sequence"]) == (hook, T)
        assert 0 < json.loads((both / hook / "metrics.json").read_text())["fvu"] < 1


def test_layer_activations_refuses_bad_positions_and_masks():
    net, x = Tiny(), tokens(10)
    with pytest.raises(ValueError, match="positions must be one of all, last, mask"):
        sae.layer_activations(net, HOOK, x, positions="every")
    with pytest.raises(ValueError, match="mask must be a bool tensor"):
        sae.layer_activations(net, HOOK, x, mask=torch.ones(10, T))
    with pytest.raises(ValueError, match="the dataset's mask has shape"):
        sae.layer_activations(net, HOOK, x, mask=torch.ones(10, T + 1, dtype=torch.bool))


def section_code(path: Path, heading: str) -> str:
    """The Python code blocks of the section ``heading`` of a markdown file, joined."""
    text = path.read_text()
    section = text.split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]
    blocks = [b.split("\n", 1)[1] for b in section.split("```python")[1:]]
    return "\n".join(b.split("```", 1)[0] for b in blocks)


def test_the_sequence_models_example_of_the_library_docs_runs(tmp_path, monkeypatch):
    code = section_code(Path(__file__).parents[1] / "docs" / "library.md", "Sequence models")
    assert "sae.layer_activations" in code and "encode(rows)" in code
    monkeypatch.chdir(tmp_path)
    scope: dict = {}
    exec(compile(code, "library.md", "exec"), scope)  # noqa: S102 - the docs' own example
    assert scope["codes"].shape == (80, 32)
    run = tmp_path / "runs" / "tiny-layer-1"
    assert json.loads((run / "data.json").read_text())["sequence"] == 8
    # the feature browser shows a row as its input and position, the tokens around it
    assert re.search(r"input \d+ · position \d+: [^<]*\[\d+\]", (run / "features.html").read_text())


@settings(max_examples=60, deadline=None)
@given(counts=st.lists(st.integers(0, 6), min_size=1, max_size=40), chunk=st.integers(1, 9),
       seed=st.integers(0, 2**16), epoch=st.integers(0, 3))
def test_the_buffers_order_is_whole_inputs_per_chunk_rows_shuffled_within(counts, chunk, seed,
                                                                          epoch):
    layout = RowLayout(np.array(counts))
    shuffle = TokenShuffle(layout, chunk, seed)
    shuffle.set_epoch(epoch)
    order = shuffle.epoch_order(epoch)
    assert sorted(order.tolist()) == list(range(len(layout)))  # every row once
    assert list(iter(shuffle)) == order.tolist()  # what the loader draws is this order
    start = 0
    while start < len(order):
        end = shuffle.span(start, chunk)
        assert shuffle.chunk_of(int(order[start]), chunk) == (epoch, start)
        inputs = layout.inputs_of(order[start:end])
        held = set(inputs.tolist())
        assert len(held) <= chunk  # at most `chunk` inputs, each with all its rows
        assert sum(counts[i] for i in held) == end - start
        start = end


class Words(TensorDataset):
    """Token ids with their vocabulary: the feature browser shows the tokens as words."""

    vocab = [f"w{i}" for i in range(VOCAB)]


def test_a_dataset_with_its_vocabulary_shows_its_rows_as_words():
    from sae.data.tokens import row_texts

    x = tokens()
    texts = row_texts(Words(x), np.arange(len(x)), np.array([3, 3]), np.array([0, 5]))
    ids = x[3].tolist()
    assert texts[0].startswith(f"input 3 · position 0: [w{ids[0]}] w{ids[1]} ")
    assert f"[w{ids[5]}]" in texts[1] and texts[1].startswith("input 3 · position 5: … ")
    plain = row_texts(TensorDataset(x), np.arange(len(x)), np.array([3]), np.array([0]))
    assert plain[0].startswith(f"input 3 · position 0: [{ids[0]}] {ids[1]} ")
