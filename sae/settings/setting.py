"""One setting: its declaration (a dataclass field with ``setting`` metadata), the conversion and
check of a value for it, and :class:`UsageError`, the one-line error of bad user input.

This is the value layer under :mod:`sae.settings.config` (which declares the fields) and
:mod:`sae.settings.cli` (which derives the command line and the YAML reading from them); it imports
neither, and neither torch nor Lightning.
"""

from __future__ import annotations

import difflib
import reprlib
from dataclasses import Field, dataclass, field, fields

__all__ = ["Setting", "UsageError", "check_fields", "convert", "did_you_mean", "setting",
           "setting_of", "shown"]


class UsageError(Exception):
    """Bad user input: printed as one line, exit code 2."""


def setting(default, help: str = "", *, key: str | None = None, choices: tuple | None = None,
            low: float | None = None, high: float | None = None, low_open: bool = False,
            nullable: bool = False, group: str | None = None, kind: str | None = None,
            const=None):
    """A dataclass field that is also a setting.

    ``key`` is its name in YAML files (default: the field name; the flag is ``--`` + key with
    dashes); ``low``/``high`` bound numbers (``low_open``: strictly above ``low``); ``nullable``
    admits ``null``/``none``; ``group`` overrides the section's --help heading; ``kind`` names a
    special parser (``devices``: auto, N or a list; ``optional-path``: ``--resume [CKPT]`` with
    ``const`` when given bare; ``size``: a count >= 1 or a fraction 0 < f < 1).
    """
    meta = {"help": help, "key": key, "choices": choices, "low": low, "high": high,
            "low_open": low_open, "nullable": nullable, "group": group, "kind": kind,
            "const": const}
    return field(default=default, metadata={"setting": meta})


@dataclass(frozen=True)
class Setting:
    name: str  # the dataclass field
    key: str  # in YAML files (flag: --key with dashes)
    type: str  # int, float, str, bool, devices, size (count or fraction) or path (--resume [CKPT])
    default: object
    help: str
    group: str
    choices: tuple | None
    low: float | None
    high: float | None
    low_open: bool
    nullable: bool
    const: object
    file: bool  # may be given in a settings file (and is written to config.yaml)

    @property
    def flag(self) -> str:
        return "--" + self.key.replace("_", "-")


def setting_of(f: Field, heading: str = "", file: bool = True) -> Setting | None:
    """The :class:`Setting` a dataclass field declares (None for a plain field). ``heading`` is
    its section's --help heading, ``file`` whether a settings file may give it."""
    meta = f.metadata.get("setting")
    if meta is None:
        return None
    base = str(f.type).split("|")[0].strip()
    kind = {"devices": "devices", "optional-path": "path", "size": "size"}.get(meta["kind"], base)
    return Setting(f.name, meta["key"] or f.name, kind, f.default, meta["help"],
                   meta["group"] or heading, meta["choices"], meta["low"], meta["high"],
                   meta["low_open"], meta["nullable"], meta["const"], file)


# ---------------------------------------------------------------- values


_SHORT = reprlib.Repr()
_SHORT.maxlevel, _SHORT.maxstring, _SHORT.maxlong, _SHORT.maxother = 2, 60, 40, 60
_SHORT.maxtuple = _SHORT.maxlist = _SHORT.maxdict = _SHORT.maxset = 4


def shown(value, limit: int = 80) -> str:
    """``repr(value)`` cut to a short prefix: how an error message quotes a user's value (a
    value read from a file can be megabytes long)."""
    text = _SHORT.repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def did_you_mean(word, candidates) -> str:
    """``"; did you mean X?"`` for the candidate closest to a misspelt ``word`` (``--lamda``:
    ``--lambda``, ``sparsmax``: ``sparsemax``), or "" when none is close."""
    if not isinstance(word, str) or len(word) > 200:
        return ""
    # flags are compared without their dashes: --foo is not close to --rho
    bare = {str(c).lstrip("-"): str(c) for c in candidates}
    close = difflib.get_close_matches(word.lstrip("-"), list(bare), n=1, cutoff=0.6)
    return f"; did you mean {bare[close[0]]}?" if close else ""


def _number_text(x) -> str:
    return shown(x) if isinstance(x, int) else f"{x:g}"


