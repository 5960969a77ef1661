"""python -m sae.run: train one SAE and write its run folder.

    python -m sae.run --model sparsemax --lambda 0.01

Run folder::

    config.yaml          resolved settings (re-usable with --config)
    metrics.csv          per-step training and per-epoch validation metrics
    metrics.json         final test-set metrics (written when training completes)
    checkpoints/         last.ckpt, best.ckpt (lowest val/loss)
    tensorboard/         TensorBoard logs
    figures/<kind>/      PNGs (see sae.callbacks)
    report.html          self-contained report

Settings are layered: defaults < --config FILE < (on --resume) the run's config.yaml < flags.
Every value is checked before any work starts; bad input is one line on stderr and exit code 2.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
from dataclasses import fields
from datetime import datetime
from pathlib import Path

import yaml

from sae.config import DEAD_GUARDS, MODELS, SAEConfig

DATASET_CHOICES = ("mnist", "fashion-mnist")
EXIT_USAGE = 2


class UsageError(Exception):
    """Bad user input: printed as one line, exit code 2."""


class OneLineParser(argparse.ArgumentParser):
    def error(self, message: str):  # argparse prints usage + message; users get one line
        raise UsageError(message)


def _number(kind, low=None, high=None, low_open=False, allow_none=False):
    def parse(text: str):
        if allow_none and str(text).lower() in ("none", "null", ""):
            return None
        try:
            value = kind(text)
        except (TypeError, ValueError):
            raise argparse.ArgumentTypeError(f"expected {kind.__name__}, got {text!r}") from None
        if kind is float and not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"must be finite, got {text!r}")
        if low is not None and (value <= low if low_open else value < low):
            raise argparse.ArgumentTypeError(f"must be {'>' if low_open else '>='} {low}, "
                                             f"got {text!r}")
        if high is not None and value > high:
            raise argparse.ArgumentTypeError(f"must be <= {high}, got {text!r}")
        return value
    return parse


def _devices(text: str):
    if text == "auto":
        return text
    if "," in text:
        try:
            return [int(t) for t in text.split(",") if t]
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected auto, N or a list like 0,1: {text!r}") \
                from None
    return _number(int, low=-1)(text)


def build_parser(suppress: bool = False) -> OneLineParser:
    """The CLI; with ``suppress`` only explicitly given flags appear in the result."""
    p = OneLineParser(
        prog="python -m sae.run", description="Train a sparse autoencoder on MNIST or "
        "Fashion-MNIST and write a run folder.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    d = SAEConfig()
    m = p.add_argument_group("model")
    m.add_argument("--model", choices=MODELS, default=d.model, help="sparsity mechanism")
    m.add_argument("--lambda", dest="lam", type=_number(float, 0), default=d.lam,
                   help="penalty weight λ (ignored by topk)")
    m.add_argument("--hidden", type=_number(int, 1), default=d.hidden, help="code units H")
    m.add_argument("--k", type=_number(int, 1), default=d.k, help="topk: active units per input")
    m.add_argument("--rho", type=_number(float, 0, 1, low_open=True), default=d.rho,
                   help="kl: target mean activation ρ")
    m.add_argument("--alpha", type=_number(float, 1, low_open=True), default=d.alpha,
                   help="entmax: α (start value when learned or annealed)")
    m.add_argument("--alpha-mode", choices=("learn", "anneal", "fixed"), default=d.alpha_mode,
                   help="entmax: learn α, anneal it to 2, or keep it fixed")
    m.add_argument("--groups", type=_number(int, 1), default=d.groups,
                   help="sparsemax/entmax: independent heads over the code")
    m.add_argument("--arch", choices=("linear", "mlp"), default=d.arch,
                   help="one linear layer each way, or a 784-W-H-W-784 MLP")
    m.add_argument("--mlp-width", type=_number(int, 1), default=d.mlp_width)
    m.add_argument("--init", choices=("auto", "random", "data"), default=d.init,
                   help="decoder columns start random or at centred training images; auto = "
                        "data for sparsemax/entmax")
    m.add_argument("--kl-threshold", type=_number(float, 0, 1, low_open=True),
                   default=d.kl_threshold, help="kl: a sigmoid unit fires above this")

    t = p.add_argument_group("training")
    t.add_argument("--epochs", type=_number(int, 1), default=10)
    t.add_argument("--max-steps", type=_number(int, 1, allow_none=True), default=None,
                   help="stop after this many steps (overrides --epochs when reached first)")
    t.add_argument("--batch-size", type=_number(int, 1), default=256)
    t.add_argument("--lr", type=_number(float, 0, low_open=True), default=d.lr)
    t.add_argument("--lr-warmup", type=_number(float, 0), default=d.lr_warmup,
                   help="learning-rate warm-up: steps (>= 1) or fraction of training (< 1)")
    t.add_argument("--lr-decay", choices=("none", "cosine"), default=d.lr_decay)
    t.add_argument("--lambda-warmup", type=_number(float, 0), default=d.lambda_warmup,
                   help="λ warm-up from 0: steps (>= 1) or fraction of training (< 1)")
    t.add_argument("--lambda-warmup-shape", choices=("linear", "cosine"),
                   default=d.lambda_warmup_shape)
    t.add_argument("--grad-clip", type=_number(float, 0), default=1.0,
                   help="gradient-norm clipping; 0 disables")
    t.add_argument("--dead-guard", choices=("auto",) + DEAD_GUARDS, default=d.dead_guard,
                   help="dead-unit remedy; auto = auxk for topk, resample otherwise")
    t.add_argument("--dead-window", type=_number(int, 1), default=d.dead_window,
                   help="a unit is dead after this many training samples without firing")
    t.add_argument("--resample-every", type=_number(int, 1), default=d.resample_every,
                   help="steps between dead-unit resamplings")
    t.add_argument("--resample-until", type=_number(float, 0, 1), default=d.resample_until,
                   help="no resampling after this fraction of training")
    t.add_argument("--aux-k", type=_number(int, 1), default=d.aux_k)
    t.add_argument("--seed", type=_number(int, 0), default=0)

    data = p.add_argument_group("data")
    data.add_argument("--dataset", choices=DATASET_CHOICES, default="mnist")
    data.add_argument("--data-dir", default=None,
                      help="folder with the IDX files (default: $SAE_DATA_DIR, torchvision's "
                           "cache, then download)")
    data.add_argument("--val-size", type=_number(int, 1), default=5000,
                      help="validation images carved from train (fixed split seed)")
    data.add_argument("--limit-train", type=_number(int, 1, allow_none=True), default=None,
                      help="use only this many training images (quick runs)")
    data.add_argument("--limit-test", type=_number(int, 1, allow_none=True), default=None)

    run = p.add_argument_group("run folder and output")
    run.add_argument("--out", default=None,
                     help="run folder (default: runs/<dataset>-<model>-<time>)")
    run.add_argument("--resume", nargs="?", const="last", default=None, metavar="CKPT",
                     help="continue the run in --out from its last checkpoint, or from CKPT")
    run.add_argument("--overwrite", action="store_true", default=False,
                     help="replace an existing run folder")
    run.add_argument("--config", default=None, help="YAML file of settings; flags override it")
    run.add_argument("--figure-every", type=_number(int, 0), default=0,
                     help="render figures every N epochs (0: only at the end)")
    run.add_argument("--no-figures", action="store_true", default=False)
    run.add_argument("--no-report", action="store_true", default=False)
    run.add_argument("--log-every", type=_number(int, 1), default=50,
                     help="log training metrics every N steps")
    run.add_argument("--progress", choices=("auto", "on", "off"), default="auto",
                     help="progress bar (auto: only on a terminal)")

    hw = p.add_argument_group("hardware (passed to Lightning)")
    hw.add_argument("--accelerator", default="auto", help="cpu, gpu, mps, auto, ...")
    hw.add_argument("--devices", type=_devices, default="auto", help="N, a list 0,1, or auto")
    hw.add_argument("--strategy", default="auto", help="auto, ddp, ddp_spawn, fsdp, ...")
    hw.add_argument("--num-nodes", type=_number(int, 1), default=1)
    hw.add_argument("--precision", default="32-true", help="32-true, bf16-mixed, 16-mixed, ...")
    hw.add_argument("--compile", action="store_true", default=False,
                    help="torch.compile the model")
    if suppress:  # explicit defaults above would otherwise win over argument_default
        for action in p._actions:
            if action.dest != "help":
                action.default = argparse.SUPPRESS
    return p


# config keys as written in config.yaml: the dest names, with "lambda" for lam
_FILE_ONLY = {"config", "resume", "overwrite", "out"}


def _flag_for(key: str) -> str:
    return "--lambda" if key in ("lam", "lambda") else "--" + key.replace("_", "-")


def settings_from_file(path: str | Path) -> dict:
    """Read a YAML mapping of settings and check every value with the CLI's own parser."""
    path = Path(path)
    if not path.is_file():
        raise UsageError(f"config file {path} does not exist")
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as e:
        raise UsageError(f"config file {path} is not valid YAML ({str(e).splitlines()[0]})") \
            from None
    if not isinstance(data, dict):
        raise UsageError(f"config file {path} must hold a mapping of settings")
    parser, tokens = build_parser(suppress=True), []
    known = {a.dest for a in parser._actions}
    for key, value in data.items():
        dest = "lam" if key == "lambda" else str(key).replace("-", "_")
        if dest not in known or dest in _FILE_ONLY:
            raise UsageError(f"config file {path}: unknown setting {key!r}")
        action = next(a for a in parser._actions if a.dest == dest)
        if action.nargs == 0:  # store_true flags
            if value:
                tokens.append(_flag_for(dest))
        elif value is not None:
            text = ",".join(map(str, value)) if isinstance(value, list) else str(value)
            tokens += [_flag_for(dest), text]
    try:
        return vars(parser.parse_args(tokens))
    except UsageError as e:
        raise UsageError(f"config file {path}: {e}") from None


