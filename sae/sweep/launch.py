"""Training a sweep's runs, N at a time, and the state of run folders.

:func:`run_state` reads what a run folder holds (finished, resumable, to restart, new, or
someone else's); :func:`train_command` turns that into the ``sae.run`` command line;
:class:`RunPool` runs those commands in a pool of numbered slots, each with its share of CPU
threads (``OMP_NUM_THREADS``) or its own GPU (``CUDA_VISIBLE_DEVICES``): in the slot's long-lived
worker process (:mod:`sae.sweep.worker`: torch and Lightning imported once, the data read once)
when the run is a single process, else as a subprocess; :func:`run_sweep` trains
what is missing and analyses what is finished, printing one progress line per run; :func:`lock`
keeps two runners out of the same sweep folder.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from pathlib import Path

from sae.settings.cli import UsageError
from sae.sweep.analysis import DataCache, analyse_run, analysis_is_current
from sae.sweep.progress import Progress, last_line, metrics_note
from sae.sweep.spec import Run
from sae.sweep.stacks import plan_stacks
from sae.system.io import UnsafePathError, open_regular
from sae.system.process import PARENT_ENV, RUN_DIR_ENV, STOPS
from sae.training import runfolder

__all__ = ["MAX_JOBS", "RUNS_PER_GPU", "Progress", "RunPool", "Worker", "check_folders",
           "check_jobs", "gpu_device_nodes", "in_process", "job_env", "lock", "log_path",
           "machine_cores", "run_state", "run_sweep", "total_threads", "train_command",
           "uses_gpu", "visible_gpus"]

RUNS_PER_GPU = 4  # runs that may share one GPU (--jobs 4 on one GPU)
MAX_JOBS = 4096  # --jobs before anything is known of the machine: no machine has more slots


# --------------------------------------------------------------------------- run folders


def run_state(folder: Path) -> str:
    """done (metrics.json), busy (another process trains it: its lock is held), resume
    (checkpoint), restart (config.yaml only), new, or foreign."""
    if (folder / "metrics.json").is_file():
        return "done"
    if folder.is_dir() and runfolder.is_locked(folder):
        return "busy"
    if (folder / "checkpoints" / "last.ckpt").is_file() and (folder / "config.yaml").is_file():
        return "resume"
    if (folder / "config.yaml").is_file():
        return "restart"
    if not folder.exists() or (folder.is_dir() and not any(folder.iterdir())) \
            or runfolder.is_leftover(folder):  # what a failed start left: taken as new
        return "new"
    return "foreign"  # something else lives there: never touched


def train_command(run: Run, folder: Path, state: str) -> list[str]:
    """The ``sae.run`` command that brings a run folder in ``state`` to done."""
    base = [sys.executable, "-m", "sae.run"]
    if state == "resume":  # the run's own config.yaml holds its settings
        return [*base, "--out", str(folder), "--resume"]
    extra = ["--overwrite"] if state == "restart" else []
    return [*base, *run.argv, "--out", str(folder), *extra]


def log_path(sweep_dir: Path, run: Run) -> Path:
    """``logs/<dataset>/<model>/<value>/seed<s>.log``: the run's console output."""
    return sweep_dir / "logs" / run.rel.relative_to("runs").with_suffix(".log")


def check_folders(sweep_dir: Path, runs: list[Run], jobs: int, gpus: list[str]) -> None:
    """Refuse, before any work, a sweep folder that is a file, run folders that are not run
    folders, and multi-GPU runs that would share the machine with other runs."""
    if sweep_dir.exists() and not sweep_dir.is_dir():
        raise UsageError(f"--out {sweep_dir} exists and is not a folder")
    for run in runs:
        if run_state(sweep_dir / run.rel) == "foreign":
            raise UsageError(f"{sweep_dir / run.rel} exists but is not a run folder (no "
                             "config.yaml); move it away")
    multi = [r for r in runs if gpus and uses_gpu(r) and jobs > 1
             and str(r.config.hardware.devices) not in ("1", "auto")]
    if multi:
        raise UsageError("--jobs > 1 gives each GPU run one GPU; use --jobs 1 for runs with "
                         f"devices={multi[0].config.hardware.devices}")


