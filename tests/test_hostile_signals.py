"""Signals and bad luck where the process boundary is the point: a stop at any moment of a
start is one line, its exit code (130 or 143) within a second or two, and nothing left that the
same command cannot use; memory stays bounded on hostile data. Each command runs as a user runs
it, in a process of its own (issue 52, cases 1, 2, 3, 5 and 7, and a slow data check)."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
from cli_helpers import cli_env

from sae.data import matrix

STOP_CODES = {signal.SIGINT: 130, signal.SIGTERM: 143}
WORDS = {signal.SIGINT: "interrupted", signal.SIGTERM: "terminated"}
TINY = ["--hidden", "16", "--batch-size", "32", "--val-size", "50", "--no-figures",
        "--no-report", "--no-features", "--progress", "off"]


@pytest.fixture
def good(tmp_path) -> Path:
    r = np.random.default_rng(0)
    np.save(tmp_path / "good.npy", r.normal(size=(400, 8)).astype(np.float32))
    return tmp_path


def handles_sigterm(pid: int, timeout: float = 30.0) -> None:
    """Wait until process ``pid`` catches SIGTERM: its command's main() has started (what a
    stop "at any moment" is measured from; before it, the interpreter itself is starting, and
    on a loaded machine that takes longer than any fixed delay)."""
    status = Path(f"/proc/{pid}/status")
    if not status.is_file():  # not Linux: fall back on time
        time.sleep(1.0)
        return
    deadline = time.perf_counter() + timeout
    while time.perf_counter() < deadline:
        for line in status.read_text().splitlines():
            if line.startswith("SigCgt:") and int(line.split()[1], 16) >> (signal.SIGTERM - 1) & 1:
                return
        time.sleep(0.01)
    raise AssertionError(f"process {pid} never caught SIGTERM")


def stopped(proc: subprocess.Popen, sig: int, timeout: float = 60) -> tuple[int, str, float]:
    """Send ``sig``; the exit code, stderr and the seconds the process took to exit."""
    start = time.perf_counter()
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=timeout)
    return proc.returncode, err, time.perf_counter() - start


def one_stop_line(err: str, sig: int) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(WORDS[sig]), err[-3000:]
    assert "Traceback" not in err and "terminate called" not in err
    return lines[0]


# --------------------------------------------------------------------------- bounded memory


def max_rss_bytes(args, cwd, data_dir) -> tuple[int, int, str]:
    """(exit code, peak resident memory in bytes, stderr) of ``python -m sae.run args``, the
    peak measured by a parent of its own (ru_maxrss of its one child)."""
    probe = textwrap.dedent("""
        import resource, subprocess, sys
        r = subprocess.run([sys.executable, "-m", "sae.run", *sys.argv[1:]],
                           stderr=subprocess.PIPE, text=True)
        sys.stderr.write(r.stderr)
        print(r.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024)
    """)
    result = subprocess.run([sys.executable, "-c", probe, *map(str, args)], cwd=cwd,
                            env=cli_env(cwd, data_dir), capture_output=True, text=True,
                            timeout=300)
    code, rss = map(int, result.stdout.splitlines()[-1].split())  # after any status lines
    return code, rss, result.stderr


@pytest.mark.slow
@pytest.mark.parametrize("case", ["label 2**40", "texts /dev/zero"])
def test_hostile_data_stays_under_2_gb(good, data_dir, case):
    labels = np.zeros(400, np.int64)
    labels[0] = 2**40
    np.save(good / "labels.npy", labels)
    train = {"x": "good.npy", **({"labels": "labels.npy"} if case == "label 2**40"
                                 else {"texts": "/dev/zero"})}
    (good / "m.json").write_text(json.dumps({"format": matrix.FORMAT, "train": train}))
    code, rss, err = max_rss_bytes(["--data", good / "m.json", *TINY, "--out", good / "run"],
                                   good, data_dir)
    assert code == 2 and rss < 2 * 2**30, (rss, err[-2000:])
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert not (good / "run").exists()


# --------------------------------------------------------------------------- sae.run


SLOW_CHECK = textwrap.dedent("""
    # python -m sae.run whose NaN scan takes a minute (sleeping in steps): a large file's check
    import os, runpy, time
    from pathlib import Path
    import sae.data.matrix

    def slow(x, progress=None):
        Path(os.environ["SCAN_STARTED"]).touch()
        for _ in range(600):
            time.sleep(0.1)
        return None

    sae.data.matrix.scan_matrix = slow
    runpy.run_module("sae.run", run_name="__main__", alter_sys=True)
