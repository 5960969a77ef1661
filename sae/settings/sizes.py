"""What a model costs, from its settings alone (no torch): every parameter and buffer of the
chosen model as training holds it, and the refusal of a model whose checkpoint would pass what a
checkpoint may hold, naming the largest ``--hidden``, ``--mlp-width`` or ``--attention-rank`` that
fits. ``python -m sae.run`` checks it before anything is imported or allocated."""

from __future__ import annotations

from dataclasses import replace

from sae.settings.config import FIXED_BUDGET, SAEConfig
from sae.settings.setting import UsageError

__all__ = ["MAX_CHECKPOINT_ELEMENTS", "SIZE_FLAGS", "check_model", "checkpoint_values",
           "model_values"]

# tensor elements a checkpoint may hold in all (sae.training.checkpoints.MAX_ELEMENTS, which imports
# torch): a model whose weights and Adam moments (three values a weight) exceed it could train
# but never be resumed, and one far beyond it fails only once its memory is asked for
MAX_CHECKPOINT_ELEMENTS = 2**29


def _support_map_values(sae: SAEConfig) -> tuple[int, int]:
    """(parameters, buffers) the Sparsemax-SAE and entmax add to the shared model
    (sae.models.sparsemax): the magnitude head, the temperatures, the inference threshold,
    entmax's α."""
    D, G = sae.input_dim, sae.groups
    temperature = sae.resolved_temperature()
    params = D * G + G + G + (D * G if temperature == "learned" else 0)
    buffers = 0
    if temperature == "energy":  # γ per group: learned, or a buffer kept fixed
        params, buffers = (params + G, 0) if sae.energy_power_mode == "learn" else (params, G)
    if sae.resolved_inference() == "threshold":  # one θ (it replaces the batch support's)
        buffers += 2
    elif sae.resolved_support() == "batch":  # θ per group and its count
        buffers += G + 1
    if sae.model == "entmax":  # α, learned or a buffer
        params, buffers = (params + 1, buffers) if sae.alpha_mode == "learn" \
            else (params, buffers + 1)
    return params, buffers


def model_values(sae: SAEConfig) -> tuple[int, int]:
    """(parameters, buffers): the tensor elements of the model ``sae`` describes as training
    holds it (the model of its ``--model`` inside sae.training.module.SAETraining, with its
    dead-unit counts), from the settings alone, without torch or any allocation. Exact:
    ``tests/test_hostile_sizes.py`` counts every model built on torch's meta device."""
    D, H = sae.input_dim, sae.hidden
    width = D if sae.arch == "linear" else sae.mlp_width
    mlp = 2 * D * width + width + D if sae.arch == "mlp" else 0  # enc_in and dec_out
    # data_var, code_scale, mean_image; the trainer's samples_since_fired and nonfinite_loss
    buffers = 2 + D + H + 1
    if sae.model == "sparsemax-attention":  # its own dictionary replaces W_enc, W_dec, biases
        rank = sae.attention_rank or D
        own = H * rank + 2 * rank * D if sae.attention_factors == "concepts" else 2 * H * D
        return own + mlp, buffers + H + 1  # firing_frequency and its batch count
    params = D + 2 * width * H + H + mlp  # b_dec, W_dec, W_enc, b_enc
    if sae.model in ("sparsemax", "entmax"):
        extra, more = _support_map_values(sae)
        return params + extra, buffers + more
    if sae.model == "jumprelu":  # θ per unit (or one), and the input's gain head
        params += (1 if sae.jumprelu_threshold == "shared" else H) \
            + (D + 1 if sae.jumprelu_gain == "input" else 0)
    if sae.model == "batchtopk":  # the running threshold and its batch count
        buffers += 2
    if sae.model == "topk" and sae.energy_rule != 0:  # the energy rule's running mean, count
        buffers += 2
    if sae.target_l0 is not None and sae.model not in FIXED_BUDGET:  # the λ controller's
        buffers += 3
    return params, buffers


def checkpoint_values(sae: SAEConfig) -> int:
    """The tensor elements a checkpoint of this model holds: every parameter with Adam's two
    moments beside it, and the buffers."""
    params, buffers = model_values(sae)
    return 3 * params + buffers


# the settings that size a model, each with the models and architectures it applies to
SIZE_FLAGS = (("hidden", "--hidden"), ("mlp_width", "--mlp-width"),
              ("attention_rank", "--attention-rank"))


def _sizes_that_fit(sae: SAEConfig) -> list[str]:
    """For each setting that sizes this model, the largest value that fits a checkpoint with
    the others as given (the count is affine in each: read at 1 and 2), where one does."""
    hints = []
    for name, flag in SIZE_FLAGS:
        if (name == "mlp_width" and sae.arch == "linear") or (name == "attention_rank" and (
                sae.model != "sparsemax-attention" or sae.attention_factors != "concepts")):
            continue
        one, two = (checkpoint_values(replace(sae, **{name: n})) for n in (1, 2))
        most = (MAX_CHECKPOINT_ELEMENTS - (2 * one - two)) // (two - one) if two > one else 0
        for value in (most, most - most % sae.groups):  # --groups must divide --hidden
            if value >= 1 and _valid(replace(sae, **{name: value})):
                hints.append(f"at most {flag} {value:,}")
                break
    return hints


def _valid(sae: SAEConfig) -> bool:
    try:
        sae.validate()
    except ValueError:
        return False
    return True


def check_model(sae: SAEConfig) -> None:
    """The model's values (:meth:`sae.settings.config.SAEConfig.validate`) as a
    :class:`UsageError`, and its size: every parameter of the chosen model counted
    (:func:`model_values`) and refused before anything is allocated, naming the largest
    ``--hidden`` (``--mlp-width``, ``--attention-rank``) that fits."""
    try:
        sae.validate()
    except ValueError as e:
        raise UsageError(str(e)) from None
    values = checkpoint_values(sae)
    if values > MAX_CHECKPOINT_ELEMENTS:
        what = f"--hidden {sae.hidden}"
        if sae.arch != "linear":
            what += f" with --mlp-width {sae.mlp_width}"
        if sae.model == "sparsemax-attention" and sae.attention_factors == "concepts":
            what += f" with --attention-rank {sae.attention_rank or sae.input_dim}"
        rows = f" on rows of {sae.input_dim} numbers" if sae.input_dim != 784 else ""
        hint = " or ".join(_sizes_that_fit(sae)) or "a smaller model"
        raise UsageError(f"{what}{rows} makes a model of about {model_values(sae)[0]:.3g} "
                         f"weights; with its optimizer state that is {values:.3g} values, more "
                         f"than the {MAX_CHECKPOINT_ELEMENTS:,} a checkpoint holds: use {hint}")
