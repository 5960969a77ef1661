"""python -m sae.features <run-folder>: write the run's feature browser."""

from __future__ import annotations

import signal
import sys

from sae.pages.features.build import build_features, checked_run
from sae.settings.cli import OneLineParser, UsageError, path_arg
from sae.system.process import (
    STOPS,
    exit_now,
    importing,
    interrupted,
    interruptible,
    running_as,
)
from sae.training.runfolder import RunFolderError


def main(argv: list[str] | None = None) -> int:
    # Ctrl-C interrupts even when started from a script that ignores SIGINT in the background
    signal.signal(signal.SIGINT, signal.default_int_handler)

    parser = OneLineParser(prog="python -m sae.features",
                           description="Write <run-folder>/features.html: what each unit of a "
                                       "trained SAE responds to.")
    parser.add_argument("run", type=path_arg, help="run folder (holds config.yaml, checkpoints/)")
    parser.add_argument("--data-dir", type=path_arg, default=None,
                        help="folder with the IDX files (default: the run's, $SAE_DATA_DIR)")
    parser.add_argument("--out", type=path_arg, default=None,
                        help="write the page here (default: <run-folder>/features.html)")
    parser.add_argument("--max-inputs", type=int, default=None,
                        help="use only the first N test inputs")
    try:
        args = parser.parse_args(argv)
        if args.max_inputs is not None and args.max_inputs < 1:
            raise UsageError(f"--max-inputs must be >= 1, got {args.max_inputs}")
        if args.out is not None and not args.out.parent.is_dir():
            raise UsageError(f"--out: folder {args.out.parent} does not exist")
        checked_run(args.run)  # answer a wrong folder before importing torch
    except (UsageError, RunFolderError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:
        with interruptible():
            # torch and Lightning: a stop mid-import ends the command at once
            with importing(interrupted if running_as("sae.features") else None):
                import sae.data.matrixdata  # noqa: F401
            from sae.data.images import DataSourceError  # imported just above, after the checks

            try:
                path = build_features(args.run, args.data_dir, args.max_inputs, args.out)
            except (RunFolderError, DataSourceError, OSError) as exc:
                print(f"error: {exc}", file=sys.stderr)
                return 2
    except STOPS as exc:  # the page is written atomically: never half of one
        return interrupted(exc)
    print(path)
    return 0


def as_command() -> None:
    """Run as ``python -m sae.features``: exit with :func:`main`'s code."""
    code = main()
    if code in (130, 143):  # stopped: the page is written atomically, so nothing is left
        exit_now(code)
    sys.exit(code)
