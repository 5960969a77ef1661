"""Pure plotting functions: numpy arrays or DataFrames in, a ``matplotlib.figure.Figure`` out.

By audience:

- :mod:`sae.figures.run`: what one run learned (sparsity histogram, firing frequencies, class ×
  unit heatmap, feature density, decoder atoms, reconstructions), drawn by the figure callback;
- :mod:`sae.figures.curves`: one run's training curves, drawn by its report;
- :mod:`sae.figures.embedding`: a t-SNE of test codes coloured by class, drawn for the feature
  browser (imported on its own: scikit-learn is loaded only when it embeds);
- :mod:`sae.figures.labels`: labels beside a figure's points that hide no line, marker or
  other label (the comparison figures' λ and k);
- :mod:`sae.figures.common`: the style, resolution, PNG/RGB output, the one colour and marker
  of each model (:func:`sae.figures.common.model_style`) and helpers they share.

The comparison of a sweep's runs is drawn by :mod:`sae.sweep.plots` with this package's style:
figures know nothing of sweeps, so imports run one way, from sweeps down to figures.

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

__all__ = [
    "DPI",
    "FREQ_FLOOR",
    "activation_frequency_curve",
    "class_selectivity",
    "class_unit_heatmap",
    "decoder_atoms",
    "feature_density_histogram",
    "figure_to_png_bytes",
    "figure_to_rgb",
    "reconstructions",
    "save_png",
    "sparsity_histogram",
    "tile_mosaic",
    "training_curves",
]
