"""``python -m sae.export RUN FOLDER --format sae|saelens``: the command of
:func:`sae.api.export.export`.

``import sae`` gives the function as ``sae.export``, and Python makes this module that
attribute once it is imported (``import sae.export``, ``python -m``); so the module is
callable and calls the function, and ``sae.export(...)`` means the same either way."""

import sys
from types import ModuleType

from sae.api.export import export, main


class _CallableModule(ModuleType):
    def __call__(self, *args, **kwargs):
        return export(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule

if __name__ == "__main__":
    raise SystemExit(main())
