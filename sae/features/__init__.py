"""Feature browser: what makes each unit fire, one self-contained ``features.html`` per run.

Usage::

    python -m sae.features <run-folder> [--data-dir DIR] [--out FILE]

The page opens with an index of all units (dead ones included) that sorts by any column (a click
on its header) and filters, with a little inline JavaScript; then a card per unit: its decoder
atom, its firing frequency, its activation histogram (with axes), the classes it fires on and
how selective it is for one of them (ranked only from ``MIN_FIRINGS`` firings on), the classes
it votes for in a linear probe, its nearest units by decoder cosine, its top activating test
inputs and a few inputs from each quantile band of its firings, each with its attribution
(which pixels drive the unit). A t-SNE of the test codes (:mod:`sae.figures.embedding`)
closes the page, which links the run's ``report.html``.

Three layers, each usable alone, each its own module:

- :func:`feature_stats` (``stats.py``): pure numpy, codes and labels in, per-unit statistics out
  (and :func:`probe_weights`, the probe's votes);
- :func:`render_features_page` (``page.py``, template ``templates/features.html.j2``):
  statistics and images in, one HTML string out, no network and no external references
  (sprite sheets inlined once, inline SVG), so a 512-unit page stays under 5 MB;
- :func:`build_features` (``build.py``): a run folder in, ``features.html`` (and
  ``figures/code_embedding/epoch_<E>.png`` (E: the checkpoint's epoch)) out.
"""

from sae.features.build import build_features
from sae.features.page import render_features_page
from sae.features.stats import (
    DENSE_LIMIT,
    HIST_BINS,
    MIN_FIRINGS,
    N_TOP,
    feature_stats,
    probe_weights,
)

__all__ = ["DENSE_LIMIT", "HIST_BINS", "MIN_FIRINGS", "N_TOP", "build_features", "feature_stats",
           "probe_weights", "render_features_page"]
