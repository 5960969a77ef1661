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
    models_using,
    variant,
)

__all__ = [
    "DATASETS", "DEAD_GUARDS", "FIXED_BUDGET", "MODELS", "NO_BUDGET", "PRECISIONS",
    "PROBE_LOSSES", "SECTIONS",
    "DataConfig",
    "HardwareConfig", "OutputConfig", "RunConfig", "RunFolderConfig", "SAEConfig", "TrainConfig",
    "setting",
]

# settings a configuration saved before they existed had, with the value they had then
SAVED_BEFORE = {"values": "shrunk", "temperature": "global", "inference": "sparsemax",
                "support": "input"}
# the settings whose ``auto`` a configuration saves resolved (``pin_auto``), so that a later
# change of default leaves what was trained as it was; and what a saved ``auto`` meant, from
# configurations saved before that: then the Sparsemax-SAE's auto temperature was normalized
PINNED = ("temperature", "values", "inference", "support")
SAVED_AUTO = {"sparsemax": {"temperature": "normalized", "values": "unshrunk-ste"},
              "entmax": {"temperature": "global"}}

DEAD_GUARDS = ("none", "resample", "auxk")
DATASETS = ("mnist", "fashion-mnist")
PROBE_LOSSES = ("softmax", "sparsemax")  # the losses a linear probe can be fitted with
# what Lightning's Trainer(precision=...) accepts
PRECISIONS = ("64", "32", "16", "bf16", "64-true", "32-true", "16-true", "bf16-true",
              "16-mixed", "bf16-mixed", "transformer-engine", "transformer-engine-float16")
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
    ``auto`` read as what it meant when configurations still saved it (``SAVED_AUTO``)."""
    meant = SAVED_AUTO.get(settings.get("model"), {})
    return {**settings, **{k: v for k, v in meant.items() if settings.get(k) == "auto"}}


@dataclass
class SAEConfig:
    """Everything that defines a model and its optimisation (stored in every checkpoint)."""

    model: str = setting("sparsemax", "sparsity mechanism", choices=MODELS)
    input_dim: int = field(default=784)  # set from the data, not a flag
    hidden: int = setting(512, "code units H", low=1)
    lam: float = setting(0.01, "penalty weight λ (ignored by topk and batchtopk)", key="lambda",
                         low=0)
    k: int = setting(32, "topk: active units per input; batchtopk: their mean over a batch "
                     "(ignored by the other models)", low=1)
    rho: float = setting(0.05, "kl: target mean activation ρ", low=0, high=1, low_open=True)
    alpha: float = setting(1.5, "entmax: α (start value when learned or annealed)", low=1,
                           low_open=True)
    alpha_mode: str = setting("learn", "entmax: learn α, anneal it to 2, or keep it fixed",
                              choices=("learn", "anneal", "fixed"))
    values: str = setting("auto", "sparsemax: the values on the support; auto = unshrunk-ste "
                          "for sparsemax; shrunk, r·p (every "
                          "value offset by the threshold); unshrunk, (r/T)·a (a ReLU whose "
                          "support sparsemax chooses); unshrunk-ste, unshrunk values whose "
                          "support can grow back (a straight-through pseudo-derivative of the "
                          "support gate reaches units near the threshold)",
                          choices=("auto", "shrunk", "unshrunk", "unshrunk-ste"))
    temperature: str = setting("auto", "sparsemax/entmax: the temperature T of the support "
                               "map(a / T); auto = energy for sparsemax's per-input support, "
                               "global for its batch support and for entmax; "
                               "global, one learned T per group; learned, "
                               "T·exp(u·(x − b_dec)) with u learned from 0; normalized, T times "
                               "the spread (std) of the input's scores over the group's "
                               "units; energy, normalized times (‖x − b_dec‖ / ν)^γ with γ "
                               "learned from 0 (--energy-power, --energy-power-mode), sizing "
                               "the support only",
                               choices=("auto", "global", "learned", "normalized", "energy"))
    energy_power: float = setting(0.0, "sparsemax, energy temperature: the power γ of the "
                                  "input's energy in T(x), its start value when learned",
                                  low=-4, high=4)
    energy_power_mode: str = setting("learn", "sparsemax, energy temperature: learn γ from "
                                     "--energy-power, or keep it fixed there",
                                     choices=("learn", "fixed"))
    inference: str = setting("auto", "sparsemax: the rule that chooses the support at "
                             "inference (validation, test, encoding); auto = sparsemax, the "
                             "rule it trains with (each input's own support, or the batch "
                             "support's running threshold); threshold, one threshold θ on "
                             "every unit's unshrunk value, estimated in training as the value "
                             "that keeps as many units as sparsemax kept (as BatchTopK's)",
                             choices=("auto", "sparsemax", "threshold"))
    support: str = setting("auto", "sparsemax: what one projection onto the simplex covers; "
                           "auto = input, each input's scores (its own support, chosen from "
                           "its own scores in training and at inference, mass 1 per input); "
                           "batch, the whole batch's scores at once in training (an input "
                           "with higher scores gets more units, as BatchTopK to TopK) and one "
                           "shared threshold, the batch threshold's running mean, at "
                           "inference; its auto temperature is global",
                           choices=("auto", "input", "batch"))
    groups: int = setting(1, "sparsemax/entmax: independent heads over the code", low=1)
    jumprelu_threshold: str = setting("unit", "jumprelu: a learned threshold per unit (unit), or "
                                      "one shared by every unit (shared: a shared threshold "
                                      "at inference, as BatchTopK's)",
                                      choices=("unit", "shared"))
    jumprelu_gain: str = setting("none", "jumprelu: values a (none), or r(x)·a with a learned "
                                 "per-input gain r(x) = softplus(w·(x − b_dec) + c) (input, the "
                                 "Sparsemax-SAE's)", choices=("none", "input"))
    batchtopk_gate: str = setting("none", "batchtopk: no gradient outside the kept entries "
                                  "(none), or the straight-through gate of the Sparsemax-SAE's "
                                  "batch support, with its L0 price λ/10 per active unit (ste)",
                                  choices=("none", "ste"))
    attention_factors: str = setting("concepts", "sparsemax-attention: concepts, encoder C·K "
                                     "and decoder C·V sharing the concepts C (as published); "
                                     "full, two free [H, D] matrices",
                                     choices=("concepts", "full"))
    attention_rank: int = setting(0, "sparsemax-attention: the concepts' dimension r (C is "
                                  "[H, r], K and V [r, D]); 0 = the input's dimension D, as "
                                  "published", low=0)
    attention_input: str = setting("unit", "sparsemax-attention: scores read x / ‖x‖ and the "
                                   "code is scaled back by ‖x‖ (unit, as published), or x "
                                   "itself (raw)", choices=("unit", "raw"))
    frequency_mask: float = setting(0.1, "sparsemax-attention: a unit whose running firing "
                                    "frequency exceeds this is masked out (0.1 as published; "
                                    "0 = off)", low=0, high=1)
    arch: str = setting("linear", "one linear layer each way, or a 784-W-H-W-784 MLP",
                        choices=("linear", "mlp"))
    mlp_width: int = setting(512, "mlp: width W of the hidden layers", low=1)
    init: str = setting("auto", "decoder columns start random or at centred training images; "
                        "auto = data for sparsemax/entmax", choices=("auto", "random", "data"))
    kl_threshold: float = setting(0.1, "kl: a sigmoid unit fires above this", low=0, high=1,
                                  low_open=True)
    jumprelu_bandwidth: float = setting(0.001, "jumprelu: bandwidth ε of the threshold's "
                                        "straight-through gradient, in units of the data's RMS "
                                        "per pixel", low=0, low_open=True)
    lr: float = setting(1e-3, "Adam learning rate", low=0, low_open=True, group="training")
    lr_warmup: float = setting(0.01, "learning-rate warm-up: steps (>= 1) or fraction of "
                               "training (< 1)", low=0, group="training")
    lr_decay: str = setting("none", "learning-rate decay after warm-up",
                            choices=("none", "cosine"), group="training")
    lambda_warmup: float = setting(0.05, "λ warm-up from 0: steps (>= 1) or fraction of "
                                   "training (< 1)", low=0, group="training")
    lambda_warmup_shape: str = setting("linear", "shape of the λ warm-up",
                                       choices=("linear", "cosine"), group="training")
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

    @classmethod
    def from_dict(cls, values: dict) -> SAEConfig:
        """The configuration a checkpoint or run folder saved. A setting it lacks was saved
        before that setting existed and takes the value it had then (``SAVED_BEFORE``), and a
        saved ``auto`` what it meant then (``SAVED_AUTO``), not today's default: an old
        Sparsemax-SAE checkpoint stays the model it was."""
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

    def resolved_values(self) -> str:
        """``auto``: what the model's variant says (``sae.settings.variants``): unshrunk values
        whose support can grow back (``unshrunk-ste``) for the Sparsemax-SAE, the only model with a
        choice of values; ``shrunk`` names the others'."""
        return self._resolved("values")

    def resolved_temperature(self) -> str:
        """``auto``: the energy temperature for the Sparsemax-SAE's per-input support (a
        configuration saved with ``auto`` before that became the default: the normalized one,
        ``SAVED_AUTO``), the global one for its batch support (a per-input temperature would
        divide away the scale its shared threshold reads) and for entmax (see docs/models.md)."""
        return self._resolved("temperature")

    def resolved_inference(self) -> str:
        """``auto``: the Sparsemax-SAE infers with the rule it trains with (``sparsemax``): each
        input's own support, or with the batch support its running batch threshold. (A
        threshold on a model trained with per-input supports, once the default, follows input
        difficulty more at 512 units but loses most of the reconstruction at 4 096; see the
        documentation.) A configuration saved before the setting existed: its own support
        (``SAVED_BEFORE``). Runs save the rule they used, so a run trained with the threshold
        default keeps it."""
        return self._resolved("inference")

    def resolved_support(self) -> str:
        """``auto``: each input's own support (``input``), what the name sparsemax promises:
        the projection of the input's own scores onto the simplex, at inference as in
        training. The batch support (``batch``) trains with one threshold for the batch and
        infers with one shared threshold, BatchTopK's rule; it was the default for a while,
        and runs saved with it keep it (configurations save the support they resolved to).
        ``input`` for a configuration saved before the setting existed (``SAVED_BEFORE``)."""
        return self._resolved("support")

    def resolved_init(self) -> str:
        """``auto`` starts the codes of variants that ask for it (sparsemax / entmax: their units
        compete for support) from data, with a linear encoder."""
        if self.init == "auto" and self.arch != "linear":
            return "random"
        return self._resolved("init")

    def _resolved(self, name: str) -> str:
        value = getattr(self, name)
        if value != "auto":
            return value
        return variant(self.model).resolved(name, vars(self)) if self.model in MODELS \
            else AUTO_DEFAULTS[name]

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
        need(self.model != "entmax" or self.alpha_mode != "learn" or self.alpha > 1.001,
             f"--alpha must be > 1.001 when learned (α = 1.001 + softplus), got {self.alpha}")
        need(self.alpha_mode != "anneal" or self.alpha <= 2,
             f"--alpha must be <= 2 when annealed towards 2, got {self.alpha}")
        need(self.hidden % self.groups == 0,
             f"--groups must divide --hidden ({self.hidden}), got {self.groups}")
        guard = self.resolved_dead_guard()
        need(guard != "auxk" or self.model in FIXED_BUDGET,
             "--dead-guard auxk applies to --model topk and batchtopk")
        need(guard == "none" or self.arch == "linear",
             f"--dead-guard {guard} needs --arch linear (use none with mlp)")
        none = self.model in MODELS and variant(self.model).budget == "none"
        need(not none or guard == "none",
             f"--model {self.model} has no dead-unit remedy of its own: --dead-guard none")
        need(not none or self.arch == "linear", f"--model {self.model} needs --arch linear")
        for name in ("values", "temperature", "support", "jumprelu_threshold", "jumprelu_gain",
                     "batchtopk_gate", "attention_factors", "attention_rank", "attention_input",
                     "frequency_mask"):
            value, models = getattr(self, name), models_using(name)
            need(value in ("auto", AUTO_DEFAULTS.get(name), _DEFAULTS.get(name))
                 or self.model in models,
                 f"--{name.replace('_', '-')} {value} applies to --model {' and '.join(models)}")
        need(self.resolved_init() != "data" or self.arch == "linear",
             "--init data needs --arch linear")
        energy = self.model == "sparsemax" and self.resolved_temperature() == "energy"
        need(energy or (self.energy_power == 0 and self.energy_power_mode == "learn"),
             "--energy-power and --energy-power-mode apply to --model sparsemax with the energy "
             "temperature")
        need(self.inference != "threshold" or (self.model == "sparsemax"
                                               and self.resolved_values() != "shrunk"),
             "--inference threshold applies to --model sparsemax with unshrunk values")
        batch = self.model == "sparsemax" and self.resolved_support() == "batch"
        need(not batch or self.resolved_values() == "unshrunk-ste",
             "--support batch needs --values unshrunk-ste (or auto)")
        need(not batch or self.resolved_temperature() == "global",
             "--support batch has one temperature per group: leave --temperature auto (global)")
        need(not batch or self.inference in ("auto", "sparsemax"),
             "--support batch infers with its batch threshold: leave --inference auto")


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
                               "epoch's shuffled order (memory holds one chunk of rows)", low=1)
    data_dir: str | None = setting(None, "folder with the IDX files (default: $SAE_DATA_DIR, "
                                   "torchvision's cache, then download)", nullable=True)
    val_size: int = setting(5000, "validation images carved from train (fixed split seed)",
                            low=1)
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
