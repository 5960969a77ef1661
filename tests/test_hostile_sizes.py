"""Every number that sizes memory is bounded by what it really costs: the model-size check counts
every parameter the chosen model has (``--attention-rank`` too), refused in one line naming the
largest setting that fits; ``python -m sae.synth`` holds a chunk of rows at a time, whatever the
number of features and rows, writes the same data as before, and stops in one line."""

import json
import math
import signal
import subprocess
import sys
import time
from dataclasses import replace

import numpy as np
import pytest
import torch
from cli_helpers import assert_one_line_error, cli_env, run_cli

from sae.data import synth
from sae.models import build_model
from sae.settings.cli import UsageError, run_config
from sae.settings.config import SAEConfig
from sae.settings.sizes import MAX_CHECKPOINT_ELEMENTS, checkpoint_values, model_values
from sae.settings.variants import MODELS
from sae.training.module import SAETraining

# --------------------------------------------------------------------------- the model's size

# settings that change a model's tensors, beside each model's defaults
SHAPES = {
    "sparsemax": [{}, {"groups": 4}, {"temperature": "learned", "groups": 2},
                  {"temperature": "energy", "energy_power_mode": "fixed", "groups": 4},
                  {"support": "batch", "groups": 2}, {"inference": "threshold"},
                  {"arch": "mlp", "mlp_width": 24, "dead_guard": "none"}],
    "entmax": [{}, {"alpha_mode": "fixed", "groups": 2}, {"temperature": "learned"}],
    "jumprelu": [{}, {"jumprelu_threshold": "shared", "jumprelu_gain": "input"}],
    "sparsemax-attention": [{}, {"attention_rank": 5}, {"attention_factors": "full"}],
    "topk": [{}, {"arch": "mlp", "mlp_width": 24, "dead_guard": "none"}],
}


def cases():
    for model in MODELS:
        for extra in SHAPES.get(model, [{}]):
            yield pytest.param(model, extra, id=f"{model}-{'-'.join(map(str, extra.values()))}")


@pytest.mark.parametrize("model, extra", list(cases()))
def test_the_size_formula_counts_every_value_of_each_model(model, extra):
    """The settings' count (no torch) equals the model built on the meta device, buffers and
    the trainer's own included: --attention-rank was not counted at all."""
    sae = SAEConfig(model=model, input_dim=12, hidden=32, k=4,
                    **({"dead_guard": "none"} if model == "sparsemax-attention" else {}),
                    **extra)
    sae.validate()
    with torch.device("meta"):
        module = SAETraining(build_model(sae, None, 1.0))
    params = sum(p.numel() for p in module.parameters())
    buffers = sum(b.numel() for b in module.buffers())
    assert model_values(sae) == (params, buffers)
    assert len(module.state_dict()) and checkpoint_values(sae) == 3 * params + buffers


def refusal(argv) -> str:
    with pytest.raises(UsageError) as caught:
        run_config([*argv, "--out", "x"])
    line = str(caught.value)
    assert "\n" not in line and "checkpoint holds" in line
    return line


def largest(line: str, flag: str) -> int:
    words = line.split(f"at most {flag} ")
    assert len(words) == 2, line
    return int(words[1].split()[0].replace(",", ""))


def test_a_huge_attention_rank_is_refused_naming_the_largest_that_fits():
    """H8: --attention-rank 10000000 built ~20 GB of weights; now refused from its size."""
    argv = ["--model", "sparsemax-attention", "--attention-rank", "10000000"]
    line = refusal(argv)
    assert "--attention-rank 10000000" in line
    rank = largest(line, "--attention-rank")
    argv[-1] = str(rank)
    assert run_config([*argv, "--out", "x"]).sae.attention_rank == rank
    argv[-1] = str(rank + 1)
    refusal(argv)


@pytest.mark.parametrize("argv, flag", [
    (["--model", "sparsemax-attention", "--hidden", "400000"], "--hidden"),
    (["--model", "sparsemax", "--groups", "7", "--hidden", "700000"], "--hidden"),
    (["--model", "topk", "--arch", "mlp", "--mlp-width", "2000000"], "--mlp-width"),
    (["--model", "jumprelu", "--hidden", "300000"], "--hidden"),
])
def test_the_largest_setting_named_is_exact(argv, flag):
    line = refusal(argv)
    most = largest(line, flag)
    at = [*argv, flag, str(most)]
    fits = run_config([*at, "--out", "x"]).sae
    assert checkpoint_values(fits) <= MAX_CHECKPOINT_ELEMENTS
    step = fits.groups if flag == "--hidden" else 1
    assert checkpoint_values(replace(fits, **{flag[2:].replace("-", "_"): most + step})) \
        > MAX_CHECKPOINT_ELEMENTS


