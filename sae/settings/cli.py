"""Settings from the command line and from YAML, derived from the fields of
:mod:`sae.settings.config`.

One declaration (a field and its ``setting`` metadata) gives: the flag, its default and help in
``python -m sae.run --help``, the check of its value (the same for a flag, a ``--config`` file, a
run's ``config.yaml`` and a sweep file), and its key in ``config.yaml``. Settings travel as
``{field name: value}`` dicts; only this module knows that ``lam`` is written ``lambda``.

:func:`run_config` is the whole settings layer of one run: the layered settings, built once
into a typed :class:`sae.settings.config.RunConfig` and checked (:func:`check_run`).

Every problem is a :class:`UsageError` with a one-line message; no torch, no Lightning here.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import fields
from datetime import datetime
from importlib.util import find_spec
from pathlib import Path

import yaml

from sae.settings.config import (
    FIXED_BUDGET,
    NO_BUDGET,
    SECTIONS,
    RunConfig,
    RunFolderConfig,
    pin_auto,
    saved_auto,
)
from sae.settings.setting import (
    Setting,
    UsageError,
    check_fields,
    convert,
    did_you_mean,
    setting_of,
    shown,
)
from sae.settings.sizes import check_model
from sae.settings.variants import uses_lambda
from sae.system.io import UnsafePathError, read_bytes, write_text
from sae.system.process import RUN_DIR_ENV

__all__ = ["LAUNCHER_ENV", "SETTINGS", "OneLineParser", "Setting", "UsageError", "build_parser",
           "check_fields", "check_mapping", "check_run",
           "config_file_dict", "load_yaml", "parse_yaml", "path_arg",
           "read_settings_file", "resolve_settings", "run_config", "shown", "to_argv",
           "unused_flags", "write_config"]


def _settings() -> dict[str, Setting]:
    return {s.name: s for section, heading in SECTIONS for f in fields(section)
            if (s := setting_of(f, heading, section is not RunFolderConfig)) is not None}


SETTINGS = _settings()
# a setting by its YAML key, field name or flag spelling
BY_KEY = {alias: s for s in SETTINGS.values()
           for alias in {s.key, s.name, s.key.replace("_", "-")}}


# ---------------------------------------------------------------- the command line


class OneLineParser(argparse.ArgumentParser):
    """The parser of every ``python -m sae.*`` command: a usage error is a :class:`UsageError`,
    which the command prints as one ``error:`` line with exit code 2 (argparse would print the
    usage too); a misspelt flag or choice names the closest one (``did you mean --lambda?``)."""

    def error(self, message: str):
        raise UsageError(message)

    def flags(self) -> list[str]:
        """Every option string this parser takes (``--lambda``, ``--help``, ...)."""
        return [flag for action in self._actions for flag in action.option_strings]

    def parse_args(self, args=None, namespace=None):
        parsed, extra = self.parse_known_args(args, namespace)
        if extra:
            self.error(unrecognized(extra, self.flags()))
        return parsed

    def _check_value(self, action, value):  # argparse's choices= (other commands' flags)
        try:
            super()._check_value(action, value)
        except argparse.ArgumentError as e:
            raise argparse.ArgumentError(
                action, str(e).split(": ", 1)[-1] + did_you_mean(value, action.choices)) \
                from None


def unrecognized(extra: list[str], flags) -> str:
    """argparse's "unrecognized arguments" message, with the flag each misspelt one is closest
    to: ``unrecognized arguments: --lamda 0.1; did you mean --lambda?``."""
    hints = []
    for arg in extra:
        if arg.startswith("--"):
            hint = did_you_mean(arg.split("=", 1)[0], flags)
            if hint:
                hints.append((arg.split("=", 1)[0], hint[len("; did you mean "):-1]))
    given = " ".join(extra)
    text = f"unrecognized arguments: {given if len(given) <= 200 else given[:197] + '...'}"
    if len(hints) == 1:
        return f"{text}; did you mean {hints[0][1]}?"
    if hints:
        return f"{text}; did you mean " + ", ".join(f"{right} (for {wrong})"
                                                     for wrong, right in hints) + "?"
    return text


def path_arg(text: str) -> Path:
    """An argparse ``type`` for a path: one the file system would refuse as too long is a usage
    error here, not an OSError wherever it is first used."""
    try:
        check_path_names("the path", text)
    except UsageError as e:
        raise argparse.ArgumentTypeError(str(e)[len("the path: "):]) from None
    return Path(text)


def _parse_text(s: Setting):
    def parse(text: str):
        try:
            return convert(s, text, text=True)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
    parse.__name__ = s.type  # argparse names the type in its messages
    return parse


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Defaults shown where there is one: no "(default: None)" for settings off by default."""

    def _get_help_string(self, action):
        if action.default is None or action.default is False:
            return action.help
        return super()._get_help_string(action)


