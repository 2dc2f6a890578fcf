"""The summary JSON as a terminal report: figures, a per-position table with bars, engines."""

from __future__ import annotations

from typing import Any

from . import capacity, config
from .diagnosis import CAUSE_TEXT


def _num(v: float | int | None) -> str:
    return "-" if v is None else f"{v:,.0f}"


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{100 * v:.1f} %"


def _fix(v: float | None, digits: int = 3) -> str:
    return "-" if v is None else f"{v:.{digits}f}"


def escape(text: str) -> str:
    """Text as one terminal line: every character that is not printable (ESC, CR, LF,
    NUL, BEL, bidi overrides ...) as its Python escape (``\\x1b``), so no label a target
    chose can move the cursor, retitle or clear the terminal. JSON output escapes them itself."""
    text = str(text)
    return text if text.isprintable() else "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def one_line(text: str, width: int = 80) -> str:
    """A label value as one terminal line: control characters escaped, long ones cut in the middle
    (checkpoint paths differ at their end: cut there, two models read as one)."""
    out = escape(text)
    head = (width - 3) // 2
    return out if len(out) <= width else out[:head] + "..." + out[len(out) - (width - 3 - head) :]


def bar(fraction: float | None, width: int = config.BAR_WIDTH) -> str:
    if fraction is None:
        return " " * width
    full = round(max(0.0, min(1.0, fraction)) * width)
    return "█" * full + "·" * (width - full)


def _model_block(model: str, entry: dict[str, Any], interval: float | None) -> list[str]:
    s = entry["all"]
    engines = entry["engines"]
    k = s["k"]
    lines = [
        f"model {one_line(model, config.MAX_LABEL_VALUE_LENGTH)}  ({len(engines)} engine{'s' if len(engines) != 1 else ''}, k={k})"
    ]
    ceiling = f"   of at most {k + 1:.3f} (k+1)" if k else ""
    lines.append(f"  mean acceptance length  {_fix(s['mean_acceptance_length'])}{ceiling}")
    lines.append(
        f"  acceptance rate         {_pct(s['acceptance_rate'])}   "
        f"({_num(s['num_accepted_tokens'])} of {_num(s['num_draft_tokens'])} draft tokens)"
    )
    lines.append(
        f"  drafts                  {_num(s['num_drafts'])}   ({_fix(s['effective_draft_length'], 2)} draft tokens per draft)"
    )
    if s["num_generation_tokens"] is not None:
        lines.append(
            f"  output from drafts      {_pct(s['draft_token_share'])} of {_num(s['num_generation_tokens'])} generation tokens"
        )
    if interval:
        lines.append(
            f"  per second              {_fix(s['drafts_per_second'], 1)} drafts, "
            f"{_fix(s['drafted_tokens_per_second'], 1)} drafted, "
            f"{_fix(s['accepted_tokens_per_second'], 1)} accepted tokens  (over {interval:.1f} s)"
        )
    if k:
        lines.append("")
        lines.append("  position    accepted  acceptance  conditional  adds to AL  AL at k=pos+1")
        for i in range(k):
            lines.append(
                f"  {i:>8}  {_num(s['accepted_per_position'][i]):>10}  {_pct(s['per_position_acceptance'][i]):>10}"
                f"  {_pct(s['conditional_acceptance'][i]):>11}  {_fix(s['marginal_acceptance_length'][i]):>10}"
                f"  {_fix(s['acceptance_length_at_k'][i]):>13}  {bar(s['per_position_acceptance'][i])}"
            )
        # The acceptance-count distribution: the shape of a failure at a glance.
        lines.append("")
        lines.append("  accepted exactly      drafts       share")
        for j, (n, share) in enumerate(zip(s["accepted_count_drafts"], s["accepted_count_ratio"], strict=True)):
            lines.append(f"  {j:>16}  {_num(n):>10}  {_pct(share):>10}  {bar(share)}")
    if "profile" in entry:  # report and diff: what the figures were judged against
        p = entry["profile"]
        lines.append("")
        if p:
            lines.append(f"  baseline profile        {one_line(p['name'])} (lowest healthy AL {p['mean_acceptance_length']:.2f})")
        else:  # two lines: each line is escaped, so a newline inside one printed as a literal \n
            lines.append("  baseline profile        none for this name: a head partly broken from the start reads as healthy")
            lines.append("                          (the sidecar also looks up vLLM's /v1/models root and baselines.aliases)")
    if (cost := entry.get("cost")) is not None:  # report and diff: against the profile (no history here)
        first, *rest = cost_text(
            cost["decode_step_factor_ratio"],
            cost["decode_steps_wasted_ratio"],
            cost["healthy_mean_acceptance_length"],
            s["mean_acceptance_length"],
            cost["break_even_mean_acceptance_length"],
            cost["below_break_even"],
            "profile AL {}; no history in the CLI",
            f"{_num(s['num_drafts'])} drafts, under the {config.DEFAULT_MIN_DRAFTS} a figure needs",
        )
        lines.append(f"  decode cost             {first}")
        lines += [f"                          {part}" for part in rest]
    if (ra := s.get("request_acceptance")) is not None:
        lines += ["", *_request_lines(ra)]
    if entry.get("diagnosis"):
        lines.append("")
        lines.append("  likely cause (a hint, not a certainty):")
        lines += [f"    - {CAUSE_TEXT[h['cause']]}: {h['evidence']}" for h in entry["diagnosis"]]
    if len(engines) > 1:
        lines.append("")
        pos_head = "".join(f"  {'pos ' + str(i):>7}" for i in range(k))
        lines.append(f"  {'engine':>8}  {'drafts':>12}  {'AL':>6}  {'acceptance':>10}{pos_head}")
        states = entry["health"]["engines"]
        for engine, e in engines.items():
            pos = "".join(f"  {_pct(v):>7}" for v in e["per_position_acceptance"])
            lines.append(
                f"  {one_line(engine, 24):>8}  {_num(e['num_drafts']):>12}  {_fix(e['mean_acceptance_length']):>6}"
                f"  {_pct(e['acceptance_rate']):>10}{pos}{_engine_mark(states.get(engine))}"
            )
    return lines


