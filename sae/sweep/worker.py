"""A long-lived training process for sweeps: imports torch and Lightning once, trains run after run.

Starting ``python -m sae.run`` for every run of a sweep pays the interpreter, torch and Lightning
start-up and the dataset's reading each time, which for short runs costs as much as the training.
A sweep instead keeps one worker per job slot (:class:`Worker`, started by
:class:`sae.sweep.launch.RunPool`); each worker reads jobs from its stdin, one JSON object a line::

    {"argv": [...sae.run flags, --out included...], "log": "<path>", "analyse": true}

and trains each with ``sae.runner.command.main(argv)``, in this process, with its stdout and stderr
(file descriptors 1 and 2, so Lightning's and C-level output too) appended to the run's log. Each
run is exactly what ``python -m sae.run ARGV`` would do: same settings layer, same seed handling
(``seed_everything`` at the start of every run), same run folder, checkpoints and exit codes. With
``analyse`` the worker then analyses the finished run (:func:`sae.sweep.analysis.analyse_run`:
probes and dynamic-sparsity measures, cached in the run folder), while the trained run's data is
still in memory. It answers one JSON line per job on the stdout it started with::

    {"code": 0, "seconds": 12.3, "analysis_error": null}

A run that Ctrl-C or SIGTERM stopped (exit 130 or 143) ends the worker after its answer: the sweep
is stopping. If the worker dies (a crash, a kill), the pool sees its stdout close and reports the
run as failed; the next run gets a new worker.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from pathlib import Path

from sae.runner import command as run
from sae.runner import stack
from sae.sweep.analysis import DataCache, analyse_run
from sae.sweep.launch import open_log
from sae.system.process import (
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_TERMINATED,
    RUN_DIR_ENV,
    STOPS,
    Terminated,
    stop_code,
    stop_with_parent,
)
from sae.training import runfolder

__all__ = ["STOPPING_CODES", "main", "run_job"]

STOPPING_CODES = (EXIT_INTERRUPTED, EXIT_TERMINATED)  # the sweep is stopping
# what a run leaves in this process's environment for its own DDP workers or sessions
_RUN_ENV = (RUN_DIR_ENV, "SAE_SESSION")


def _redirect(fd: int) -> None:
    """Point this process's stdout and stderr (the file descriptors, not only sys.std*) at fd."""
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os.dup2(fd, 1)
    os.dup2(fd, 2)


def _folder_of(argv: list[str]) -> Path | None:
    return Path(argv[argv.index("--out") + 1]) if "--out" in argv else None


def run_stack_job(job: dict, data) -> dict:
    """Train (and analyse) a stack of runs in this process (``sae.runner.stack``): its output
    goes to the first run's log and is copied to the others' at the end; the answer has each
    run's exit code (``codes``)."""
    argvs, logs = [list(a) for a in job["stack"]], [Path(p) for p in job["logs"]]
    with open_log(logs[0]) as fh:
        before = fh.tell()
        _redirect(fh.fileno())
    print(f"\n$ a stack of {len(argvs)} runs:", flush=True)
    for argv in argvs:
        print(f"$   python -m sae.run {' '.join(argv)}", flush=True)
    start = time.perf_counter()
    try:
        codes = stack.main(argvs)
    except BaseException:  # noqa: BLE001 (a failure must not end the worker)
        traceback.print_exc()
        codes = [EXIT_FAILED] * len(argvs)
    seconds = time.perf_counter() - start
    print(f"# exit codes {codes} after {seconds:.1f} s", flush=True)
    sys.stdout.flush()
    text = logs[0].read_bytes()[before:]
    for log in logs[1:]:  # each run's log tells its part, as a run alone's would
        with open_log(log) as fh:
            os.write(fh.fileno(), text)
    errors = []
    for argv, code in zip(argvs, codes, strict=True):
        folder = _folder_of(argv)
        errors.append(None)
        if code == 0 and job.get("analyse") and folder is not None:
            try:
                analyse_run(folder, data)
            except Exception as e:  # noqa: BLE001 (reported; the sweep retries it itself)
                errors[-1] = f"{type(e).__name__}: {e}"
    return {"code": max(codes), "codes": codes, "seconds": seconds, "analysis_errors": errors}


def run_job(job: dict, data) -> dict:
    """Train (and analyse) one run in this process; returns the answer to send back."""
    if "stack" in job:
        return run_stack_job(job, data)
    argv, log = list(job["argv"]), Path(job["log"])
    with open_log(log) as fh:
        _redirect(fh.fileno())
    print(f"\n$ python -m sae.run {' '.join(argv)}", flush=True)
    start = time.perf_counter()
    try:
        code = run.main(argv)
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    except KeyboardInterrupt:
        code = EXIT_INTERRUPTED
    except BaseException as e:  # noqa: BLE001 (a run's failure must not end the worker)
        if isinstance(e, Terminated):  # between sae.run's own handlers
            code = EXIT_TERMINATED
        else:
            traceback.print_exc()
            code = EXIT_FAILED
    finally:
        folder = _folder_of(argv)
        if folder is not None:
            runfolder.release(folder)  # the next run of this worker may be someone else's
        for name in _RUN_ENV:
            os.environ.pop(name, None)
    seconds = time.perf_counter() - start
    print(f"# exit code {code} after {seconds:.1f} s", flush=True)
    answer = {"code": code, "seconds": seconds, "analysis_error": None}
    if code == 0 and job.get("analyse") and folder is not None:
        start = time.perf_counter()
        try:
            analyse_run(folder, data)
        except Exception as e:  # noqa: BLE001 (reported; the sweep retries it itself)
            traceback.print_exc()
            answer["analysis_error"] = f"{type(e).__name__}: {e}"
        print(f"# analysed in {time.perf_counter() - start:.1f} s", flush=True)
    return answer


def main() -> int:
    reply = os.fdopen(os.dup(1), "w", buffering=1, encoding="utf-8")
    # until the first job, and between jobs, output goes where stderr went
    os.dup2(2, 1)
    stop_with_parent()  # stop (SIGTERM) when the sweep dies, even by kill -9
    import torch  # deferred: seconds of import, with the output redirected and the stop armed

    if os.environ.get("OMP_NUM_THREADS", "").isdigit():
        torch.set_num_threads(max(1, int(os.environ["OMP_NUM_THREADS"])))
    data = DataCache()
    reply.write(json.dumps({"ready": os.getpid()}) + "\n")
    try:
        for line in sys.stdin:
            if not line.strip():
                continue
            answer = run_job(json.loads(line), data)
            reply.write(json.dumps(answer) + "\n")
            if answer["code"] in STOPPING_CODES:
                return answer["code"]
    except STOPS as e:  # the sweep stops while this worker waits for a job
        return stop_code(e)
    return 0


if __name__ == "__main__":
    sys.exit(main())