def _metavar(s: Setting) -> str:
    if s.choices is not None and len(s.choices) <= 8:
        return "{" + ",".join(s.choices) + "}"
    return s.key.upper().replace("-", "_")


def build_parser(suppress: bool = False) -> OneLineParser:
    """``python -m sae.run``'s parser; with ``suppress`` only explicitly given flags are set."""
    p = OneLineParser(
        prog="python -m sae.run", description="Train a sparse autoencoder on MNIST or "
        "Fashion-MNIST and write a run folder.",
        formatter_class=_HelpFormatter,
        argument_default=argparse.SUPPRESS if suppress else None)
    groups = {}
    for s in SETTINGS.values():
        if s.group not in groups:
            groups[s.group] = p.add_argument_group(s.group)
        group = groups[s.group]
        default = argparse.SUPPRESS if suppress else s.default
        if s.type == "bool":
            group.add_argument(s.flag, dest=s.name, action="store_true", default=default,
                               help=s.help)
        elif s.type == "path":
            group.add_argument(s.flag, dest=s.name, nargs="?", const=s.const, default=default,
                               metavar="CKPT", help=s.help)
        else:
            group.add_argument(s.flag, dest=s.name, type=_parse_text(s), default=default,
                               help=s.help, metavar=_metavar(s))
    return p


def to_argv(settings: dict) -> list[str]:
    """``python -m sae.run`` flags for ``{field name: value}`` (None: left at the default)."""
    argv: list[str] = []
    for name, value in settings.items():
        s = SETTINGS[name]
        if s.type == "bool":
            argv += [s.flag] if value else []
        elif value is not None:
            argv += [s.flag, ",".join(map(str, value)) if isinstance(value, list) else str(value)]
    return argv


# ---------------------------------------------------------------- YAML


# Bounds on a settings or sweep file: far above any real one (a sweep file is a few kB, nests
# four levels, and uses no aliases), far below what would cost seconds or memory to build.
MAX_YAML_BYTES = 1_000_000
MAX_YAML_DEPTH = 32
MAX_YAML_NODES = 100_000  # values in the document once every alias is expanded


class YAMLTooComplex(yaml.YAMLError):
    """A document over the bounds above (an alias bomb, absurd nesting): refused unbuilt."""


class _StrictLoader(yaml.SafeLoader):
    """safe_load that refuses a mapping with a repeated key (YAML keeps the last silently) and
    a document over the bounds above, checked on the composed node graph before any value is
    built: an alias bomb is a few hundred nodes with aliases, so it is measured, not expanded."""

    def __init__(self, stream):
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent, index):
        self._depth += 1
        try:
            if self._depth > MAX_YAML_DEPTH:
                raise YAMLTooComplex(f"it nests deeper than {MAX_YAML_DEPTH} levels")
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_document(self, node):
        _check_expanded_size(node)
        return super().construct_document(node)


def _children(node: yaml.Node) -> list:
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    return []


def _check_expanded_size(root: yaml.Node) -> None:
    """Count the values of ``root`` with aliases expanded (memoised per node, so linear in the
    composed graph); refuse a self-referencing document or one over :data:`MAX_YAML_NODES`
    (named as aliases only where one was met: a long plain list is not an alias bomb)."""
    size: dict[int, int] = {}
    open_nodes: set[int] = set()
    stack = [(root, False)]
    aliased = False  # a node met a second time: an alias
    while stack:
        node, finished = stack.pop()
        if finished:
            total = 1 + sum(size[id(child)] for child in _children(node))
            open_nodes.discard(id(node))
            size[id(node)] = total
            if total > MAX_YAML_NODES:
                raise YAMLTooComplex(f"its aliases expand to more than {MAX_YAML_NODES:,} values"
                                     if aliased else f"it holds more than {MAX_YAML_NODES:,} "
                                     "values")
            continue
        if id(node) in size:
            aliased = True
            continue
        open_nodes.add(id(node))
        stack.append((node, True))
        for child in _children(node):
            if id(child) in open_nodes:
                raise YAMLTooComplex("an alias refers to a value that contains it")
            if id(child) in size:
                aliased = True
            else:
                stack.append((child, False))