def lock(sweep_dir: Path):
    """An exclusive lock on the sweep folder: two runners must not train the same runs.

    Returns the open lock file; the lock lasts until it is closed (use it in a ``with``).
    ``.lock`` is opened without following a link, without blocking and without truncating, and
    only if it is a regular file: a planted link, FIFO, folder or device is refused (UsageError)
    and nothing it points to is touched.
    """
    try:
        fd = open_regular(sweep_dir / ".lock", os.O_RDWR | os.O_CREAT)
    except UnsafePathError as e:
        raise UsageError(f"refusing sweep folder {sweep_dir}: {e}") from None
    except OSError as e:
        raise UsageError(f"cannot lock sweep folder {sweep_dir}: {e.strerror or e}") from None
    handle = os.fdopen(fd, "r+b")
    try:
        import fcntl  # not on Windows

        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except ImportError:  # no fcntl (Windows): run unlocked
        pass
    except OSError:
        handle.close()
        raise UsageError(f"another sweep is running in {sweep_dir}") from None
    return handle


def open_log(path: Path):
    """A run's log, opened for appending without following a link (sae.system.io.open_regular)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = open_regular(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    return os.fdopen(fd, "a", encoding="utf-8")


# --------------------------------------------------------------------------- machine share


def uses_gpu(run: Run) -> bool:
    """Whether the run trains on a GPU when one is visible (auto picks one when present)."""
    return run.config.hardware.accelerator.lower() in ("gpu", "cuda", "auto")


def visible_gpus() -> list[str]:
    """GPU ids the runs may use: $CUDA_VISIBLE_DEVICES when set, else every CUDA device."""
    if os.environ.get("CUDA_VISIBLE_DEVICES") is not None:
        return [g for g in os.environ["CUDA_VISIBLE_DEVICES"].split(",") if g]
    if not gpu_device_nodes():
        return []  # importing torch to learn this costs seconds before the first run starts
    import torch  # deferred: only where device nodes show a GPU

    return [str(i) for i in range(torch.cuda.device_count())]


def gpu_device_nodes() -> bool:
    """False only where no GPU can be visible: a Linux /dev without the nodes a CUDA or ROCm
    device needs (``nvidia*``, ``kfd``, WSL's ``dxg``); True where that cannot be told."""
    if not sys.platform.startswith("linux"):
        return True
    try:
        names = os.listdir("/dev")
    except OSError:
        return True
    return any(n.startswith("nvidia") or n in ("kfd", "dxg") for n in names)


def total_threads() -> int:
    """The CPU threads to share: $OMP_NUM_THREADS when set, else the usable cores."""
    try:
        return max(1, int(os.environ["OMP_NUM_THREADS"]))
    except (KeyError, ValueError):
        return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else \
            (os.cpu_count() or 1)


def machine_cores() -> int:
    """This machine's cores (``os.cpu_count()``), or those this process may run on where that
    is known and more."""
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 0
    return max(1, os.cpu_count() or 1, usable)


def check_jobs(jobs: int, gpus: list[str], engine: str = "workers",
               address: str | None = None) -> None:
    """Refuse more job slots than the machine can run at once (each slot holds a process and
    a thread share; a billion of them would exhaust memory before the first run): at most
    this machine's cores, or :data:`RUNS_PER_GPU` runs on each GPU the runs use (``gpus``),
    whichever is more. On a Ray cluster (``address``) the cluster's CPUs bound it once
    connected (:class:`sae.sweep.raypool.RayPool`); until then :data:`MAX_JOBS`."""
    if engine == "ray" and address:
        limit, what = MAX_JOBS, "what a sweep allows before the cluster is reached"
    else:
        cores = machine_cores()
        limit, what = max(cores, RUNS_PER_GPU * len(gpus)), f"this machine's {cores} cores"
        if RUNS_PER_GPU * len(gpus) > cores:
            what = f"{RUNS_PER_GPU} runs on each of its {len(gpus)} GPUs"
    if jobs > limit:
        raise UsageError(f"--jobs {jobs} is more than {what}; use --jobs {limit} or fewer")


def job_env(slot: int, threads: int, gpu: str | None) -> dict[str, str]:
    """The environment of one training subprocess: its thread share and GPU."""
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    # the training stops (SIGTERM, keeping its checkpoint) if the sweep dies, even by kill -9
    env[PARENT_ENV] = str(os.getpid())
    for name in (RUN_DIR_ENV, "RANK", "LOCAL_RANK", "NODE_RANK", "WORLD_SIZE"):
        env.pop(name, None)  # a sweep started inside a run must not steer its children
    if gpu is not None:
        env["CUDA_VISIBLE_DEVICES"] = gpu
    return env


# --------------------------------------------------------------------------- the pool


def in_process(run: Run, gpus_per_slot: int) -> bool:
    """Whether a run can train inside a sweep worker: one process on one device.

    Multi-process runs (``strategy: ddp``, several devices or nodes) start their own processes
    by re-running their command line, so they train as ``python -m sae.run`` subprocesses.
    """
    hardware = run.config.hardware
    if hardware.num_nodes != 1 or hardware.strategy != "auto":
        return False
    devices = str(hardware.devices)
    if devices == "1":
        return True
    # auto: every visible GPU of the slot when the run may use one, else one CPU process
    return devices == "auto" and (not uses_gpu(run) or gpus_per_slot <= 1)


class Worker:
    """One ``sae.sweep.worker`` process: trains the jobs sent to it, one at a time."""

    def __init__(self, env: dict[str, str], stderr: Path):
        with open_log(stderr) as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "sae.sweep.worker"], stdin=subprocess.PIPE,
                stdout=subprocess.PIPE, stderr=err, env=env, text=True, bufsize=1)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def train(self, job: dict) -> dict | None:
        """Send one job and wait for its answer; None when the worker died on the way."""
        try:
            self.proc.stdin.write(json.dumps(job) + "\n")
            self.proc.stdin.flush()
            for line in self.proc.stdout:
                answer = json.loads(line)
                if "code" in answer:
                    return answer
        except (OSError, ValueError):
            pass
        self.proc.wait()
        return None

    def close(self) -> None:
        """End the worker: its stdin closes and it exits after the job in hand."""
        try:
            self.proc.stdin.close()
        except OSError:
            pass


