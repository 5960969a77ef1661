"""Sweeps: train a grid of SAEs, analyse each run, compare them in tables and plots.

One module per job; ``python -m sae.compare`` (:mod:`sae.sweep.command`, which also documents the
sweep file and folder) is the command that ties them together.

- :mod:`sae.sweep.spec`: the sweep file's schema, expanded into runs and checked by sae.run;
- :mod:`sae.sweep.launch`: run-folder states and the pool of ``python -m sae.run`` subprocesses;
- :mod:`sae.sweep.stacks`: which runs train together as stacks (``--stack``);
- :mod:`sae.sweep.progress`: the line printed as each run finishes;
- :mod:`sae.sweep.heartbeat`: a line at least every half minute while the runs train;
- :mod:`sae.sweep.analysis`: probe, per-class L0 and L0–ink correlation of a finished run;
- :mod:`sae.sweep.aggregate`: results of the runs, seed averages, the KL-SAE matching;
- :mod:`sae.sweep.matching`: every model at the same L0, and the verdict judged there;
- :mod:`sae.sweep.display`: the tables as text, markdown and HTML;
- :mod:`sae.sweep.plots`: the comparison figures (drawn with :mod:`sae.figures`' style);
- :mod:`sae.sweep.render`: results.csv, comparison.md, comparison.html and the plots;
- :mod:`sae.sweep.folds`: what those pages fold below their verdict (definitions, columns).
"""
