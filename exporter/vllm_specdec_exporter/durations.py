"""Durations as Prometheus writes them: the one parser and the one spelling (window names, rule
ranges, flags, the web config, the landing page)."""

from __future__ import annotations

import re

from .errors import shown  # a value quoted in an error is clipped (a file's may be megabytes)

# Prometheus's duration grammar (model.ParseDuration): integer amounts, units in
# descending order, each at most once: 500ms, 90s, 1m30s, 1h, 1d, 1w, 1y.
_DURATION_UNITS = (
    ("y", 365 * 86400.0),
    ("w", 7 * 86400.0),
    ("d", 86400.0),
    ("h", 3600.0),
    ("m", 60.0),
    ("s", 1.0),
    ("ms", 0.001),
)
_DURATION_RE = re.compile("".join(rf"(?:([0-9]+){u})?" for u, _ in _DURATION_UNITS))  # ASCII digits: \d took Arabic-Indic ones


def parse_duration(text: object) -> float:
    """A Prometheus duration ('500ms', '1m30s', '5m', '1w') -> seconds (> 0)."""
    raw = "" if isinstance(text, int) and text.bit_length() > 64 else str(text).strip()  # str() refuses a huge int
    m = _DURATION_RE.fullmatch(raw) if raw else None
    if m is None and raw != "0":
        raise ValueError(f"{shown(text)} is not a duration (Prometheus form, e.g. 500ms, 1m30s, 5m, 1h)")
    try:
        value = sum(int(n) * unit for n, (_, unit) in zip(m.groups(), _DURATION_UNITS, strict=True) if n) if m else 0.0

    except OverflowError:
        value = float("inf")
    if value == float("inf"):
        raise ValueError(f"{shown(text)} is too long a duration")
    if not value > 0:
        raise ValueError(f"{shown(text)} is not a positive duration")
    return value


def format_duration(seconds: float) -> str:
    """The one spelling of a duration, everywhere (window names, rule ranges, the landing page's
    query step): the largest unit that divides it, 300 -> '5m', 90 -> '90s', 1.5 -> '1500ms'."""
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    return f"{round(seconds * 1000)}ms"  # Prometheus takes whole milliseconds, never an exponent
