"""``python -m sae.features``: a run's feature browser. The command is
:mod:`sae.pages.features.command`; this module keeps its name."""

from sae.pages.features.command import as_command, main

__all__ = ["main"]

if __name__ == "__main__":
    as_command()
