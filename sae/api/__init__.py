"""The Python API: ``load`` a trained SAE, ``train`` one, ``export`` one for other
tools. ``import sae`` gives all three (``sae.load``, ``sae.train``, ``sae.export``)."""

from sae.api.activations import layer_activations
from sae.api.export import ExportError, export
from sae.api.load import LoadError, load
from sae.api.train import TrainingFailed, train

__all__ = ["ExportError", "LoadError", "TrainingFailed", "export", "layer_activations", "load",
           "train"]
