"""``python -m sae.synth``: data from a known dictionary. The command is :mod:`sae.data.synth`;
this module keeps its name."""

from sae.data.synth import as_command, main

__all__ = ["main"]

if __name__ == "__main__":
    as_command()
