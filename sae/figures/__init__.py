"""Pure plotting functions: numpy arrays or DataFrames in, a ``matplotlib.figure.Figure`` out.

By audience:

- :mod:`sae.figures.run`: what one run learned (sparsity histogram, firing frequencies, class ×
  unit heatmap, feature density, decoder atoms, reconstructions), drawn by the figure callback;
- :mod:`sae.figures.curves`: one run's training curves, drawn by its report;
- :mod:`sae.figures.embedding`: a t-SNE of test codes coloured by class, drawn for the feature
  browser (imported on its own: scikit-learn is loaded only when it embeds);
- :mod:`sae.figures.sweep`: the comparison of a sweep's runs (Pareto, probe, L0 distributions,
  per-class L0, L0–ink correlation);
- :mod:`sae.figures.common`: the style, resolution, PNG/RGB output and helpers they share.

The public functions are re-exported here, so ``from sae import figures;
figures.decoder_atoms(...)`` works whichever module a figure lives in.
"""

from sae.figures.common import DPI, figure_to_png_bytes, figure_to_rgb, save_png, tile_mosaic
from sae.figures.curves import training_curves
from sae.figures.run import (
    FREQ_FLOOR,
    activation_frequency_curve,
    class_selectivity,
    class_unit_heatmap,
    decoder_atoms,
    feature_density_histogram,
    reconstructions,
    sparsity_histogram,
)
from sae.figures.sweep import (
    class_l0_heatmap,
    fvu_l0_pareto,
    l0_distributions,
    l0_ink_correlation,
    probe_vs_l0,
)

__all__ = [
    "DPI",
    "FREQ_FLOOR",
    "activation_frequency_curve",
    "class_l0_heatmap",
    "class_selectivity",
    "class_unit_heatmap",
    "decoder_atoms",
    "feature_density_histogram",
    "figure_to_png_bytes",
    "figure_to_rgb",
    "fvu_l0_pareto",
    "l0_distributions",
    "l0_ink_correlation",
    "probe_vs_l0",
    "reconstructions",
    "save_png",
    "sparsity_histogram",
    "tile_mosaic",
    "training_curves",
]
