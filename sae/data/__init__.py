"""Data: MNIST / Fashion-MNIST images (:mod:`~sae.data.images`), ``--data`` activation matrices
(:mod:`~sae.data.matrix`, :mod:`~sae.data.matrixdata`), the checks of a run's data
(:mod:`~sae.data.rundata`), and the commands that make data (:mod:`~sae.data.synth`,
:mod:`~sae.data.layer`). Kept light: importing one module does not import the others."""
