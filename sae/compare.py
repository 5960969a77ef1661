"""``python -m sae.compare``: run a sweep, compare its models, publish. The command is
:mod:`sae.sweep.command`; this module keeps its name."""

from sae.sweep.command import as_command, main

__all__ = ["main"]

if __name__ == "__main__":
    as_command()
