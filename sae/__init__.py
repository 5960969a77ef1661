"""sae: sparse autoencoders on images and on any network's activations, compared by sparsity
mechanism.

    import sae

    model = sae.load("runs/mnist-sparsemax")     # a run folder, checkpoint or exported folder
    codes = model.encode(x)                      # x [B, D] -> codes [B, H]

``sae.load``, ``sae.train`` and ``sae.export`` live in ``sae.api``.
"""

__version__ = "0.1.0"

__all__ = ["ExportError", "LoadError", "TrainingFailed", "export", "layer_activations", "load",
           "train"]


def __getattr__(name: str):
    if name in __all__:
        # deferred: the commands import this package first, and most (python -m sae.compare
        # --help, the sweep's planning) need neither torch nor Lightning, which sae.api imports
        import sae.api

        return getattr(sae.api, name)
    raise AttributeError(f"module 'sae' has no attribute {name!r}")


def __dir__() -> list[str]:
    # the lazy names too: dir(sae) and tab completion list the public API before first use
    return sorted({*globals(), *__all__})