def is_primary_process() -> bool:
    """False in the worker processes that Lightning or torchrun start for DDP."""
    return all(int(os.environ.get(name, 0)) == 0 for name in ("RANK", "LOCAL_RANK", "NODE_RANK"))


def resolve_settings(argv: list[str]) -> argparse.Namespace:
    """Layer defaults, --config, the resumed run's config.yaml and explicit flags."""
    build_parser().parse_args(argv)  # --help (with defaults shown) and bad values end here
    explicit = vars(build_parser(suppress=True).parse_args(argv))
    settings = vars(build_parser().parse_args([]))
    if explicit.get("config"):
        settings.update(settings_from_file(explicit["config"]))
    if explicit.get("resume") is not None:
        out = explicit.get("out") or os.environ.get("SAE_RUN_DIR")
        if out is None and explicit["resume"] != "last":
            out = _run_dir_of_checkpoint(Path(explicit["resume"]))
        if out is None:
            raise UsageError("--resume needs --out RUN_FOLDER (or a checkpoint inside one)")
        saved = Path(out) / "config.yaml"
        if not saved.is_file():
            raise UsageError(f"cannot resume: {saved} does not exist")
        settings.update(settings_from_file(saved))
        settings["out"] = str(out)
    settings.update(explicit)
    if settings.get("out") is None:
        settings["out"] = os.environ.get("SAE_RUN_DIR") or str(
            Path("runs") / f"{settings['dataset']}-{settings['model']}-"
            f"{datetime.now().strftime('%Y%m%d-%H%M%S')}")
    return argparse.Namespace(**settings)


