"""Sizes and durations as people type them: ``200GB``, ``1.5TiB``, ``500M``, ``7d``, ``90s``;
and lists of names cut short for a message.

>>> parse_size("1.5KiB"), parse_size("2GB"), parse_duration("12h")
(1536, 2000000000, 43200.0)
"""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Sequence

_SIZE_UNITS = {
    "": 1, "b": 1,
    "k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6, "g": 10**9, "gb": 10**9,
    "t": 10**12, "tb": 10**12, "p": 10**15, "pb": 10**15,
    "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40, "pib": 2**50,
}
_DURATION_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_NUMBER_UNIT = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*([a-zA-Z]*)\s*$")


def parse_size(text: str | int) -> int:
    """Bytes from ``"200GB"`` (decimal units), ``"1.5TiB"`` (binary), ``"500M"``, ``"1024"``."""
    if isinstance(text, int) and not isinstance(text, bool):
        if text < 0:
            raise ValueError(f"invalid size {text}: must be >= 0 bytes")
        return text
    if not isinstance(text, str):
        raise TypeError(f"a size must be a number of bytes or a string like '200GB'; got {text!r}")
    match = _NUMBER_UNIT.match(text)
    unit = match.group(2).lower() if match else None
    if unit not in _SIZE_UNITS:
        raise ValueError(f"invalid size {text!r}: use a number with B, KB, MB, GB, TB "
                         "(or KiB, MiB, GiB, TiB), e.g. 200GB")
    return int(float(match.group(1)) * _SIZE_UNITS[unit])


def parse_duration(text: str | int | float | timedelta) -> float:
    """Seconds from ``"7d"``, ``"12h"``, ``"30m"``, ``"90s"``, ``"2w"``, a number of seconds or a
    ``timedelta``."""
    if isinstance(text, timedelta):
        seconds = text.total_seconds()
    elif isinstance(text, (int, float)) and not isinstance(text, bool):
        seconds = float(text)
    elif isinstance(text, str):
        match = _NUMBER_UNIT.match(text)
        unit = match.group(2).lower() if match else None
        if unit not in _DURATION_UNITS:
            raise ValueError(f"invalid duration {text!r}: use a number with s, m, h, d or w "
                             "(seconds, minutes, hours, days, weeks), e.g. 7d")
        seconds = float(match.group(1)) * _DURATION_UNITS[unit]
    else:
        raise TypeError(f"a duration must be seconds, a timedelta or a string like '7d'; "
                        f"got {text!r}")
    if seconds < 0:
        raise ValueError(f"invalid duration {text!r}: must not be negative")
    return seconds


def format_size(num_bytes: int | None) -> str:
    """``"1.2 GB"``: decimal units, like the ones :func:`parse_size` reads."""
    if num_bytes is None:
        return "?"
    value = float(num_bytes)
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(value) < 1000 or unit == "TB":
            return f"{int(value)} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1000
    raise AssertionError("unreachable")


def format_age(seconds: float | None) -> str:
    """``"5 min ago"``, ``"3 days ago"``; ``"?"`` if unknown."""
    if seconds is None:
        return "?"
    seconds = max(0.0, seconds)
    for limit, unit, name in ((60, 1, "s"), (3600, 60, "min"), (86400, 3600, "h"),
                              (float("inf"), 86400, "days")):
        if seconds < limit:
            count = int(seconds // unit)
            if name == "days" and count == 1:
                name = "day"
            return "just now" if name == "s" and count < 10 else f"{count} {name} ago"
    raise AssertionError("unreachable")


def format_names(names: Sequence[str], most: int = 3) -> str:
    """``"a, b, c and 2 more"``: the first ``most`` of ``names``, and how many are left out."""
    shown = ", ".join(names[:most])
    return shown + (f" and {len(names) - most} more" if len(names) > most else "")
