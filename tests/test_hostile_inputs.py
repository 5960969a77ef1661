"""Hostile files and bad luck: every one is one short line and an exit code, in bounded time and
memory, and a start that fails leaves no folder behind (so the retry simply works).

Most cases call the commands in-process (``main(argv)``); the signal cases need a real process.
"""

import errno
import os
import signal
import struct
import subprocess
import sys
import time
import tracemalloc

import numpy as np
import pytest
from cli_helpers import QUICK, cli_env
from test_data import write_dataset, write_idx
from test_hostile_signals import handles_sigterm

from sae.settings.cli import MAX_YAML_DEPTH, UsageError, read_settings_file

# a 9-level alias bomb: 9**9 values (387 million) once expanded, in under 500 bytes
BOMB = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{n}: &{n} [{', '.join([f'*{p}'] * 9)}]\n"
    for p, n in zip("abcdefgh", "bcdefghi", strict=True))
TINY = ["--val-size", "5", "--hidden", "16", "--k", "4", "--batch-size", "8", "--max-steps", "2",
        "--no-figures", "--no-report", "--no-features"]


@pytest.fixture(autouse=True)
def _restore_process_state():
    """main() installs signal handlers and names its run folder in the environment."""
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    yield
    for s, handler in handlers.items():
        signal.signal(s, handler)
    os.environ.pop("SAE_RUN_DIR", None)


def one_line(err: str, limit: int = 1000) -> str:
    """The one ``error:`` line of ``err``; a value quoted in it is cut to a short prefix, so it
    stays well under ``limit`` (the paths in it are the test's own)."""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err[-2000:]
    assert len(lines[0]) <= limit, lines[0][:limit + 100]
    return lines[0]


def run(argv, capsys) -> tuple[int, str]:
    from sae.runner.command import main

    code = main([str(a) for a in argv])
    return code, capsys.readouterr().err


def bounded(call) -> tuple[object, float, int]:
    """``call()``'s result, its seconds and its peak of Python memory in bytes."""
    tracemalloc.start()
    start = time.perf_counter()
    try:
        result = call()
    finally:
        seconds = time.perf_counter() - start
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    return result, seconds, peak


# --------------------------------------------------------------------------- YAML


def test_alias_bomb_in_a_sweep_file_is_refused_unbuilt_even_with_dry_run(tmp_path, capsys):
    from sae.sweep.command import main

    sweep = tmp_path / "bomb.yaml"
    sweep.write_text("description:\n" + "".join("  " + line + "\n" for line in
                                                 BOMB.splitlines()) +
                     "datasets: [mnist]\nseeds: [0]\nmodels:\n  l1: {lambda: 0.1}\n")
    assert len(sweep.read_bytes()) < 600
    code, seconds, peak = bounded(lambda: main([str(sweep), "--dry-run",
                                                "--out", str(tmp_path / "sw")]))
    assert code == 2 and seconds < 5 and peak < 50e6
    assert "refused" in one_line(capsys.readouterr().err, 300)
    assert not (tmp_path / "sw").exists()


def test_alias_bomb_as_config_yaml_is_refused_by_run_and_by_report(tmp_path, capsys):
    from sae.pages.report import main as report

    bomb = tmp_path / "config.yaml"
    bomb.write_text(BOMB)
    assert len(BOMB) < 500
    (code, err), seconds, peak = bounded(
        lambda: run(["--config", bomb, "--out", tmp_path / "run"], capsys))
    assert code == 2 and seconds < 5 and peak < 50e6
    assert "aliases expand" in one_line(err, 300)
    assert not (tmp_path / "run").exists()
    # the report shows that config.yaml was refused, in bounded time, memory and size
    code, seconds, peak = bounded(lambda: report([str(tmp_path)]))
    out = capsys.readouterr()
    assert code == 0 and seconds < 5 and peak < 100e6, out.err
    page = (tmp_path / "report.html").read_text()
    assert len(page) < 1e6 and "aliases expand" in page


def test_a_report_of_metrics_json_nested_50_000_deep_says_so(tmp_path, capsys):
    from sae.pages.report import main as report

    (tmp_path / "config.yaml").write_text("model: l1\n")
    (tmp_path / "metrics.json").write_text("[" * 50_000 + "]" * 50_000)
    assert report([str(tmp_path)]) == 0, capsys.readouterr().err
    assert "metrics.json could not be read" in (tmp_path / "report.html").read_text()


