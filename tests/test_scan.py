"""Large activation matrices: rows read from the file on demand (sae.data.npyfile.FileRows), one
streamed pass for the NaN check, the hash and the moments (sae.data.scan), the start-up's status
lines (sae.system.status), and the training order drawn as the epoch goes."""

import hashlib
import math
import pickle
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
import torch
from cli_helpers import cli_env
from hypothesis import given, settings
from hypothesis import strategies as st

from sae.data import npyfile, scan
from sae.data.matrixdata import BlockShuffle, MatrixDataModule, streamed_moments
from sae.data.npyfile import FileRows, open_rows
from sae.system import status


def save(path, array):
    np.save(path, array)
    return path


# --------------------------------------------------------------------------- rows from the file


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 200), d=st.integers(1, 9),
       dtype=st.sampled_from([np.float16, np.float32, np.float64]), gap=st.integers(1, 300),
       data=st.data())
def test_rows_read_from_the_file_are_numpys_rows(tmp_path_factory, n, d, dtype, gap, data):
    x = np.random.default_rng(n * d).normal(size=(n, d)).astype(dtype)
    rows = open_rows(save(tmp_path_factory.mktemp("rows") / "x.npy", x))
    index = data.draw(st.lists(st.integers(-n, n - 1), max_size=3 * n))
    start, stop = data.draw(st.integers(-n - 2, n + 2)), data.draw(st.integers(-n - 2, n + 2))
    old = npyfile.GAP_BYTES
    npyfile.GAP_BYTES = gap  # rows read in one call or apart: the same rows either way
    try:
        np.testing.assert_array_equal(rows[np.array(index, dtype=np.int64)],
                                      x[np.array(index, dtype=np.int64)])
        np.testing.assert_array_equal(rows[start:stop], x[start:stop])
        np.testing.assert_array_equal(rows[index[0] if index else 0], x[index[0] if index else 0])
    finally:
        npyfile.GAP_BYTES = old
    assert rows[torch.tensor([0])].dtype == dtype


def test_rows_out_of_range_or_strided_are_refused(tmp_path):
    rows = open_rows(save(tmp_path / "x.npy", np.zeros((5, 2), np.float32)))
    for index in (5, -6, [0, 5], np.array([-6])):
        with pytest.raises(IndexError):
            rows[index]
    with pytest.raises(IndexError, match="step 1"):
        rows[::2]


def test_rows_pickle_by_opening_the_file_again(tmp_path):
    x = np.arange(12, dtype=np.float32).reshape(6, 2)
    rows = pickle.loads(pickle.dumps(open_rows(save(tmp_path / "x.npy", x))))
    assert isinstance(rows, FileRows)
    np.testing.assert_array_equal(rows[[4, 1]], x[[4, 1]])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/maps")
def test_checking_and_training_reads_never_map_the_file(tmp_path):
    """A map of a file read whole counts all of it in the process's resident memory; reads do
    not (the page cache is the kernel's)."""
    path = save(tmp_path / "x.npy", np.random.default_rng(0).normal(size=(3000, 4)).astype(
        np.float32))
    dm = MatrixDataModule(path, val_size=100)
    dm.load()
    dm.train_mean, dm.train_x[torch.arange(0, 2000, 7)], dm.train_pca()
    assert str(path) not in open("/proc/self/maps").read()


# --------------------------------------------------------------------------- one pass


@settings(max_examples=30, deadline=None)
@given(n=st.integers(2, 120), d=st.integers(1, 7), block_rows=st.integers(1, 50),
       dtype=st.sampled_from([np.float16, np.float32, np.float64]), tail=st.binary(max_size=9))
