"""Feature browser: what makes each unit fire, one self-contained ``features.html`` per run.

Usage::

    python -m sae.features <run-folder> [--data-dir DIR] [--out FILE]

The page opens with an index of all units (dead ones included) that sorts by any column (a click
on its header) and filters, with a little inline JavaScript; then a card per unit: its decoder
atom, its firing frequency, its activation histogram (with axes), the classes it fires on and
how selective it is for one of them (ranked only from ``MIN_FIRINGS`` firings on), the classes
it votes for in a linear probe, its nearest units by decoder cosine, its top activating test
inputs and a few inputs from each quantile band of its firings, each with its attribution
(which pixels drive the unit). A t-SNE of the test codes beside one of the same inputs' pixels
(:mod:`sae.figures.embedding`) closes the page, which links the run's ``report.html``.

Three layers, each usable alone, each its own module:

- :func:`feature_stats` (``stats.py``): pure numpy, codes and labels in, per-unit statistics out
  (and :func:`probe_weights`, the probe's votes);
- :func:`render_features_page` (``page.py``, template ``templates/features.html.j2``):
  statistics and images in, one HTML string out, no network and no external references
  (sprite sheets inlined once, inline SVG), so a 512-unit page stays under 5 MB;
- :func:`build_features` (``build.py``): a run folder in, ``features.html`` (and
  ``figures/code_embedding/test_set.png``) out; :func:`write_features` the same from a model
  and data already in memory (a run at its end).
"""

from sae.pages.features.build import build_features, write_features
from sae.pages.features.page import render_features_page
from sae.pages.features.stats import (
    DENSE_LIMIT,
    HIST_BINS,
    MIN_FIRINGS,
    N_TOP,
    feature_stats,
    probe_weights,
)

__all__ = ["DENSE_LIMIT", "HIST_BINS", "MIN_FIRINGS", "N_TOP", "build_features", "feature_stats",
           "probe_weights", "render_features_page", "write_features"]