class RunPool:
    """Trains runs N at a time, each in a numbered slot (thread share, GPU).

    Single-process runs train in the slot's :class:`Worker` (torch and Lightning imported once
    per slot, not once per run); multi-process runs as ``sae.run`` subprocesses
    (:func:`in_process`). ``workers=False`` trains every run as a subprocess.
    """

    def __init__(self, jobs: int, threads: int, gpus: list[str], logs: Path | None = None,
                 workers: bool = True):
        self.slots = list(range(jobs))
        # one GPU per slot only when runs share the machine; a lone run may use them all
        self.threads, self.gpus = threads, gpus if jobs > 1 else []
        self.gpus_per_slot = 1 if self.gpus else len(gpus)
        self.logs, self.use_workers = logs, workers and logs is not None
        self.workers: dict[int, Worker] = {}
        self.lock = threading.Lock()
        self.live: set[subprocess.Popen] = set()
        self.stopping = False
        # not stop_signals_to_main_thread: these threads start the runs' processes, which
        # would inherit the blocked signals and ignore the stop
        self.executor = ThreadPoolExecutor(max_workers=jobs)

    def _gpu(self, slot: int) -> str | None:
        return self.gpus[slot % len(self.gpus)] if self.gpus else None

    def _worker(self, slot: int) -> Worker | None:
        """The slot's live worker, started when needed (None once the pool is stopping)."""
        with self.lock:
            if self.stopping:
                return None
            worker = self.workers.get(slot)
            if worker is None or not worker.alive():
                worker = Worker(job_env(slot, self.threads, self._gpu(slot)),
                                self.logs / f"worker{slot}.log")
                self.workers[slot] = worker
                self.live.add(worker.proc)
            return worker

    def _train(self, run: Run, command: list[str], log: Path,
               analyse: bool) -> tuple[int | None, float]:
        """Exit code (None: not started, the sweep is stopping) and seconds taken."""
        with self.lock:
            slot = self.slots.pop(0)
        try:
            if self.use_workers and in_process(run, self.gpus_per_slot):
                return self._in_worker(slot, command, log, analyse)
            return self._subprocess(slot, run, command, log)
        except OSError:  # its log cannot be written (a link planted there, a full disk)
            return 1, 0.0
        finally:
            with self.lock:
                self.slots.append(slot)

    def _in_worker(self, slot: int, command: list[str], log: Path,
                   analyse: bool) -> tuple[int | None, float]:
        worker = self._worker(slot)
        if worker is None:
            return None, 0.0
        start = time.perf_counter()
        answer = worker.train({"argv": command[3:], "log": str(log), "analyse": analyse})
        seconds = time.perf_counter() - start
        if answer is None:  # the worker died: say so in the run's log
            code = worker.proc.returncode
            with open_log(log) as fh:
                fh.write(f"error: the training process ended unexpectedly (exit {code})\n")
            return (code if code else 1), seconds
        return answer["code"], seconds

    def _subprocess(self, slot: int, run: Run, command: list[str],
                    log: Path) -> tuple[int | None, float]:
        gpu = self._gpu(slot) if uses_gpu(run) else None
        log.parent.mkdir(parents=True, exist_ok=True)
        start = time.perf_counter()
        with open_log(log) as fh:
            with self.lock:  # checked and registered together: stop() misses no process
                if self.stopping:
                    return None, 0.0
                fh.write(f"\n$ {' '.join(command)}\n")
                fh.flush()
                proc = subprocess.Popen(command, stdout=fh, stderr=subprocess.STDOUT,
                                        stdin=subprocess.DEVNULL,
                                        env=job_env(slot, self.threads, gpu))
                self.live.add(proc)
            code = proc.wait()
            seconds = time.perf_counter() - start
            fh.write(f"# exit code {code} after {seconds:.1f} s\n")
            with self.lock:
                self.live.discard(proc)
        return code, seconds

    def submit(self, run: Run, command: list[str], log: Path, analyse: bool = False) -> Future:
        """Queue one training; the future gives (exit code or None, seconds). With ``analyse``
        a worker also analyses the finished run (its analysis.json is then current)."""
        return self.executor.submit(self._train, run, command, log, analyse)

    def submit_stack(self, trainings: list[tuple], analyse: bool = False) -> Future:
        """Queue ``trainings`` ((run, command, log) each) as one stack, in a worker; the
        future gives one (exit code or None, seconds) each. Without workers (or for a run a
        worker cannot train) each trains alone, one after another in one slot."""
        return self.executor.submit(self._train_stack, trainings, analyse)

    def _train_stack(self, trainings: list[tuple], analyse: bool) -> list[tuple]:
        stackable = self.use_workers and all(in_process(run, self.gpus_per_slot)
                                             for run, _, _ in trainings)
        if not stackable:
            return [self._train(run, command, log, analyse) for run, command, log in trainings]
        with self.lock:
            slot = self.slots.pop(0)
        try:
            worker = self._worker(slot)
            if worker is None:
                return [(None, 0.0)] * len(trainings)
            start = time.perf_counter()
            answer = worker.train({"stack": [command[3:] for _, command, _ in trainings],
                                   "logs": [str(log) for _, _, log in trainings],
                                   "analyse": analyse})
            seconds = time.perf_counter() - start
            if answer is None:  # the worker died: say so in each run's log
                code = worker.proc.returncode or 1
                for _, _, log in trainings:
                    with open_log(log) as fh:
                        fh.write("error: the training process ended unexpectedly "
                                 f"(exit {code})\n")
                return [(code, seconds)] * len(trainings)
            return [(code, seconds) for code in answer["codes"]]
        except OSError:  # a log cannot be written
            return [(1, 0.0)] * len(trainings)
        finally:
            with self.lock:
                self.slots.append(slot)

    def close(self) -> None:
        """Wait for the queued runs, then end the workers."""
        self.executor.shutdown(wait=True)
        for worker in self.workers.values():
            worker.close()
        for worker in self.workers.values():
            worker.proc.wait()

    def stop(self) -> None:
        """Start no more runs, interrupt the running ones and wait for them to exit.

        SIGINT, like Ctrl-C in a terminal, lets a training stop cleanly with its last
        checkpoint intact, so the next invocation resumes it; a process still running after
        10 s (one that ignores SIGINT) gets SIGTERM, which sae.run also handles cleanly, and
        one still running 30 s later is killed.
        """
        with self.lock:
            self.stopping = True
            procs = list(self.live)
        self.executor.shutdown(wait=False, cancel_futures=True)
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)
        for sig, wait_s in ((signal.SIGTERM, 10), (signal.SIGKILL, 30)):
            for proc in procs:
                try:
                    proc.wait(timeout=wait_s)
                except subprocess.TimeoutExpired:
                    proc.send_signal(sig)
        for proc in procs:
            proc.wait()
        self.executor.shutdown(wait=True)


