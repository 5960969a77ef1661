"""What python -m sae.run shows while it trains and as it ends, read as a user's terminal and a
pipe read it: the progress bar (stderr, ``--progress on``), the kept line per validation and
the finishing steps (stdout, line by line as they arrive), Ctrl-C in a pseudo-terminal, and a
resumed run's bar. Times are measured and printed (``-s``); they are asserted with wide margins
only, as the machine running the tests may be loaded."""

import errno
import fcntl
import os
import pty
import re
import select
import shlex
import struct
import subprocess
import sys
import termios
import threading
import time

import pytest
from cli_helpers import QUICK, cli_env

from sae.training.checkpoints import read_checkpoint

pytestmark = pytest.mark.slow

class Timed:
    """A started ``python -m sae.run``, its stdout read line by line and its stderr chunk by
    chunk, each stamped with the time it arrived (time.monotonic)."""

    def __init__(self, args, cwd, data_dir):
        self.proc = subprocess.Popen([sys.executable, "-m", "sae.run", *map(str, args)],
                                     cwd=cwd, env=cli_env(cwd, data_dir), stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE)
        self.lines: list[tuple[float, str]] = []
        self.chunks: list[tuple[float, str]] = []
        self._err = threading.Thread(target=self._read_stderr, daemon=True)
        self._err.start()

    def _read_stderr(self):
        while chunk := os.read(self.proc.stderr.fileno(), 65536):
            self.chunks.append((time.monotonic(), chunk.decode(errors="replace")))

    def wait(self, timeout=600) -> int:
        """Read stdout to its end; the process's exit code. ``self.ended``: when it exited."""
        for line in self.proc.stdout:
            self.lines.append((time.monotonic(), line.decode().rstrip("\n")))
        self.proc.wait(timeout=timeout)
        self.ended = time.monotonic()
        self._err.join(timeout=30)
        return self.proc.returncode

    @property
    def stdout(self) -> list[str]:
        return [line for _, line in self.lines]

    @property
    def frames(self) -> list[tuple[float, str]]:
        """Every drawing of a bar on stderr (the text between carriage returns), stamped."""
        out = []
        for t, chunk in self.chunks:
            out += [(t, f) for f in re.split(r"[\r\n]", chunk) if f.strip()]
        return out


def test_the_bar_shows_validation_metrics_epochs_count_from_1_and_a_pipe_sees_each_step(
        tmp_path, data_dir):
    out = tmp_path / "run"
    run = Timed(["--model", "l1", "--epochs", 2, "--figure-every", 1, "--no-features",
                 "--progress", "on", "--out", out, *QUICK], tmp_path, data_dir)
    assert run.wait() == 0, "".join(c for _, c in run.chunks)[-3000:]
    stderr = "".join(c for _, c in run.chunks)
    frames = run.frames
    bars = [f for _, f in frames if f.startswith("Epoch")]
    # epochs counted from 1, with the total, from the first drawing on
    assert {b.split(":")[0] for b in bars} == {"Epoch 1/2", "Epoch 2/2"}, set(bars)
    assert "Epoch 0" not in stderr and "Training" not in stderr and "v_num" not in stderr
    assert "DataLoader 0" not in stderr
    # a kept line per validation on stdout, and its numbers in the bar right after it
    lines = run.stdout
    kept = [ln for ln in lines if ln.startswith("epoch ")]
    assert [ln.split(" · ")[0] for ln in kept] == ["epoch 1/2", "epoch 2/2"]
    first_fvu = re.search(r"val FVU (\d\.\d{4})", kept[0]).group(1)
    shown = [(t, f) for t, f in frames if f.startswith("Epoch") and "val FVU=" in f]
    assert shown and f"val FVU={first_fvu}" in shown[0][1], shown[:1]
    assert re.search(r"val L0=\d+\.\d, dead=\d+\.\d %", shown[0][1]), shown[0][1]
    assert all("val FVU=" in f for _, f in frames[frames.index(shown[0]):]
               if f.startswith("Epoch"))  # kept for the rest of the run
    # the training bar is redrawn at least once a second while it trains (its drawings with
    # no validation between them)
    gaps, last = [], None
    for t, f in frames:
        if f.startswith("Epoch"):
            if last is not None:
                gaps.append(t - last)
            last = t
        elif f.startswith("Validation"):
            last = None
    print(f"longest time between two drawings of the training bar: {max(gaps):.2f} s")
    assert max(gaps) < 3
    validation_end = max(t for t, f in frames if f.startswith("Validation")
                         and t <= shown[0][0])
    print(f"validation metrics drawn {shown[0][0] - validation_end:.2f} s after the "
          "validation bar's last drawing")
    assert shown[0][0] - validation_end < 5
    # figures named from epoch 1, one per epoch with --figure-every 1
    for kind in ("decoder_atoms", "sparsity_histogram"):
        assert sorted(p.name for p in (out / "figures" / kind).iterdir()) == \
            ["epoch_1.png", "epoch_2.png"]
    # a pipe sees each finishing step's name as it starts, its time as it ends (the figures
    # were drawn in training: no step of their own)
    stamped = dict((line, t) for t, line in run.lines)
    assert "figures …" not in lines
    for name in ("test metrics", "report"):
        start = lines.index(f"{name} …")
        end = next(ln for ln in lines[start + 1:] if ln.startswith(f"{name} … "))
        took = float(re.fullmatch(rf"{name} … (\d+\.\d) s", end).group(1))
        waited = stamped[end] - stamped[f"{name} …"]
        print(f"{name}: its line came {waited:.2f} s before its end ({took} s)")
        if took >= 1:  # the start line was not held back until the step ended
            assert waited >= 0.5 * took, (name, waited, took)
    assert "not resumable" not in stderr
    # the process ends within a fraction of a second of its last line
    lingered = run.ended - run.lines[-1][0]
    print(f"the process ended {lingered:.2f} s after its last line")
    assert lines[-1] == f"report: {out / 'report.html'}"
    assert lingered < 2.0


