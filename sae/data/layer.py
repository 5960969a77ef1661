"""python -m sae.layer: a small classifier's hidden layer as an SAE dataset.

Trains an MLP or a CNN on MNIST or Fashion-MNIST, then writes one chosen layer's activations on
the training and test images as an activation manifest (:mod:`sae.data.matrix`), with the labels and
each row's image index, so that ``python -m sae.run --data OUT/dataset.json`` trains an SAE on
what the network represents and its feature browser shows the images that excite each unit::

    python -m sae.layer --dataset mnist --arch mlp --layer 1 --out layers/mnist-mlp-1
    python -m sae.run --data layers/mnist-mlp-1/dataset.json --model sparsemax --lambda 0.01

Layers are counted from the input: ``mlp`` is 784-512-256-10 with ReLUs (layer 1: 512 units,
layer 2: 256); ``cnn`` is two 3x3 convolutions with 2x2 max-pooling and a 128-unit dense layer
(layer 1: 16x13x13 = 2 704, layer 2: 32x5x5 = 800, layer 3: 128). A layer's activations are
taken after its ReLU (after pooling for the convolutions): non-negative, as the SAE's codes of
pixels are. OUT holds ``train.npy`` / ``test.npy`` (N x D, ``--dtype``), ``*_labels.npy``,
``*_rows.npy``, ``classifier.pt`` (the network's tensors only) and ``dataset.json``, which also
records how it was made and the classifier's test accuracy. OUT must be new or empty: nothing
is overwritten. Bad flags are one ``error:`` line and exit code 2 before any work.

Ctrl-C or SIGTERM (even when started in the background, where a shell ignores SIGINT) is one
line and exit 130 or 143, and a failure to write is one line and exit 1: what this run wrote
is removed, and OUT too if it made it, so the same command can simply be run again. A dump
killed mid-write (kill -9) leaves its marker (:data:`MARKER`) and no ``dataset.json``: the same
command takes such a folder and writes it again, if it holds nothing but this tool's files.
"""

from __future__ import annotations

import io
import signal
import sys
from pathlib import Path

from sae.system.io import (
    outermost_new,
    remove_made_folders,
    write_bytes,
    write_json,
    write_text,
)
from sae.system.process import (
    STOPS,
    exit_now,
    importing,
    interrupted,
    raise_terminated,
    running_as,
)

ARCHS = {"mlp": 2, "cnn": 3}  # hidden layers each architecture has
MARKER = ".sae-layer"  # written first: a folder with it and no dataset.json is an unfinished dump
PARTS = ("train", "train_labels", "train_rows", "test", "test_labels", "test_rows")
WRITTEN = {MARKER, "classifier.pt", "dataset.json", *(f"{name}.npy" for name in PARTS)}


def build_classifier(arch: str):
    """The classifier as a sequence of stages; stage i's output is hidden layer i + 1, the last
    stage gives the 10 logits (so ``--hook <i>`` of it is hidden layer i + 1)."""
    from torch import nn  # torch: not at the command's start, before its flags are checked

    if arch == "mlp":
        return nn.Sequential(*[
            nn.Sequential(nn.Flatten(), nn.Linear(784, 512), nn.ReLU()),
            nn.Sequential(nn.Linear(512, 256), nn.ReLU()),
            nn.Linear(256, 10)])
    return nn.Sequential(*[
        nn.Sequential(nn.Unflatten(1, (1, 28, 28)), nn.Conv2d(1, 16, 3), nn.ReLU(),
                      nn.MaxPool2d(2)),                                # 16 x 13 x 13
        nn.Sequential(nn.Conv2d(16, 32, 3), nn.ReLU(), nn.MaxPool2d(2)),  # 32 x 5 x 5
        nn.Sequential(nn.Flatten(), nn.Linear(800, 128), nn.ReLU()),
        nn.Linear(128, 10)])


def forward(stages, x, upto: int | None = None):
    """Logits of ``x`` [B, 784], or the flattened output of hidden layer ``upto`` (1-based)."""
    for i, stage in enumerate(stages):
        x = stage(x)
        if upto is not None and i + 1 == upto:
            return x.flatten(1)
    return x


def train_classifier(arch: str, train_x, train_y, epochs: int, seed: int, batch_size: int = 128,
                     lr: float = 1e-3, say=print):
    """Adam on the cross-entropy, the order of each epoch drawn from (seed, epoch)."""
    # torch: not at the command's start, before its flags are checked
    import torch
    from torch.nn import functional as F  # likewise

    torch.manual_seed(seed)
    stages = build_classifier(arch)
    opt = torch.optim.Adam(stages.parameters(), lr=lr)
    for epoch in range(epochs):
        g = torch.Generator().manual_seed(seed * 1000 + epoch)
        order = torch.randperm(len(train_x), generator=g)
        total = 0.0
        for start in range(0, len(order), batch_size):
            idx = order[start:start + batch_size]
            loss = F.cross_entropy(forward(stages, train_x[idx]), train_y[idx])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            total += float(loss.detach()) * len(idx)
        say(f"epoch {epoch + 1}/{epochs} · loss {total / len(order):.4f}")
    return stages.eval()


