"""SAELens classes for the toolkit's own mechanisms: ``import sae.saelens`` (needs the
``saelens`` extra) registers, with SAELens' ``register_sae_class``, one architecture per
mechanism, ``sae.<mechanism>`` (``sae.sparsemax``, ``sae.entmax``, ``sae.kl``,
``sae.sparsemax-attention``, and ``sae.l1``, ``sae.topk``, ``sae.batchtopk``,
``sae.jumprelu`` for the settings SAELens' own architectures have no place for). Then::

    import sae.saelens                      # registers them
    from sae_lens import SAE

    lens = SAE.load_from_disk("exported/sparsemax")   # sae.export(..., format="saelens")
    codes = lens.encode(x)                  # x [..., d_in] -> [..., d_sae]: sae.load's codes

Each such SAELens model holds the toolkit's inference model (``model``, built from the
settings in ``cfg.json``, its tensors loaded from ``sae_weights.safetensors``) and computes
with it: its code is the mechanism's own (the input-dependent temperature and each input's
sparsemax of the Sparsemax-SAE, α-entmax, the sigmoid, the attention support), not a copy of
the formulas. SAELens' hooks see the input, the pre-activations, the codes and the
reconstruction as with its own architectures. It is an inference model: it stays in eval mode
(BatchTopK's threshold, the running thresholds), and SAELens' training runner does not train it.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch

try:
    with warnings.catch_warnings():  # SAELens' imports warn of its own dependencies' renames
        warnings.simplefilter("ignore", DeprecationWarning)
        from sae_lens import SAE, SAEConfig, register_sae_class
        from sae_lens.registry import get_sae_class
except ImportError:  # one line: what to install
    raise ImportError("sae.saelens needs SAELens: pip install 'sae[saelens]'") from None

from sae.api.saelens_format import PREFIX
from sae.models import build_model
from sae.settings.config import SAEConfig as ModelConfig
from sae.settings.variants import VARIANTS

__all__ = ["ARCHITECTURES", "ToolkitSAE", "ToolkitSAEConfig"]


@dataclass
class ToolkitSAEConfig(SAEConfig):
    """SAELens' config of a ``sae.<mechanism>`` model: SAELens' fields and ``sae_settings``,
    the toolkit model's settings (``{"config": {...}, "data_var": v}``, as ``sae.load``
    reports them). One subclass per architecture names it."""

    sae_settings: dict[str, Any] = field(default_factory=dict)
    apply_b_dec_to_input: bool = False  # the toolkit model centres its input itself
    mechanism: ClassVar[str] = ""  # set by each registered subclass

    @classmethod
    def architecture(cls) -> str:
        return PREFIX + cls.mechanism


class ToolkitSAE(SAE[ToolkitSAEConfig]):
    """A SAELens model computing with the toolkit's inference model ``self.model``:
    ``encode`` x [..., d_in] -> codes [..., d_sae], ``decode`` codes -> x̂ [..., d_in]. The
    SAELens names ``W_enc`` [d_in, d_sae], ``b_enc``, ``W_dec`` [d_sae, d_in] and ``b_dec``
    are read-only views of the model's dictionary where it has a linear one."""

    def initialize_weights(self) -> None:
        settings = self.cfg.sae_settings
        if not isinstance(settings, dict) or not isinstance(settings.get("config"), dict) \
                or settings["config"].get("model") != self.cfg.mechanism:
            raise ValueError(f"{self.cfg.architecture()}: cfg.json's sae_settings do not "
                             f"describe a {self.cfg.mechanism} model (written by sae.export)")
        config = ModelConfig.from_dict(settings["config"])
        with torch.device(self.device):  # the meta device while SAELens loads the weights
            self.model = build_model(config, data_var=float(settings["data_var"]))
        self.model.to(self.dtype).eval()

    def train(self, mode: bool = True):
        """SAELens' mode; the toolkit model stays at inference (its thresholds are fixed)."""
        super().train(mode)
        self.model.eval()
        return self

    def _rows(self, x: torch.Tensor, width: int) -> tuple[torch.Tensor, torch.Size]:
        """x [..., width] -> (x [rows, width], the leading shape)."""
        return x.reshape(-1, width), x.shape[:-1]

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        """x [..., d_in] -> codes [..., d_sae], the toolkit model's ``encode``."""
        x = self.reshape_fn_in(x.to(self.dtype))
        x = self.run_time_activation_norm_fn_in(self.hook_sae_input(x))
        rows, lead = self._rows(x, self.cfg.d_in)
        a, centred = self.model.pre_activations(rows)
        a = self.hook_sae_acts_pre(a)
        h = self.model.code(a, centred)[0]
        return self.hook_sae_acts_post(h).reshape(*lead, self.cfg.d_sae)

    def decode(self, feature_acts: torch.Tensor) -> torch.Tensor:
        """codes [..., d_sae] -> x̂ [..., d_in], the toolkit model's ``decode``."""
        rows, lead = self._rows(feature_acts, self.cfg.d_sae)
        out = self.hook_sae_recons(self.model.decode(rows).reshape(*lead, self.cfg.d_in))
        out = self.run_time_activation_norm_fn_out(out)
        return self.reshape_fn_out(out, self.d_head)

    def fold_W_dec_norm(self):
        raise NotImplementedError(f"{self.cfg.architecture()}: folding the decoder norms would "
                                  "change this mechanism's codes")

    @property
    def W_enc(self) -> torch.Tensor:
        rows = self.model.attribution()
        if rows is None:
            raise AttributeError(f"{self.cfg.architecture()} has no linear encoder W_enc")
        return rows[0].t()

    @property
    def b_enc(self) -> torch.Tensor:
        if self.model.attribution() is None:
            raise AttributeError(f"{self.cfg.architecture()} has no encoder bias b_enc")
        return self.model.b_enc.detach()

    @property
    def W_dec(self) -> torch.Tensor:
        return self._decoder()[0].t()

    @property
    def b_dec(self) -> torch.Tensor:
        return self._decoder()[1]

    def _decoder(self) -> tuple[torch.Tensor, torch.Tensor]:
        linear = self.model.linear_decoder()
        if linear is None:
            raise AttributeError(f"{self.cfg.architecture()} has no linear decoder W_dec")
        return linear


def _register() -> dict[str, type[ToolkitSAEConfig]]:
    """One config class per mechanism, registered under ``sae.<mechanism>`` (once a
    process: a second import finds them registered)."""
    configs = {}
    for mechanism in VARIANTS:
        name = PREFIX + mechanism
        config = dataclass(type(f"ToolkitSAEConfig_{mechanism.replace('-', '_')}",
                                (ToolkitSAEConfig,), {"mechanism": mechanism}))
        try:
            configs[name] = get_sae_class(name)[1]
        except KeyError:
            register_sae_class(name, ToolkitSAE, config)
            configs[name] = config
    return configs


ARCHITECTURES = _register()
