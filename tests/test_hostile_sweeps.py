"""Hostile input to ``python -m sae.compare``: Ray addresses where no cluster answers, ``--jobs``
beyond the machine, names from the sweep that are not folder names, sweeps of absurd size, and
SIGTERM to a Ray driver. Each is one line and an exit code, in seconds, before any folder is
made (``--dry-run`` too); a stopped Ray driver stops its trainings as the local engine does.

Most cases call the command in-process (``main(argv)``); the signal cases need a real process
and a local Ray instance (skipped without Ray).
"""

import importlib.machinery
import json
import os
import signal
import socket
import sys
import threading
import time
import types
import uuid
from pathlib import Path

import numpy as np
import pytest
from sweep_helpers import TINY, write_yaml
from test_hostile_signals import handles_sigterm
from test_ray_engine import SWEEP, env, needs_ray, sweep_file, trainings

from sae.data import matrix
from sae.settings.cli import UsageError
from sae.sweep import command, raypool
from sae.sweep.launch import MAX_JOBS, machine_cores
from sae.sweep.spec import MAX_RUNS


@pytest.fixture(autouse=True)
def _offline(data_dir, monkeypatch):
    """The image files of the tiny sweep, no download; main() may install a SIGTERM handler."""
    monkeypatch.setenv("SAE_DATA_DIR", str(data_dir))
    monkeypatch.setenv("SAE_OFFLINE", "1")
    handler = signal.getsignal(signal.SIGTERM)
    yield
    signal.signal(signal.SIGTERM, handler)


@pytest.fixture
def sweep(tmp_path) -> Path:
    return write_yaml(tmp_path / "tiny.yaml", TINY)


@pytest.fixture
def no_ray_start(monkeypatch):
    """Ray must never be reached in these cases: the check comes first."""
    def refuse(*args, **kwargs):
        raise AssertionError("Ray was started or connected")

    monkeypatch.setattr(command, "RayPool", refuse)


def refused(argv, capsys, *words, seconds: float = 10.0) -> str:
    """Run sae.compare in-process: exit 2, one ``error:`` line holding ``words``, in time."""
    start = time.perf_counter()
    code = command.main([str(a) for a in argv])
    took = time.perf_counter() - start
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith("error: "), (code, err)
    assert took < seconds, took
    for word in words:
        assert word in err[0], err[0]
    return err[0]


def free_port() -> int:
    """A port where nothing listens (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --------------------------------------------------------------------------- Ray addresses


@needs_ray
@pytest.mark.parametrize("address", ["not-an-address", "", "localhost:99999", "127.0.0.1:0",
                                     "ray://", "ray://host", "host:port", "host:６３７９",
                                     "a b:6379"])
@pytest.mark.parametrize("dry", [False, True], ids=["run", "dry-run"])
def test_a_malformed_ray_address_is_one_line_before_any_folder(sweep, tmp_path, capsys, address,
                                                               dry, no_ray_start):
    out = tmp_path / "out"
    refused([sweep, "--engine", "ray", "--address", address, "--out", out,
             *(["--dry-run"] if dry else [])], capsys, "is not a Ray address", "host:port",
            seconds=5)
    assert not out.exists()


class Silent:
    """A server that accepts connections and never answers (a stuck or foreign service)."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.port = self.sock.getsockname()[1]