def _completed(futures: dict[Future, object]) -> Iterator[Future]:
    """Futures as they finish, woken at least once a second so Ctrl-C is seen promptly."""
    left = set(futures)
    while left:
        done, left = wait(left, timeout=1.0, return_when=FIRST_COMPLETED)
        yield from done


# --------------------------------------------------------------------------- the sweep


def run_sweep(sweep_dir: Path, runs: list[Run], jobs: int, gpus: list[str],
              say: Callable[[str], None], workers: bool = True, data: DataCache | None = None,
              on_idle: Callable[[list[Run]], None] | None = None, pool=None,
              stack: int | None = 1) -> tuple[dict[Path, dict], int]:
    """Train what is missing, analyse what is finished; returns (analyses, failures).

    With ``workers`` (the default) single-process runs train, and are analysed, in long-lived
    worker processes (:class:`Worker`); otherwise each run is a ``sae.run`` subprocess and the
    analysis runs here, with the data splits of ``data``. ``pool`` trains the runs instead of a
    :class:`RunPool` of ``jobs`` slots when given (:class:`sae.sweep.raypool.RayPool`: Ray
    tasks, analysed here). ``stack``: runs a stack holds at most (:func:`plan_stacks`; None:
    as many as pays, 1: every run alone). ``on_idle(finished runs)`` is called
    once, as soon as a run finishes with fewer runs left to finish than there are slots (so a
    slot has nothing to train while others do): the work that must wait for the last run
    (the tables and plots) can prepare there, on a core that would otherwise idle.
    """
    threads = max(1, total_threads() // jobs)
    if pool is None:  # the workers start first: this process imports torch only when it has
        pool = RunPool(jobs, threads, gpus, logs=sweep_dir / "logs", workers=workers)  # work
    data = DataCache() if data is None else data
    progress, analyses = Progress(len(runs), jobs), {}

    def share_cores() -> None:  # this process's own work shares the cores with the trainings
        import torch  # deferred: only when this process analyses a run itself

        torch.set_num_threads(threads)

    def analyse(run: Run, folder: Path) -> dict | None:
        if not analysis_is_current(folder):  # a worker's analysis is read, not redone
            share_cores()
        try:
            analyses[folder] = analyse_run(folder, data)
        except Exception as e:  # a broken checkpoint must not cost the other runs' tables
            say(f"warning: analysis of {run.rel} failed: {type(e).__name__}: {e}")
            return None
        return analyses[folder]

    states = {id(run): run_state(sweep_dir / run.rel) for run in runs}
    trainings = [(run, train_command(run, sweep_dir / run.rel, states[id(run)]),
                  log_path(sweep_dir, run))
                 for run in runs if states[id(run)] not in ("done", "busy")]
    pending = {}
    for group in plan_stacks(trainings, stack, jobs):
        if len(group) == 1:
            pending[pool.submit(*group[0], analyse=True)] = [(group[0][0], group[0][2])]
        else:
            pending[pool.submit_stack(group, analyse=True)] = [(r, log) for r, _, log in group]
    progress.to_train = len(trainings)
    idle_called, completed = on_idle is None, 0
    finished: list[Run] = [run for run in runs if states[id(run)] == "done"]
    try:
        for run in runs:  # finished before: analyse them while the trainings run
            _report_earlier(run, states[id(run)], sweep_dir / run.rel, progress, analyse, say)
        for future in _completed(pending):
            members = pending[future]
            outcomes = future.result() if len(members) > 1 else [future.result()]
            for (run, log), outcome in zip(members, outcomes, strict=True):
                if _report_trained(run, log, outcome, sweep_dir / run.rel, progress,
                                   analyse, say, len(members)):
                    finished.append(run)
            completed += 1
            if not idle_called and 0 < len(pending) - completed < jobs:
                idle_called = True
                share_cores()
                try:
                    on_idle(list(finished))
                except Exception:  # noqa: BLE001 (only a head start: the tables redo it and
                    pass           # report what fails)
    except STOPS:  # Ctrl-C, or SIGTERM to the sweep
        pool.stop()
        raise
    pool.close()
    return analyses, progress.failed


def _report_earlier(run: Run, state: str, folder: Path, progress: Progress, analyse,
                    say: Callable[[str], None]) -> None:
    """The line of a run that was not trained now: finished before (analysed here), or busy in
    another process (left alone, counted as failed)."""
    if state == "done":
        progress.skipped += 1
        a = analyse(run, folder)
        say(progress.line(run, "skipped (finished)", metrics_note(folder, a)))
    elif state == "busy":
        progress.failed += 1
        say(progress.line(run, "FAILED (busy)", "another process is training it; left alone"))


def _report_trained(run: Run, log: Path, outcome: tuple[int, float], folder: Path,
                    progress: Progress, analyse, say: Callable[[str], None],
                    stacked: int = 1) -> bool:
    """The line of a run whose training ended (``outcome``: exit code, seconds; in a stack of
    ``stacked`` runs, the stack's seconds), analysed when it finished; whether it did."""
    code, seconds = outcome
    if code == 0 and run_state(folder) == "done":
        progress.trained += 1
        progress.trained_seconds += seconds / stacked  # the slot's time, shared
        a = analyse(run, folder)
        took = f"trained in {seconds:.1f} s" + (f" (a stack of {stacked})" if stacked > 1
                                                 else "")
        say(progress.line(run, took, metrics_note(folder, a)))
        return True
    progress.failed += 1
    say(progress.line(run, f"FAILED (exit {code})", f"{last_line(log)} [log: {log}]"))
    return False