def _no_duplicates(loader: _StrictLoader, node: yaml.MappingNode, deep: bool = False):
    seen = set()
    for key_node, _ in node.value:
        if not isinstance(key_node, yaml.ScalarNode):
            raise yaml.constructor.ConstructorError(
                None, None, f"a key must be a plain value, not a {key_node.id} "
                f"(line {key_node.start_mark.line + 1})", key_node.start_mark)
        key = loader.construct_object(key_node, deep=deep)
        if key in seen:
            raise yaml.constructor.ConstructorError(
                None, None, f"repeated key {shown(key)} (line {key_node.start_mark.line + 1})",
                key_node.start_mark)
        seen.add(key)
    return loader.construct_mapping(node, deep)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _no_duplicates)


def parse_yaml(text: str, what: str):
    """The YAML document in ``text`` read with the bounded safe loader above.

    Raises:
        UsageError: not valid YAML, a repeated key, or over the bounds (``what`` names it).
    """
    if len(text) > MAX_YAML_BYTES:
        raise UsageError(f"{what} is refused: it is larger than {MAX_YAML_BYTES:,} characters")
    try:
        return yaml.load(text, Loader=_StrictLoader)
    except YAMLTooComplex as e:
        raise UsageError(f"{what} is refused: {e}") from None
    except yaml.YAMLError as e:
        reason = " ".join(str(e).split())
        raise UsageError(f"{what} is not valid YAML ({reason[:200]})") from None
    except RecursionError:  # a bound above should come first; never a traceback
        raise UsageError(f"{what} is refused: it nests too deeply") from None


def load_yaml(path: str | Path, what: str):
    """The YAML document in ``path`` (safe: no tags that build objects; no repeated keys;
    bounded in size, nesting and alias expansion)."""
    path = Path(path)
    try:  # a regular file only (a FIFO would block, a device never end), bounded
        text = read_bytes(path, MAX_YAML_BYTES, follow_links=True).decode("utf-8")
    except FileNotFoundError:
        raise UsageError(f"{what} {path} does not exist") from None
    except UnicodeDecodeError:
        raise UsageError(f"{what} {path} is not UTF-8 text") from None
    except UnsafePathError as e:
        if "folder" in str(e):
            raise UsageError(f"{what} {path} is a folder, not a file") from None
        if "larger than" in str(e):
            raise UsageError(f"{what} {path} is refused: it is larger than "
                             f"{MAX_YAML_BYTES:,} bytes") from None
        raise UsageError(f"{what} {e}") from None
    except OSError as e:
        raise UsageError(f"{what} {path} cannot be read ({e.strerror or e})") from None
    return parse_yaml(text, f"{what} {path}")


def check_mapping(mapping, where: str, exclude: frozenset = frozenset(),
                  lists: frozenset = frozenset()) -> dict:
    """A YAML mapping of settings as ``{field name: checked value}``.

    ``exclude`` names fields that may not be given here, ``lists`` fields whose value may be a
    list of values (each checked; a sweep's grid).
    """
    if mapping is None:
        return {}
    if not isinstance(mapping, dict):
        raise UsageError(f"{where} must be a mapping of settings")
    out: dict = {}
    for key, value in mapping.items():
        s = BY_KEY.get(key) if isinstance(key, str) else None
        if s is None or not s.file:
            known = [k for k, v in BY_KEY.items() if v.file]
            raise UsageError(f"{where}: unknown setting {shown(key)}"
                             f"{did_you_mean(key, known)} (see python -m sae.run --help)")
        if s.name in exclude:
            raise UsageError(f"{where}: {shown(key)} cannot be set here")
        if s.name in out:
            raise UsageError(f"{where}: {shown(key)} is given twice")
        if isinstance(value, dict):
            raise UsageError(f"{where}: {shown(key)} takes a value, not a mapping")
        try:
            if isinstance(value, list) and s.name in lists:
                out[s.name] = [convert(s, v) for v in value]
            elif isinstance(value, list) and s.type != "devices":
                raise ValueError("takes one value, not a list")
            else:
                out[s.name] = convert(s, value)
        except ValueError as e:
            raise UsageError(f"{where}: {s.key} {e}") from None
    return out


