r"""Sparse autoencoders: one base model (``base``), pure loss terms (``losses``) and one small
module per variant. These are plain ``torch.nn.Module``\ s, what inference needs; training wraps
one in :class:`sae.training.module.SAETraining`.

Adding a variant is a subclass of ``SparseAutoencoder`` defining ``code`` and ``penalty`` (see
``l1.py``) in a module of its own, and its module in :mod:`sae.settings.variants`, the registry
that the command line, the checks and ``build_model`` read. Its class is then also a name of this
package (``from sae.models import L1SAE``), imported from its module when first asked for.
"""

from __future__ import annotations

import importlib

import torch
from torch import Tensor

from sae.models.base import SparseAutoencoder
from sae.settings.config import MODELS, SAEConfig
from sae.settings.variants import VARIANTS, variant

# every registered variant's class by its name (a "module:Class" reference names it)
_CLASSES = {(v.cls.rpartition(":")[2] if isinstance(v.cls, str) else v.cls.__name__): v.name
            for v in VARIANTS.values()}

__all__ = ["MODELS", "SAEConfig", "SparseAutoencoder", "build_model", "decode_dataset",
           "encode_codes", "encode_dataset", "model_class", *sorted(_CLASSES)]


def __getattr__(name: str):
    if name in _CLASSES:
        return model_class(_CLASSES[name])
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def model_class(name: str) -> type[SparseAutoencoder]:
    """The class of the registered variant ``name`` (``sae.settings.variants``); a
    ``"module:Class"``
    reference is imported here, above the modules it names."""
    cls = variant(name).cls
    if isinstance(cls, str):
        module, _, attr = cls.partition(":")
        cls = getattr(importlib.import_module(module), attr)
    return cls


def build_model(config: SAEConfig, mean_image: Tensor | None = None, data_var: float = 1.0,
                init_inputs: Tensor | None = None) -> SparseAutoencoder:
    """The SAE variant named by ``config.model``; ``init_inputs`` [n, D] seed decoder columns."""
    return model_class(config.model)(config, mean_image, data_var, init_inputs)


@torch.no_grad()
def encode_dataset(model: SparseAutoencoder, x: Tensor,
                   batch_size: int = 1024) -> tuple[Tensor, Tensor]:
    """Run the model over x [N, D] in eval mode on its device -> (x̂ [N, D], h [N, H]) on CPU."""
    was_training = model.training
    model.eval()
    x_hats, codes = [], []
    for start in range(0, len(x), batch_size):
        batch = x[start:start + batch_size].to(model.device)
        x_hat, h, _ = model.forward_pass(batch)
        x_hats.append(x_hat.float().cpu())
        codes.append(h.float().cpu())
    model.train(was_training)
    H = model.config.hidden
    return (torch.cat(x_hats) if x_hats else x.new_zeros(0, x.shape[-1]),
            torch.cat(codes) if codes else x.new_zeros(0, H))


@torch.no_grad()
def encode_codes(model: SparseAutoencoder, x: Tensor, batch_size: int = 1024) -> Tensor:
    """The codes h [N, H] (CPU) of x [N, D] in eval mode, without decoding them (half the work of
    :func:`encode_dataset` when the reconstruction is not needed, as for probes)."""
    was_training = model.training
    model.eval()
    codes = []
    for start in range(0, len(x), batch_size):
        a, x_centred = model.pre_activations(x[start:start + batch_size].to(model.device))
        codes.append(model.code(a, x_centred)[0].float().cpu())
    model.train(was_training)
    return torch.cat(codes) if codes else x.new_zeros(0, model.config.hidden)


@torch.no_grad()
def decode_dataset(model: SparseAutoencoder, codes: Tensor, batch_size: int = 1024) -> Tensor:
    """Decode codes h [N, H] in batches on the model's device -> x̂ [N, D] on CPU."""
    was_training = model.training
    model.eval()
    out = [model.decode(codes[i:i + batch_size].to(model.device)).float().cpu()
           for i in range(0, len(codes), batch_size)]
    model.train(was_training)
    return torch.cat(out) if out else codes.new_zeros(0, model.config.input_dim)