def activations(stages, x, layer: int, batch_size: int = 1000):
    """Hidden layer ``layer``'s flattened activations on ``x``, [N, D] float32: read with a
    forward hook on stage ``layer`` while the classifier runs, as ``--source`` reads any model's
    layer (:class:`sae.data.streamed.LayerReader`)."""
    # torch and Lightning: not at the command's start, before its flags are checked
    import torch
    from torch.utils.data import TensorDataset  # likewise

    from sae.data.streamed import LayerReader  # likewise

    reader = LayerReader(stages, stages[layer - 1])
    inputs = TensorDataset(x)
    return torch.cat([reader.rows(inputs, range(i, min(i + batch_size, len(x))))[0]
                      for i in range(0, len(x), batch_size)])


def accuracy(stages, x, y) -> float:
    import torch  # not at the command's start, before its flags are checked

    with torch.no_grad():
        logits = torch.cat([forward(stages, x[i:i + 1000]) for i in range(0, len(x), 1000)])
    return float((logits.argmax(1) == y).float().mean())


def _npy_bytes(array) -> bytes:
    import numpy as np  # not at the command's start, before its flags are checked

    buffer = io.BytesIO()
    np.save(buffer, np.ascontiguousarray(array), allow_pickle=False)
    return buffer.getvalue()


def write_dataset(out: Path, parts: dict, manifest: dict) -> None:
    """Every array of ``parts`` as ``<name>.npy`` and the manifest last, each atomically: a
    folder with ``dataset.json`` is complete."""
    for name, array in parts.items():
        write_bytes(out / f"{name}.npy", _npy_bytes(array))
    write_json(out / "dataset.json", manifest)


def unfinished(out: Path) -> bool:
    """Whether ``out`` holds an unfinished dump of this tool (its marker, no dataset.json, and
    nothing but the files it writes or their temporaries), which a new run may take."""
    if not out.is_dir() or out.is_symlink():
        return False
    names = {p.name for p in out.iterdir()}
    return MARKER in names and "dataset.json" not in names and all(
        name in WRITTEN or (name.startswith(".") and name.endswith(".tmp")) for name in names)


def _undo(out: Path, made: Path | None) -> None:
    """Remove what a stopped or failed dump wrote in ``out`` (its files only), and ``out`` and
    the parents it made (``made``: the outermost), while they are empty."""
    if not out.is_dir() or out.is_symlink():
        return
    for entry in out.iterdir():
        if (entry.name in WRITTEN or (entry.name.startswith(".") and entry.name.endswith(".tmp")
                                      and "-" in entry.name)) and entry.is_file() \
                and not entry.is_symlink():
            entry.unlink(missing_ok=True)
    remove_made_folders(out, made)


def main(argv: list[str] | None = None) -> int:
    from sae.settings.cli import OneLineParser, UsageError, path_arg  # yaml: for the command only

    # Ctrl-C always interrupts, even when started from a script that ignores SIGINT for its
    # background jobs; SIGTERM stops it the same way
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, raise_terminated)

    parser = OneLineParser(prog="python -m sae.layer",
                           description="Train a small classifier and write one hidden layer's "
                                       "activations as an SAE dataset (OUT/dataset.json).")
    parser.add_argument("--dataset", choices=("mnist", "fashion-mnist"), default="mnist")
    parser.add_argument("--arch", choices=tuple(ARCHS), default="mlp",
                        help="mlp: 784-512-256-10; cnn: two convolutions and a dense layer")
    parser.add_argument("--layer", type=int, default=1,
                        help="hidden layer, counted from the input (mlp: 1-2, cnn: 1-3)")
    parser.add_argument("--epochs", type=int, default=3, help="classifier training epochs")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dtype", choices=("float32", "float16"), default="float32",
                        help="of the written activations")
    parser.add_argument("--limit-train", type=int, default=None,
                        help="train on (and write) only the first N training images")
    parser.add_argument("--data-dir", type=path_arg, default=None,
                        help="folder with the IDX files (default: $SAE_DATA_DIR)")
    parser.add_argument("--out", type=path_arg, required=True,
                        help="new or empty folder for the dataset")
    try:
        args = parser.parse_args(argv)
        if not 1 <= args.layer <= ARCHS[args.arch]:
            raise UsageError(f"--layer must be 1 to {ARCHS[args.arch]} for --arch {args.arch}, "
                             f"got {args.layer}")
        if args.epochs < 1:
            raise UsageError(f"--epochs must be >= 1, got {args.epochs}")
        if args.limit_train is not None and args.limit_train < 2:
            raise UsageError(f"--limit-train must be >= 2, got {args.limit_train}")
        if not 0 <= args.seed < 2**32:
            raise UsageError(f"--seed must be in [0, 2^32), got {args.seed}")
        if args.out.is_symlink() or (args.out.exists() and (not args.out.is_dir() or any(
                args.out.iterdir())) and not unfinished(args.out)):
            raise UsageError(f"--out {args.out} exists and is not an empty folder; choose a "
                             "new one (nothing is overwritten)")
    except UsageError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except STOPS as e:
        return interrupted(e)
    again = " (an unfinished dump: written again)" if unfinished(args.out) else ""
    print(f"dataset folder: {args.out}{again}", flush=True)
    state: dict = {}

    def stopped(e: BaseException) -> int:
        if "made" in state:
            _undo(args.out, state["made"])
        return interrupted(e, "nothing was kept" if "made" in state else "nothing was written")

    try:
        # torch: a stop mid-import ends the command at once (sae.system.process.importing)
        with importing(stopped if running_as("sae.layer") else None):
            import torch  # noqa: F401

            import sae.data.images  # noqa: F401
        return _dump(args, argv, state)
    except STOPS as e:
        return stopped(e)