def read_all(fd, proc, until=None, timeout=300) -> bytes:
    """Everything the pseudo-terminal ``fd`` shows until ``until`` appears in it (returned at
    once) or the process ends (EIO once the last writer closed it)."""
    data, deadline = b"", time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], 0.5)
        if ready:
            try:
                chunk = os.read(fd, 65536)
            except OSError as e:
                if e.errno == errno.EIO:
                    return data
                raise
            if not chunk:
                return data
            data += chunk
            if until is not None and re.search(until, data):
                return data
        elif proc.poll() is not None and until is None:
            return data
    raise AssertionError(f"timed out; the terminal shows: {data[-2000:]!r}")


def screen_lines(data: bytes) -> list[str]:
    """The lines a terminal would show at the end of ``data``, roughly: each line's text after
    its last carriage return, escape sequences dropped, blank lines left out."""
    text = re.sub(r"\x1b\[[0-9;]*[A-Za-z]", "", data.decode(errors="replace"))
    lines = [line.split("\r")[-1] if line.split("\r")[-1].strip() else
             next((p for p in reversed(line.split("\r")) if p.strip()), "")
             for line in text.split("\n")]
    return [line.rstrip() for line in lines if line.strip()]


TINY = ["--model", "l1", "--hidden", "32", "--batch-size", "16", "--val-size", "512",
        "--limit-test", "256", "--no-figures", "--no-features"]
# with its bar: 256 steps an epoch, so that a drawing between its first and last step is seen
# however fast a step is (drawings are 0.2 s apart)
WITH_BAR = ["--limit-train", "4096", "--epochs", "2"]
MID_FIRST_EPOCH = rb"Epoch 1/2: +\d+%\|[^\r\n]*\| +(?:[1-9]|[1-9]\d|1\d\d|2[0-4]\d|25[0-5])/256 "
# without one: 64 steps an epoch; typed once the first epoch's line is whole
WITHOUT_BAR = ["--limit-train", "1024", "--epochs", "3", "--progress", "off"]
AFTER_FIRST_EPOCH = rb"epoch 1/3[^\r\n]*\r\n"