@pytest.mark.slow
def test_the_command_refuses_a_huge_rank_before_any_folder_or_allocation(tmp_path, data_dir):
    started = time.monotonic()
    done = run_cli(["--model", "sparsemax-attention", "--attention-rank", "10000000",
                    "--out", tmp_path / "made" / "run"], tmp_path, data_dir, timeout=120)
    assert_one_line_error(done)
    assert "at most --attention-rank" in done.stderr and not (tmp_path / "made").exists()
    assert time.monotonic() - started < 30  # no 20 GB asked for first


# --------------------------------------------------------------------------- sae.synth's data


def reference(cfg: synth.SynthConfig):
    """The generator as it was before it was streamed (every row and support in memory, each
    chunk's draws at once): what the data of a seed must stay."""
    rng = np.random.default_rng(cfg.seed)
    directions = rng.standard_normal((cfg.features, cfg.dim))
    directions /= np.linalg.norm(directions, axis=1, keepdims=True)
    weights, partner = synth._weights(cfg, rng), synth._partners(cfg, rng)
    paired = partner >= 0
    base = max(cfg.mean_l0 / (1.0 + cfg.pair_prob * float(weights[paired].sum())) - 1.0, 0.0)
    splits = []
    for n in (cfg.train, cfg.test):
        xs, actives = [], []
        for start in range(0, n, 4096):
            m = min(4096, n - start)
            c = rng.lognormal(0.0, cfg.complexity_sigma, m)
            k = np.minimum(1 + rng.poisson(base * c / math.exp(cfg.complexity_sigma ** 2 / 2)),
                           cfg.features)
            order = np.argsort(-(np.log(weights) + rng.gumbel(size=(m, cfg.features))), axis=1)
            active = np.zeros((m, cfg.features), dtype=bool)
            take = np.arange(cfg.features)[None, :] < k[:, None]
            active[np.repeat(np.arange(m), take.sum(1)), order[take]] = True
            joins = active[:, paired] & (rng.random((m, int(paired.sum()))) < cfg.pair_prob)
            rows, cols = np.nonzero(joins)
            active[rows, partner[np.flatnonzero(paired)[cols]]] = True
            values = np.where(active, rng.lognormal(0.0, cfg.value_sigma, (m, cfg.features)),
                              0.0)
            xs.append((values @ directions).astype(np.float32))
            actives.append(active)
        splits.append([np.concatenate(xs), np.concatenate(actives)])
    (train_x, train_active), (test_x, test_active) = splits
    sigma = cfg.noise * math.sqrt(float(np.mean(np.square(train_x, dtype=np.float64))))
    for x in (train_x, test_x):
        x += rng.normal(0.0, sigma, x.shape).astype(np.float32) if sigma > 0 else 0
    return directions.astype(np.float32), train_x, test_x, train_active, test_active


SYNTH_CASES = [
    synth.SynthConfig(dim=8, features=300, train=5000, test=300, mean_l0=6.0, pair_share=1.0,
                      seed=7),
    synth.SynthConfig(dim=3, features=2050, train=4200, test=10, mean_l0=20.0, noise=0.0,
                      seed=11),
]


@pytest.mark.parametrize("cfg", SYNTH_CASES, ids=["pairs", "no-noise"])
def test_streamed_data_is_the_data_of_the_same_seed(tmp_path, monkeypatch, cfg):
    """H9: the rows, in blocks of a few rows (a tiny budget) and summed a piece at a time, are
    the arrays the in-memory generator made, file for file."""
    monkeypatch.setattr(synth, "SUM_PIECE", 1000)
    features, train_x, test_x, train_active, test_active = reference(cfg)
    synth.stream(tmp_path, cfg, "test", budget=200_000)
    for name, want in (("features", features), ("train", train_x), ("test", test_x),
                       ("train_active", np.packbits(train_active, axis=1)),
                       ("test_active", np.packbits(test_active, axis=1))):
        got = np.load(tmp_path / f"{name}.npy")
        assert got.dtype == want.dtype and np.array_equal(got, want), name
    spec = json.loads((tmp_path / "dataset.json").read_text())
    assert spec["source"]["true_l0_mean"]["train"] == round(float(train_active.sum(1).mean()), 4)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(synth.WRITTEN)
    made = synth.generate(cfg, budget=200_000)
    assert np.array_equal(made.train_x, train_x) and np.array_equal(made.test_active, test_active)


# the reproduction's shape, scaled down: 16 384 features, rows enough for one chunk in blocks
WIDE = ["--train", "2048", "--test", "10", "--dim", "2", "--features", "16384", "--mean-l0", "4"]
PEAK = """
import resource, subprocess, sys
limit = int(sys.argv[1])
def cap():
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
done = subprocess.run([sys.executable, "-m", "sae.synth", *sys.argv[2:]], preexec_fn=cap,
                      capture_output=True, text=True)
sys.stdout.write(f"{done.returncode}\\n{resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss}\\n")
sys.stdout.write(done.stderr)
"""