""")


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_stop_during_a_slow_data_check_is_one_line_within_a_second(good, data_dir, sig):
    started = good / "scanning"
    proc = subprocess.Popen([sys.executable, "-c", SLOW_CHECK, "--data",
                             str(good / "good.npy"), *TINY, "--out", str(good / "run")],
                            cwd=good, env=cli_env(good, data_dir, SCAN_STARTED=str(started)),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while not started.exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    assert started.exists(), proc.communicate()[1][-2000:]
    time.sleep(0.3)
    code, err, seconds = stopped(proc, sig)
    assert code == STOP_CODES[sig] and seconds < 2.0, (code, seconds, err[-2000:])
    assert "before training started; nothing was written" in one_stop_line(err, sig)
    assert not (good / "run").exists()


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
@pytest.mark.parametrize("data", ["activations", "images"])
def test_a_stop_while_torch_is_imported_ends_the_start_at_once(good, data_dir, sig, data):
    """Before the claim (a data check imports torch and Lightning) and after it (an image
    run's imports): one line, no abort from inside torch's import, no folder, in a second or
    two."""
    np.save(good / "rows.npy", np.random.default_rng(1).normal(size=(20_000, 64))
            .astype(np.float32))
    which = ["--data", str(good / "rows.npy")] if data == "activations" else \
        ["--limit-train", "20000", "--val-size", "50", "--limit-test", "256"]
    out = good / "made" / "run"
    for delay in (0.0, 0.6, 1.6, 3.0):  # after main() catches signals
        proc = subprocess.Popen([sys.executable, "-m", "sae.run", *TINY, *which, "--epochs",
                                 "50", "--out", str(out)], cwd=good,
                                env=cli_env(good, data_dir), stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, text=True)
        handles_sigterm(proc.pid)
        time.sleep(delay)
        if (out / "checkpoints").is_dir():  # training already: not a start any more
            proc.kill()
            proc.wait()
            break
        code, err, seconds = stopped(proc, sig)
        assert code == STOP_CODES[sig] and seconds < 2.0, (delay, code, seconds, err[-3000:])
        one_stop_line(err, sig)
        assert not (good / "made").exists(), (delay, err)


# --------------------------------------------------------------------------- sae.data.layer


@pytest.mark.slow
def test_the_layer_stops_in_one_line_even_started_with_sigint_ignored(tmp_path, data_dir):
    """Case 7: Ctrl-C at 2 s was a traceback, and started in the background SIGINT was
    ignored; SIGTERM likewise. Nothing is left in --out's place."""
    for sig, delay in ((signal.SIGINT, 2.0), (signal.SIGTERM, 1.0)):
        out = tmp_path / "made" / "layer"
        proc = subprocess.Popen([sys.executable, "-m", "sae.layer", "--epochs", "1",
                                 "--limit-train", "3000", "--out", str(out)], cwd=tmp_path,
                                env=cli_env(tmp_path, data_dir), stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, text=True,
                                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
        time.sleep(delay)
        code, err, seconds = stopped(proc, sig)
        assert code == STOP_CODES[sig] and seconds < 2.0, (sig, code, seconds, err[-2000:])
        one_stop_line(err, sig)
        assert not (tmp_path / "made").exists()


# --------------------------------------------------------------------------- sae.pages.gallery


GALLERY = textwrap.dedent("""
    # python -m sae.gallery with one run (mnist, topk): what a retry does is the point here
    import sys
    import sae.pages.gallery as gallery
    gallery.MODELS, gallery.DATASETS = ("topk",), ("mnist",)
    sys.exit(gallery.main(sys.argv[1:]))
""")
GALLERY_FLAGS = ["--epochs", "1", "--limit-train", "1024", "--val-size", "256", "--limit-test",
                 "256", "--hidden", "32", "--batch-size", "128", "--k", "8", "--no-features",
                 "--no-report"]


def gallery(tmp_path, data_dir, **popen) -> subprocess.Popen:
    script = tmp_path / "gallery.py"
    script.write_text(GALLERY)
    return subprocess.Popen([sys.executable, str(script), "--out", str(tmp_path / "g"),
                             "--runs", str(tmp_path / "gr"), *GALLERY_FLAGS], cwd=tmp_path,
                            env=cli_env(tmp_path, data_dir), stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, start_new_session=True, **popen)


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGKILL], ids=["SIGINT", "SIGKILL"])
def test_a_stopped_gallery_is_continued_by_the_same_command(tmp_path, data_dir, sig):
    """Case 5: stopped while its training starts (Ctrl-C reaches the whole process group, as
    from a terminal; or kill -9), the same command finishes the gallery."""
    run = tmp_path / "gr" / "mnist-topk"
    proc = gallery(tmp_path, data_dir)
    deadline = time.time() + 120
    while not (run / "config.yaml").exists() and time.time() < deadline:
        time.sleep(0.02)
    os.killpg(proc.pid, sig)
    _, err = proc.communicate(timeout=120)
    if sig == signal.SIGINT:
        assert proc.returncode == 130, err[-3000:]
        assert err.strip().splitlines()[-1] == \
            "interrupted; run the same command again to continue"
        assert "Traceback" not in err
        # the training undid its start, or kept a checkpoint to resume from
        assert not run.exists() or (run / "checkpoints" / "last.ckpt").is_file()
    again = gallery(tmp_path, data_dir)
    _, err = again.communicate(timeout=300)
    assert again.returncode == 0, err[-3000:]
    assert (run / "metrics.json").is_file() and (tmp_path / "g" / "README.md").is_file()