def ctrl_c_in_a_terminal(where, data_dir, args, until):
    """A run (TINY and ``args``) in a pseudo-terminal of 120 columns, stopped by Ctrl-C typed
    into it once the terminal shows ``until``: (run folder, everything the terminal showed,
    exit code)."""
    out = where / "run"
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))

    def controlling_terminal():  # the pseudo-terminal is the run's, as a shell's is
        fcntl.ioctl(0, termios.TIOCSCTTY, 0)

    proc = subprocess.Popen([sys.executable, "-m", "sae.run", *TINY, *args, "--out", str(out)],
                            cwd=where, env=cli_env(where, data_dir),
                            stdin=slave, stdout=slave, stderr=slave, start_new_session=True,
                            preexec_fn=controlling_terminal)
    os.close(slave)
    try:
        shown = read_all(master, proc, until=until)
        os.write(master, b"\x03")  # Ctrl-C as typed: the terminal sends SIGINT and echoes ^C
        shown += read_all(master, proc)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
        os.close(master)
    return out, shown, proc.returncode


@pytest.fixture(scope="module")
def stopped(tmp_path_factory, data_dir):
    """A run with its progress bar, stopped by Ctrl-C in its first epoch."""
    return ctrl_c_in_a_terminal(tmp_path_factory.mktemp("ctrl_c"), data_dir, WITH_BAR,
                                MID_FIRST_EPOCH)


def test_ctrl_c_closes_the_bar_then_says_the_report_and_lastly_the_resume_command(stopped):
    out, shown, code = stopped
    assert code == 130, shown[-3000:]
    lines = screen_lines(shown)
    command = shlex.join([sys.executable, "-m", "sae.run", "--out", str(out), "--resume"])
    assert lines[-1] == f"interrupted; continue with: {command}", lines[-5:]
    assert lines[-2] == f"report: {out / 'report.html'}", lines[-5:]
    assert re.fullmatch(r"report … \d+\.\d s", lines[-3]), lines[-5:]  # named as it starts
    # the bar, closed at the stop with the step reached, is the line before them
    step = int(read_checkpoint(out / "checkpoints" / "last.ckpt")["global_step"])
    assert re.match(rf"Epoch 1/2: +\d+%\|.*\| {step}/256 ", lines[-4]), lines[-5:]
    text = shown.decode(errors="replace")
    assert "^Creport" not in text and "^Cinterrupted" not in text
    if "^C" in text:  # echoed after the bar: its drawing at the stop wipes it from the line
        line = text[text.rindex("^C"):].split("\n")[0].rstrip("\r")  # a pty ends lines \r\n
        assert "Epoch 1/2" in line.split("\r")[-1] and "\x1b[K" in line.split("\r")[-1], line
    after_report = text[text.index("report …"):]
    assert "Epoch" not in after_report  # no bar drawn again after the stop


def test_a_run_resumed_mid_epoch_draws_its_epoch_and_warns_of_nothing(stopped, data_dir):
    out, _, code = stopped
    assert code == 130
    step = int(read_checkpoint(out / "checkpoints" / "last.ckpt")["global_step"])
    assert 0 < step < 256  # stopped mid-epoch: the resume goes on within epoch 1
    run = Timed(["--out", out, "--resume", "--progress", "on"], out.parent, data_dir)
    assert run.wait() == 0, "".join(c for _, c in run.chunks)[-3000:]
    stderr = "".join(c for _, c in run.chunks)
    assert "not resumable" not in stderr, stderr[-2000:]
    bars = [f for _, f in run.frames if "|" in f]
    assert re.match(rf"Epoch 1/2: +\d+%\|.*\| {step}/256 ", bars[0]), bars[:2]
    assert "Training" not in stderr
    assert [ln.split(" · ")[0] for ln in run.stdout if ln.startswith("epoch ")] == \
        ["epoch 1/2", "epoch 2/2"]


def test_ctrl_c_without_a_bar_puts_the_echoed_ctrl_c_on_a_line_of_its_own(tmp_path, data_dir):
    out, shown, code = ctrl_c_in_a_terminal(tmp_path, data_dir, WITHOUT_BAR, AFTER_FIRST_EPOCH)
    assert code == 130, shown[-3000:]
    lines = screen_lines(shown)
    command = shlex.join([sys.executable, "-m", "sae.run", "--out", str(out), "--resume"])
    assert lines[-1] == f"interrupted; continue with: {command}", lines[-5:]
    assert lines[-2] == f"report: {out / 'report.html'}", lines[-5:]
    text = shown.decode(errors="replace")
    assert "^Creport" not in text and "^Cinterrupted" not in text
    if "^C" in text:  # the terminal echoes control characters (stty echoctl, the default)
        assert "^C" in lines, lines[-6:]