@pytest.mark.slow
def test_synth_holds_a_chunk_of_rows_whatever_the_features(tmp_path, data_dir):
    """H9: a 160 KB dataset of 16 384 features peaked at 2.9 GB (every support unpacked, each
    chunk's float64 temporaries); now at most its budget and a chunk's supports beside the
    interpreter, under an address-space limit that the old generator ran out of."""
    limit = 1536 * 2**20
    done = subprocess.run([sys.executable, "-c", PEAK, str(limit), *WIDE, "--out", "wide"],
                          cwd=tmp_path, env=cli_env(tmp_path, data_dir), capture_output=True,
                          text=True, timeout=300)
    code, peak_kb, *err = done.stdout.splitlines()
    assert code == "0" and "Traceback" not in done.stdout, done.stdout[-2000:]
    chunk = 2048 * 16384  # one chunk's supports, a byte each
    assert int(peak_kb) * 1024 < 150 * 2**20 + synth.BUDGET + chunk, peak_kb
    assert np.load(tmp_path / "wide" / "train_active.npy").shape == (2048, 2048)


def test_the_size_guard_counts_the_files_written():
    cfg = synth.SynthConfig(dim=4096, features=16384, train=10_000_000, test=10)
    with pytest.raises(ValueError, match="GB of files"):
        cfg.check()
    assert synth.SynthConfig(train=200_000, dim=2, features=16384, mean_l0=4).file_bytes() \
        < 500 * 2**20


# --------------------------------------------------------------------------- sae.synth's signals


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_synth_stops_in_one_line_started_in_the_background(tmp_path, data_dir, sig):
    """Started as ``cmd &`` (SIGINT ignored), Ctrl-C was ignored and SIGTERM killed it
    silently; now one line, exit 130 or 143, and nothing left where --out was."""
    proc = subprocess.Popen([sys.executable, "-m", "sae.synth", "--out", "made/ds", "--train",
                             "200000", "--dim", "64", "--features", "4096"], cwd=tmp_path,
                            env=cli_env(tmp_path, data_dir), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    assert proc.stdout.readline().startswith("dataset folder:")
    deadline = time.monotonic() + 60
    while not any((tmp_path / "made" / "ds").glob(".*.tmp")) and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.5)  # in the middle of writing
    proc.send_signal(sig)
    try:
        _, err = proc.communicate(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        pytest.fail(f"{sig.name} was ignored")
    assert proc.returncode == {signal.SIGINT: 130, signal.SIGTERM: 143}[sig], err[-2000:]
    word = {signal.SIGINT: "interrupted", signal.SIGTERM: "terminated"}[sig]
    assert err.strip().splitlines() == [f"{word}; nothing was kept"], err[-2000:]
    assert not (tmp_path / "made").exists()


def _synth(out, capsys) -> tuple[int, list[str]]:
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        code = synth.main(["--out", str(out), "--train", "200", "--test", "10", "--dim", "4",
                           "--features", "16", "--mean-l0", "2"])
    finally:
        for s, handler in handlers.items():
            signal.signal(s, handler)
    return code, capsys.readouterr().err.strip().splitlines()


def test_synth_undoes_a_failed_write_and_keeps_a_users_folder(tmp_path, monkeypatch, capsys):
    """A write that fails (a full disk) is one line and exit 1; the files are removed and the
    empty folder the user made stays."""
    out = tmp_path / "mine"
    out.mkdir()

    def full(self):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(synth._NpyFile, "commit", full)
    code, err = _synth(out, capsys)
    assert code == 1 and len(err) == 1 and "No space left" in err[0], err
    assert out.is_dir() and not any(out.iterdir())



def test_synth_runs_again_where_a_killed_run_left_its_files(tmp_path, capsys):
    """kill -9 leaves temporary files (and outputs renamed before dataset.json): the same
    command takes the folder; a user's file, or a complete dataset, is refused."""
    out = tmp_path / "data"
    out.mkdir()
    (out / ".train.npy-k1ll3d.tmp").write_bytes(b"half")
    (out / "features.npy").write_bytes(b"renamed before the kill")
    code, err = _synth(out, capsys)
    assert code == 0, err
    assert not any(p.name.endswith(".tmp") for p in out.iterdir())
    assert (out / "dataset.json").is_file()
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    code, err = _synth(out, capsys)  # a complete dataset is not a killed run's
    assert code == 2 and len(err) == 1 and "not an empty folder" in err[0]
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / ".train.npy-k1ll3d.tmp").write_bytes(b"half")
    (mine / "notes.txt").write_text("mine")
    code, err = _synth(mine, capsys)
    assert code == 2 and (mine / "notes.txt").read_text() == "mine"
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
