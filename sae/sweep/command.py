"""python -m sae.compare: train a grid of SAEs, analyse each run, compare them in tables and plots.

    python -m sae.compare experiments/quick.yaml [--out DIR] [--jobs N] [--dry-run]
                                                 [--publish DIR] [--engine workers|processes|ray]

Sweep file (YAML)::

    description: free text shown at the top of the comparison     (optional)
    datasets: [mnist, fashion-mnist]      # or one name
    seeds: [0, 1, 2]                      # training seeds (a list of integers >= 0)
    common:                               # sae.run settings for every run (optional)
      hidden: 512
      epochs: 8
    models:                               # name -> entry; the order is the tables' order
      l1:
        lambda: [0.003, 0.01, 0.03]       # the grid: λ for every model but topk ...
      topk:
        k: [16, 32, 64]                   # ... and k for topk
      kl:
        lambda: [0.01, 0.1, 1.0]
        rho: 0.05                         # any other key: a per-model override of `common`
      entmax-anneal:                      # a name that is not a model needs `model:`
        model: entmax
        alpha_mode: anneal
        lambda: [0.01]
    probe_loss: softmax                   # or sparsemax: the probe the verdict judges (optional;
                                          # both probes are fitted and tabled)
    targets: [5, 10, 20]                  # the mean L0s models are compared at (optional;
                                          # default 16 and 32, and 64 in the verdict)
    unequal_budget: "k is the target ..." # why the models' search budgets differ (optional)

Target L0s instead of a grid: ``target_l0: [16, 32]`` in a model's entry gives one run per value
and seed, each trained with ``sae.run --target-l0`` (λ adapts during training until the
validation L0 lands near the value, then is held; topk and batchtopk take the value as their k,
so it must be a whole number); ``target_l0: targets`` means the sweep's own ``targets``. In
``common`` it applies to every model with a λ or a k; the published Sparsemax-SAE
(``sparsemax-attention``, neither) keeps its one run at its own L0. A model has either a grid or
target L0s, never both (one ``error:`` line; a model that inherits ``common``'s targets gives
``target_l0: null`` to keep its grid); a single ``lambda`` beside them is where λ starts::

    targets: [16, 32]
    common: {hidden: 512, epochs: 20, target_l0: targets}
    models:
      l1: {}                              # runs/<dataset>/l1/target16/, target32/
      jumprelu: {lambda: 0.03}            # λ starts at 0.03
      topk: {}                            # k16/, k32/
      sparsemax-attention: {}             # one run: its L0 is its own

Such runs land near, not at, their target; the comparison at equal L0 takes a run within 5 % of
a target as it is (:data:`sae.sweep.matching.L0_TOLERANCE`) and interpolates between runs that
bracket it otherwise, so a seed whose run missed its target by more, with no run beyond it, has
no cell there.

Equal search budgets: every model with a λ or k gets as many training configurations per seed
(grid values or target L0s; no other setting takes a list) as every other model on the same
data, so that none wins by being searched more. A sweep file that gives one model more is
refused before anything trains, in one line naming the models and their budgets, unless it says
why in ``unequal_budget: "reason"``; the comparison page then states the budgets and the reason.

Settings are ``sae.run`` flag names without the dashes (``max_steps`` or ``max-steps``; ``lambda``
for ``--lambda``); ``true``/``false`` turn switches such as ``no_figures`` on or off, ``null`` means
sae.run's default. ``dataset``, ``seed`` and ``model`` come from the sweep's structure, and
``out``, ``resume``, ``overwrite`` and ``config`` belong to the runner, so none of them may appear
in ``common``. Activations instead of images: ``data: FILE`` (a ``.npy`` matrix or a ``.json``
manifest, as ``sae.run --data``) in ``common`` (then without ``datasets``) or in a model's entry;
such runs are named, in folders and tables, after the manifest's name or the file's stem, and a
sweep whose started runs trained on other bytes than the file holds now is refused. Only the grid
key and ``target_l0`` take a list (``devices`` may be a list of GPU ids); a missing
grid key gives one run at the value of ``common`` or sae.run's default. Every combination is
checked with sae.run's own parser before anything starts; bad input is one ``error:`` line on
stderr and exit code 2.

Sweep folder (default ``sweeps/<sweep file stem>``)::

    sweep.yaml                 the sweep file as last run
    runs/<dataset>/<model>/<lambda0.01 | k32 | target16>/seed<s>/
                               a sae.run folder, plus analysis.json and test_l0.npy
    logs/<same path>.log       each run's console output (appended on every attempt)
    raw_probe.json             raw-pixel probe accuracy per dataset and data split (cached)
    results.csv                one row per finished run (sae.sweep.aggregate.RESULT_COLUMNS)
    comparison.md              mean ± std over seeds per configuration, "vs KL-SAE", raw input
    comparison.html            the same tables and the plots, one self-contained page
    fvu_vs_l0.png, l0_distributions.png, and what the data has: probe_vs_l0.png and
    class_l0.png (labels), l0_ink_correlation.png (images), truth_vs_l0.png (known features)

``--publish DIR`` copies everything above but ``runs/``, ``logs/`` and ``raw_probe.json`` to DIR
(the committed ``figures/compare/<preset>/`` folders are made this way), with the marker file
``.sae-publication``, and brings the "See also" line of every other publication beside DIR up to
date, so that the pages published before it link it too, and so the figure gallery's list of
comparisons (DIR/../../gallery, when there is one). DIR must be new, empty or an earlier
publication (it carries the marker and only a publication's files); any other folder, even one
holding only files named like a sweep's outputs, is refused before any work.

Damage and interruptions: a sweep folder or run folder holding a link is refused (the writes
would land outside it); a damaged ``analysis.json``, ``test_l0.npy`` or ``raw_probe.json`` is
recomputed; a run whose ``metrics.json`` is damaged is reported as failed (one line; delete that
file to train the run again) and the others are tabled. Ctrl-C or SIGTERM while the outputs are
written stops with one line (exit 130 / 143); each output is written atomically, so none is left
half-written.

Each run trains as ``python -m sae.run ... --out <run folder>`` would: in one of ``--jobs``
long-lived worker processes (:mod:`sae.sweep.worker`), which import torch and Lightning and read
the dataset once and then train, and analyse, run after run; a multi-process run (DDP) and every
run under ``--engine processes`` in a subprocess of its own; under ``--engine ray`` each run is a
Ray task (:mod:`sae.sweep.raypool`). While the sweep trains, its runs
write no figures, feature browser or report (``sae.sweep.spec.RUN_PAGES_OFF``; ``common`` may
switch them on): ``python -m sae.report RUN`` and ``python -m sae.features RUN`` build them for
the runs a reader opens. A run with
``metrics.json`` is finished and never trained again (nor deleted); one with a checkpoint but no
``metrics.json`` continues with ``--resume``; one killed before its first checkpoint (only
``config.yaml``) starts again with ``--overwrite``. So a killed sweep, started again with the same
command, picks up where it stopped; a resumed run keeps the settings of its own config.yaml. To
change a finished configuration, use a new ``--out`` (or move its run folders away). Runs no
longer in the sweep file are left alone and left out of the tables. ``--jobs N`` (at most the
machine's cores, or four runs on each GPU the runs use) trains N runs at a time, splitting the
CPU threads between them (``OMP_NUM_THREADS``), or giving each one GPU (``CUDA_VISIBLE_DEVICES``)
when GPUs are visible and its accelerator is ``gpu``, ``cuda`` or ``auto`` (with ``--jobs 1`` a
run sees every GPU, for ``devices: 2`` and DDP). Ctrl-C stops the sweep: the running trainings
get SIGINT and keep their last checkpoint; no new ones start.

Analysis of a finished run (cached in ``analysis.json`` next to the run's ``metrics.json``) loads
``checkpoints/last.ckpt``, encodes the run's own training and test images, and records the linear
probe's test accuracy (``sae.metrics.linear_probe``: train-set codes -> test-set codes), the mean
L0 of each class on the test set, and the Pearson correlation between a test input's L0 and its
ink (sum of pixels; undefined, stored as null, when L0 or ink is constant). The per-sample test L0
is saved as ``test_l0.npy``. The tables and plots wait for the last run, but what they need
before it (the plotting libraries, the raw-pixel probes) is done as soon as a slot has no run
left to take, while the others still train. Exit status: 0 when every run finished, 1 when some
failed (the tables then cover the finished ones), 2 for bad input, 130 when interrupted.
"""

