"""A tiny transformer over random tokens: the sequence model the per-position hook tests read
(``encoder.layers.0`` and ``encoder.layers.1`` give [B, T, D] outputs, D = 16, T = 8;
``summary`` [B, D]), and sources with layers or masks a run refuses."""

from collections import OrderedDict

import torch
from torch import nn
from torch.utils.data import TensorDataset

VOCAB, T, D = 50, 8, 16


class Tiny(nn.Module):
    """Embedding, two encoder layers (batch first), a head over the vocabulary."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Embedding(VOCAB, D)
        layer = nn.TransformerEncoderLayer(D, 2, 32, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.head = nn.Linear(D, VOCAB)
        self.summary = Mean()

    def forward(self, tokens, attention_mask=None):
        pad = None if attention_mask is None else ~attention_mask.bool()
        h = self.encoder(self.embed(tokens), src_key_padding_mask=pad)
        return self.head(h), self.summary(h)


class Mean(nn.Module):
    """[B, T, D] -> [B, D]: a layer without positions."""

    def forward(self, h):
        return h.mean(1)


class Sum(nn.Module):
    """[B, K] -> [B]: a layer of one dim, which no SAE reads."""

    def forward(self, x):
        return x.sum(-1)


def tokens(n=300, seed=1) -> torch.Tensor:
    return torch.randint(0, VOCAB, (n, T), generator=torch.Generator().manual_seed(seed))


def padded(n=300, seed=1) -> TensorDataset:
    """Tokens with a padding mask: input i has 3 to 8 real positions, then padding."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(3, T + 1, (n,), generator=g)
    mask = torch.arange(T)[None, :] < lengths[:, None]
    return TensorDataset(tokens(n, seed) * mask, mask)


def factory():
    """(model, dataset) for --source sequence_net:factory."""
    return Tiny(), TensorDataset(tokens())


def flat_factory():
    """A model whose layer ``pool`` gives one number per input."""
    torch.manual_seed(0)
    model = nn.Sequential(OrderedDict(lin=nn.Linear(8, 4), pool=Sum()))
    return model, TensorDataset(torch.randn(100, 8))


def short_mask_factory():
    """Masks of 5 positions for inputs of 8."""
    return Tiny(), TensorDataset(tokens(), torch.ones(300, 5, dtype=torch.bool))