def _bounded(s: Setting, value):
    if s.low is not None and (value <= s.low if s.low_open else value < s.low):
        raise ValueError(f"must be {'>' if s.low_open else '>='} {_number_text(s.low)}, "
                         f"got {_number_text(value)}")
    if s.high is not None and value > s.high:
        raise ValueError(f"must be <= {_number_text(s.high)}, got {_number_text(value)}")
    return value


def _number(s: Setting, value):
    kind = int if s.type == "int" else float
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise ValueError(f"expected {'an integer' if kind is int else 'a number'}, "
                         f"got {shown(value)}")
    if isinstance(value, float) and kind is int:
        raise ValueError(f"expected an integer, got {shown(value)}")
    try:
        number = kind(value)
    except ValueError:
        raise ValueError(f"expected {'an integer' if kind is int else 'a number'}, "
                         f"got {shown(value)}") from None
    if kind is float and number != number or number in (float("inf"), float("-inf")):
        raise ValueError(f"must be finite, got {shown(value)}")
    return _bounded(s, number)


def _devices(value):
    if isinstance(value, int) and not isinstance(value, bool):
        items = [value]
    elif isinstance(value, list):
        items = value
    elif isinstance(value, str) and value == "auto":
        return value
    elif isinstance(value, str):
        try:
            items = [int(t) for t in value.split(",") if t.strip()]
        except ValueError:
            raise ValueError(f"expected auto, N or a list like 0,1, got {shown(value)}") from None
        if "," not in value:  # a count
            items = items[:1]
            if items and items[0] == -1:
                return -1
            if not items or items[0] < 1:
                raise ValueError(f"a device count must be >= 1 (or -1 for all), got {shown(value)}")
            return items[0]
    else:
        raise ValueError(f"expected auto, N or a list like 0,1, got {shown(value)}")
    if not items or any(isinstance(i, bool) or not isinstance(i, int) or i < 0 for i in items):
        raise ValueError(f"expected auto, N or a list of device ids >= 0, got {shown(value)}")
    if isinstance(value, int):
        if value == 0:
            raise ValueError("a device count must be >= 1 (or -1 for all), got 0")
        return value
    return items


def _size(value):
    """A count (an integer >= 1) or a fraction (0 < f < 1)."""
    given = value
    if isinstance(value, str):
        try:
            value = float(value) if any(c in value for c in ".eE") else int(value)
        except ValueError:
            pass
    if isinstance(value, float) and value.is_integer() and value >= 1:
        value = int(value)
    if isinstance(value, bool) or not (isinstance(value, int) and value >= 1 or
                                       isinstance(value, float) and 0 < value < 1):
        raise ValueError(f"expected a count >= 1 or a fraction between 0 and 1, got "
                         f"{shown(given)}")
    return value


def convert(s: Setting, value, text: bool = False):
    """``value`` (command-line text when ``text``, else a YAML value) checked for setting ``s``.

    Raises ValueError with the reason (without the setting's name). ``None`` (or the text
    ``none``/``null`` for a nullable setting) means the setting's default.
    """
    if value is None or (text and s.nullable and str(value).lower() in ("none", "null")):
        return s.default
    if s.type == "bool":
        if not isinstance(value, bool):
            raise ValueError(f"takes true or false, got {shown(value)}")
        return value
    if s.type in ("int", "float"):
        return _number(s, value)
    if s.type == "devices":
        return _devices(value)
    if s.type == "size":
        return _size(value)
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise ValueError(f"expected text, got {shown(value)}")
    value = str(value)
    if s.choices is not None and value not in s.choices:
        raise ValueError(f"must be one of {', '.join(map(str, s.choices))}, got {shown(value)}"
                         + did_you_mean(value, s.choices))
    return value


def check_fields(obj) -> None:
    """Check every setting field of a config dataclass (ValueError, one line, flag named)."""
    for f in fields(obj):
        s = setting_of(f)
        if s is None:
            continue
        value = getattr(obj, f.name)
        if value is None and s.default is None:
            continue
        try:
            if convert(s, value) != value:
                raise ValueError(f"got {shown(value)}")
        except ValueError as e:
            raise ValueError(f"{s.flag} {e}") from None
