"""Small inline SVG charts for the landing page: pure functions of their figures.

No JavaScript, no external assets, and no text inside the SVG: a terminal browser
prints an element's text, so every word stays in the page's HTML beside the chart (the
picture is decorative; its ``aria-label`` says what it shows). A frame maps time to x
(start at 0, end at the width) and a value to y (``high`` at the top, 0; ``low`` at the
bottom, the height); values outside are drawn at the edge. A point without a value (too
few drafts behind it) breaks the line; a lone point is a dot.
"""

from __future__ import annotations

import html
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

WIDTH, HEIGHT = 360, 90
LINE = "#1f4e9a"  # the acceptance length
HEALTHY = "#2a8a2a"  # the healthy reference
DEGRADED = "#d2691e"  # the degraded threshold
# Positions 0, 1, ...: dark to light, then again.
POSITIONS = ("#08306b", "#2171b5", "#6baed6", "#74c476", "#fd8d3c", "#e6550d", "#9e9ac8", "#756bb1")

Point = tuple[float, float | None]  # (time, value), None: nothing to draw there


@dataclass(frozen=True, slots=True)
class Frame:
    start: float  # the time at x = 0
    end: float  # the time at x = width
    low: float  # the value at the bottom
    high: float  # the value at the top
    width: float = WIDTH
    height: float = HEIGHT

    def x(self, t: float) -> float:
        span = self.end - self.start
        return self.width if span <= 0 else self.width * (t - self.start) / span

    def y(self, v: float) -> float:
        span = self.high - self.low
        if span <= 0:
            return self.height / 2
        return self.height * (self.high - min(max(v, self.low), self.high)) / span


def _n(v: float) -> str:
    """A coordinate, to a tenth of a pixel: '12.5', '0'."""
    return f"{v:.1f}".removesuffix(".0")


def runs(frame: Frame, points: Iterable[Point]) -> list[list[tuple[float, float]]]:
    """The (x, y) runs of ``points`` (oldest first) inside the frame's time span; a point
    without a value ends a run. (Frame.x and Frame.y, inlined: a page draws hundreds.)"""
    out: list[list[tuple[float, float]]] = []
    current: list[tuple[float, float]] = []
    start, end, low, high, height = frame.start, frame.end, frame.low, frame.high, frame.height
    sx = frame.width / (end - start) if end > start else 0.0
    sy = height / (high - low) if high > low else 0.0
    for t, v in points:
        if v is None or not start <= t <= end:
            if current:
                out.append(current)
            current = []
            continue
        x = (t - start) * sx if sx else frame.width
        y = (high - min(max(v, low), high)) * sy if sy else height / 2
        current.append((x, y))
    if current:
        out.append(current)
    return out


def line(frame: Frame, points: Iterable[Point], color: str, dash: str = "") -> str:
    """A polyline per run (a dot for a lone point)."""
    extra = f' stroke-dasharray="{dash}"' if dash else ""
    parts = []
    for run in runs(frame, points):
        if len(run) == 1:
            parts.append(f'<circle cx="{_n(run[0][0])}" cy="{_n(run[0][1])}" r="2" fill="{color}"/>')
        else:
            coords = " ".join([f"{x:.1f},{y:.1f}" for x, y in run]).replace(".0,", ",").replace(".0 ", " ")
            coords = coords.removesuffix(".0")
            parts.append(f'<polyline points="{coords}" fill="none" stroke="{color}" stroke-width="1.5"{extra}/>')
    return "".join(parts)


def level(frame: Frame, value: float, color: str, dash: str) -> str:
    """A horizontal line across the frame at ``value``."""
    y = _n(frame.y(value))
    return f'<line x1="0" y1="{y}" x2="{_n(frame.width)}" y2="{y}" stroke="{color}" stroke-width="1" stroke-dasharray="{dash}"/>'


def svg(frame: Frame, body: str, label: str) -> str:
    w, h = _n(frame.width), _n(frame.height)
    return (
        f'<svg class="chart" role="img" aria-label="{html.escape(label)}" width="{w}" height="{h}" '
        f'viewBox="0 0 {w} {h}" xmlns="http://www.w3.org/2000/svg">'
        f'<rect width="{w}" height="{h}" fill="#f8f8f8" stroke="#ccc"/>{body}</svg>'
    )


def acceptance_length_chart(
    frame: Frame, points: Sequence[Point], healthy: float | None, degraded: float | None, label: str
) -> str:
    """The acceptance length over time against the healthy reference (dashes) and the degraded
    threshold (dots), where known."""
    body = ""
    if degraded is not None:
        body += level(frame, degraded, DEGRADED, "2 3")
    if healthy is not None:
        body += level(frame, healthy, HEALTHY, "6 4")
    return svg(frame, body + line(frame, points, LINE), label)


def position_chart(frame: Frame, positions: Sequence[Sequence[Point]], label: str) -> str:
    """One line per position (0 first, darkest)."""
    body = "".join(line(frame, points, POSITIONS[i % len(POSITIONS)]) for i, points in enumerate(positions))
    return svg(frame, body, label)
