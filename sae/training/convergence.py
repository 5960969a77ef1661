"""Whether a run has converged: how much its validation FVU and mean L0 moved in the last epoch.

A run whose validation metrics still move at its end is compared at a point of its curve that
longer training would leave behind, so a comparison must say which of its runs had settled.
Definition, on the validation rows of a run's ``metrics.csv`` (one per epoch, the last of each)::

    change(m) = |m_last − m_previous| / |m_previous|          m = val/fvu, val/l0
    converged = change(val/fvu) < FVU_TOLERANCE  and  change(val/l0) < L0_TOLERANCE

A run with fewer than two validated epochs has no change to measure: every value is None.
"""

from __future__ import annotations

import csv
import math
from pathlib import Path

from sae.settings.metric_defs import FVU_TOLERANCE, L0_TOLERANCE

__all__ = ["FVU_TOLERANCE", "L0_TOLERANCE", "KEYS", "final_validation", "last_epoch_change",
           "read_validation"]

KEYS = ("val_fvu_change", "val_l0_change", "converged")


def _number(text: str | None) -> float | None:
    try:
        value = float(text) if text not in (None, "") else None
    except ValueError:
        return None
    return value if value is not None and math.isfinite(value) else None


def read_validation(path: str | Path) -> list[dict[str, float]]:
    """The last validation row of each epoch of a ``metrics.csv``: ``{"epoch", "fvu", "l0"}``,
    in epoch order; [] when the file is missing or unreadable."""
    by_epoch: dict[int, dict[str, float]] = {}
    try:
        with open(path, newline="", encoding="utf-8") as fh:
            for row in csv.DictReader(fh):
                fvu, l0 = _number(row.get("val/fvu")), _number(row.get("val/l0"))
                epoch = _number(row.get("epoch"))
                if fvu is not None and l0 is not None and epoch is not None:
                    by_epoch[int(epoch)] = {"epoch": int(epoch), "fvu": fvu, "l0": l0}
    except (OSError, UnicodeDecodeError, csv.Error):
        return []
    return [by_epoch[e] for e in sorted(by_epoch)]


def _change(last: float, previous: float) -> float | None:
    return abs(last - previous) / abs(previous) if previous != 0 else None


def last_epoch_change(rows: list[dict[str, float]]) -> dict[str, float | bool | None]:
    """``val_fvu_change``, ``val_l0_change`` (relative, over the last epoch) and ``converged``
    of validation rows as :func:`read_validation` gives them."""
    if len(rows) < 2:
        return dict.fromkeys(KEYS)
    previous, last = rows[-2], rows[-1]
    fvu, l0 = _change(last["fvu"], previous["fvu"]), _change(last["l0"], previous["l0"])
    converged = None if fvu is None or l0 is None else \
        bool(fvu < FVU_TOLERANCE and l0 < L0_TOLERANCE)
    return {"val_fvu_change": fvu, "val_l0_change": l0, "converged": converged}


def final_validation(rows: list[dict[str, float]]) -> dict[str, float | None]:
    """``val_fvu`` and ``val_l0``: the last validation of validation rows as
    :func:`read_validation` gives them (None without any): what a comparison chooses settings
    by, so that the test set only reports."""
    last = rows[-1] if rows else {}
    return {"val_fvu": last.get("fvu"), "val_l0": last.get("l0")}
