"""``python -m sae.gallery``: the figure gallery. The command is :mod:`sae.pages.gallery`; this
module keeps its name."""

from sae.pages.gallery import as_command, main

__all__ = ["main"]

if __name__ == "__main__":
    as_command()
