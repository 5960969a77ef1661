"""python -m sae.gallery: the curated figure gallery of figures/gallery/.

Trains (or reuses) one default run per dataset × model through ``python -m sae.run`` and copies
its final decoder atoms, sorted firing frequencies, class × unit heatmap and sparsity histogram
into ``--out``, with a README.md table of the runs' test metrics, the command that made it and
links to every comparison published in ``--out``/../compare/ (``python -m sae.compare
--publish`` brings them up to date when it publishes one there later: :func:`relink`).
Every figure names its dataset, model and λ in its title (the figure callback writes them), and
the firing-frequency figures share one fixed log axis, so the same height means the same
frequency side by side.

    python -m sae.gallery --out figures/gallery --runs runs/gallery

Bad values (here or in the flags passed on to ``sae.run``) are one ``error:`` line and exit
code 2 before ``--out`` is created; so is a finished run whose ``metrics.json`` or latest figure
is damaged (delete it to make it again). Ctrl-C or SIGTERM: the training under way stops as
``sae.run`` does (with its checkpoint, or leaving nothing before its first one), the gallery
waits for it, says so in one line and exits 130 or 143; every file is written atomically. The
same command then continues: a run with a checkpoint is resumed, one stopped before its first
checkpoint (a kill -9) is started again with ``--overwrite`` (which refuses a folder holding
files a run does not write).
"""

from __future__ import annotations

import math
import re
import signal
import subprocess
import sys
from pathlib import Path

from sae.settings.cli import OneLineParser, UsageError, resolve_settings
from sae.settings.config import DATASETS, FIXED_BUDGET
from sae.system.io import UnsafePathError, copy_file, read_bytes, read_text, write_text
from sae.system.process import (
    EXIT_FAILED,
    EXIT_USAGE,
    STOPS,
    Terminated,
    interrupted,
    interruptible,
)
from sae.training import runfolder
from sae.training.runfolder import RunFolder

MODELS = ("sparsemax", "kl", "l1", "topk", "batchtopk", "jumprelu")
KINDS = ("decoder_atoms", "activation_frequency", "class_unit_heatmap", "sparsity_histogram")


EPOCH_PNG = re.compile(r"epoch_(\d+)\.png")
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
METRICS = ("lam", "mse", "fvu", "l0_mean", "l0_std", "dead_fraction", "dense_fraction",
           "wall_time_s")


HEAD = ("dataset", "model", "λ / k", "mse", "fvu", "fvu at L0", "L0 (mean ± std)", "dead %",
        "dense %", "train s")
NOTE = ("fvu at L0: the reconstruction from only the units counted in L0. It equals fvu except "
        "for the KL-SAE, whose sigmoid units below the firing threshold (0.1) still add to the "
        "reconstruction.")


def index_page(out: Path, made: str, rows: list[list[str]]) -> str:
    """index.html: the README's table and every copied figure, one section per dataset, each
    figure shown from its file beside the page (a browser opens this; it does not render
    markdown), with links to the published comparison pages."""
    from sae.pages import html as pages  # jinja2: only when the page is written

    sections = []
    for dataset in DATASETS:
        body = []
        for kind in KINDS:
            shown = [f"{dataset}-{model}-{kind}.png" for model in MODELS
                     if (out / f"{dataset}-{model}-{kind}.png").is_file()]
            if shown:
                body.append(pages.fragment("<h3>{}</h3>", kind.replace("_", " ")))
                body += [pages.image_link(name, name) for name in shown]
        sections.append(pages.Section(dataset, dataset, pages.join(body)))
    sections.insert(0, pages.Section("runs", "Runs", pages.join([
        pages.table(HEAD, rows, stack=True), pages.fragment("<p>{}</p>", NOTE)])))
    intro: list = [made]
    links = comparisons_html(out)
    if links is not None:
        intro.append(links)
    return pages.render_page(title="Gallery", heading="Gallery",
                             subtitle=f"generated {pages.timestamp()}", intro=intro,
                             sections=sections)


