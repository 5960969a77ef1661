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
kept) when its task's worker dies (``SAE_STOP_WITH_PARENT``), and Ctrl-C on the driver cancels
the tasks, whose trainings then get SIGINT as the local engine's do.
"""

from __future__ import annotations

import importlib.util
import signal
import subprocess
import time
from concurrent.futures import Future
from pathlib import Path

from sae.settings.cli import UsageError
from sae.sweep.launch import job_env, open_log, run_state, train_command, uses_gpu
from sae.sweep.spec import Run

__all__ = ["GPU_SHARE", "RayPool", "check_ray", "train_task"]

GPU_SHARE = 0.25  # a run on a GPU asks for a quarter of one: four runs share it
# how long a cancelled run has to stop after SIGINT, then after SIGTERM, before it is killed
STOP_WAITS = ((signal.SIGTERM, 10.0), (signal.SIGKILL, 30.0))
BUSY_WAIT = 60.0  # seconds a retried task waits for the training of its first try to stop


def check_ray() -> None:
    """UsageError (one line, exit 2) when Ray is not installed."""
    if importlib.util.find_spec("ray") is None:
        raise UsageError('--engine ray needs Ray: pip install -e ".[ray]"')


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
    command = train_command(run, folder_path, state)
    env = job_env(0, threads, None)  # the training stops if this worker dies
    with open_log(Path(log)) as fh:
        fh.write(f"\n$ {' '.join(command)}\n")
        fh.flush()
        start = time.perf_counter()
        proc = subprocess.Popen(command, stdout=fh, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, env=env)
        try:
            code = proc.wait()
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


class RayPool:
    """Trains runs as Ray tasks; the interface of :class:`sae.sweep.launch.RunPool`.

    ``address``: a running cluster's (``ray start --head`` prints it), or None for a Ray
    instance of this machine's own, with ``cpus`` CPUs, started here and ended by
    :meth:`close`.
    """

    def __init__(self, threads: int, address: str | None = None, cpus: int | None = None):
        check_ray()
        import ray  # deferred: an optional extra, and seconds to import

        self.ray, self.threads, self.started = ray, threads, not ray.is_initialized()
        if self.started:
            ray.init(address=address, num_cpus=None if address else cpus,
                     include_dashboard=False, log_to_driver=False,
                     logging_level="WARNING")
        self.task = ray.remote(train_task)
        self.refs: list = []

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

    def _gpus(self) -> bool:
        return self.ray.cluster_resources().get("GPU", 0) > 0

    def close(self) -> None:
        """Wait for the queued runs; end the Ray instance this pool started."""
        if self.refs:
            self.ray.wait(self.refs, num_returns=len(self.refs))
        if self.started:
            self.ray.shutdown()

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
        if self.started:
            self.ray.shutdown()
