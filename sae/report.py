"""``python -m sae.report``: a run's report.html. The command is :mod:`sae.pages.report`; this
module keeps its name."""

from sae.pages.report import as_command, main

__all__ = ["main"]

if __name__ == "__main__":
    as_command()