def test_a_huge_value_is_quoted_by_a_short_prefix(tmp_path, capsys):
    from sae.sweep.command import main

    # 6 561 values: under the loader's bounds, so refused by the sweep's own check
    head = "datasets: [mnist]\nseeds: [0]\nmodels: {l1: {}}\n"
    sweep = tmp_path / "s.yaml"
    sweep.write_text(head + "description: [&a [x, x, x, x, x, x, x, x, x], "
                     + ", ".join(f"&{n} [{', '.join([f'*{p}'] * 9)}]" for p, n in
                                 zip("abc", "bcd", strict=True)) + "]\nprobe_loss: *d\n")
    assert main([str(sweep), "--dry-run"]) == 2
    assert "probe_loss" in one_line(capsys.readouterr().err, 300)
    sweep.write_text(head + "probe_loss: " + "x" * 500_000 + "\n")
    assert main([str(sweep), "--dry-run"]) == 2
    assert "probe_loss" in one_line(capsys.readouterr().err, 300)
    bad = tmp_path / "c.yaml"
    bad.write_text("model: " + "y" * 100_000 + "\n")
    with pytest.raises(UsageError) as e:
        read_settings_file(bad)
    assert len(str(e.value)) < 300


@pytest.mark.parametrize("text, message", [
    ("? [a, b]\n: 1\n", "plain value"),                       # a list as a key
    ("? {a: 1}\n: 1\n", "plain value"),                       # a mapping as a key
    ("[" * 50_000 + "]" * 50_000, "deeper than"),             # YAML nested 50 000 deep
    ('{"a": ' * 50_000 + "1" + "}" * 50_000, "deeper than"),  # JSON (also YAML) likewise
    ("a: &a [*a]\n", "contains it"),                          # a value that holds itself
    ("hidden: 1\n" + "#" * 1_100_000, "larger than"),
])
def test_malformed_yaml_is_one_line(tmp_path, text, message):
    path = tmp_path / "c.yaml"
    path.write_text(text)
    with pytest.raises(UsageError, match=message) as e:
        read_settings_file(path)
    assert "\n" not in str(e.value) and len(str(e.value)) < 300


def test_a_few_anchors_and_real_nesting_still_read(tmp_path):
    from sae.settings.cli import load_yaml

    path = tmp_path / "s.yaml"
    path.write_text("common: &c {hidden: 64, lr: 0.001}\nmodels:\n  l1: *c\n  kl: *c\n")
    assert load_yaml(path, "x")["models"]["kl"] == {"hidden": 64, "lr": 0.001}
    path.write_text("a: " + "[" * (MAX_YAML_DEPTH - 1) + "]" * (MAX_YAML_DEPTH - 1) + "\n")
    load_yaml(path, "x")


# --------------------------------------------------------------------------- settings


def test_values_that_would_fail_later_are_refused_before_the_folder(tmp_path, capsys,
                                                                   monkeypatch):
    from importlib.util import find_spec

    import torch

    from sae.settings.cli import LAUNCHER_ENV

    for name in LAUNCHER_ENV:
        monkeypatch.delenv(name, raising=False)
    cases = [(["--num-nodes", "2"], "launcher"),
             (["--seed", str(2**32)], "<= 4294967295"),
             (["--seed", "-1"], ">= 0"),
             (["--precision", "bf16-true"], "bf16-mixed"),
             (["--precision", "16-true"], "16-mixed")]
    if find_spec("torch_xla") is None:
        cases.append((["--accelerator", "tpu"], "torch_xla"))
    if find_spec("transformer_engine") is None:
        cases.append((["--precision", "transformer-engine"], "transformer_engine"))
    if not torch.cuda.is_available():
        cases.append((["--accelerator", "cuda"], "CUDA"))
    if not torch.backends.mps.is_available():
        cases.append((["--accelerator", "mps"], "MPS"))
    if not (torch.cuda.is_available() or torch.backends.mps.is_available()):
        cases.append((["--accelerator", "gpu"], "no CUDA or MPS"))
    out = tmp_path / "new" / "run"
    for flags, message in cases:
        code, err = run([*flags, "--out", out], capsys)
        assert code == 2, (flags, err)
        assert message in one_line(err), flags
        assert not (tmp_path / "new").exists(), flags


