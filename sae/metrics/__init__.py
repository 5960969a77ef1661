"""Metrics of sparse autoencoders, each a pure function of tensors with its definition written down.

Grouped by job: :mod:`sae.metrics.basic` (reconstruction and sparsity: FVU, L0, dead units),
:mod:`sae.metrics.dynamic` (does the number of active units adapt to the input, and does that
pay?), :mod:`sae.metrics.truth` (scores against known features) and :mod:`sae.metrics.probes`
(linear probes on features). Every name is also importable
from ``sae.metrics`` itself.
"""

from __future__ import annotations

from sae.metrics.basic import (
    SUMMARY_KEYS,
    active,
    class_firing_frequency,
    class_selectivity,
    dead_fraction,
    dense_fraction,
    firing_frequency,
    fvu,
    ink,
    l0,
    mse,
    recon_bias,
    summarize,
)
from sae.metrics.dynamic import (
    DYNAMIC_KEYS,
    DYNAMIC_SUBSET,
    PCA,
    adaptive_gain,
    adaptivity,
    dynamic_sparsity,
    input_energy,
    partial_spearman,
    pca_residual,
    principal_components,
    support_fvu,
)
from sae.metrics.probes import (
    PROBE_LOSSES,
    SPARSE_DENSITY,
    ProbeResult,
    linear_probe,
    linear_probes,
    probe_loss,
    probe_probabilities,
    raw_pixel_baseline,
)
from sae.metrics.truth import GROUND_TRUTH_KEYS, FeatureMatch, ground_truth, match_features

__all__ = [
    "DYNAMIC_KEYS",
    "GROUND_TRUTH_KEYS",
    "FeatureMatch",
    "DYNAMIC_SUBSET",
    "PCA",
    "PROBE_LOSSES",
    "SPARSE_DENSITY",
    "SUMMARY_KEYS",
    "ProbeResult",
    "active",
    "adaptive_gain",
    "adaptivity",
    "class_firing_frequency",
    "class_selectivity",
    "dead_fraction",
    "dense_fraction",
    "dynamic_sparsity",
    "firing_frequency",
    "ground_truth",
    "fvu",
    "ink",
    "input_energy",
    "l0",
    "linear_probe",
    "linear_probes",
    "match_features",
    "mse",
    "partial_spearman",
    "pca_residual",
    "principal_components",
    "probe_loss",
    "probe_probabilities",
    "raw_pixel_baseline",
    "recon_bias",
    "summarize",
    "support_fvu",
]
