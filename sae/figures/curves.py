"""Training curves of one run, drawn from Lightning's ``metrics.csv`` (DataFrame in, Figure out).

The run's report draws them when it is written, so a report made mid-training is current.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import PercentFormatter

from sae.figures.common import drop_unused, empty_note, styled

__all__ = ["training_curves"]

_TRAIN_COLOUR = "C0"
_VAL_COLOUR = "C1"

# (panel title, y label, ((column, legend label), ...)) in display order.
_CURVE_PANELS: tuple[tuple[str, str, tuple[tuple[str, str], ...]], ...] = (
    ("Total loss", "loss", (("train/loss", "train"), ("val/loss", "val"))),
    ("Reconstruction error", "mean squared error per input value", (("val/mse", "val"),)),
    # train/recon is the loss's reconstruction term ‖x − x̂‖² / E‖x − x̄‖²: the batch FVU
    ("Fraction of variance unexplained", "FVU (0 = perfect)",
     (("train/recon", "train (batch)"), ("val/fvu", "val"))),
    ("Sparsity penalty term", "penalty", (("train/penalty", "train"),)),
    ("Penalty weight λ_t (warm-up)", "λ_t", (("train/lambda", "train"),)),
    ("Active units per input", "mean L0", (("train/l0", "train"), ("val/l0", "val"))),
    # the legend says where a unit was counted dead: train over the guard's window of recent
    # training inputs, val over the whole validation set
    ("Dead units (fire on no input)", "share of units",
     (("train/dead_fraction", "train: last window of inputs"),
      ("val/dead_fraction", "val: validation set"))),
)

# The dead-units panel's y axis reaches at least this share: one dead unit of 512 (0.2 %) is a
# small step, not a swing across the whole panel.
_DEAD_AXIS_MIN = 0.05


def _series(history: pd.DataFrame, column: str) -> pd.DataFrame:
    """The non-missing ``(x, y)`` pairs of one logged column, sorted by step.

    CSVLogger rows are sparse (train and val metrics land on different rows), so every
    column is read on its own.
    """
    if column not in history.columns:
        return pd.DataFrame({"x": [], "y": []})
    x = history["step"] if "step" in history.columns else pd.Series(history.index)
    frame = pd.DataFrame({
        "x": pd.to_numeric(x, errors="coerce").to_numpy(),
        "y": pd.to_numeric(history[column], errors="coerce").to_numpy(),
    })
    return frame.dropna().sort_values("x", kind="stable")


# Per-batch values that are noisy enough to need smoothing; lambda and dead fraction are not.
_NOISY = frozenset({"train/loss", "train/recon", "train/penalty", "train/l0"})


def _plot_series(ax: Axes, s: pd.DataFrame, label: str, column: str) -> None:
    """Draw one curve; long noisy train curves get a faint raw line under a rolling mean."""
    is_val = column.startswith("val/")
    colour = _VAL_COLOUR if is_val else _TRAIN_COLOUR
    if column not in _NOISY or len(s) < 200:
        ax.plot(s["x"], s["y"], color=colour, label=label, lw=1.4,
                marker="o" if is_val and len(s) <= 60 else None, ms=3)
        return
    window = max(5, len(s) // 50)
    ax.plot(s["x"], s["y"], color=colour, lw=0.6, alpha=0.3)
    smooth = s["y"].rolling(window, center=True, min_periods=1).mean()
    ax.plot(s["x"], smooth, color=colour, lw=1.4, label=f"{label} (smoothed)")


@styled
def training_curves(history: pd.DataFrame) -> Figure:
    """Training and validation curves against the optimiser step.

    Args:
        history: Lightning CSVLogger ``metrics.csv`` as read by pandas: a ``step`` column and
            any subset of ``train/{loss,recon,penalty,lambda,l0,dead_fraction}`` and
            ``val/{loss,fvu,mse,l0,dead_fraction}``; rows are sparse (NaN where not logged).

    Returns:
        One axes per panel that has data (loss, reconstruction error, FVU, penalty, λ_t, L0,
        dead units); panels whose columns were never logged are left out. With nothing
        logged at all, a single axes says so.
    """
    panels = []
    for title, ylabel, columns in _CURVE_PANELS:
        series = [(_series(history, col), label, col) for col, label in columns]
        series = [s for s in series if len(s[0])]
        if series:
            panels.append((title, ylabel, series))
    if not panels:
        fig = Figure(figsize=(6.0, 3.0), layout="constrained")
        fig.suptitle("Training curves")
        empty_note(fig.add_subplot(), "no training metrics logged yet")
        return fig

    cols = min(len(panels), 4 if len(panels) >= 7 else 3)
    rows = math.ceil(len(panels) / cols)
    fig = Figure(figsize=(4.2 * cols, 3.1 * rows + 0.5), layout="constrained")
    axes = drop_unused(fig, fig.subplots(rows, cols, squeeze=False), len(panels))
    for ax, (title, ylabel, series) in zip(axes, panels, strict=True):
        for s, label, col in series:
            _plot_series(ax, s, label, col)
        ys = np.concatenate([s["y"].to_numpy() for s, _, _ in series])
        if title.startswith("Dead"):
            ax.yaxis.set_major_formatter(PercentFormatter(1.0))
            ax.set_ylim(0, min(1.0, max(_DEAD_AXIS_MIN, 1.15 * float(np.nanmax(ys)))))
        elif title.startswith("Penalty weight"):
            # linear from 0: the warm-up's rise from λ_0 ≈ 0 is the point of this panel (a log
            # axis or autoscaling would start at the first logged value and hide it)
            ax.set_ylim(0, 1.1 * float(np.nanmax(ys)) if np.nanmax(ys) > 0 else 1.0)
        elif ys.min() > 0 and ys.max() / ys.min() > 30:  # losses falling by decades
            ax.set_yscale("log")
        ax.set(title=title, ylabel=ylabel, xlabel="training step")
        ax.legend(fontsize="small")
    fig.suptitle("Training curves")
    return fig