def read_settings_file(path: str | Path) -> dict:
    """A ``--config`` file or a run's ``config.yaml`` as ``{field name: checked value}``."""
    data = load_yaml(path, "config file")
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise UsageError(f"config file {path} must hold a mapping of settings")
    return check_mapping(data, f"config file {path}")


def config_file_dict(settings: dict) -> dict:
    """What ``config.yaml`` holds: every file setting, by its YAML key, in declaration order."""
    return {s.key: settings[s.name] for s in SETTINGS.values() if s.file and s.name in settings}


# ---------------------------------------------------------------- layering


def defaults() -> dict:
    return {name: s.default for name, s in SETTINGS.items()}


PATH_SETTINGS = ("out", "resume", "config", "data_dir", "data")
NAME_MAX, PATH_MAX = 255, 4096  # bytes: the limits of Linux and macOS file systems


def check_path_names(flag: str, path: str | Path) -> None:
    """Refuse a path the file system would refuse with ENAMETOOLONG, before it is used."""
    encoded = os.fsencode(path)
    if len(encoded) >= PATH_MAX:
        raise UsageError(f"{flag}: the path is longer than file systems allow ({PATH_MAX} bytes)")
    for part in Path(path).parts:
        if len(os.fsencode(part)) > NAME_MAX:
            raise UsageError(f"{flag}: the name {shown(part, 40)} is longer than file systems "
                             f"allow ({NAME_MAX} bytes)")


def _check_paths(settings: dict) -> None:
    for name in PATH_SETTINGS:
        if isinstance(settings.get(name), str):
            check_path_names(SETTINGS[name].flag, settings[name])


def _data_label(settings: dict) -> str:
    """What a default run folder is named after: the --data file's stem, the --hook of a
    --source, else the dataset."""
    if settings.get("source"):
        return "".join(c if c.isalnum() or c in "-_" else "-" for c in str(settings["hook"]))
    return Path(settings["data"]).stem if settings.get("data") else settings["dataset"]


def resolve_settings(argv: list[str]) -> argparse.Namespace:
    """Layer defaults < ``--config`` < the resumed run's ``config.yaml`` < explicit flags."""
    build_parser().parse_args(argv)  # --help (with defaults shown) and bad values end here
    explicit = vars(build_parser(suppress=True).parse_args(argv))
    _check_paths({**explicit, "out": explicit.get("out") or os.environ.get(RUN_DIR_ENV)})
    settings = defaults()
    if explicit.get("config"):
        settings.update(read_settings_file(explicit["config"]))
    if explicit.get("resume") is not None:
        if explicit["resume"] != "last" and Path(explicit["resume"]).is_dir():
            raise UsageError(f"--resume {explicit['resume']} is a folder; give a checkpoint "
                             "file, or --out FOLDER --resume")
        out = explicit.get("out") or os.environ.get(RUN_DIR_ENV)
        if out is None and explicit["resume"] != "last":
            out = run_dir_of_checkpoint(Path(explicit["resume"]))
        if out is None:
            raise UsageError("--resume needs --out RUN_FOLDER (or a checkpoint inside one)")
        saved = Path(out) / "config.yaml"
        if Path(out).is_file():
            raise UsageError(f"cannot resume: {out} is a file, not a run folder")
        if not saved.is_file():
            raise UsageError(f"cannot resume: {saved} does not exist")
        settings.update(saved_auto(read_settings_file(saved)))
        settings["out"] = str(out)
    settings.update(explicit)
    settings = pin_auto(settings)  # config.yaml and the checkpoint save the mode, not auto
    if settings.get("out") is None:
        settings["out"] = os.environ.get(RUN_DIR_ENV) or str(
            Path("runs") / f"{_data_label(settings)}-{settings['model']}-"
            f"{datetime.now().strftime('%Y%m%d-%H%M%S')}")
    _check_paths(settings)  # data_dir may come from a file
    return argparse.Namespace(**settings)


