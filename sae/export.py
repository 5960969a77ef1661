"""``python -m sae.export RUN FOLDER --format sae|saelens``: the command of
:func:`sae.api.export.export`.

This module is the command only. In Python the function is ``sae.export`` (``import sae``),
and it stays the function: importing this module would make Python rebind ``sae.export`` to
it, so an import other than ``python -m`` is refused with one line naming the function."""

if __name__ != "__main__":
    raise ImportError("sae.export is the command python -m sae.export; in Python call the "
                      "function sae.export(...) after import sae (sae.api.export.export)")

from sae.api.export import main  # noqa: E402 - the command runs only as __main__

raise SystemExit(main())
