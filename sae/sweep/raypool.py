"""A sweep's runs as Ray tasks (``python -m sae.compare FILE --engine ray``).

:class:`RayPool` does what :class:`sae.sweep.launch.RunPool` does, with Ray as the scheduler:
each run is one task that trains it as ``python -m sae.run`` would, on whichever node has its
resources free (``threads`` CPUs, and a quarter of a GPU when it trains on one), on a local Ray
instance or on a running cluster (``--address``). The run folders must be on a file system
every node sees: the task writes the run folder and its log where the local engine would. The
driver (the ``sae.compare`` process) analyses each finished run and writes the tables, as with
the local engine.

A task decides its command from the run folder's state when it starts (new, restart or resume,
:func:`sae.sweep.launch.run_state`), so a run whose worker died part-way and is retried by Ray
(once) resumes from its last checkpoint. The training process stops (SIGTERM, its checkpoint
kept) when its task's worker dies (``SAE_STOP_WITH_PARENT``), and Ctrl-C or SIGTERM on the
driver cancels the tasks, whose trainings then get SIGINT as the local engine's do.

``--address`` is checked before Ray is imported and before any folder is made
(:func:`check_address`): its form (``host:port``, ``ray://host:port`` or ``auto``), then that a
Ray cluster answers there within :data:`CONNECT_TIMEOUT` seconds. Ray itself would retry an
address where nothing listens for minutes, or for ever. Once connected, ``--jobs`` is bounded by
the cluster's CPUs. While Ray connects, its own SIGTERM handlers are in place (Python's
``sys.exit(15)``, then its C++ stack dump); :class:`RayPool` turns a SIGTERM then into
:class:`sae.system.process.Terminated` and puts the command's handler back once connected.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import time
from concurrent.futures import Future
from contextlib import contextmanager, nullcontext
from pathlib import Path

from sae.settings.cli import UsageError
from sae.settings.setting import shown
from sae.sweep.launch import RUNS_PER_GPU, job_env, open_log, run_state, train_command, uses_gpu
from sae.sweep.spec import Run
from sae.system.io import read_text
from sae.system.process import STOPS, Terminated, importing

__all__ = ["CONNECT_TIMEOUT", "GPU_SHARE", "MAX_CLUSTER_JOBS", "RayPool", "check_address",
           "check_ray", "parse_address", "train_task"]

GPU_SHARE = 1 / RUNS_PER_GPU  # a run on a GPU asks for a quarter of one: four runs share it
CONNECT_TIMEOUT = 3.0  # seconds a Ray address has to accept a connection and answer
# --jobs on a cluster before its CPUs are known (then they bound it): far above a real sweep's,
# far below what the job slots would cost to hold
MAX_CLUSTER_JOBS = 4096
_HINT = "(`ray start --head` starts one and prints its address)"
_ADDRESS_FORMS = ("give host:port (a port from 1 to 65535), as `ray start --head` prints it, "
                  "ray://host:port, or auto")
# how long a cancelled run has to stop after SIGINT, then after SIGTERM, before it is killed
STOP_WAITS = ((signal.SIGTERM, 10.0), (signal.SIGKILL, 30.0))
BUSY_WAIT = 60.0  # seconds a retried task waits for the training of its first try to stop


def check_ray() -> None:
    """UsageError (one line, exit 2) when Ray is not installed."""
    if importlib.util.find_spec("ray") is None:
        raise UsageError('--engine ray needs Ray: pip install -e ".[ray]"')


def parse_address(address: str) -> tuple[str, int] | None:
    """The (host, port) of an ``--address``; None for ``auto``.

    Raises:
        UsageError: not ``host:port`` with a port from 1 to 65535, ``ray://host:port`` or
            ``auto``.
    """
    if address == "auto":
        return None
    rest = address.removeprefix("ray://")
    host, colon, port = rest.rpartition(":")
    if host.startswith("[") and host.endswith("]"):  # an IPv6 address, as URLs write it
        host = host[1:-1]
    if not colon or not host or any(c.isspace() or c in "/@[]" for c in host) or \
            not (port.isascii() and port.isdecimal() and len(port) <= 5 and
                 1 <= int(port) <= 65535):
        raise UsageError(f"--address {shown(address)} is not a Ray address: {_ADDRESS_FORMS}")
    return host, int(port)


def _auto_address() -> str:
    """The cluster ``auto`` finds, as Ray finds it: $RAY_ADDRESS, else the address the last
    ``ray start`` on this machine recorded (``ray_current_cluster`` in Ray's temporary
    folder: $RAY_TMPDIR, else $TMPDIR, else /tmp, and ``ray`` in it)."""
    if os.environ.get("RAY_ADDRESS"):
        return os.environ["RAY_ADDRESS"]
    temp = os.environ.get("RAY_TMPDIR") or \
        (os.environ.get("TMPDIR") if sys.platform.startswith("linux") else None) or "/tmp"
    record = Path(temp) / "ray" / "ray_current_cluster"
    try:
        found = read_text(record, 4096, follow_links=True).strip()
    except (OSError, ValueError):  # none recorded (or unreadable): no cluster to find
        found = ""
    if not found:
        raise UsageError("--address auto: no Ray cluster was started on this machine "
                         "(`ray start --head` starts one); or give its address")
    return found


def check_address(address: str, connect: bool = True) -> None:
    """Refuse an ``--address`` that names no Ray cluster, in seconds and before any work: its
    form; with ``connect``, that something listens there (a TCP connection within
    :data:`CONNECT_TIMEOUT` seconds) and answers as a gRPC server, as Ray's GCS and its client
    server (``ray://``) do (not asked with Ray's TLS on). For ``auto``, the cluster Ray would
    find (:func:`_auto_address`).

    Raises:
        UsageError: one line naming the address and what is wrong.
    """
    where = parse_address(address)
    if not connect:
        return
    if where is None:
        found = _auto_address()
        try:
            where = parse_address(found)
        except UsageError:
            raise UsageError(f"--address auto found {shown(found)}, which is not a Ray "
                             "address") from None
        address = f"auto ({found})"
    plain = os.environ.get("RAY_USE_TLS", "").lower() not in ("1", "true")  # else TLS's
    _check_listening(*where, address, grpc_check=plain)


def _check_listening(host: str, port: int, address: str, grpc_check: bool) -> None:
    """UsageError unless a server at host:port accepts a connection within
    :data:`CONNECT_TIMEOUT` seconds and, with ``grpc_check``, answers gRPC's health check
    (:func:`_check_grpc`)."""
    start = f"--address {shown(address)}: no Ray cluster"
    try:
        socket.create_connection((host, port), timeout=CONNECT_TIMEOUT).close()
    except socket.gaierror:
        raise UsageError(f"{start}: host {shown(host)} is not known") from None
    except TimeoutError:
        raise UsageError(f"{start} answered within {CONNECT_TIMEOUT:g} s {_HINT}") from None
    except OSError as e:
        raise UsageError(f"{start} listens there ({e.strerror or e}) {_HINT}") from None
    if grpc_check:
        _check_grpc(f"[{host}]:{port}" if ":" in host else f"{host}:{port}", start)


def _check_grpc(target: str, start: str) -> None:
    """Ask the server at ``target`` gRPC's standard health check, as Ray's GCS answers it: a
    reply, or a gRPC server's "no such method", passes (Ray's own connection then decides); no
    answer in :data:`CONNECT_TIMEOUT` seconds, or an answer that is not gRPC (an HTTP server, a
    proxy that accepts every connection), is refused at once, where Ray would retry for
    minutes."""
    try:
        import grpc  # Ray's own dependency: installed with it
    except ImportError:
        return
    with grpc.insecure_channel(target) as channel:
        check = channel.unary_unary("/grpc.health.v1.Health/Check")
        try:
            check(b"", timeout=CONNECT_TIMEOUT)  # an empty HealthCheckRequest
        except grpc.RpcError as e:
            details = " ".join((e.details() or "").split())
            if e.code() == grpc.StatusCode.UNIMPLEMENTED and "http2 header" not in details:
                return
            if e.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
                raise UsageError(f"{start} answered within {CONNECT_TIMEOUT:g} s "
                                 f"{_HINT}") from None
            raise UsageError(f"{start} answers there, something else does "
                             f"({shown(details, 100)}) {_HINT}") from None


def train_task(run: Run, folder: str, log: str, threads: int) -> tuple[int, float]:
    """Bring one run folder to done on this node: the ``sae.run`` command its state calls for,
    with ``threads`` CPU threads, its output appended to ``log``. Returns (exit code,
    seconds). Cancelled (KeyboardInterrupt), it stops the training as Ctrl-C would and waits."""
    folder_path = Path(folder)
    state, waited = run_state(folder_path), 0.0
    while state == "busy" and waited < BUSY_WAIT:  # a retry: the first try's training is still
        time.sleep(1.0)                            # stopping (it holds the folder's lock)
        state, waited = run_state(folder_path), waited + 1.0
    if state == "done":  # a retried task whose first try finished the run
        return 0, 0.0
    return _run_command(train_command(run, folder_path, state), Path(log), threads)


def train_stack_task(runs: list[Run], folders: list[str], logs: list[str],
                     threads: int) -> list[tuple[int, float]]:
    """Bring run folders to done on this node as one stack (``python -m sae.runner.stack``),
    its output in the first log and copied to the others; (exit code, seconds) each. Runs a
    first try finished are left as they are; runs that cannot stack now (one busy, or some
    resuming and some not) train one after another, alone."""
    paths = [Path(f) for f in folders]
    states = [run_state(p) for p in paths]
    todo = [i for i, state in enumerate(states) if state != "done"]
    if any(states[i] == "busy" for i in todo) or len({states[i] == "resume" for i in todo}) > 1:
        return [train_task(runs[i], folders[i], logs[i], threads) for i in range(len(runs))]
    outcomes = [(0, 0.0)] * len(runs)
    if not todo:
        return outcomes
    argvs = [train_command(runs[i], paths[i], states[i])[3:] for i in todo]
    first = Path(logs[todo[0]])
    before = first.stat().st_size if first.is_file() else 0
    code, seconds = _run_command([sys.executable, "-m", "sae.runner.stack", json.dumps(argvs)],
                                 first, threads)
    text = first.read_bytes()[before:]
    for i in todo:
        if i != todo[0]:
            with open_log(Path(logs[i])) as fh:
                os.write(fh.fileno(), text)
        done = run_state(paths[i]) == "done"
        outcomes[i] = (0 if done else (code or 1), seconds)
    return outcomes


def _run_command(command: list[str], log: Path, threads: int) -> tuple[int, float]:
    """Run ``command`` with ``threads`` CPU threads, its output appended to ``log``; (exit code,
    seconds). Cancelled (KeyboardInterrupt), it stops the training as Ctrl-C would and waits."""
    env = job_env(0, threads, None)  # the training stops if this worker dies
    with open_log(log) as fh:
        fh.write(f"\n$ {' '.join(command)}\n")
        fh.flush()
        start = time.perf_counter()
        proc = subprocess.Popen(command, stdout=fh, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, env=env)
        try:
            code = _wait(proc)
        except KeyboardInterrupt:  # the task was cancelled: stop as the local engine does
            proc.send_signal(signal.SIGINT)
            for sig, wait_s in STOP_WAITS:
                try:
                    proc.wait(timeout=wait_s)
                    break
                except subprocess.TimeoutExpired:
                    proc.send_signal(sig)
            proc.wait()
            raise
        seconds = time.perf_counter() - start
        fh.write(f"# exit code {code} after {seconds:.1f} s\n")
    return code, seconds


@contextmanager
def _own_stops(held: list[int]):
    """Inside the block Ctrl-C and SIGTERM are noted in ``held``, not raised; the caller raises
    a noted stop after the block. ``ray.init`` puts its own SIGTERM handlers in place while it
    starts (they end what it started and exit: :meth:`RayPool._connect` takes that exit as
    the stop), so it is Ctrl-C that waits here."""
    previous = {s: signal.signal(s, lambda signum, frame: held.append(signum))
                for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def _wait(proc: subprocess.Popen) -> int:
    """The exit code of ``proc``, waited for in short steps: Ray cancels a running task by
    raising KeyboardInterrupt in its thread between two Python instructions, which a wait
    blocked in the kernel would not see until the training ended."""
    while True:
        try:
            return proc.wait(timeout=0.5)
        except subprocess.TimeoutExpired:
            continue


class RayPool:
    """Trains runs as Ray tasks; the interface of :class:`sae.sweep.launch.RunPool`.

    ``address``: a running cluster's (``ray start --head`` prints it), or None for a Ray
    instance of this machine's own, with ``cpus`` CPUs, started here and ended by
    :meth:`close`. ``jobs`` (``--jobs``) may not exceed the cluster's CPUs. Made before the
    sweep folder: a cluster that cannot be reached, or is too small, leaves nothing behind.

    Raises:
        UsageError: Ray could not start or connect (one line, Ray's first), or too few CPUs.
        Terminated, KeyboardInterrupt: a stop while Ray connects (what it made is ended).
    """

    def __init__(self, threads: int, address: str | None = None, cpus: int | None = None,
                 jobs: int = 1):
        check_ray()
        with importing():  # a stop during the import (seconds) is raised after it
            import ray  # deferred: an optional extra, and seconds to import

        self.ray, self.threads, self.started = ray, threads, not ray.is_initialized()
        self.task = ray.remote(train_task)
        self.stack_task = ray.remote(train_stack_task)
        self.refs: list = []
        if self.started:
            self._connect(address, cpus)
        try:
            self._check_jobs(jobs, address)
        except BaseException:  # too few CPUs, or a stop: end what was started
            self._end()
            raise

    def _connect(self, address: str | None, cpus: int | None) -> None:
        """``ray.init``, with its stops and failures as this command's (see the class).

        A new local instance is not cut short by Ctrl-C: Ray, interrupted while it starts one,
        leaves some of its processes running for good, so Ctrl-C waits (:func:`_own_stops`)
        and is raised once the instance is up, and then ended. SIGTERM meanwhile reaches Ray's
        own handlers, which end the processes it started and exit; that exit (``ray.init``
        exits for no other reason) is the stop. Connecting to a cluster starts nothing here: a
        stop ends it at once.
        """
        handler = signal.getsignal(signal.SIGTERM)
        held: list[int] = []
        try:
            with _own_stops(held) if not address else nullcontext():
                # "local": a new instance, whatever $RAY_ADDRESS says (it names a cluster)
                self.ray.init(address=address or "local",
                              num_cpus=None if address else cpus, include_dashboard=False,
                              log_to_driver=False, logging_level="WARNING")
        except SystemExit as e:  # Ray's SIGTERM handlers while it starts: sys.exit(15 or 1)
            self._end()
            if e.code == signal.SIGTERM or not address:
                raise Terminated from None
            raise
        except STOPS:
            self._end()
            raise
        except Exception as e:  # noqa: BLE001 (Ray's many errors: one line, exit 2)
            self._end()
            if held:  # Ctrl-C in a terminal stops Ray's processes too: the stop is the cause
                raise Terminated if held[0] == signal.SIGTERM else KeyboardInterrupt from None
            lines = str(e).strip().splitlines() or [type(e).__name__]
            where = f"the Ray cluster at {address}" if address else "a Ray instance"
            raise UsageError(f"cannot connect to {where}: {shown(lines[0], 200)}") from None
        finally:  # over Ray's (Python's and its C++ stack dump): a stop unwinds as Ctrl-C
            signal.signal(signal.SIGTERM, handler)
        if held:
            self._end()
            raise Terminated if held[0] == signal.SIGTERM else KeyboardInterrupt

    def _check_jobs(self, jobs: int, address: str | None) -> None:
        """On a cluster (``address``): ``--jobs`` at most its CPUs, and a task's CPUs at most
        those of its largest node (a task that fits no node would wait for ever)."""
        if not address:  # this machine's own instance: bounded as the local engine
            return
        nodes = [float(n.get("Resources", {}).get("CPU", 0)) for n in self.ray.nodes()
                 if n.get("Alive")]
        cpus = int(sum(nodes))
        if jobs > cpus:
            raise UsageError(f"--jobs {jobs} is more than the {cpus} CPUs of the Ray cluster at "
                             f"{address}; use --jobs {max(1, cpus)} or fewer")
        self.threads = max(1, min(self.threads, int(max(nodes))))

    def _end(self) -> None:
        """End the Ray instance or connection this pool started (none made: nothing done)."""
        if self.started:
            self.ray.shutdown()

    def submit(self, run: Run, command: list[str], log: Path, analyse: bool = False) -> Future:
        """Queue one training; the future gives (exit code, seconds). The driver analyses
        (``analyse`` is the local workers' and is not needed here)."""
        folder = command[command.index("--out") + 1]
        ref = self.task.options(num_cpus=self.threads,
                                num_gpus=GPU_SHARE if uses_gpu(run) and self._gpus() else 0,
                                max_retries=1, retry_exceptions=False
                                ).remote(run, folder, str(log), self.threads)
        self.refs.append(ref)
        return ref.future()

    def submit_stack(self, trainings: list[tuple], analyse: bool = False) -> Future:
        """Queue ``trainings`` ((run, command, log) each) as one stack in one Ray task; the
        future gives one (exit code, seconds) each."""
        runs = [run for run, _, _ in trainings]
        folders = [command[command.index("--out") + 1] for _, command, _ in trainings]
        gpu = any(uses_gpu(run) for run in runs) and self._gpus()
        ref = self.stack_task.options(num_cpus=self.threads, num_gpus=GPU_SHARE if gpu else 0,
                                      max_retries=1, retry_exceptions=False
                                      ).remote(runs, folders, [str(log) for _, _, log in
                                                               trainings], self.threads)
        self.refs.append(ref)
        return ref.future()

    def _gpus(self) -> bool:
        return self.ray.cluster_resources().get("GPU", 0) > 0

    def close(self) -> None:
        """Wait for the queued runs; end the Ray instance this pool started."""
        if self.refs:
            self.ray.wait(self.refs, num_returns=len(self.refs))
        self._end()

    def stop(self) -> None:
        """Start no more runs, stop the running ones (their trainings get SIGINT and keep
        their last checkpoint) and wait for them."""
        for ref in self.refs:
            self.ray.cancel(ref)
        pending = list(self.refs)
        limit = time.monotonic() + sum(w for _, w in STOP_WAITS) + 5
        while pending and time.monotonic() < limit:
            _, pending = self.ray.wait(pending, num_returns=len(pending), timeout=1.0)
        for ref in pending:
            self.ray.cancel(ref, force=True)
        self._end()
