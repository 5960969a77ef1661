"""``python -m sae.layer``: a classifier's hidden layer as --data. The command is
:mod:`sae.data.layer`; this module keeps its name."""

from sae.data.layer import as_command, main

__all__ = ["main"]

if __name__ == "__main__":
    as_command()
