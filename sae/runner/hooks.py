"""``--hook a,b,c``: one SAE per layer of one model, each in a run folder of its own
(``OUT/a``, ``OUT/b``, ...), from one set of forward passes.

The model runs once over the training (and test) inputs with every layer hooked at once, and
each layer's rows are written to a row file of its own (:mod:`sae.data.rowcache`); then the
runs train one after the other, each exactly as ``--hook <layer> --out OUT/<layer>`` trains,
reading its rows from its file instead of running the model. The passes are shared, and each
run is the run that layer alone would make (the same rows, batches and order). The row files
(each the layer's activations, rows × width float32) are removed when the runs end.
"""

from __future__ import annotations

import signal
import sys
from pathlib import Path

from sae.settings.cli import UsageError, run_config
from sae.system.process import EXIT_USAGE, STOPS, interrupted, raise_terminated
from sae.training import runfolder


def hooks_of(argv: list[str]) -> list[str]:
    """The layers ``argv``'s --hook names (one, or several comma-separated); [] when its
    settings do not check (the run's own checks then say why)."""
    if not any("," in arg for arg in argv) and "--config" not in argv:
        return []  # several layers come from a flag or a settings file: none here
    try:
        hook = run_config(argv).data.hook
    except UsageError:
        return []
    return [h.strip() for h in hook.split(",")] if hook else []


def without(argv: list[str], flags: tuple[str, ...]) -> list[str]:
    """``argv`` without ``flags`` and their values (``--flag V`` or ``--flag=V``)."""
    out, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg in flags:
            skip = True
        elif not arg.startswith(tuple(f"{f}=" for f in flags)):
            out.append(arg)
    return out


def run_hooks(argv: list[str], run_one) -> int | None:
    """Train one run per layer of ``--hook a,b,c`` (``run_one``: the command, for one layer);
    None when ``argv`` names one layer. The exit code: 0 when every run finished, else the
    first run's that did not (a stop ends the runs still to come)."""
    hooks = hooks_of(argv)
    if len(hooks) < 2:
        return None
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, raise_terminated)
    config = run_config(argv)
    if "" in hooks or len(set(hooks)) < len(hooks):
        print(f"error: --hook {config.data.hook}: name each layer once, separated by commas",
              file=sys.stderr)
        return EXIT_USAGE
    if not config.data.source:
        print("error: --hook with several layers reads a model's layers: give --source",
              file=sys.stderr)
        return EXIT_USAGE
    if _several_processes(config.hardware):
        print("error: --hook with several layers trains them one after the other in one "
              "process: give one --hook per command to train on several devices or "
              "processes", file=sys.stderr)
        return EXIT_USAGE
    out = Path(config.folder.out)
    rows, made = None, not out.exists()
    try:
        rows = _dump(config, hooks, out)
        rest = without(argv, ("--hook", "--out"))
        for hook in hooks:
            print(f"layer {hook}: {out / hook}", flush=True)
            code = run_one([*rest, "--hook", hook, "--out", str(out / hook)])
            runfolder.release(out / hook)  # its run is over: the caller may resume or read it
            if code != 0:
                return code
        return 0
    except UsageError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except STOPS as e:
        return interrupted(e, "the runs not yet started were not started")
    finally:
        if "sae.data.rowcache" in sys.modules:  # loaded by _dump: its row files go
            sys.modules["sae.data.rowcache"].release(config.data.source, rows)
        if made and out.is_dir() and not any(out.iterdir()):  # no run began in it
            out.rmdir()


def _several_processes(hardware) -> bool:
    """Whether the hardware settings ask for more than one training process (DDP, FSDP,
    several devices or machines), which would each start the command again."""
    devices = hardware.devices
    count = len(devices) if isinstance(devices, list | tuple) else \
        devices if isinstance(devices, int) else 1
    return any(s in hardware.strategy for s in ("ddp", "fsdp")) or hardware.num_nodes > 1 \
        or count > 1 or count == -1


def _dump(config, hooks: list[str], out: Path) -> Path:
    """Every layer's rows in one pass per batch of inputs (:func:`sae.data.rowcache.dump`);
    the folder of row files. Raises ``UsageError`` with one line."""
    from sae.data.hooked import LayerReader, SourceError, find_layer  # torch: for --source
    from sae.data.rowcache import dump, release, row_folder  # likewise
    from sae.data.streamed import resolve  # likewise

    data = config.data
    if config.folder.resume is None and not config.folder.overwrite:
        taken = [h for h in hooks if (out / h).exists()]
        if taken:
            raise UsageError(f"{out / taken[0]} exists; give another --out, --overwrite, or "
                             "--resume (nothing is overwritten)")
    try:
        model, train, test = resolve(data.source)
        layers = [find_layer(model, h, data.source) for h in hooks]
        probe = LayerReader(model, layers[0], hook=hooks[0], positions=data.positions)
        sequence = probe.read(train, [0]).sequence
        most = max(1, data.buffer_rows // (sequence or 1))
        folder = row_folder(out)
        print(f"reading {len(hooks)} layers in one pass over the inputs, {most} a pass",
              flush=True)
        try:
            dump(data.source, model, hooks, layers, [d for d in (train, test) if d is not None],
                 data.positions, most, folder)
        except BaseException:
            release(data.source, folder)
            raise
    except SourceError as e:
        raise UsageError(str(e)) from None
    return folder