from __future__ import annotations

import argparse
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path

import yaml

from sae.data.rundata import check_sweep_data
from sae.pages import gallery
from sae.settings.cli import OneLineParser, UsageError, path_arg, shown
from sae.sweep.analysis import DataCache, run_metrics
from sae.sweep.heartbeat import STARTING_EVERY, Heartbeat, starting_line, sweep_status
from sae.sweep.launch import (
    MAX_JOBS,
    check_folders,
    check_jobs,
    lock,
    machine_cores,
    run_state,
    run_sweep,
    total_threads,
    train_command,
    uses_gpu,
    visible_gpus,
)
from sae.sweep.raypool import RayPool, check_address, check_ray
from sae.sweep.render import (
    FIGURE_FILES,
    prepare_outputs,
    publish_page,
    relink_page,
    write_outputs,
)
from sae.sweep.spec import Run, Sweep, check_budgets, check_name, load_sweep, plan
from sae.system.io import copy_file, find_link, read_text, write_text
from sae.system.process import (
    EXIT_FAILED,
    EXIT_USAGE,
    STOPS,
    interrupted,
    raise_terminated,
    stop_code,
    stop_word,
)


def parse_args(argv: list[str]) -> argparse.Namespace:
    """The command line, checked: ``--jobs`` an integer >= 1, ``--out`` and ``--publish`` paths."""
    p = OneLineParser(prog="python -m sae.compare",
                      description="Train every combination of a sweep file through sae.run "
                                  "(skipping finished runs, resuming interrupted ones), analyse "
                                  "them, and write results.csv, comparison.md, comparison.html "
                                  "and plots.")
    p.add_argument("sweep", type=path_arg,
                   help="sweep file (YAML), e.g. experiments/quick.yaml")
    p.add_argument("--out", type=path_arg, default=None,
                   help="sweep folder (default: sweeps/<file stem>)")
    p.add_argument("--jobs", default="1",
                   help="runs trained at the same time, at most this machine's cores (four a "
                        "GPU for GPU runs; a Ray cluster's CPUs with --address) (default: 1)")
    p.add_argument("--engine", choices=("workers", "processes", "ray"), default="workers",
                   help="workers: single-process runs train in one long-lived process per job "
                        "slot (torch and the data loaded once); processes: every run is its own "
                        "`python -m sae.run` process; ray: every run is a Ray task, on a local "
                        "Ray instance or the cluster at --address (the run folders on a file "
                        "system every node sees) (default: workers)")
    p.add_argument("--stack", default="auto", metavar="auto|N|off",
                   help="train runs that share their data and loop as stacks of at most N "
                        "(one pass over the batches, one backward and one optimiser step for "
                        "all; each run's results are those of training it alone); auto: up "
                        "to 8, never fewer stacks than --jobs; off: every run alone; "
                        "--engine processes trains every run alone (default: auto)")
    p.add_argument("--address", default=None,
                   help="--engine ray: a running Ray cluster's address, as `ray start --head` "
                        "prints it (default: a Ray instance of this machine's own)")
    p.add_argument("--dry-run", action="store_true",
                   help="check the file and show what would run; train nothing, write nothing")
    p.add_argument("--publish", type=path_arg, default=None, metavar="DIR",
                   help="also copy the tables, plots, comparison.html and sweep.yaml (no run "
                        "folders) to DIR, e.g. figures/compare/mnist")
    args = p.parse_args(argv)
    args.jobs = _jobs(args.jobs)
    args.stack = _stack(args.stack, args.engine)
    if args.address is not None and args.engine != "ray":
        raise UsageError("--address applies to --engine ray")
    if args.engine == "ray":
        check_ray()
        if args.address is not None:
            check_address(args.address, connect=False)  # its form; a cluster there: in main
    if not args.out:  # the sweep folder is named after the file: sweeps/<its stem>
        try:
            check_name(Path(args.sweep).stem, f"sweep file {args.sweep}: its name")
        except UsageError as e:
            raise UsageError(f"{e}; give --out") from None
    args.out = Path(args.out) if args.out else Path("sweeps") / Path(args.sweep).stem
    args.publish = Path(args.publish) if args.publish else None
    return args