def comparisons(out: Path) -> list[str]:
    """The published comparisons the gallery in ``out`` links: every folder of
    ``out``/../compare/ that holds a comparison page (comparison.md or .html), by name."""
    return sorted({p.parent.name for p in (out.parent / "compare").glob("*/comparison.*")
                   if p.name in ("comparison.md", "comparison.html")})


def comparisons_markdown(out: Path) -> str | None:
    """README.md's line linking every published comparison; None when there is none."""
    names = comparisons(out)
    return "Comparisons: " + " · ".join(
        f"[{name}](../compare/{name}/comparison.md)" for name in names) if names else None


def comparisons_html(out: Path):
    """index.html's paragraph text linking every published comparison; None when there is
    none."""
    from sae.pages import html as pages  # jinja2: only when the page is written

    names = comparisons(out)
    return pages.fragment("Comparisons: {}", pages.join(
        pages.join([pages.link(f"../compare/{name}/comparison.html", name), " "])
        for name in names)) if names else None


_COMPARISONS_HTML = re.compile(r"<p>Comparisons: .*?</p>\n", re.S)


def relink(out: Path) -> list[Path]:
    """Bring the comparisons line of the gallery in ``out`` (README.md and index.html) up to
    the comparisons published beside it now; nothing else in them changes.

    A gallery links the comparisons that existed when it was made; ``python -m sae.compare
    --publish`` calls this after each publication, so that the gallery links it too. Returns
    the files rewritten (those whose line changed); a file that cannot be read as text is left
    as it is.
    """
    written = []
    readme, index = out / "README.md", out / "index.html"
    line = comparisons_markdown(out)
    try:
        text = read_text(readme) if readme.is_file() else None
    except (OSError, UnicodeDecodeError):
        text = None
    if text is not None:  # the line is the last paragraph, as the gallery writes it
        head = text.rsplit("\n\nComparisons: ", 1)[0].rstrip("\n") + "\n"
        changed = head + (f"\n{line}\n" if line is not None else "")
        if changed != text:
            written.append(write_text(readme, changed))
    try:
        text = read_text(index) if index.is_file() else None
    except (OSError, UnicodeDecodeError):
        text = None
    if text is not None and "<nav>" in text:
        changed = _COMPARISONS_HTML.sub("", text, count=1)
        links = comparisons_html(out)
        if links is not None:
            at = changed.index("<nav>")
            changed = f"{changed[:at]}<p>{links}</p>\n{changed[at:]}"
        if changed != text:
            written.append(write_text(index, changed))
    return written


def latest_png(run: Path, kind: str) -> Path | None:
    """The ``epoch_<E>.png`` of ``kind`` with the highest E (other names are not figures).

    Raises UsageError when that file is not a PNG (a damaged figure is not copied).
    """
    folder = run / "figures" / kind
    found = [(int(m[1]), p) for p in (folder.iterdir() if folder.is_dir() else ())
             if (m := EPOCH_PNG.fullmatch(p.name))]
    if not found:
        return None
    png = max(found)[1]
    try:
        ok = read_bytes(png).startswith(PNG_SIGNATURE)
    except OSError as e:
        raise UsageError(f"cannot read {png}: {e.strerror or e}") from None
    if not ok:
        raise UsageError(f"{png} is not a PNG file (damaged); delete it to draw it again")
    return png


def read_metrics(run: Path) -> dict:
    """A finished run's metrics.json; UsageError when it is damaged or lacks a metric."""
    folder = RunFolder(run)
    path, m = folder.metrics_file, folder.metrics()
    if m is None or not all(
            isinstance(m.get(k), int | float) and not isinstance(m.get(k), bool)
            and math.isfinite(m[k]) for k in METRICS):
        raise UsageError(f"{path} is damaged (not the metrics of a finished run); delete it to "
                         "train the run again")
    return m


