"""One run from the command line to its pages (:mod:`~sae.runs.command`, ``python -m sae.run``)."""