def _run_dir_of_checkpoint(ckpt: Path) -> str | None:
    for parent in ckpt.resolve().parents[:2]:
        if (parent / "config.yaml").is_file():
            return str(parent)
    return None


def model_config(args: argparse.Namespace) -> SAEConfig:
    names = {f.name for f in fields(SAEConfig)}
    config = SAEConfig(**{k: v for k, v in vars(args).items() if k in names})
    try:
        config.validate()
    except ValueError as e:
        raise UsageError(str(e)) from None
    return config


def check_settings(args: argparse.Namespace) -> None:
    """Cross-field checks that the parser cannot do alone."""
    if args.resume is not None and args.overwrite:
        raise UsageError("--resume and --overwrite exclude each other")
    if args.data_dir is not None and not Path(args.data_dir).is_dir():
        raise UsageError(f"--data-dir {args.data_dir} is not a folder")
    if args.resume not in (None, "last") and not Path(args.resume).is_file():
        raise UsageError(f"--resume checkpoint {args.resume} does not exist")


def prepare_run_folder(args: argparse.Namespace) -> Path:
    """Create the run folder; never touch an existing one unless --resume or --overwrite."""
    out = Path(args.out)
    exists = out.exists() and (not out.is_dir() or any(out.iterdir()))
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {out} exists and is not a folder")
    if args.resume is not None:
        ckpt = checkpoint_to_resume(args)
        if not ckpt.is_file():
            raise UsageError(f"cannot resume: no checkpoint at {ckpt}")
        return out
    if exists and not args.overwrite:
        raise UsageError(f"run folder {out} already exists; pass --resume to continue it or "
                         "--overwrite to replace it")
    if exists and args.overwrite:
        if not (out / "config.yaml").is_file():
            raise UsageError(f"refusing to --overwrite {out}: it is not a run folder "
                             "(no config.yaml)")
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)
    return out


