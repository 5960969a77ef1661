"""Config and metric values as a page shows them: short numbers for metrics (4 significant digits,
a percentage for shares, minutes for seconds), and config values exactly as written, so that the
run can be repeated from its page."""

from __future__ import annotations

import math

__all__ = ["config_value", "format_metric", "format_value"]


def _is_fraction(name: str) -> bool:
    """Metrics that are shares of something and read best also as a percentage."""
    leaf = name.rsplit("/", 1)[-1].rsplit(".", 1)[-1]
    return "fraction" in leaf or "accuracy" in leaf or leaf in {"fvu", "explained_variance"}


def _duration(seconds: float) -> str:
    """Seconds as '1 h 02 min', '3 min 05 s' or '12.3 s'."""
    if seconds >= 3600:
        return f"{int(seconds // 3600)} h {int(seconds % 3600 // 60):02d} min"
    if seconds >= 60:
        return f"{int(seconds // 60)} min {int(seconds % 60):02d} s"
    return f"{seconds:.3g} s"


def format_value(value: object) -> str:
    """A config or metric value as short text: 4 significant digits for floats."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, float):
        if not math.isfinite(value):
            return str(value)
        return f"{value:,.0f}" if abs(value) >= 1e4 else f"{value:.4g}"
    if isinstance(value, list | tuple):
        return "[" + ", ".join(format_value(v) for v in value) + "]"
    return str(value)


def format_metric(name: str, value: object) -> str:
    """``format_value`` plus a percentage for fractions and a readable form for seconds."""
    text = format_value(value)
    is_number = isinstance(value, int | float) and not isinstance(value, bool)
    if not is_number or not math.isfinite(value):
        return text
    if _is_fraction(name):
        return f"{text} ({100 * value:.4g} %)"
    if name.endswith("_s") and value >= 60:
        return f"{text} ({_duration(float(value))})"
    return text


def config_value(value: object) -> str:
    """Config values as written (no rounding: the config must be reproducible from the page)."""
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, list | tuple):
        return "[" + ", ".join(config_value(v) for v in value) + "]"
    return format_value(value)
