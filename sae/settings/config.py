"""Every setting of ``sae``, declared once: dataclass fields whose metadata give the flag, help and
allowed values. No torch, no Lightning.

``sae.settings.cli`` derives from these fields the command line of ``python -m sae.run`` (flags,
defaults, help), the reading of ``--config`` files and ``config.yaml``, and the settings a sweep
file may give; so a new setting is one field here. ``python -m sae.run`` checks every value
against these before it imports anything heavy: a typo costs a fraction of a second, not
Lightning's import time.

Sections: :class:`SAEConfig` is what the model needs (it is stored in checkpoints);
:class:`TrainConfig`, :class:`DataConfig`, :class:`OutputConfig` and :class:`HardwareConfig`
the rest of a run; :class:`RunFolderConfig` the command-line-only settings that say which folder
to use and how. :class:`RunConfig` nests one of each: a run's settings, typed, as the settings
layer (:func:`sae.settings.cli.run_config`) builds them once and training and sweeps read them.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields, replace

from sae.settings.setting import check_fields, setting
from sae.settings.variants import (
    AUTO_DEFAULTS,
    FIXED_BUDGET,
    MODELS,
    NO_BUDGET,
    VariantSettings,
    models_using,
    settings_classes,
    variant,
)

__all__ = [
    "DATASETS", "DEAD_GUARDS", "FIXED_BUDGET", "MODELS", "NO_BUDGET", "PRECISIONS",
    "PROBE_LOSSES", "SECTIONS",
    "DataConfig",
    "HardwareConfig", "OutputConfig", "RunConfig", "RunFolderConfig", "SAEConfig", "TrainConfig",
    "setting",
]


def _declared(name: str) -> list:
    """Each variant settings class's own ``name`` declaration (``VariantSettings``), the classes
    they derive from included, once each."""
    classes = dict.fromkeys(c for cls in settings_classes() for c in cls.__mro__
                            if issubclass(c, VariantSettings))
    return [vars(c)[name] for c in classes if name in vars(c)]


# settings a configuration saved before they existed had, with the value they had then
SAVED_BEFORE = {k: v for saved in _declared("SAVED_BEFORE") for k, v in saved.items()}
# the settings whose ``auto`` a configuration saves resolved (``pin_auto``), so that a later
# change of default leaves what was trained as it was
PINNED = tuple(dict.fromkeys(name for names in _declared("PINNED") for name in names))
# the settings another model may be given only at their default or ``auto``
REFUSED_ELSEWHERE = tuple(dict.fromkeys(n for names in _declared("REFUSED_ELSEWHERE")
                                        for n in names))

DEAD_GUARDS = ("none", "resample", "auxk")
DATASETS = ("mnist", "fashion-mnist")
POSITIONS = ("all", "last", "mask")  # --positions: which positions of a [B, T, D] layer are rows
PROBE_LOSSES = ("softmax", "sparsemax")  # the losses a linear probe can be fitted with
# what Lightning's Trainer(precision=...) accepts
PRECISIONS = ("64", "32", "16", "bf16", "64-true", "32-true", "16-true", "bf16-true",
              "16-mixed", "bf16-mixed", "transformer-engine", "transformer-engine-float16")
LOGGERS = ("tensorboard", "csv", "wandb")  # --logger: metrics.csv is written with each
ACCELERATORS = ("auto", "cpu", "gpu", "cuda", "mps", "tpu")


def pin_auto(settings: dict) -> dict:
    """The settings with each ``PINNED`` ``auto`` that the model uses replaced by what it
    resolves to now (``sae.settings.variants``): what a new run saves."""
    model = settings.get("model")
    if model not in MODELS:
        return dict(settings)
    uses = variant(model).settings
    return {**settings, **{k: variant(model).resolved(k, settings) for k in PINNED
                           if k in uses and settings.get(k) == "auto"}}


def saved_auto(settings: dict) -> dict:
    """The settings of a saved configuration (a checkpoint's, a run's config.yaml) with each
    ``auto`` read as what it meant when configurations still saved it (the variant's
    ``saved_auto``)."""
    model = settings.get("model")
    meant = variant(model).saved_auto if model in MODELS else {}
    return {**settings, **{k: v for k, v in meant.items() if settings.get(k) == "auto"}}


@dataclass
class _ModelCommon:
    """The model settings every variant reads: which model, its size and its budget."""

    model: str = setting("sparsemax", "sparsity mechanism", choices=MODELS)
    input_dim: int = field(default=784)  # set from the data, not a flag
    hidden: int = setting(512, "code units H", low=1)
    lam: float = setting(0.01, "penalty weight λ (ignored by topk and batchtopk)", key="lambda",
                         low=0)
    k: int = setting(32, "topk: active units per input; batchtopk: their mean over a batch "
                     "(ignored by the other models)", low=1)


@dataclass
class _ModelShape:
    """The architecture and optimisation settings every variant reads (after the variants' own
    in --help and config.yaml)."""

    arch: str = setting("linear", "one linear layer each way, or a 784-W-H-W-784 MLP",
                        choices=("linear", "mlp"))
    mlp_width: int = setting(512, "mlp: width W of the hidden layers", low=1)
    init: str = setting("auto", "decoder columns start random or at centred training images; "
                        "auto = data for sparsemax/entmax", choices=("auto", "random", "data"))
    lr: float = setting(1e-3, "Adam learning rate", low=0, low_open=True, group="training")
    lr_warmup: float = setting(0.01, "learning-rate warm-up: steps (>= 1) or fraction of "
                               "training (< 1)", low=0, group="training")
    lr_decay: str = setting("none", "learning-rate decay after warm-up",
                            choices=("none", "cosine"), group="training")
    lambda_warmup: float = setting(0.05, "λ warm-up from 0: steps (>= 1) or fraction of "
                                   "training (< 1)", low=0, group="training")
    lambda_warmup_shape: str = setting("linear", "shape of the λ warm-up",
                                       choices=("linear", "cosine"), group="training")
    target_l0: float | None = setting(None, "land on this L0: λ adapts during training, then "
                                      "is held (models with a λ); topk and batchtopk: k = it",
                                      low=0, low_open=True, nullable=True, group="training")
    l0_hold: float = setting(0.1, "--target-l0: the last fraction of training, after the λ "
                             "warm-up, trained with λ held fixed", low=0, high=0.9,
                             group="training")
    dead_guard: str = setting("auto", "dead-unit remedy; auto = auxk for topk and batchtopk, "
                              "resample otherwise", choices=("auto",) + DEAD_GUARDS,
                              group="training")
    dead_window: int = setting(20_000, "a unit is dead after this many training samples "
                               "without firing", low=1, group="training")
    resample_every: int = setting(500, "steps between dead-unit resamplings", low=1,
                                  group="training")
    resample_until: float = setting(0.7, "no resampling after this fraction of training",
                                    low=0, high=1, group="training")
    aux_k: int = setting(256, "AuxK: dead units used to model the residual", low=1,
                         group="training")
    aux_coef: float = field(default=1 / 32)  # AuxK loss weight (Gao et al. 2024), not a flag


# the variants' own settings (sae.settings.variants) come between the common ones: dataclass
# fields are collected from the bases in reverse order, so this reads common, variants (in the
# order they registered), shape
_BASES = (_ModelShape, *reversed(settings_classes()), _ModelCommon)


@dataclass
class SAEConfig(*_BASES):
    """Everything that defines a model and its optimisation (stored in every checkpoint).

    Its fields are the common settings and every registered variant's own
    (``sae.settings.variants``: a mechanism's module declares its settings class, whose fields
    and methods, such as the Sparsemax-SAE's ``resolved_support``, are this class's).
    """

    def __post_init__(self) -> None:
        # a fixed budget lands on its target by construction: k is the target
        if self.target_l0 is not None and self.model in FIXED_BUDGET \
                and float(self.target_l0).is_integer():
            self.k = int(self.target_l0)

    @classmethod
    def from_dict(cls, values: dict) -> SAEConfig:
        """The configuration a checkpoint or run folder saved. A setting it lacks was saved
        before that setting existed and takes the value it had then (``SAVED_BEFORE``), and a
        saved ``auto`` what it meant then (its variant's ``saved_auto``), not today's default:
        an old Sparsemax-SAE checkpoint stays the model it was."""
        names = {f.name for f in fields(cls)}
        known = saved_auto({**SAVED_BEFORE, **values})
        return cls(**{k: v for k, v in known.items() if k in names})

    def pinned(self) -> SAEConfig:
        """This configuration with each ``PINNED`` ``auto`` replaced by the mode it resolves to
        now (``pin_auto``): what a model saves in its checkpoint."""
        return replace(self, **{k: v for k, v in pin_auto(asdict(self)).items()
                                if k in PINNED})

    def resolved_dead_guard(self) -> str:
        if self.dead_guard != "auto":
            return self.dead_guard
        if self.arch != "linear" or variant(self.model).budget == "none":
            return "none"  # a model without a penalty has nothing a resampling would trade
        return "auxk" if self.model in FIXED_BUDGET else "resample"

    def resolved_init(self) -> str:
        """``auto`` starts the codes of variants that ask for it (sparsemax / entmax: their units
        compete for support) from data, with a linear encoder."""
        if self.init == "auto" and self.arch != "linear":
            return "random"
        return self.resolved_setting("init")

    def validate(self) -> None:
        """Raise ValueError with a one-line, user-facing message for any invalid value.

        Single values are checked against their field's bounds (``sae.settings.setting``); this
        adds the checks that involve several fields.
        """
        check_fields(self)

        def need(ok: bool, message: str) -> None:
            if not ok:
                raise ValueError(message)

        need(self.input_dim >= 1, "input_dim must be >= 1")
        need(self.model not in FIXED_BUDGET or self.k <= self.hidden,
             f"--k must be <= --hidden ({self.hidden}), got {self.k}")
        guard = self.resolved_dead_guard()
        need(guard != "auxk" or self.model in FIXED_BUDGET,
             "--dead-guard auxk applies to --model topk and batchtopk")
        need(guard == "none" or self.arch == "linear",
             f"--dead-guard {guard} needs --arch linear (use none with mlp)")
        none = self.model in MODELS and variant(self.model).budget == "none"
        need(not none or guard == "none",
             f"--model {self.model} has no dead-unit remedy of its own: --dead-guard none")
        need(not none or self.arch == "linear", f"--model {self.model} needs --arch linear")
        for name in REFUSED_ELSEWHERE:
            value, models = getattr(self, name), models_using(name)
            need(value in ("auto", AUTO_DEFAULTS.get(name), _DEFAULTS.get(name))
                 or self.model in models,
                 f"--{name.replace('_', '-')} {value} applies to --model {' and '.join(models)}")
        need(self.target_l0 is None or self.model not in NO_BUDGET,
             f"--target-l0 needs a model with a λ or a k; --model {self.model} has neither")
        need(self.target_l0 is None or self.model not in FIXED_BUDGET
             or self.k == self.target_l0,
             f"--target-l0 sets --k for --model {self.model}: give a whole number, got "
             f"{self.target_l0!r:.40}")
        need(self.resolved_init() != "data" or self.arch == "linear",
             "--init data needs --arch linear")
        for check in _declared("check"):  # each variant settings class's own checks
            check(self, need)


_DEFAULTS = {f.name: f.default for f in fields(SAEConfig)}


@dataclass
class TrainConfig:
    """How long and how a run trains (beyond the model's own optimisation settings)."""

    epochs: int = setting(10, "training epochs", low=1)
    max_steps: int | None = setting(None, "stop after this many steps (overrides --epochs "
                                    "when reached first)", low=1, nullable=True)
    batch_size: int = setting(256, "training batch size", low=1)
    grad_clip: float = setting(1.0, "gradient-norm clipping; 0 disables", low=0)
    seed: int = setting(0, "seed of initialisation, data order and the data-init images", low=0,
                        high=2**32 - 1)  # what NumPy's and Lightning's seeding accept
    until_converged: bool = setting(False, "stop at the end of the first epoch over which "
                                    "validation FVU and L0 settled (the convergence rule: "
                                    "moved under 1 and 2 percent; with --target-l0 once λ is "
                                    "held); --epochs is the cap")


@dataclass
class DataConfig:
    """Which images (or activations) a run trains and is tested on."""

    dataset: str = setting("mnist", "image dataset (when no --data is given)", choices=DATASETS)
    data: str | None = setting(None, "activations to train on instead of images: an (N, D) "
                               ".npy matrix or a .json manifest of splits, labels and how to "
                               "show each row (see docs/own-data.md)",
                               nullable=True)
    source: str | None = setting(None, "a PyTorch model's layer to train on while the model "
                                 "runs: pkg.module:factory, factory() returning (model, dataset) "
                                 "(see docs/library.md); needs --hook", nullable=True)
    hook: str | None = setting(None, "the layer of --source, named as model.named_modules() "
                               "names it", nullable=True)
    buffer_rows: int = setting(8192, "--source: inputs the model runs on at once, a chunk of the "
                               "epoch's shuffled order (memory holds one chunk of rows); for a "
                               "layer of positions, rows (its T positions count T each)", low=1)
    positions: str = setting("all", "--hook on a layer of positions ([B, T, D]): which are rows "
                             "(all; last: each input's last; mask: where the dataset's padding "
                             "mask is true)", choices=POSITIONS)
    data_dir: str | None = setting(None, "folder with the IDX files (default: $SAE_DATA_DIR, "
                                   "torchvision's cache, then download)", nullable=True)
    val_size: int | float | None = setting(
        None, "validation rows carved from train (fixed split seed): a count, or a fraction "
        "(0 < f < 1) of the training rows; default the smaller of 5,000 and 10 percent of them "
        "(MNIST: 5,000); a --data manifest's own val rows replace it", nullable=True,
        kind="size")
    limit_train: int | None = setting(None, "use only this many training images (quick runs)",
                                      low=2, nullable=True)  # training needs two
    limit_test: int | None = setting(None, "use only this many test images", low=1,
                                     nullable=True)


@dataclass
class OutputConfig:
    """What a run writes besides its checkpoints and metrics."""

    figure_every: int = setting(5, "render figures every N epochs and at the end (0: only at "
                                "the end)", low=0)
    no_figures: bool = setting(False, "write no figures")
    no_report: bool = setting(False, "write no report.html")
    no_features: bool = setting(False, "write no features.html (the feature browser; its t-SNE "
                                "takes a few seconds)")
    log_every: int = setting(50, "log training metrics every N steps", low=1)
    logger: str = setting("tensorboard", "where the curves go besides metrics.csv (always "
                          "written): TensorBoard (<out>/tensorboard), none more (csv), or "
                          "Weights & Biases (wandb: pip install -e \".[wandb]\")",
                          choices=LOGGERS)
    progress: str = setting("auto", "progress bar (auto: only on a terminal)",
                            choices=("auto", "on", "off"))


@dataclass
class HardwareConfig:
    """Passed to Lightning's Trainer."""

    accelerator: str = setting("auto", "device kind", choices=ACCELERATORS)
    devices: object = setting("auto", "N, a list 0,1, or auto", kind="devices")
    strategy: str = setting("auto", "auto, ddp, ddp_spawn, fsdp, ...")
    num_nodes: int = setting(1, "machines taking part", low=1)
    precision: str = setting("32-true", "numeric precision", choices=PRECISIONS)
    compile: bool = setting(False, "torch.compile the model")


@dataclass
class RunFolderConfig:
    """Command-line only: which run folder, and what may happen to it (never saved)."""

    out: str | None = setting(None, "run folder (default: runs/<dataset>-<model>-<time>)",
                              nullable=True)
    resume: str | None = setting(None, "continue the run in --out from its last checkpoint, or "
                                 "from CKPT", nullable=True, kind="optional-path", const="last")
    overwrite: bool = setting(False, "replace an existing run folder (only one this tool made)")
    config: str | None = setting(None, "YAML file of settings; flags override it",
                                 nullable=True)


# (section, --help heading); the order of --help and of config.yaml
SECTIONS = ((SAEConfig, "model"), (TrainConfig, "training"), (DataConfig, "data"),
            (OutputConfig, "run folder and output"),
            (HardwareConfig, "hardware (passed to Lightning)"),
            (RunFolderConfig, "run folder and output"))


@dataclass
class RunConfig:
    """One run's settings, typed: a section dataclass each (as ``SECTIONS``).

    Built once from the layered flat settings (``{field name: value}``, :mod:`sae.settings.cli`) and
    passed as it is to training and sweeps; :meth:`settings` gives the flat form back
    (what ``config.yaml`` is written from).
    """

    sae: SAEConfig = field(default_factory=SAEConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    data: DataConfig = field(default_factory=DataConfig)
    output: OutputConfig = field(default_factory=OutputConfig)
    hardware: HardwareConfig = field(default_factory=HardwareConfig)
    folder: RunFolderConfig = field(default_factory=RunFolderConfig)

    @classmethod
    def from_settings(cls, settings: dict) -> RunConfig:
        """The sections of flat ``{field name: value}`` settings; a setting not given keeps its
        default, a name of no section is ignored."""
        parts = {}
        for f in fields(cls):
            section = f.default_factory
            names = {g.name for g in fields(section)}
            parts[f.name] = section(**{k: v for k, v in settings.items() if k in names})
        return cls(**parts)

    def settings(self) -> dict:
        """Every field of every section, flat: ``{field name: value}``."""
        return {k: v for f in fields(self) for k, v in asdict(getattr(self, f.name)).items()}

    def stack_key(self) -> tuple:
        """What runs that train as one stack (``sae.training.stack``) share: the data (its
        split and order), the loop (epochs, steps, batch, seed, gradient clipping, convergence
        rule, logging) and the hardware. What may differ is the model: mechanism, width, λ, k,
        target L0, learning rate, initialisation and the mechanism's own settings. A compiled
        model or a run on several devices or nodes trains alone."""
        hw = self.hardware
        if hw.compile or hw.num_nodes != 1 or str(hw.devices) not in ("1", "auto") \
                or any(s in str(hw.strategy) for s in ("ddp", "fsdp")):
            return ("alone", self.folder.out)
        return tuple(repr(sorted(asdict(part).items())) for part in
                     (self.data, self.train, self.hardware)) + (self.output.log_every,)
