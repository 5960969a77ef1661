"""``python -m sae.run``: train one SAE. The command is :mod:`sae.runs.command`; this module keeps
its name."""

from sae.runs.command import as_command, main

__all__ = ["main"]

if __name__ == "__main__":
    as_command()
