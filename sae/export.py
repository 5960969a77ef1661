"""``python -m sae.export RUN FOLDER --format sae|saelens``: the command of
:func:`sae.api.export.export`. (``import sae`` gives the function as ``sae.export``; this
module is only run, never imported.)"""

from sae.api.export import main

if __name__ == "__main__":
    raise SystemExit(main())
