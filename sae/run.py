"""``python -m sae.run``: train one SAE. The command is :mod:`sae.runner.command`; this module keeps
its name."""

from sae.runner.command import as_command, main

__all__ = ["main"]

if __name__ == "__main__":
    as_command()