MAX_STACK = 64  # runs a stack may hold: beyond it a step's memory grows, its overhead does not fall


def _stack(text: str, engine: str) -> int | None:
    """``--stack`` as runs a stack holds at most: None for auto, 1 for off."""
    if text == "off" or engine == "processes":
        return 1
    if text == "auto":
        return None
    if not text.isdigit() or not 1 <= int(text) <= MAX_STACK:
        raise UsageError(f"--stack must be auto, off or an integer from 1 to {MAX_STACK}, got "
                         f"{shown(text, 40)}")
    return int(text)


def _jobs(text: str) -> int:
    """``--jobs`` as an integer from 1 to :data:`MAX_JOBS` (the machine's own bound comes once
    the runs are known: :func:`sae.sweep.launch.check_jobs`); a number of any length is one
    line, never a conversion's traceback."""
    if not (text.isascii() and text.isdecimal()) or not text.strip("0"):
        raise UsageError(f"--jobs must be an integer >= 1, got {shown(text, 40)}")
    if len(text.lstrip("0")) > len(str(MAX_JOBS)) or int(text) > MAX_JOBS:
        raise UsageError(f"--jobs {shown(text, 40)} is more than a sweep runs at once "
                         f"({MAX_JOBS}); this machine has {machine_cores()} cores")
    return int(text)