def test_one_pass_gives_the_files_hash_and_exact_column_sums(tmp_path_factory, n, d, block_rows,
                                                              dtype, tail):
    x = np.random.default_rng(n + d).normal(size=(n, d)).astype(dtype)
    path = save(tmp_path_factory.mktemp("scan") / "x.npy", x)
    with open(path, "ab") as f:  # bytes after the data are the file's too: hashed as such
        f.write(tail)
    old = scan.BLOCK_BYTES
    scan.BLOCK_BYTES = block_rows * d * x.itemsize
    seen = []
    try:
        found = scan.scan_matrix(open_rows(path), progress=seen.append)
    finally:
        scan.BLOCK_BYTES = old
    assert found.sha256 == hashlib.sha256(path.read_bytes()).hexdigest()
    assert found.bad is None
    x64 = x.astype(np.float64)
    np.testing.assert_allclose(found.sums, x64.sum(0), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(found.squares, (x64 * x64).sum(0), rtol=1e-12)
    assert seen == sorted(seen) and seen[-1] == x.nbytes and len(seen) == math.ceil(
        n / block_rows)


def test_a_float64_value_beyond_float32_is_found_and_large_valid_ones_are_not(tmp_path):
    big = np.full((50, 3), 3e38)  # within float32, but each column's squares pass F32_MAX²
    assert scan.scan_matrix(open_rows(save(tmp_path / "ok.npy", big))).bad is None
    big[37, 1] = 1e39
    row, why = scan.scan_matrix(open_rows(save(tmp_path / "bad.npy", big))).bad
    assert row == 37 and "beyond the float32 range" in why


@pytest.mark.parametrize("test_split", [False, True])
def test_the_training_moments_from_the_pass_equal_a_pass_over_the_training_rows(tmp_path,
                                                                                test_split):
    r = np.random.default_rng(3)
    x = (r.normal(size=(1500, 6)) * [1, 10, 100, 0.1, 5, 1] + 40).astype(np.float32)
    path = save(tmp_path / "x.npy", x)
    if test_split:
        import json

        save(tmp_path / "t.npy", x[:300])
        path = tmp_path / "data.json"
        path.write_text(json.dumps({"format": "sae-activations/1", "train": {"x": "x.npy"},
                                    "test": {"x": "t.npy"}}))
    dm = MatrixDataModule(path, val_size=200)
    dm.load()
    mean, var = dm.train_mean, dm.train_variance
    assert dm.data.train.scan is not None
    ref_mean, ref_var = streamed_moments(dm.train_x)
    torch.testing.assert_close(mean, ref_mean, rtol=1e-6, atol=0)
    assert var == pytest.approx(ref_var, rel=1e-9)
    train = x[dm.train_index].astype(np.float64)
    assert var == pytest.approx(float(((train - train.mean(0)) ** 2).sum(1).mean()), rel=1e-9)


def test_limit_train_takes_the_moments_of_its_own_rows(tmp_path):
    x = np.random.default_rng(4).normal(size=(900, 3)).astype(np.float32) * [1, 2, 3]
    dm = MatrixDataModule(save(tmp_path / "x.npy", x), val_size=100, limit_train=50)
    dm.load()
    torch.testing.assert_close(dm.train_mean, torch.from_numpy(
        x[dm.train_index].astype(np.float64).mean(0)).float())


# --------------------------------------------------------------------------- the training order


def eager_block_order(n: int, block: int, g: torch.Generator) -> list[int]:
    """The order as it was drawn whole before the first batch (runs made then resume exactly)."""
    starts = torch.arange(0, n, block)[torch.randperm(math.ceil(n / block), generator=g)]
    order = []
    for start in starts.tolist():
        order += (start + torch.randperm(min(block, n - start), generator=g)).tolist()
    return order


@settings(max_examples=25, deadline=None)
@given(n=st.integers(1, 400), block=st.integers(1, 64), epoch=st.integers(0, 3),
       served=st.integers(0, 400))
def test_the_order_drawn_as_the_epoch_goes_is_the_order_drawn_whole(n, block, epoch, served):
    shuffle = BlockShuffle(n, seed=7, block=block)
    shuffle.set_epoch(epoch)
    state = np.random.SeedSequence([7, epoch]).generate_state(2)
    whole = eager_block_order(n, block, torch.Generator().manual_seed(
        int(state[0]) << 32 | int(state[1])))
    assert list(shuffle) == whole
    shuffle.load_state_dict({"epoch": epoch, "served": min(served, n)})
    assert list(shuffle) == whole[min(served, n):]


# --------------------------------------------------------------------------- status lines


def test_status_lines_name_the_tasks_in_progress_and_how_far_they_got():
    lines = []
    with status.StartupStatus(every=0.05, write=lines.append):
        time.sleep(0.2)
        assert lines == []  # nothing declared: nothing to say
        with status.task("importing torch and Lightning"), status.task("checking x.npy"):
            status.note("checking x.npy", "1.21 of 3.07 GB read")
            status.note("no such task", "ignored")
            time.sleep(0.3)
        time.sleep(0.1)
        said = len(lines)
    time.sleep(0.2)
    assert len(lines) == said  # stopped: no more lines
    assert lines and all(line.startswith("starting (") for line in lines)
    assert "importing torch and Lightning; checking x.npy, 1.21 of 3.07 GB read" in lines[-1]
    with status.task("nobody listens"):  # no status running: nothing happens
        status.note("nobody listens", "x")
    assert status.running() is None


def test_progress_lines_say_the_step_the_rate_and_the_time_left():
    from sae.training.progress import progress_line

    class Trainer:
        estimated_stepping_batches, global_step, current_epoch, max_epochs = 46798, 1200, 0, 2
        num_training_batches, max_steps = 23399, -1

    line = progress_line(Trainer(), 0.0041)
    # the step as metrics.csv names it (from 0), then the count done
    assert line.startswith("epoch 1/2 · step 1199 · 1200 of 46798 done · 4.1 ms a step · "
                           "about 3:07 left")


SLOW_SCAN = textwrap.dedent("""
    # python -m sae.run whose data check takes 2 s, with status lines every 0.25 s
    import runpy, time
    import sae.data.matrix, sae.data.scan, sae.system.status

    real = sae.data.scan.scan_matrix

    def slow(x, progress=None):
        for k in range(8):
            time.sleep(0.25)
            progress(k * 100)
        return real(x, progress)

    sae.data.matrix.scan_matrix = slow
    sae.system.status.EVERY = 0.25
    runpy.run_module("sae.run", run_name="__main__", alter_sys=True)
""")


@pytest.mark.slow
def test_a_run_says_what_its_start_up_does_until_the_first_step(tmp_path, data_dir):
    save(tmp_path / "x.npy", np.random.default_rng(0).normal(size=(600, 8)).astype(np.float32))
    r = subprocess.run([sys.executable, "-c", SLOW_SCAN, "--data", "x.npy", "--max-steps", "3",
                        "--hidden", "16", "--val-size", "50", "--no-figures", "--out", "run"],
                       cwd=tmp_path, env=cli_env(tmp_path, data_dir), capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    lines = [line for line in r.stdout.splitlines() if line.startswith("starting (")]
    assert any("checking x.npy, 0.00 of 0.00 GB read" in line for line in lines), r.stdout
    assert any("importing torch and Lightning" in line for line in lines), r.stdout


def test_the_first_training_step_ends_the_status_lines():
    from sae.training.progress import EpochLines

    class Trainer:
        global_step = 0

    with status.StartupStatus(every=60, write=print) as running:
        assert status.running() is running
        EpochLines().on_train_batch_start(Trainer(), None, None, 0)
        assert status.running() is None


def test_a_read_cut_short_by_the_system_goes_on_where_it_stopped(tmp_path, monkeypatch):
    """One read returns at most about 2 GiB on Linux: a larger span takes several."""
    import os

    x = np.random.default_rng(5).normal(size=(40, 3))
    path = save(tmp_path / "x.npy", x)
    rows = open_rows(path)
    real = os.preadv
    monkeypatch.setattr(os, "preadv", lambda fd, buffers, offset: real(fd, [buffers[0][:7]],
                                                                        offset))
    np.testing.assert_array_equal(rows[:], x)
    np.testing.assert_array_equal(rows[[39, 2, 3]], x[[39, 2, 3]])
    assert scan.scan_matrix(rows).sha256 == hashlib.sha256(path.read_bytes()).hexdigest()


def test_a_stop_signal_waits_for_a_held_block_while_our_threads_run(tmp_path):
    """A stop the kernel hands to another thread runs the main thread's handler at once, so
    every thread of the toolkit's own blocks the stop signals: signals_held then holds them."""
    import os
    import signal

    from sae.data.rundata import DataCheck
    from sae.system.process import signals_held

    x = save(tmp_path / "x.npy", np.zeros((50, 4), np.float32))
    got = []
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: got.append("handled"))
    try:
        with status.StartupStatus(every=60, write=print):
            check = DataCheck(x)
            time.sleep(0.1)  # both threads have started
            with signals_held():
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(0.3)
                got.append("end of the block")
            check.result()
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert got == ["end of the block", "handled"]