def unused_flags(argv: list[str], config: RunConfig) -> list[str]:
    """A note for each flag given on the command line that the chosen model does not use:
    --lambda with a fixed-budget model (topk, batchtopk), --k with a penalty (λ) model,
    --dataset beside --data."""
    explicit = vars(build_parser(suppress=True).parse_args(argv))
    sae = config.sae
    fixed = sae.model in FIXED_BUDGET
    data = config.data.data
    notes = [f"note: --dataset is ignored: the run trains on --data {data}"] \
        if "dataset" in explicit and data else []
    own = sae.model in NO_BUDGET
    if "lam" in explicit and not uses_lambda(sae.model, vars(sae)):
        notes.append(f"note: --lambda is ignored by --model {sae.model}: its sparsity is "
                     + ("its own (no λ or k)" if own else f"--k {sae.k}"))
    if "k" in explicit and not fixed:
        notes.append(f"note: --k is ignored by --model {sae.model}: its sparsity is "
                     + ("its own (no λ or k)" if own else f"--lambda {sae.lam:g}"))
    return notes


def run_dir_of_checkpoint(ckpt: Path) -> str | None:
    for parent in ckpt.resolve().parents[:2]:
        if (parent / "config.yaml").is_file():
            return str(parent)
    return None


# ---------------------------------------------------------------- the run's typed settings


# set by the launchers that start a run on several machines (torchrun, SLURM, MPI, LSF); without
# one, each machine waits for the others forever
LAUNCHER_ENV = ("WORLD_SIZE", "SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "LSB_JOBID")
# weights held in 16 bits: the models here diverge in float16 and evaluate in float32
HALF_WEIGHTS = ("16-true", "bf16-true")
NEEDS_PACKAGE = {"tpu": "torch_xla", "transformer-engine": "transformer_engine",
                 "transformer-engine-float16": "transformer_engine"}


def run_config(argv: list[str]) -> RunConfig:
    """The run's settings for ``argv`` (:func:`resolve_settings`), typed and checked: the model's
    values (:meth:`sae.settings.config.SAEConfig.validate`) and the run's (:func:`check_run`)."""
    config = RunConfig.from_settings(vars(resolve_settings(argv)))
    check_model(config.sae)
    check_run(config)
    return config


def check_run(config: RunConfig) -> None:
    """Cross-field checks of a run that the parser cannot do alone (files, environment); the run
    folder's own (``--resume last``) are :func:`sae.training.runfolder.check_resume`'s."""
    folder, hardware = config.folder, config.hardware
    if folder.resume is not None and folder.overwrite:
        raise UsageError("--resume and --overwrite exclude each other")
    data = config.data
    if (data.source is None) != (data.hook is None):
        raise UsageError("--source and --hook go together: the model and the layer of it to "
                         "read")
    if data.source is not None and data.data is not None:
        raise UsageError("--source and --data exclude each other: stream a model's layer, or "
                         "read a matrix")
    data_dir = config.data.data_dir
    if data_dir is not None and not Path(data_dir).is_dir():
        raise UsageError(f"--data-dir {data_dir} is not a folder")
    if folder.resume not in (None, "last"):
        if not Path(folder.resume).is_file():
            raise UsageError(f"--resume checkpoint {folder.resume} does not exist")
    if hardware.num_nodes > 1 and not any(os.environ.get(name) for name in LAUNCHER_ENV):
        raise UsageError(f"--num-nodes {hardware.num_nodes} needs a launcher that starts the run "
                         f"on every machine (torchrun, SLURM; none of {', '.join(LAUNCHER_ENV)} "
                         "is set); on one machine use --num-nodes 1")
    if hardware.precision in HALF_WEIGHTS:
        raise UsageError(f"--precision {hardware.precision} keeps the weights in 16 bits, which "
                         "these models cannot train or be evaluated in; use "
                         f"{hardware.precision.replace('true', 'mixed')}")
    if config.output.logger == "wandb" and find_spec("wandb") is None:
        raise UsageError("--logger wandb needs the wandb package, which is not installed: "
                         "pip install -e \".[wandb]\" (the wandb extra)")
    for flag, value in (("--accelerator", hardware.accelerator),
                        ("--precision", hardware.precision)):
        if value in NEEDS_PACKAGE and find_spec(NEEDS_PACKAGE[value]) is None:
            raise UsageError(f"{flag} {value} needs the {NEEDS_PACKAGE[value]} package, which "
                             "is not installed")


def write_config(config: RunConfig, path: Path) -> None:
    """The run's ``config.yaml``: every file setting (:func:`config_file_dict`), re-usable with
    ``--config`` and read back by ``--resume`` as the same settings."""
    write_text(path, yaml.safe_dump(config_file_dict(config.settings()), sort_keys=False))