PUBLISHED = ("sweep.yaml", "results.csv", "comparison.md", "comparison.html", *FIGURE_FILES)
PUBLISH_MARKER = ".sae-publication"  # in every folder --publish made: it may be refreshed


def check_publish_dir(folder: Path) -> None:
    """A --publish folder may be new, empty, or an earlier publication (the marker and only
    PUBLISHED files): anything else in it is the user's, and is never overwritten."""
    if folder.exists() and not folder.is_dir():
        raise UsageError(f"--publish {folder} exists and is not a folder")
    if not folder.is_dir():
        return
    entries = {p.name for p in folder.iterdir()}
    other = sorted(entries - {*PUBLISHED, PUBLISH_MARKER})
    if other:
        raise UsageError(f"--publish {folder} holds files that are not a sweep's outputs "
                         f"({other[0]}, ...); choose an empty or new folder")
    if entries and PUBLISH_MARKER not in entries:
        raise UsageError(f"--publish {folder} was not made by --publish (no {PUBLISH_MARKER}); "
                         "its files are left alone: choose an empty or new folder")
    link = find_link(folder)
    if link is not None:
        raise UsageError(f"--publish {folder}: {link} is a link; refusing to write there")


def check_sweep_dir(folder: Path) -> None:
    """Refuse a sweep folder with a link anywhere inside: its runs, logs and tables would be
    written through it, outside the folder."""
    if folder.is_dir():
        link = find_link(folder)
        if link is not None:
            raise UsageError(f"refusing sweep folder {folder}: {link} is a link (a sweep folder "
                             "holds no links; remove it)")


