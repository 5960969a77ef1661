"""One run from the command line to its pages (:mod:`~sae.runner.command`, python -m sae.run)."""