def cost_text(
    factor: float | None,
    wasted: float | None,
    healthy: float | None,
    al: float | None,
    break_even: float | None,
    below: bool | None,
    reference: str,
    too_few: str,
) -> list[str]:
    """What the head costs in decode steps (capacity.py's figures, as the sidecar exports them:
    ``factor`` healthy AL / AL, ``wasted`` 1 - AL / healthy AL), then, below the break-even, that
    drafting is slower than none: one or two parts, for report, diff and the demo alike.
    ``reference``: what the healthy AL is, "{}" where it goes ("profile AL {}"); ``too_few``: why
    there is no figure when ``below`` is None. Never a fake 0: without a healthy reference the
    cost is unknown, and too few drafts give no figure."""
    if below is None:  # too few drafts (or no AL) for any figure
        return [f"no figure: {too_few}"]
    if healthy is None:
        first = "unknown: no baseline profile, so no healthy AL to count wasted decode steps against"
    elif factor is None or wasted is None:
        first = "unknown: no figure from these counters"
    elif factor <= 1:
        first = f"no decode steps wasted: AL {_fix(al)} is at or above the healthy AL ({reference.format(f'{healthy:g}')})"
    else:
        first = (
            f"{factor:.2f}x the decode steps of a healthy head ({reference.format(f'{healthy:g}')}): "
            f"{100 * wasted:.0f} % of decode work wasted"
        )
    if not below:
        return [first]
    return [first, f"AL {_fix(al)} is under the break-even {_fix(break_even)}: {capacity.SLOWER_THAN_OFF}"]


def _request_lines(ra: dict[str, Any]) -> list[str]:
    """vLLM's per-request histogram (PR #44487): the shares at each end, and the bucket
    edges they were read at when those are not the thresholds themselves."""
    low, high = ra["thresholds"]

    def row(sign: str, edge: float | None, threshold: float, share: float | None) -> str:
        if edge is None:
            return f"    acceptance {sign} {threshold:<5g} {'-':>10}   (no bucket edge to read it at)"
        note = "" if edge == threshold else f"   (the bucket edge nearest {threshold:g}; no edge at {threshold:g})"
        return f"    acceptance {sign} {edge:<5g} {_pct(share):>10}{note}"

    return [
        f"  per-request acceptance  {_num(ra['requests'])} finished requests",
        row("<=", ra["below_edge"], low, ra["below_ratio"]),
        row("> ", ra["above_edge"], high, ra["above_ratio"]),
    ]


def _engine_mark(state: str | None) -> str:
    """Mark an engine the verdict calls collapsed or degraded (health.engine_state, the summary's
    health.engines), so one dead data-parallel rank stands out of the table."""
    return f"  <- {state}" if state in ("collapsed", "degraded") else ""


def render_text(summary: dict[str, Any], title: str) -> str:
    """The report; ``title``'s own line breaks are kept, every line is escaped (``escape``)."""
    lines = [*title.split("\n"), ""]
    interval = summary["interval_seconds"]
    for model, entry in summary["models"].items():
        lines += _model_block(model, entry, interval)
        lines.append("")
    warnings = list(summary["warnings"])
    for entry in summary["models"].values():
        warnings += entry["all"]["warnings"]
        for e in entry["engines"].values():
            warnings += e["warnings"]
    if warnings:
        lines.append(f"warnings ({len(warnings)}):")
        lines += [f"  - {one_line(w, 400)}" for w in warnings]
    # Every line escaped whole: the diagnosis and anything else that quotes a label.
    return "\n".join(map(escape, lines)).rstrip() + "\n"
