"""Feature browser: what makes each unit fire, one self-contained ``features.html`` per run.

Usage::

    python -m sae.features <run-folder> [--data-dir DIR] [--out FILE]

For every unit (dead ones included) the page shows its decoder atom, its top activating test
inputs with their activations and labels, a histogram of its activations, its firing frequency,
the classes it fires on and how selective it is for one of them. An index at the top lists all
units and sorts / filters them with a little inline JavaScript; a t-SNE of the test codes
(:mod:`sae.embedding`) opens the page.

Three layers, each usable alone, each its own module:

- :func:`feature_stats` (``stats.py``): pure numpy, codes and labels in, per-unit statistics out;
- :func:`render_features_page` (``page.py``): statistics and images in, one HTML string out, no
  network and no external references (sprite sheets inlined once, inline SVG), so a 512-unit
  page stays a few MB and opens quickly;
- :func:`build_features` (``build.py``): a run folder in, ``features.html`` (and
  ``figures/code_embedding/epoch_<E>.png`` (E: the checkpoint's epoch)) out.
"""

from sae.features.build import build_features
from sae.features.page import render_features_page
from sae.features.stats import DENSE_LIMIT, HIST_BINS, N_TOP, feature_stats

__all__ = ["DENSE_LIMIT", "HIST_BINS", "N_TOP", "build_features", "feature_stats",
           "render_features_page"]
