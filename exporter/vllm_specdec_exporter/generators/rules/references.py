"""Dangling references: a rule or a dashboard panel that reads a recording rule nobody records would
silently never fire / stay empty. Generation fails instead, naming the reader and the series."""

from __future__ import annotations

import re
from collections.abc import Iterable

from .options import Options, P, Rule

# Recorded names of our own prefix (level:vllm_specdec_metric:op); a dashboard's op may hold $window.
RECORDED_NAME = re.compile(rf"(?<![A-Za-z0-9_:$])[A-Za-z_][A-Za-z0-9_]*:{P}_[A-Za-z0-9_]+:[A-Za-z0-9_$]+")
WINDOW_VARIABLE = "$window"


class DanglingReference(ValueError):
    """A generated rule or dashboard reads a recorded series that no recording rule defines."""


def recorded(rules: Iterable[Rule]) -> set[str]:
    return {r["record"] for r in rules if "record" in r}


def references(expr: str, windows: Iterable[str] = ()) -> set[str]:
    """The recorded names of our prefix an expression reads; $window expanded over ``windows``."""
    found = set(RECORDED_NAME.findall(expr))
    return {n.replace(WINDOW_VARIABLE, w) for n in found for w in (windows if WINDOW_VARIABLE in n else ("",))}


def check_references(where: str, defined: set[str], readers: dict[str, str], o: Options, windows: Iterable[str] = ()) -> None:
    """Fail on the first reader (an alert, a rule, a panel) whose expression reads an unrecorded series."""
    windows = tuple(windows)
    for reader, expr in readers.items():
        missing = sorted(references(expr, windows) - defined)
        if missing:
            raise DanglingReference(
                f"{where}: {reader} reads {', '.join(missing)}, which no recording rule defines (recorded windows: "
                f"{', '.join(o.windows)}; detection {o.detection_window}, trend {o.trend_window}, hourly "
                f"{o.hourly_window}: each must be a recorded window)"
            )
