"""Sparse autoencoders: one base LightningModule (``base``), pure loss terms (``losses``) and one
small module per variant.

Adding a variant is a subclass of ``SparseAutoencoder`` defining ``code`` and ``penalty`` (see
``l1.py``) and one line in ``MODEL_CLASSES`` (its name must also be in ``sae.config.MODELS``, which
the CLI offers). The training guards (dead-unit resampling, the non-finite-loss stop) are Lightning
callbacks in ``sae.guards``; ``training_callbacks(config)`` lists those a config needs.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import Tensor

from sae.checkpoints import read_checkpoint
from sae.config import MODELS, SAEConfig
from sae.guards import NonFiniteLossError, training_callbacks
from sae.models.base import SparseAutoencoder
from sae.models.batchtopk import BatchTopKSAE
from sae.models.jumprelu import JumpReLUSAE
from sae.models.kl import KLSAE
from sae.models.l1 import L1SAE
from sae.models.sparsemax import EntmaxSAE, SparsemaxSAE
from sae.models.topk import TopKSAE

__all__ = ["BatchTopKSAE", "EntmaxSAE", "JumpReLUSAE", "KLSAE", "L1SAE", "MODELS", "MODEL_CLASSES",
           "NonFiniteLossError", "SAEConfig", "SparseAutoencoder", "SparsemaxSAE", "TopKSAE",
           "build_model", "decode_dataset", "encode_codes", "encode_dataset", "load_checkpoint",
           "model_from_checkpoint",
           "training_callbacks"]

MODEL_CLASSES: dict[str, type[SparseAutoencoder]] = {
    "l1": L1SAE,
    "kl": KLSAE,
    "sparsemax": SparsemaxSAE,
    "entmax": EntmaxSAE,
    "topk": TopKSAE,
    "batchtopk": BatchTopKSAE,
    "jumprelu": JumpReLUSAE,
}


def build_model(config: SAEConfig, mean_image: Tensor | None = None, data_var: float = 1.0,
                init_inputs: Tensor | None = None) -> SparseAutoencoder:
    """The SAE variant named by ``config.model``; ``init_inputs`` [n, D] seed decoder columns."""
    if config.model not in MODEL_CLASSES:
        raise ValueError(f"unknown model {config.model!r}; choose from {MODELS}")
    return MODEL_CLASSES[config.model](config, mean_image, data_var, init_inputs)


@torch.no_grad()
def encode_dataset(model: SparseAutoencoder, x: Tensor,
                   batch_size: int = 1024) -> tuple[Tensor, Tensor]:
    """Run the model over x [N, D] in eval mode on its device -> (x̂ [N, D], h [N, H]) on CPU."""
    was_training = model.training
    model.eval()
    x_hats, codes = [], []
    for start in range(0, len(x), batch_size):
        batch = x[start:start + batch_size].to(model.device)
        x_hat, h, _ = model(batch)
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


def load_checkpoint(path: str | Path,
                    map_location: str | torch.device = "cpu") -> SparseAutoencoder:
    """Rebuild a trained SAE, in eval mode, from a checkpoint written by ``python -m sae.run``.

    The file is untrusted: it is read with ``sae.checkpoints.read_checkpoint`` (tensors and plain
    data only, checksum verified; CheckpointError otherwise). Reads its ``hyper_parameters``
    ({"config": {...}, "data_var": v}) and ``state_dict``; keys a newer config does not know
    are ignored, missing ones take defaults.
    """
    return model_from_checkpoint(read_checkpoint(path, map_location=map_location))


def model_from_checkpoint(state: dict) -> SparseAutoencoder:
    """The SAE, in eval mode, of a checkpoint already read with ``read_checkpoint`` (callers
    that also want its step or epoch read the file once)."""
    hp = state["hyper_parameters"]
    model = build_model(SAEConfig.from_dict(hp["config"]), data_var=hp["data_var"])
    model.load_state_dict(state["state_dict"])
    return model.eval()