class Http:
    """A server that answers every connection as a plain HTTP server does."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                conn.settimeout(2)
                try:
                    conn.recv(1024)
                    conn.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")
                except OSError:
                    pass


@needs_ray
@pytest.mark.parametrize("case", ["nothing listens", "ray:// nothing listens", "silent",
                                  "http", "unknown host"])
def test_an_address_where_no_ray_cluster_answers_is_refused_in_seconds(
        sweep, tmp_path, capsys, case, no_ray_start):
    """Ray itself retried such addresses for minutes (nothing listening: for ever), then a
    traceback, with a sweep folder and its .lock left behind."""
    server = Silent() if case == "silent" else Http() if case == "http" else None
    address = {"nothing listens": f"127.0.0.1:{free_port()}",
               "ray:// nothing listens": f"ray://127.0.0.1:{free_port()}",
               "unknown host": "no-such-host.invalid:6379"}.get(case)
    address = address or f"127.0.0.1:{server.port}"
    out = tmp_path / "out"
    for dry in ([], ["--dry-run"]):
        refused([sweep, "--engine", "ray", "--address", address, "--out", out, *dry], capsys,
                "no Ray cluster", seconds=raypool.CONNECT_TIMEOUT + 7)
        assert not out.exists()
    if server is not None:
        server.sock.close()


@needs_ray
def test_address_auto_without_a_cluster_is_refused(sweep, tmp_path, capsys, monkeypatch,
                                                   no_ray_start):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path / "raytmp"))  # no cluster recorded there
    out = tmp_path / "out"
    argv = [sweep, "--engine", "ray", "--address", "auto", "--out", out]
    refused(argv, capsys, "auto", "no Ray cluster was started on this machine")
    # a cluster recorded by an earlier `ray start`, gone since
    (tmp_path / "raytmp" / "ray").mkdir(parents=True)
    (tmp_path / "raytmp" / "ray" / "ray_current_cluster").write_text(f"127.0.0.1:{free_port()}")
    refused([*argv, "--dry-run"], capsys, "auto (127.0.0.1:", "no Ray cluster listens there")
    assert not out.exists()


# --------------------------------------------------------------------------- --jobs


@pytest.mark.parametrize("jobs", ["1000000000", str(10**30), "9" * 5000, str(MAX_JOBS + 1)])
@pytest.mark.parametrize("dry", [False, True], ids=["run", "dry-run"])
def test_jobs_beyond_any_machine_are_one_line_naming_the_limit(sweep, tmp_path, capsys, jobs,
                                                               dry):
    """--jobs 10**30 was an OverflowError traceback after the sweep folder was made; a billion
    took some 36 GB for the job slots; --dry-run accepted both."""
    out = tmp_path / "out"
    line = refused([sweep, "--jobs", jobs, "--out", out, *(["--dry-run"] if dry else [])],
                   capsys, str(MAX_JOBS), f"{machine_cores()} cores", seconds=5)
    assert len(line) < 300
    assert not out.exists()


def test_jobs_beyond_this_machine_s_cores_are_refused_and_up_to_them_accepted(
        sweep, tmp_path, capsys):
    cores = machine_cores()
    out = tmp_path / "out"
    for dry in ([], ["--dry-run"]):
        refused([sweep, "--jobs", cores + 1, "--out", out, *dry], capsys,
                f"--jobs {cores + 1} is more than this machine's {cores} cores",
                f"--jobs {cores} or fewer")
        assert not out.exists()
    for jobs in sorted({1, min(2, cores), cores}):  # the presets' --jobs 2 on two cores
        assert command.main([str(sweep), "--jobs", str(jobs), "--out", str(out),
                             "--dry-run"]) == 0
    assert not out.exists()


@pytest.mark.parametrize("jobs", ["²", "٣"])
def test_jobs_that_are_not_a_count_are_one_line(sweep, tmp_path, capsys, jobs):
    """Unicode digits passed the old check and then failed int() with a traceback."""
    refused([sweep, "--jobs", jobs, "--out", tmp_path / "out", "--dry-run"], capsys,
            "--jobs must be an integer >= 1")


@needs_ray
def test_jobs_on_a_ray_cluster_are_capped_before_it_is_reached(sweep, tmp_path, capsys,
                                                               no_ray_start):
    out = tmp_path / "out"
    refused([sweep, "--engine", "ray", "--address", f"127.0.0.1:{free_port()}", "--jobs",
             MAX_JOBS + 1, "--out", out], capsys, str(MAX_JOBS), seconds=5)
    assert not out.exists()


def fake_ray(monkeypatch, node_cpus: list[float]) -> types.ModuleType:
    """A stand-in for Ray in this process: a cluster of nodes with these CPUs."""
    ray = types.ModuleType("ray")
    ray.__spec__ = importlib.machinery.ModuleSpec("ray", None)
    ray.calls = []
    ray.is_initialized = lambda: False
    ray.init = lambda **kwargs: ray.calls.append(("init", kwargs))
    ray.shutdown = lambda: ray.calls.append(("shutdown",))
    ray.remote = lambda function: function
    ray.nodes = lambda: [{"Alive": True, "Resources": {"CPU": c}} for c in node_cpus] + \
        [{"Alive": False, "Resources": {"CPU": 64.0}}]
    monkeypatch.setitem(sys.modules, "ray", ray)
    return ray


def test_jobs_on_a_ray_cluster_are_bounded_by_its_cpus_once_connected(monkeypatch):
    ray = fake_ray(monkeypatch, [2.0, 2.0])
    with pytest.raises(UsageError, match=r"--jobs 5 is more than the 4 CPUs of the Ray "
                                         r"cluster at h:6379; use --jobs 4 or fewer"):
        raypool.RayPool(1, "h:6379", jobs=5)
    assert ray.calls[-1] == ("shutdown",)  # the connection is ended
    # a task asks for no more CPUs than a node holds (else it would wait for ever)
    assert raypool.RayPool(8, "h:6379", jobs=2).threads == 2
    # this machine's own instance: a new one, even where $RAY_ADDRESS names a cluster
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:6379")
    raypool.RayPool(1, None, cpus=2, jobs=2)
    assert ray.calls[-1] == ("init", {"address": "local", "num_cpus": 2,
                                      "include_dashboard": False, "log_to_driver": False,
                                      "logging_level": "WARNING"})


# --------------------------------------------------------------------------- names


def data_sweep(tmp_path: Path, data: str) -> Path:
    r = np.random.default_rng(0)
    np.save(tmp_path / "good.npy", r.normal(size=(200, 8)).astype(np.float32))
    return write_yaml(tmp_path / "d.yaml", {
        "seeds": [0], "models": {"topk": {"k": [4]}},
        "common": {"data": data, "hidden": 16, "max_steps": 2, "val_size": 50}})


@pytest.mark.parametrize("name", ["..", "."])
def test_a_data_set_named_dot_dot_cannot_move_runs_out_of_the_sweep(tmp_path, capsys, name):
    """A manifest named ".." put the runs at runs/../topk/..., outside runs/ (then an
    IsADirectoryError traceback)."""
    (tmp_path / "m.json").write_text(json.dumps({"format": matrix.FORMAT, "name": name,
                                                 "train": {"x": "good.npy"}}))
    sweep = data_sweep(tmp_path, str(tmp_path / "m.json"))
    out = tmp_path / "out"
    for dry in (["--dry-run"], []):
        refused([sweep, "--out", out, *dry], capsys, repr(name), "cannot be a folder name",
                seconds=60)  # the first imports torch to read the manifest
        assert not out.exists()


def test_a_data_file_whose_stem_is_dot_dot_is_refused(tmp_path, capsys):
    sweep = data_sweep(tmp_path, str(tmp_path / "...npy"))
    (tmp_path / "good.npy").rename(tmp_path / "...npy")
    refused([sweep, "--out", tmp_path / "out", "--dry-run"], capsys, "'..'",
            "cannot be a folder name", seconds=60)


def test_a_sweep_file_named_dot_dot_needs_out(tmp_path, capsys, monkeypatch):
    """Its default folder, sweeps/<stem>, would have been sweeps/.. (the working folder)."""
    monkeypatch.chdir(tmp_path)
    write_yaml(tmp_path / "...yaml", TINY)
    refused(["...yaml", "--dry-run"], capsys, "'..'", "give --out")
    refused(["...yaml"], capsys, "give --out")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["...yaml"]
    assert command.main(["...yaml", "--dry-run", "--out", "elsewhere"]) == 0


# --------------------------------------------------------------------------- size


def test_a_sweep_of_100_000_seeds_names_the_run_limit_not_aliases(tmp_path, capsys):
    sweep = write_yaml(tmp_path / "seeds.yaml", {**TINY, "seeds": list(range(100_000))})
    line = refused([sweep, "--dry-run", "--out", tmp_path / "out"], capsys,
                   f"at most {MAX_RUNS:,} runs")
    assert "alias" not in line


def test_a_sweep_of_too_many_runs_is_counted_not_built(tmp_path, capsys):
    """Each run is checked with sae.run's parser (ms each): 20 002 of them took a minute."""
    sweep = write_yaml(tmp_path / "many.yaml", {**TINY, "seeds": list(range(MAX_RUNS // 2 + 1))})
    refused([sweep, "--dry-run", "--out", tmp_path / "out"], capsys,
            f"the sweep has {2 * (MAX_RUNS // 2 + 1):,} runs", f"at most {MAX_RUNS:,}",
            seconds=5)


# --------------------------------------------------------------------------- SIGTERM on Ray


def ray_processes(mark: str) -> list[int]:
    """Live processes whose environment carries ``mark`` (a driver's and all it started)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                continue
            if mark.encode() in Path(f"/proc/{pid}/environ").read_bytes():
                found.append(int(pid))
        except (OSError, IndexError):
            continue
    return found


def start_marked(args, root: Path, data_dir: Path, mark: str):
    import subprocess

    return subprocess.Popen([sys.executable, "-m", "sae.compare", *map(str, args)], cwd=root,
                            env={**env(root, data_dir), "SAE_TEST_MARK": mark},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def gone(mark: str, seconds: float = 20) -> list[int]:
    """The marked processes still alive after up to ``seconds``."""
    end = time.monotonic() + seconds
    while ray_processes(mark) and time.monotonic() < end:
        time.sleep(0.5)
    return ray_processes(mark)


@pytest.mark.slow
@needs_ray
def test_sigterm_to_a_ray_driver_stops_its_trainings_with_their_checkpoints(tmp_path, data_dir):
    """It was Ray's C++ stack dump and exit 15 (or -6), the trainings ran on."""
    sweep_file(tmp_path, {**SWEEP, "common": {**SWEEP["common"], "epochs": 1000}})
    folder, mark = tmp_path / "ray", uuid.uuid4().hex
    driver = start_marked(["ray.yaml", "--jobs", "2", "--engine", "ray", "--out", folder],
                          tmp_path, data_dir, mark)
    try:
        end = time.monotonic() + 180
        while not list(folder.glob("runs/**/last.ckpt")) and time.monotonic() < end:
            time.sleep(0.2)
        kept = [p.parent.parent for p in folder.glob("runs/**/last.ckpt")]
        assert kept and trainings(folder), "no training reached its first checkpoint"
        start = time.monotonic()
        driver.send_signal(signal.SIGTERM)
        _, err = driver.communicate(timeout=120)
        took = time.monotonic() - start
    finally:
        if driver.poll() is None:
            driver.kill()
    assert driver.returncode == 143, err[-3000:]
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("terminated; run the same command"), err
    assert took < 30, took
    assert not trainings(folder) and not gone(mark)  # no training, no Ray process left
    for run in kept:  # each training stopped as Ctrl-C stops it: its checkpoint kept
        assert (run / "checkpoints" / "last.ckpt").is_file() and \
            not (run / "metrics.json").exists()
        log = folder / "logs" / run.relative_to(folder / "runs").with_suffix(".log")
        assert "interrupted" in log.read_text()


@pytest.mark.slow
@needs_ray
def test_sigterm_while_ray_starts_leaves_nothing(tmp_path, data_dir):
    """Stopped while ray.init started the local instance, the driver left with exit 15 and no
    word (Ray's handler), its sweep folder and .lock behind, and some Ray processes running."""
    sweep_file(tmp_path)
    folder, mark = tmp_path / "ray", uuid.uuid4().hex
    driver = start_marked(["ray.yaml", "--engine", "ray", "--out", folder], tmp_path, data_dir,
                          mark)
    try:
        handles_sigterm(driver.pid)
        end = time.monotonic() + 60
        while len(ray_processes(mark)) < 3 and time.monotonic() < end:  # Ray is starting
            time.sleep(0.05)
        driver.send_signal(signal.SIGTERM)
        _, err = driver.communicate(timeout=60)
    finally:
        if driver.poll() is None:
            driver.kill()
    assert driver.returncode == 143, err[-3000:]
    assert err.strip().splitlines() == ["terminated; nothing was written"], err[-3000:]
    assert not folder.exists()
    assert not gone(mark)