def checkpoint_to_resume(args: argparse.Namespace) -> Path:
    if args.resume in (None, "last"):
        return Path(args.out) / "checkpoints" / "last.ckpt"
    return Path(args.resume)


def write_config(args: argparse.Namespace, path: Path) -> None:
    skip = _FILE_ONLY
    data = {("lambda" if k == "lam" else k): v for k, v in vars(args).items() if k not in skip}
    tmp = path.with_suffix(".tmp")
    tmp.write_text(yaml.safe_dump(data, sort_keys=False))
    tmp.replace(path)


def resumable_csv_logger(out: Path):
    """Lightning's CSVLogger, except that an existing metrics.csv is continued, not deleted."""
    import csv

    from lightning.pytorch.loggers import CSVLogger
    from lightning.pytorch.loggers.csv_logs import ExperimentWriter

    class ContinuingWriter(ExperimentWriter):
        def _check_log_dir_exists(self) -> None:
            if self._fs.isfile(self.metrics_file_path):  # keep its columns, append new rows
                with open(self.metrics_file_path, newline="") as f:
                    self.metrics_keys = next(csv.reader(f), [])

    class ContinuingCSVLogger(CSVLogger):
        @property
        def experiment(self):
            if self._experiment is None:
                self._fs.makedirs(self.root_dir, exist_ok=True)
                self._experiment = ContinuingWriter(log_dir=self.log_dir)
            return self._experiment

    return ContinuingCSVLogger(out, name="", version="")


def trim_history(path: Path, global_step: int) -> None:
    """Drop rows logged after the checkpoint we resume from (they will be logged again).

    Lightning logs a row with step = (optimiser steps taken) − 1, so a checkpoint taken after
    ``global_step`` steps covers the rows with step < global_step.
    """
    import pandas as pd

    if path.is_file():
        history = pd.read_csv(path)
        history[history["step"] < global_step].to_csv(path, index=False)


def quiet_lightning() -> None:
    """Keep the terminal for what matters: Lightning's banners and known-harmless warnings off."""
    import logging
    import warnings

    for name in ("lightning.pytorch", "lightning.fabric"):
        logging.getLogger(name).setLevel(logging.WARNING)
    for message in (".*exists and is not empty.*", ".*does not have many workers.*",
                    ".*LeafSpec.*", ".*is an invalid version and will not be supported.*"):
        warnings.filterwarnings("ignore", message=message)