def publish(sweep_dir: Path, folder: Path, sweep: Sweep | None = None,
            runs: list[Run] | None = None) -> list[Path]:
    """Copy the sweep's outputs (not its runs) to folder; returns the copies.

    With the sweep and its runs, the comparison pages are rendered again for ``folder``, so
    that they link only what exists there (no run reports; the gallery and the other data set's
    page where they lie beside it).
    """
    folder.mkdir(parents=True, exist_ok=True)
    write_text(folder / PUBLISH_MARKER, "made by python -m sae.compare --publish\n")
    copies = []
    for name in PUBLISHED:
        if (sweep_dir / name).is_file():
            copies.append(copy_file(sweep_dir / name, folder / name))
        elif name in FIGURE_FILES:  # a figure the sweep no longer draws (its data lacks it)
            (folder / name).unlink(missing_ok=True)
    if sweep is not None and runs is not None and (sweep_dir / "results.csv").is_file():
        publish_page(sweep_dir, sweep, runs, folder)
    relink_publications(folder)
    relink_gallery(folder)
    return copies


def relink_gallery(folder: Path) -> list[Path]:
    """Bring the comparisons line of the figure gallery beside the publications
    (``folder``/../../gallery, made by ``python -m sae.gallery``) up to date, so that it links
    every comparison published, this one too (:func:`sae.pages.gallery.relink`). A folder without
    a gallery page, or holding a link, is left alone; returns the files rewritten."""
    out = folder.parent.parent / "gallery"
    if not (out / "index.html").is_file() or find_link(out) is not None:
        return []
    return gallery.relink(out)


def _page_datasets(folder: Path) -> list[str]:
    """The datasets named by a publication's sweep.yaml (none for a sweep on a data file)."""
    try:
        data = yaml.safe_load(read_text(folder / "sweep.yaml"))
    except (OSError, ValueError, yaml.YAMLError):
        return []
    names = data.get("datasets") if isinstance(data, dict) else None
    names = [names] if isinstance(names, str) else names
    return [n for n in names if isinstance(n, str)] if isinstance(names, list) else []


def relink_publications(folder: Path) -> list[Path]:
    """Bring the "See also" line of every other publication beside ``folder`` up to date, so
    that a page published earlier links the one just published (:func:`relink_page`). Only
    folders that ``--publish`` made (the marker) and that hold no link are touched; returns the
    files rewritten."""
    written = []
    here = folder.resolve()
    for other in sorted(p for p in folder.parent.iterdir() if p.is_dir()):
        if other.resolve() == here or not (other / PUBLISH_MARKER).is_file() or \
                find_link(other) is not None:
            continue
        written += relink_page(other, _page_datasets(other))
    return written


def all_done(sweep_dir: Path, runs: list[Run]) -> bool:
    """Whether every run is finished (then no engine needs to start: the tables are remade)."""
    return all(run_state(sweep_dir / run.rel) == "done" for run in runs)


def dry_run(sweep_dir: Path, runs: list[Run], say: Callable[[str], None]) -> None:
    """Say what each run would do (its state and sae.run command); touch nothing."""
    states = {}
    for run in runs:
        state = run_state(sweep_dir / run.rel)
        states[state] = states.get(state, 0) + 1
        command = train_command(run, sweep_dir / run.rel, state)[1:]
        say(f"{state:<8} {run.rel}" + ("" if state == "done" else
                                        f"  $ python {' '.join(command)}"))
    counts = ", ".join(f"{n} {s}" for s, n in states.items())
    say(f"{len(runs)} runs ({counts}); nothing was trained (--dry-run)")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    started = time.time()  # the heartbeat's clock, and the age of a log it reads
    # a line every few seconds until the sweep's first (checks of large data, Ray's start)
    with Heartbeat(lambda line: print(line, flush=True), lambda: starting_line(started),
                   every=STARTING_EVERY) as starting:
        return _main(argv, started, starting)