def test_num_nodes_is_taken_under_a_launcher(monkeypatch):
    from sae.settings.cli import run_config

    monkeypatch.setenv("SLURM_NTASKS", "8")
    assert run_config(["--num-nodes", "2", "--out", "x"]).hardware.num_nodes == 2


def test_over_long_names_are_one_line(tmp_path, capsys):
    from sae.pages.features.command import main as features
    from sae.pages.report import main as report
    from sae.sweep.command import main as compare

    long = "n" * 300
    code, err = run(["--out", tmp_path / long / "run"], capsys)
    assert code == 2 and "longer than" in one_line(err)
    assert main_code(features, [str(tmp_path / long)], capsys) == 2
    assert main_code(report, [str(tmp_path / long)], capsys) == 2
    sweep = tmp_path / "s.yaml"
    sweep.write_text(f"datasets: [mnist]\nseeds: [0]\nmodels:\n  {long}: {{model: l1}}\n")
    assert main_code(compare, [str(sweep), "--dry-run"], capsys) == 2
    assert list(tmp_path.iterdir()) == [sweep]


def main_code(main, argv, capsys) -> int:
    code = main(argv)
    one_line(capsys.readouterr().err)
    return code


# --------------------------------------------------------------------------- data files


def _float_images(folder):
    images = np.zeros((30, 28, 28), ">f4")
    path = folder / "train-images-idx3-ubyte"
    path.write_bytes(struct.pack(">BBBB3I", 0, 0, 0x0D, 3, *images.shape) + images.tobytes())


def _small_images(folder):
    write_idx(folder / "t10k-images-idx3-ubyte", np.zeros((10, 10, 10)))


def _no_test_images(folder):
    write_idx(folder / "t10k-images-idx3-ubyte", np.zeros((0, 28, 28)))
    write_idx(folder / "t10k-labels-idx1-ubyte", np.zeros(0))


def _dimensions_that_overflow(folder):
    # 2**22 * 2**21 * 2**21 = 2**64 wraps to 0 in int64: a header that promises no data
    path = folder / "t10k-images-idx3-ubyte"
    path.write_bytes(struct.pack(">BBBB3I", 0, 0, 0x08, 3, 2**22, 2**21, 2**21))


def _labels_out_of_range(folder):
    write_idx(folder / "train-labels-idx1-ubyte", np.full(30, 12))


def test_an_idx_file_that_unpacks_to_more_than_the_bound_is_refused(tmp_path, monkeypatch):
    import gzip

    import sae.data.images

    monkeypatch.setattr(sae.data.images, "MAX_IDX_BYTES", 1 << 20)
    path = tmp_path / "train-images-idx3-ubyte.gz"
    path.write_bytes(gzip.compress(bytes(2 << 20)))  # 2 MiB of zeros in a few kB
    assert path.stat().st_size < 20_000
    with pytest.raises(sae.data.images.DataSourceError, match="more than 1 MiB"):
        sae.data.images.read_idx(path)


@pytest.mark.parametrize("damage, message", [
    (_float_images, "bytes"), (_small_images, "10x10 images"), (_no_test_images, "no images"),
    (_dimensions_that_overflow, "corrupt"), (_labels_out_of_range, "label 12"),
])
def test_damaged_data_files_are_one_line_and_leave_no_folder(tmp_path, capsys, damage,
                                                             message):
    write_dataset(tmp_path / "data" / "mnist")
    damage(tmp_path / "data" / "mnist")
    code, err = run(["--data-dir", tmp_path / "data", "--out", tmp_path / "made" / "run",
                     *TINY], capsys)
    assert code == 2 and message in one_line(err)
    assert not (tmp_path / "made").exists()  # nor the parent --out created


# --------------------------------------------------------------------------- failed starts


@pytest.mark.slow
def test_a_non_finite_loss_before_the_first_checkpoint_leaves_no_folder(tmp_path, capsys,
                                                                       data_dir):
    out = tmp_path / "parent" / "run"
    code, err = run(["--model", "l1", "--lr", "1e6", "--grad-clip", "0", "--max-steps", 40,
                     "--out", out, "--data-dir", data_dir, *QUICK, "--no-figures",
                     "--no-report", "--no-features"], capsys)
    assert code == 1 and "nothing was kept" in one_line(err)
    assert not (tmp_path / "parent").exists()
    code, err = run(["--model", "l1", "--max-steps", 2, "--out", out, "--data-dir", data_dir,
                     *QUICK, "--no-figures", "--no-report", "--no-features"], capsys)
    assert code == 0, err[-2000:]
    assert (out / "metrics.json").is_file()