def ensure_run(run: Path, dataset: str, model: str, lam: float, epochs: int,
               extra: list[str]) -> dict:
    """Train the run unless it already finished; return its metrics.json."""
    folder = RunFolder(run)
    if not folder.metrics_file.is_file():
        cmd = [sys.executable, "-m", "sae.run", "--model", model, "--lambda", str(lam),
               "--dataset", dataset, "--epochs", str(epochs), "--out", str(run), *extra]
        if folder.checkpoint.is_file():  # interrupted: it continues
            cmd.append("--resume")
        elif run.exists() and not runfolder.is_leftover(run):
            # stopped before its first checkpoint (kill -9): nothing to resume, so it starts
            # again; --overwrite refuses a folder holding anything a run does not write
            cmd.append("--overwrite")
        print("$", Path(sys.executable).name, " ".join(cmd[1:]), flush=True)
        code = train(cmd)
        if code:
            raise subprocess.CalledProcessError(code, cmd)
    return read_metrics(run)


GRACE_S = 5.0  # a Ctrl-C in a terminal reaches the training too: the time it is given alone


def train(cmd: list[str]) -> int:
    """Run ``cmd`` (an ``sae.run`` command); its exit code. Stopped (Ctrl-C, SIGTERM), the
    gallery stops the training as a run stops (:func:`stop_training`) before it goes on
    stopping, so that what the run leaves is what the same command continues from."""
    proc = subprocess.Popen(cmd)
    try:
        return proc.wait()
    except STOPS as e:
        stop_training(proc, signal.SIGTERM if isinstance(e, Terminated) else signal.SIGINT)
        raise


def stop_training(proc: subprocess.Popen, sig: int) -> None:
    """Wait for a training to stop: alone for :data:`GRACE_S` (the terminal's Ctrl-C reached
    it), then after ``sig`` (its checkpoint is written, or a start before the first checkpoint
    is undone), killed only if it still runs 30 s later. Further signals meanwhile are dropped:
    the gallery is stopping already."""
    held = {signal.SIGINT, signal.SIGTERM}
    signal.pthread_sigmask(signal.SIG_BLOCK, held)
    try:
        for send, wait_s in ((None, GRACE_S), (sig, 30.0), (signal.SIGKILL, 30.0)):
            if send is not None and proc.poll() is None:
                proc.send_signal(send)
            try:
                proc.wait(timeout=wait_s)
                return
            except subprocess.TimeoutExpired:
                continue
    finally:
        while signal.sigtimedwait(held, 0) is not None:
            pass
        signal.pthread_sigmask(signal.SIG_UNBLOCK, held)


def parse_args(argv: list[str]):
    """The gallery's own flags, checked, and the rest (checked as ``sae.run`` flags)."""
    parser = OneLineParser(prog="python -m sae.gallery", description=__doc__)
    parser.add_argument("--out", default="figures/gallery")
    parser.add_argument("--runs", default="runs/gallery")
    parser.add_argument("--epochs", default="10")
    parser.add_argument("--lambda", dest="lam", default="0.01")
    args, extra = parser.parse_known_args(argv)
    try:
        args.epochs, args.lam = int(args.epochs), float(args.lam)
    except ValueError:
        raise UsageError(f"--epochs takes an integer and --lambda a number, got "
                         f"{args.epochs[:40]!r} and {args.lam[:40]!r}") from None
    if args.epochs < 1 or not math.isfinite(args.lam) or args.lam < 0:
        raise UsageError(f"--epochs must be >= 1 and --lambda a finite number >= 0, got "
                         f"{args.epochs} and {args.lam}")
    settings = resolve_settings(["--model", MODELS[0], "--lambda", str(args.lam), "--epochs",
                                 str(args.epochs), "--out", str(Path(args.runs) / "x"), *extra])
    args.k = settings.k  # what topk and batchtopk train with (they do not use λ)
    return args, extra