def _main(argv: list[str], started: float, starting: Heartbeat) -> int:
    def say(line: str) -> None:
        print(line, flush=True)

    try:
        args = parse_args(argv)
        sweep = load_sweep(args.sweep)
        runs = plan(sweep)
        gpus = visible_gpus() if any(uses_gpu(r) for r in runs) else []
        check_jobs(args.jobs, gpus, args.engine, args.address)
        check_sweep_dir(args.out)
        check_folders(args.out, runs, args.jobs, gpus)
        check_sweep_data(args.out, runs)  # every data file, and the one each run trained on
        check_budgets(sweep)  # every model as many configurations, or a reason why
        if args.publish is not None:
            check_publish_dir(args.publish)
        on_ray = args.engine == "ray" and not all_done(args.out, runs)
        if on_ray and args.address is not None:
            check_address(args.address)  # a cluster answers there, in seconds
        if args.dry_run:
            dry_run(args.out, runs, say)
            return 0
    except UsageError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_USAGE

    signal.signal(signal.SIGTERM, raise_terminated)  # stop the trainings as Ctrl-C does
    threads = max(1, total_threads() // args.jobs)
    try:
        held, pool = claim(args, threads, on_ray)
    except UsageError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except STOPS as e:
        return interrupted(e)
    threads = pool.threads if pool is not None else threads  # a cluster's nodes may hold fewer
    with held:
        write_text(args.out / "sweep.yaml", sweep.text)
        starting.stop()
        say(f"sweep {sweep.path.name}: {len(runs)} runs → {args.out} "
            f"({args.jobs} at a time, {threads} CPU thread{'s' * (threads > 1)} each)")
        data = DataCache()  # the splits this process loads, shared by the analysis and tables
        doing: list[str] = []  # what the heartbeat names once no run trains
        beat = Heartbeat(say, lambda: sweep_status(args.out, runs, started,
                                                   doing[-1] if doing else None))
        try:
            with beat:
                analyses, failed = run_sweep(
                    args.out, runs, args.jobs, gpus, beat.say, workers=args.engine == "workers",
                    data=data, on_idle=lambda finished: prepare_outputs(args.out, finished, data),
                    pool=pool, stack=args.stack)
        except STOPS as e:
            return interrupted(e, f"run the same command again to continue ({args.out})")
        failed += report_damaged(args.out, runs, say)
        try:
            doing.append("writing the tables and figures")
            with beat:
                written = write_outputs(args.out, sweep, runs, analyses, data)
            say("wrote " + ", ".join(str(p.relative_to(args.out)) for p in written) +
                f" in {args.out}")
            if args.publish is not None:
                copies = publish(args.out, args.publish, sweep, runs)
                say(f"published {len(copies)} files to {args.publish}")
        except STOPS as e:  # each file is written atomically: none is half-made
            print(f"{stop_word(e)} while writing the tables; run the same command again to "
                  f"write them ({args.out})", file=sys.stderr)
            return stop_code(e)
    if failed:
        print(f"error: {failed} of {len(runs)} runs failed; see their logs in {args.out / 'logs'}",
              file=sys.stderr)
        return EXIT_FAILED
    return 0


def claim(args: argparse.Namespace, threads: int, on_ray: bool):
    """The sweep folder, made and locked, and the Ray pool when the runs train on Ray (else
    None): Ray is reached first, so that a cluster that refuses, or a stop while Ray starts,
    leaves no folder behind. Returns (the lock to hold, the pool)."""
    pool = RayPool(threads, args.address, cpus=total_threads(), jobs=args.jobs) \
        if on_ray else None
    try:
        args.out.mkdir(parents=True, exist_ok=True)
        return lock(args.out), pool
    except BaseException:
        if pool is not None:
            pool.close()
        raise


def report_damaged(sweep_dir: Path, runs: list[Run], say: Callable[[str], None]) -> int:
    """Say which finished runs have a damaged ``metrics.json`` (left out of the tables); returns
    how many. Not retrained: the file is the run's own record, and a changed record is the
    user's to judge (deleting it makes the next sweep train the run again)."""
    damaged = [r for r in runs if run_state(sweep_dir / r.rel) == "done"
               and run_metrics(sweep_dir / r.rel) is None]
    for run in damaged:
        say(f"warning: {run.rel}: metrics.json is damaged; left out of the tables (delete "
            f"{sweep_dir / run.rel / 'metrics.json'} to train the run again)")
    return len(damaged)


def as_command() -> None:
    """Run as ``python -m sae.compare``: exit with :func:`main`'s code."""
    sys.exit(main())
