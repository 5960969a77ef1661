"""The training engine: one run's fit (:mod:`~sae.training.engine`), its callbacks, checkpoints,
run folder, test metrics (:mod:`~sae.training.evaluate`) and convergence."""