def _dump(args, argv: list[str] | None, state: dict) -> int:
    """Train, then write the dataset; ``state["made"]`` is set once ``--out`` is written to
    (the outermost folder made, or None), so that a stop can undo it."""
    # torch and Lightning: loaded once the flags are checked (main)
    import torch

    from sae.data.images import CLASS_NAMES, DataSourceError, load_arrays, to_float  # likewise
    from sae.data.matrix import FORMAT  # numpy, likewise

    try:
        arrays = load_arrays(args.dataset, args.data_dir)
    except DataSourceError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    train_x, test_x = to_float(arrays.train_images), to_float(arrays.test_images)
    train_y = torch.from_numpy(arrays.train_labels)
    test_y = torch.from_numpy(arrays.test_labels)
    if args.limit_train:
        train_x, train_y = train_x[:args.limit_train], train_y[:args.limit_train]
    try:
        stages = train_classifier(args.arch, train_x, train_y, args.epochs, args.seed)
        test_accuracy = accuracy(stages, test_x, test_y)
        print(f"classifier test accuracy {100 * test_accuracy:.2f} %", flush=True)
        parts = {}
        for split, x, y in (("train", train_x, train_y), ("test", test_x, test_y)):
            parts[split] = activations(stages, x, args.layer).numpy().astype(args.dtype)
            parts[f"{split}_labels"] = y.numpy().astype("int64")
            parts[f"{split}_rows"] = torch.arange(len(x)).numpy()
        dim = parts["train"].shape[1]
        manifest = {
            "format": FORMAT,
            "name": f"{args.dataset} {args.arch} layer {args.layer}",
            "train": {"x": "train.npy", "labels": "train_labels.npy", "rows": "train_rows.npy"},
            "test": {"x": "test.npy", "labels": "test_labels.npy", "rows": "test_rows.npy"},
            "images": {"dataset": args.dataset},
            "class_names": CLASS_NAMES[args.dataset],
            "source": {"command": "python -m sae.layer " + " ".join(
                           argv if argv is not None else sys.argv[1:]),
                       "arch": args.arch, "layer": args.layer, "dim": dim,
                       "epochs": args.epochs, "seed": args.seed,
                       "classifier_test_accuracy": round(test_accuracy, 6)},
        }
        buffer = io.BytesIO()  # written atomically, as every file here
        torch.save({k: v.detach().clone() for k, v in stages.state_dict().items()}, buffer)
        state["made"] = outermost_new(args.out)
        args.out.mkdir(parents=True, exist_ok=True)
        write_text(args.out / MARKER, "made by python -m sae.layer; dataset.json is written "
                   "last\n")
        write_bytes(args.out / "classifier.pt", buffer.getvalue())
        write_dataset(args.out, parts, manifest)
    except OSError as e:
        if "made" in state:
            _undo(args.out, state["made"])
        print(f"error: cannot write {args.out}: {e.strerror or e}; nothing was kept",
              file=sys.stderr)
        return 1
    print(f"layer {args.layer} of {args.arch}: {dim} values per image, "
          f"{len(parts['train'])} train and {len(parts['test'])} test rows")
    print(f"dataset: {args.out / 'dataset.json'}")
    print(f"next: python -m sae.run --data {args.out / 'dataset.json'}")
    return 0


def as_command() -> None:
    """Run as ``python -m sae.layer``: exit with :func:`main`'s code."""
    code = main()
    if code in (130, 143):  # stopped: nothing is left to write; no slow teardown of torch
        exit_now(code)
    sys.exit(code)
