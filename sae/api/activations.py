"""``sae.layer_activations``: a network's layer as an SAE sees it, the rows ``--hook`` trains on.

    rows = sae.layer_activations(net, "encoder.layers.1", tokens)   # [N·T, D]
    codes = sae.load("runs/net-layer-1").encode(rows)               # [N·T, H]

The layer is read with the forward hook a streamed run reads it with
(:class:`sae.data.hooked.LayerReader`), so the rows are the very rows a run on that layer
trains on: a [B, D] output is one row per input; a [B, T, D] output (or a tuple whose first
element is one) one row per position ``positions`` keeps, input by input, position by
position; an output of more dims one flattened row per input.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import TensorDataset

from sae.data.hooked import LayerReader, SourceError, find_layer
from sae.settings.config import POSITIONS


def layer_activations(model: nn.Module, hook: str, inputs, positions: str = "all",
                      mask: torch.Tensor | None = None, batch_size: int = 256) -> torch.Tensor:
    """The rows of layer ``hook`` of ``model`` on ``inputs``, [R, D] float32 on the CPU.

    ``inputs``: a tensor [N, ...] of inputs, or a map-style dataset whose items a streamed run
    takes (an input, ``(input, label)``, ``(input, mask)``, or a dict with ``attention_mask``).
    ``positions`` (a layer of positions [B, T, D] only): ``"all"`` (R = N·T), ``"last"``
    (R = N: each input's last position, its last true one where there is a mask) or
    ``"mask"`` (R = the true values of the mask). ``mask``: [N, T] bool beside a tensor of
    inputs (true: a real position). The model runs in eval mode, without gradients,
    ``batch_size`` inputs a pass, on the device of its parameters; the rest of each pass is
    skipped. Raises ``ValueError`` with one line for a bad layer name, ``positions`` value,
    mask or output.
    """
    if positions not in POSITIONS:
        raise ValueError(f"positions must be one of {', '.join(POSITIONS)}, got {positions!r:.40}")
    if isinstance(inputs, torch.Tensor):
        if mask is not None and (mask.dtype != torch.bool or len(mask) != len(inputs)):
            raise ValueError(f"mask must be a bool tensor with one row per input ([{len(inputs)},"
                             f" T]), got {mask.dtype} of shape {tuple(mask.shape)}")
        inputs = TensorDataset(inputs) if mask is None else TensorDataset(inputs, mask)
    elif mask is not None:
        raise ValueError("mask goes with a tensor of inputs; a dataset's items give their own")
    layer = find_layer(model, hook, type(model).__name__)
    device = next((t.device for t in (*model.parameters(), *model.buffers())),
                  torch.device("cpu"))
    reader = LayerReader(model, layer, device, max(1, int(batch_size)), hook, positions)
    try:
        return reader.rows(inputs, range(len(inputs)))[0]
    except SourceError as e:
        raise ValueError(str(e)) from None