def train(args: argparse.Namespace) -> dict:
    """Build everything from validated settings, fit, evaluate on the test set."""
    import lightning.pytorch as L
    import torch
    from lightning.pytorch.callbacks import ModelCheckpoint, Timer, TQDMProgressBar
    from lightning.pytorch.loggers import TensorBoardLogger

    from sae import metrics
    from sae.data import ImageDataModule
    from sae.models import build_model, encode_dataset, training_callbacks

    out = Path(args.out)
    config = model_config(args)
    quiet_lightning()
    L.seed_everything(args.seed, workers=True, verbose=False)
    dm = ImageDataModule(args.dataset, args.data_dir, args.batch_size, args.val_size,
                         limit_train=args.limit_train, limit_test=args.limit_test)
    dm.load()
    mean = dm.train_mean
    data_var = float((dm.train_x - mean).pow(2).sum(-1).mean())
    init_inputs = None
    if config.resolved_init() == "data":  # seeded: the same images for the same --seed
        pick = torch.randperm(len(dm.train_x), generator=torch.Generator().manual_seed(args.seed))
        init_inputs = dm.train_x[pick[: config.hidden]]
    model = build_model(config, mean, data_var, init_inputs)

    steps_per_epoch = math.ceil(len(dm.train_x) / args.batch_size)
    val_interval, val_every_epochs = 1.0, 1
    if args.max_steps is not None and args.max_steps < steps_per_epoch:
        # still validate (and checkpoint) before stopping; counted in steps across epochs, as
        # DDP ranks see shorter epochs
        val_interval, val_every_epochs = args.max_steps, None
    callbacks = [ModelCheckpoint(dirpath=out / "checkpoints", filename="best", monitor="val/loss",
                                 mode="min", save_top_k=1, save_last=True,
                                 enable_version_counter=False)]
    callbacks += [timer := Timer(), *training_callbacks(config)]  # time saved in checkpoints
    if not args.no_figures:
        from sae.callbacks import FigureCallback

        callbacks.append(FigureCallback(out / "figures", every_n_epochs=args.figure_every,
                                        class_names=dm.class_names))
    show_progress = args.progress == "on" or (args.progress == "auto" and sys.stderr.isatty())
    if show_progress:
        callbacks.append(TQDMProgressBar(refresh_rate=20))
    loggers = [resumable_csv_logger(out),
               TensorBoardLogger(out, name="tensorboard", version="", default_hp_metric=False)]
    trainer = L.Trainer(
        max_epochs=args.epochs, max_steps=args.max_steps or -1, accelerator=args.accelerator,
        devices=args.devices, strategy=args.strategy, num_nodes=args.num_nodes,
        precision=args.precision, gradient_clip_val=args.grad_clip or None,
        gradient_clip_algorithm="norm", logger=loggers, callbacks=callbacks,
        log_every_n_steps=min(args.log_every, steps_per_epoch), val_check_interval=val_interval,
        check_val_every_n_epoch=val_every_epochs,
        num_sanity_val_steps=0, enable_progress_bar=show_progress, enable_model_summary=False,
        default_root_dir=out)
    fit_model = torch.compile(model) if args.compile else model
    ckpt = str(checkpoint_to_resume(args)) if args.resume is not None else None
    if ckpt is not None and trainer.is_global_zero:
        saved = torch.load(ckpt, map_location="cpu", weights_only=False)
        trim_history(out / "metrics.csv", saved["global_step"])
    try:
        trainer.fit(fit_model, datamodule=dm, ckpt_path=ckpt)
    except SystemExit:
        # Lightning turns Ctrl-C into a graceful shutdown and sys.exit(1); report it as the
        # interruption it is (main prints how to resume, exit code 130)
        if trainer.interrupted:
            raise KeyboardInterrupt from None
        raise
    wall = timer.time_elapsed("train")  # summed over the sessions of a resumed run
    # the last validation's checkpoint can be behind when --max-steps ends mid-epoch
    trainer.save_checkpoint(out / "checkpoints" / "last.ckpt")
    if not trainer.is_global_zero:
        return {}

    x_hat, codes = encode_dataset(model, dm.test_x)
    result = metrics.summarize(dm.test_x, x_hat, codes, mean, threshold=model.fire_threshold)
    # the reconstruction from only the units counted in L0 (differs from fvu for sigmoid codes,
    # whose sub-threshold activity still reconstructs)
    result["fvu_at_l0"] = result["fvu"]
    if model.fire_threshold > 0:
        kept = codes * metrics.active(codes, model.fire_threshold)
        with torch.no_grad():
            x_kept = torch.cat([model.decode(kept[i:i + 1024].to(model.device)).cpu()
                                for i in range(0, len(kept), 1024)])
        result["fvu_at_l0"] = metrics.fvu(dm.test_x, x_kept, mean)
    result.update(wall_time_s=wall, steps=int(trainer.global_step),
                  epochs=int(trainer.current_epoch), model=config.model, lam=config.lam,
                  dataset=args.dataset, seed=args.seed, hidden=config.hidden,
                  fire_threshold=float(model.fire_threshold))
    if config.model == "entmax":
        result["alpha"] = float(model.current_alpha())
    tmp = out / "metrics.json.tmp"
    tmp.write_text(json.dumps(result, indent=2))
    tmp.replace(out / "metrics.json")
    if not args.no_report:
        from sae.report import write_report

        write_report(out)
    return result


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        args = resolve_settings(argv)
        model_config(args)
        check_settings(args)
        primary = is_primary_process()
        if primary:
            out = prepare_run_folder(args)
            if args.resume is None:
                write_config(args, out / "config.yaml")
            os.environ["SAE_RUN_DIR"] = str(out)  # DDP workers re-run this CLI: same folder
    except UsageError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_USAGE

    from sae.data import DataSourceError
    from sae.models import NonFiniteLossError

    try:
        result = train(args)
    except DataSourceError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except NonFiniteLossError as e:
        last = Path(args.out) / "checkpoints" / "last.ckpt"
        kept = f"last good checkpoint kept at {last}" if last.is_file() else "no checkpoint yet"
        print(f"error: training stopped: {e}; {kept}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"interrupted; continue with: python -m sae.run --out {args.out} --resume",
              file=sys.stderr)
        return 130
    if result:
        print(f"run folder: {args.out}")
        print(" ".join(f"{k}={result[k]:.4g}" for k in
                       ("mse", "fvu", "l0_mean", "l0_std", "dead_fraction", "dense_fraction",
                        "wall_time_s") if k in result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