def test_a_failed_start_keeps_the_parents_it_did_not_make(tmp_path, capsys):
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("kept")
    code, err = run(["--data-dir", tmp_path, "--out", tmp_path / "mine" / "a" / "b" / "run",
                     *TINY], capsys)
    assert code == 2
    one_line(err)
    assert [p.name for p in (tmp_path / "mine").iterdir()] == ["notes.txt"]


def _full_disk(*args, **kwargs):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def test_a_full_disk_at_the_first_checkpoint_exits_1_and_leaves_no_folder(tmp_path, capsys,
                                                                         data_dir, monkeypatch):
    import sae.training.checkpoints

    monkeypatch.setattr(sae.training.checkpoints, "write_bytes", _full_disk)
    out = tmp_path / "run"
    code, err = run(["--model", "l1", "--max-steps", 2, "--out", out, "--data-dir", data_dir,
                     *QUICK, "--no-figures", "--no-report", "--no-features"], capsys)
    assert code == 1 and "No space left" in one_line(err)
    assert not out.exists()


def test_resume_on_a_full_disk_is_one_line_and_keeps_the_run(tmp_path, capsys, data_dir,
                                                             monkeypatch):
    import sae.training.runfolder

    out = tmp_path / "run"
    flags = ["--model", "l1", "--out", out, "--data-dir", data_dir, *QUICK, "--no-figures",
             "--no-report", "--no-features"]
    code, err = run([*flags, "--max-steps", 2], capsys)
    assert code == 0, err[-2000:]
    sae.training.runfolder.release(out)  # as the first run's exit would
    before = sorted(p.relative_to(out) for p in out.rglob("*"))
    monkeypatch.setattr(sae.training.runfolder, "new_session", _full_disk)
    code, err = run(["--out", out, "--resume", "--max-steps", 4], capsys)
    assert code == 1, err[-2000:]
    assert "No space left" in one_line(err)
    assert sorted(p.relative_to(out) for p in out.rglob("*")) == before


def test_a_signal_between_the_checks_and_the_claim_is_one_line(tmp_path, monkeypatch, capsys):
    """A Ctrl-C that lands after the settings are checked and before the run folder is claimed
    (it once escaped as a KeyboardInterrupt traceback) stops as one line, writing nothing."""
    from types import SimpleNamespace

    from sae.runner import command

    class Folder:
        @property
        def out(self):  # the first thing read after the checks: the signal lands here
            raise KeyboardInterrupt

    monkeypatch.setattr(command, "_checked",
                        lambda argv, on_stop: (SimpleNamespace(folder=Folder()), None))
    monkeypatch.setattr(command, "QUICK_EXIT", False)  # set by the stop; restored after
    code, err = run(["--out", tmp_path / "run"], capsys)
    assert code == 130
    assert err.strip() == "interrupted before training started; nothing was written"
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("sig, code, word", [(signal.SIGTERM, 143, "terminated"),
                                             (signal.SIGINT, 130, "interrupted")])
def test_a_signal_while_starting_is_one_line_and_leaves_no_folder(tmp_path, data_dir, sig,
                                                                  code, word):
    out = tmp_path / "made" / "run"
    delays = []
    # from the moment main() catches signals (before it the interpreter itself is starting,
    # for longer than any fixed delay on a loaded machine): while checking the settings; while
    # importing torch and Lightning
    for delay in (0.0, 1.5):
        proc = subprocess.Popen([sys.executable, "-m", "sae.run", "--out", str(out),
                                 "--epochs", "50", *QUICK, "--no-figures", "--no-report"],
                                cwd=tmp_path, env=cli_env(tmp_path, data_dir),
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        handles_sigterm(proc.pid)
        time.sleep(delay)
        if (out / "checkpoints" / "last.ckpt").exists():
            proc.kill()
            proc.wait()
            break
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == code, err[-2000:]
        lines = err.strip().splitlines()
        assert len(lines) == 1 and word in lines[0] and "Traceback" not in err, err[-2000:]
        assert not (tmp_path / "made").exists(), (delay, err)
        delays.append(delay)
    assert delays, "the run checkpointed before the first signal"
