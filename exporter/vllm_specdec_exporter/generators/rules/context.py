"""What every alert expression is built from: the PromQL arithmetic that renders config.py's
threshold formulas (Expr), the variant's series and labels per options (X, context), and the
annotation text every description shares (where, cost). expressions.py builds the alerts from it.
"""

from __future__ import annotations

from dataclasses import dataclass

from ... import config as c
from ...capacity import SLOWER_THAN_OFF
from .options import (
    ENGINE,
    MODEL_LEVEL,
    SERVER,
    SIDECAR,
    Options,
    Source,
    base_window,
    by,
    levels,
    name,
)


@dataclass(frozen=True)
class Expr:
    """A PromQL arithmetic expression and its precedence, so that config.py's shared threshold
    formulas (written once, for the sidecar's floats and for this) give the alerts' PromQL, with
    parentheses only where PromQL needs them."""

    text: str
    precedence: int = 3  # 1: + and -, 2: * and /, 3: an operand

    def __str__(self) -> str:
        return self.text

    def _binary(self, op: str, other: Expr | int, precedence: int, reflected: bool = False) -> Expr:
        operand = other if isinstance(other, Expr) else Expr(str(other))
        left, right = (operand, self) if reflected else (self, operand)
        lhs = f"({left.text})" if left.precedence < precedence else left.text
        rhs = f"({right.text})" if right.precedence <= precedence else right.text
        return Expr(f"{lhs} {op} {rhs}", precedence)

    def __sub__(self, other: Expr | int) -> Expr:
        return self._binary("-", other, 1)

    def __radd__(self, other: int) -> Expr:
        return self._binary("+", other, 1, reflected=True)

    def __mul__(self, other: Expr) -> Expr:
        return self._binary("*", other, 2)

    def __truediv__(self, other: Expr) -> Expr:
        return self._binary("/", other, 2)


def label(key: str) -> str:
    """An alert annotation's reference to one of the alert's labels."""
    return f"{{{{ $labels.{key} }}}}"


def where(src: Source, o: Options) -> str:
    """'<model> on <namespace>/<pod>' in every description, with the labels the options name.
    Outside Kubernetes (a static scrape) there is no pod: the sidecar variant names the target
    instead, the vLLM-direct one the model alone, never an empty 'on /'."""
    ns, pod = f"$labels.{o.namespace_label}", f"$labels.{o.pod_label}"
    at = f"{{{{ if {ns} }}}}{label(o.namespace_label)}/{{{{ end }}}}{label(o.pod_label)}"
    other = f"{{{{ else }}}} (target {label(c.LABEL_TARGET)})" if src is SIDECAR else ""
    return f"{label(c.LABEL_MODEL)}{{{{ if {pod} }}}} on {at}{other}{{{{ end }}}}"


ENGINE_LABEL, POSITION_LABEL = label(c.LABEL_ENGINE), label(c.LABEL_POSITION)
TARGET_AT_INSTANCE = f"Target {label(c.LABEL_TARGET)} of the exporter at {label('instance')}"


@dataclass(frozen=True)
class X:
    """What every alert expression is built from, per variant and options."""

    src: Source
    o: Options
    lv: dict[str, tuple[str, ...]]
    t: dict[str, str]
    on: str
    on_model: str  # the model's labels: where the healthy reference is kept
    floor: str
    w: str
    al5: str
    d5: str
    egain: str  # an engine's speculative gain (AL - 1) over w, only with real traffic
    collapse: str
    k: str
    where: str  # the server an alert names, from o's labels
    dtr: str  # drafts over the trend window
    for_: str = ""  # the `for` of the alert being built (registry.alert_rules sets it)


def context(src: Source, o: Options) -> X:
    L, lv = c.ALERT_LEVEL, dict(levels(src, o))
    t, w, tr = o.thresholds, o.detection_window, o.trend_window
    return X(
        src=src,
        o=o,
        lv=lv,
        t=t,
        on=f"on({by(lv[L])})",
        on_model=f"on({by(lv[MODEL_LEVEL])})",
        floor=t["min_drafts_per_second"],
        w=w,
        al5=name(L, "mean_acceptance_length", f"ratio_rate{w}"),
        d5=name(L, "drafts", f"rate{w}"),
        # No ratio is recorded per engine: the engine alerts divide the two rates (docs/scale.md).
        egain=f"{name(ENGINE, 'accepted_tokens', f'rate{w}')} / ({name(ENGINE, 'drafts', f'rate{w}')} >= {t['min_drafts_per_second']})",
        collapse=str(c.collapse_floor(Expr(t["collapse_margin"]))),
        k=name(L, "num_speculative_tokens", "max"),
        where=where(src, o),
        dtr=name(L, "drafts", f"rate{tr}"),
    )


def _server_query(x: X, promql: str) -> str:
    """A query template reading ``promql`` (recorded names, each followed by ``{SEL}``) for the
    alert's own server: each {SEL} becomes a matcher on every label of the alert's level (from the
    options), filled from the alert's $labels. An absent label (no cluster, a static scrape without
    a pod) matches as "", as it does in PromQL."""
    keys = x.lv[c.ALERT_LEVEL]
    sel = "{" + ",".join(f"{k}=%q" for k in keys) + "}"
    args = " ".join([f"$labels.{k}" for k in keys] * promql.count("{SEL}"))
    return f'printf "{promql.replace("{SEL}", sel)}" {args} | query'


# Cost wording: capacity.describe's figures (the step factor, the wasted share, the break-even) as
# the pages and tickets say them; nothing where nothing is wasted, as there.
COST_UNKNOWN = "Cost unknown: no healthy reference (no baseline profile, nor an hour of history at this k)."


def cost(x: X) -> str:
    """What the head costs, appended to the collapse pages' and degradation tickets' descriptions
    (issue 34): the recorded per-server figures (recording._capacity, the same series the dashboard
    shows), read by Prometheus's alert-template query function. A template is expanded only when
    its alert is evaluated and firing or pending, once per alert per evaluation: a few instant
    reads of one server's recorded series, cheap beside the rules themselves. No healthy reference
    (no profile, no history at this k): no figure, and it says so; below the break-even (drafting k
    tokens costs more than it returns) it says to turn speculative decoding off."""
    w = base_window(x.o)
    factor = name(SERVER, "decode_step_factor", f"ratio_rate{w}")
    wasted = name(SERVER, "decode_steps_wasted", f"ratio_rate{w}")
    al = name(SERVER, "mean_acceptance_length", f"ratio_rate{w}")
    even = name(SERVER, "break_even_mean_acceptance_length", "max")
    slower = SLOWER_THAN_OFF[:1].upper() + SLOWER_THAN_OFF[1:]
    return (
        f"{{{{ with {_server_query(x, f'100 * {wasted}{{SEL}}')} }}}}"
        f"{{{{ $wasted := first . | value }}}}{{{{ if ge $wasted 0.5 }}}}"
        f"{{{{ with {_server_query(x, f'{factor}{{SEL}}')} }}}}"
        f' Decode needs {{{{ first . | value | printf "%.1f" }}}}x the steps of a healthy head: '
        f'{{{{ $wasted | printf "%.0f" }}}} % of decode work wasted.{{{{ end }}}}{{{{ end }}}}'
        f"{{{{ else }}}} {COST_UNKNOWN}{{{{ end }}}}"
        f"{{{{ with {_server_query(x, f'{al}{{SEL}} < {even}{{SEL}}')} }}}} {slower}.{{{{ end }}}}"
    )