def main(argv: list[str] | None = None) -> int:
    # Ctrl-C always interrupts, even when started from a script that ignores SIGINT for its
    # background jobs; SIGTERM (interruptible) stops as Ctrl-C does
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with interruptible():
            try:
                args, extra = parse_args(sys.argv[1:] if argv is None else argv)
            except UsageError as e:
                print(f"error: {e}", file=sys.stderr)
                return EXIT_USAGE
            try:
                return _gallery(args, extra, argv)
            except (UsageError, UnsafePathError) as e:
                print(f"error: {e}", file=sys.stderr)
                return EXIT_USAGE
            except OSError as e:
                print(f"error: cannot write the gallery: {e.strerror or e}", file=sys.stderr)
                return EXIT_FAILED
    except STOPS as e:
        return interrupted(e, "run the same command again to continue")


def _gallery(args, extra: list[str], argv: list[str] | None) -> int:
    out, runs, k = Path(args.out), Path(args.runs), args.k
    for dataset in DATASETS:  # damage in a finished run is found before anything is written
        for model in MODELS:
            run = runs / f"{dataset}-{model}"
            if (run / "metrics.json").is_file():
                read_metrics(run)
                for kind in KINDS:
                    latest_png(run, kind)
    rows = []
    for dataset in DATASETS:
        for model in MODELS:
            run = runs / f"{dataset}-{model}"
            try:
                m = ensure_run(run, dataset, model, args.lam, args.epochs, extra)
            except subprocess.CalledProcessError as e:
                print(f"error: run {run} failed ({e.returncode})", file=sys.stderr)
                return EXIT_FAILED
            for kind in KINDS:
                png = latest_png(run, kind)
                if png is not None:
                    copy_file(png, out / f"{dataset}-{model}-{kind}.png")
            fvu_at_l0 = m.get("fvu_at_l0")
            if isinstance(fvu_at_l0, bool) or not isinstance(fvu_at_l0, int | float):
                fvu_at_l0 = float("nan")
            setting = f"k = {k}" if model in FIXED_BUDGET else f"λ = {m['lam']:g}"  # (its models
            # all have a λ or a k)
            rows.append([dataset, model, setting, f"{m['mse']:.4f}", f"{m['fvu']:.3f}",
                         f"{fvu_at_l0:.3f}", f"{m['l0_mean']:.1f} ± {m['l0_std']:.1f}",
                         f"{100 * m['dead_fraction']:.1f}", f"{100 * m['dense_fraction']:.1f}",
                         f"{m['wall_time_s']:.0f}"])
    command = " ".join(["python -m sae.gallery", *(argv if argv is not None else sys.argv[1:])])
    made = (f"Made by `{command}` ({args.epochs} epochs, λ = {args.lam:g} or k = {k} for "
            f"{' and '.join(FIXED_BUDGET)}, 512 units, seed 0, default settings otherwise). "
            "Test-set metrics (10 000 images):")
    lines = [
        "# Gallery", "", made, "",
        "| " + " | ".join(HEAD) + " |", "|" + "---|" * len(HEAD),
        *("| " + " | ".join(r) + " |" for r in rows), "", NOTE, "",
        "Files: `<dataset>-<model>-<kind>.png` for kind in " + ", ".join(KINDS) + ". Each "
        "image's title names its dataset, model and λ or k; the activation_frequency figures "
        "share one fixed log scale (10⁻⁴ to 1), so they compare side by side. `index.html` "
        "shows them all in a browser.", ""]
    if comparisons_markdown(out) is not None:  # the published comparisons beside the gallery
        lines += [comparisons_markdown(out), ""]
    write_text(out / "README.md", "\n".join(lines))
    write_text(out / "index.html", index_page(out, made, rows))
    print(f"gallery written to {out}")
    return 0


def as_command() -> None:
    """Run as ``python -m sae.gallery``: exit with :func:`main`'s code."""
    sys.exit(main())
