"""How many training rows a run holds out for validation: ``--val-size`` as a count, a
fraction, or the default rule. Pure arithmetic, no torch: the command resolves it before the
run folder is written (``config.yaml`` records the count), the data modules again where only
they know the rows (``--source``).

The default is the smaller of :data:`DEFAULT_VAL_ROWS` and :data:`DEFAULT_VAL_SHARE` of the
training rows: 5 000 of MNIST's 60 000 (what runs have always held out, so published numbers
recompute), 1 200 of a 12 000-row matrix (a fixed 5 000 would take 42 % of it).
"""

from __future__ import annotations

__all__ = ["DEFAULT_VAL_ROWS", "DEFAULT_VAL_SHARE", "LARGE_VAL_SHARE", "large_val_note",
           "val_rows"]

DEFAULT_VAL_ROWS = 5000
DEFAULT_VAL_SHARE = 0.1
LARGE_VAL_SHARE = 0.25  # a validation split above this share of the rows is worth a note


def val_rows(val_size: int | float | None, n: int) -> int:
    """The validation rows of ``n`` training rows: ``val_size`` itself when a count (>= 1), that
    share of ``n`` when a fraction (0 < f < 1), else the default rule; at least 1 row."""
    if val_size is None:
        return max(1, min(DEFAULT_VAL_ROWS, int(DEFAULT_VAL_SHARE * n)))
    if isinstance(val_size, float) and 0 < val_size < 1:
        return max(1, int(val_size * n))
    return int(val_size)


def large_val_note(val: int, n: int, unit: str = "rows") -> str | None:
    """A ``note:`` line when ``val`` validation rows take more than :data:`LARGE_VAL_SHARE` of
    ``n`` training rows (they are not trained on), else None."""
    if n <= 0 or val <= LARGE_VAL_SHARE * n:
        return None
    return (f"note: the validation split takes {val:,} of the {n:,} training {unit} "
            f"({100 * val / n:.0f} %), which are not trained on; --val-size sets it (a count, "
            "or a fraction such as 0.1)")
