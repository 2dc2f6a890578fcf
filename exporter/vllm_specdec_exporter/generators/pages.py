"""The generated blocks of README.md and docs/*.md, from the registries and from real runs.

A block sits between two markers and is replaced whole by `make generate`; `--check`
(run by tests/test_docs.py) fails when one differs, like the rules and dashboards:

    <!-- generated: KIND [ARGS] (make generate; do not edit) -->
    ...
    <!-- end generated -->

Kinds:

- ``flags``: serve's flags, config keys and environment variables (settings.FLAGS);
- ``metrics``: the exported families (metrics.FAMILIES), with METRIC_NOTES;
- ``alerts``: the alerts (generators/rules/registry.py ALERTS), with ALERT_NOTES;
- ``help COMMAND``: the command's ``--help`` (cli.build_parser), 100 columns;
- ``output report|diff FILE...``: the command's real text output on files of this
  repository (relative paths, run from its root), what "(real output)" means.

Run: python -m vllm_specdec_exporter.generators.pages [--root DIR] [--check]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import re
import sys
from collections.abc import Callable
from pathlib import Path

from .output import exit_status
from .rules import ALERTS, Options, alert_figures, default_options

BEGIN = re.compile(r"<!-- generated: (?P<spec>[^()>]*?) \(make generate; do not edit\) -->\n")
END = "<!-- end generated -->"
COLUMNS = 100  # argparse wraps --help to the terminal; the docs are written at this width

# What the README said of a family beyond its help text (metrics.py), by short name.
METRIC_NOTES: dict[str, str] = {
    "drafts": "vLLM's `spec_decode_num_drafts`, renamed",
    "generation_tokens": 'when vLLM exposes them; still exported while spec decode is off, so "generating '
    'without drafting" stays visible',
    "window_drafts": "always present",
    "health": "one series per state, the current one 1",
    "engine_health": "one series per state, the current one 1",
    "diagnosis_info": "one series per cause that fits, none when nothing does (see "
    "[Diagnosis](configuration.md#diagnosis-why-it-fell))",
    "request_acceptance_below_ratio": "only with vLLM PR #44487's per-request histogram",
    "request_acceptance_above_ratio": "only with vLLM PR #44487's per-request histogram",
    "window_requests": "only with vLLM PR #44487's per-request histogram",
    "exporter_polls": "result: success, http_error, timeout, connect_error, invalid_url, too_large, "
    "not_prometheus, no_spec_decode, unsupported_producer, error",
    "exporter_last_poll_parse_errors": "a gauge: a payload that stays malformed is not counted again on every poll",
    "exporter_warnings_suppressed": "what is remembered of them is bounded: 16-byte digests of the first 1,000 characters",
    "exporter_build_info": "`revision` from `$VLLM_SPECDEC_EXPORTER_REVISION` (the image build sets it from "
    "`--build-arg REVISION=...`) or the source checkout's git commit, else `unknown`",
}

# Per alert (keyed by its name after PREFIX, so that each alert name is written only in
# the registry), what the registry does not hold: (fires when, catches, threshold and why,
# onset to firing). Onset minutes are measured by promtool (tests/alert_onset.py).
# {family:SHORT} stands for that exported family's sample name, and {NAME} for a figure the rule
# is built from (rules/text.py alert_figures: a threshold by its key, a window, the alert's {for},
# what follows from them): no threshold is written here, so a changed one changes the table.
PREFIX = "VLLMSpecDecode"
ALERT_NOTES: dict[str, tuple[str, str, str, str]] = {
    "AcceptanceCollapsed": (
        "AL over {window} < 1 + `collapse_margin` ({collapse_al}) with >= `min_drafts_per_second` ({min_drafts_per_second})",
        "the broken V4-Pro MTP head (AL 1.036), the mis-wired k=3 layer (1.09)",
        "{collapse_margin}: every broken-collapse figure is below {collapse_al}, every healthy one above, including random-token "
        "benchmark load (1.19-1.21), which must never page",
        "16 min (head), 15 min (mis-wired)",
    ),
    "AcceptanceCollapsedFast": (
        "AL over **{fast_collapse_range}** < {collapse_al} with >= `fast_collapse_min_drafts_per_second` "
        "({fast_collapse_min_drafts_per_second}) drafts/s",
        "the same collapses at production traffic, in minutes",
        "{fast_collapse_min_drafts_per_second} drafts/s x {fast_collapse_range} = {fast_collapse_drafts} drafts: enough to make "
        "AL < {collapse_al} certain (below); under {fast_collapse_min_drafts_per_second} drafts/s only the slow path above pages",
        "4 min at 10, 100 and 1,000 drafts/s (broken head; mis-wired layer: 4 min)",
    ),
    "EngineCollapsed": (
        "one engine's AL over {window} < {collapse_al} with traffic, while its server has not collapsed",
        "a dead data-parallel rank (DP=8, one rank at AL 1.036: the server shows 2.41)",
        "the same margin, per engine",
        "15 min",
    ),
    "EngineLagging": (
        "an engine's AL - 1 < `engine_lag_fraction` ({engine_lag_fraction}) x its server's, with traffic",
        "a partly broken rank",
        "healthy ranks differ by ~5 % (quiet on the DP=8 noise case); a rank at AL 1.9 among 2.61s is at 0.59 of "
        "the server's gain",
        "15-23 min (judged every 3 min)",
    ),
    "FirstPositionAcceptanceLow": (
        "position 0 acceptance over {window}, with traffic, below what the matched profile allows (`degraded_fraction` "
        "x (profile AL - 1) / k, at most `position0_floor`, {position0_floor}), or below {position0_floor} once the "
        "model's position 0 was at {position0_floor} or more within {day_range} in any pod of its namespace",
        "partial degradations: the V4-Flash sampling bug (0.149), missing draft context (0.22), MTP-3 at AL 1.2, "
        "and any served name after a fall (24 min) or on a rollout's new pods; a steady weak drafter with no "
        "profile (vLLM's Qwen3-VL EAGLE3 reference, 0.29) is not a fall and stays quiet",
        "healthy position 0 is >= 0.66 (V4-Flash k=1 worst workload; V4-Pro 0.92, fixed V4-Flash 0.70); every "
        "partial degradation is <= 0.33 (AL - 1 bounds it). Against a profile, AL - 1 <= k x position 0 makes the "
        "floor one that no server the profile calls healthy falls under (V4-Flash k=7: {v4_flash_k7_position0_floor}). Random-token load "
        "gives the sampling bug's very counters: it warns, never pages, and the description names both readings",
        "18-23 min (its 5m positions recorded every 3 min)",
    ),
    "DraftChainBroken": (
        "position 1's conditional acceptance over {window} < `chain_conditional_floor` ({chain_conditional_floor}) while "
        "position 0 >= {position0_floor}, with traffic, where a profile matches or the model's best busy server's was at "
        "{chain_healthy} or more over an hour within {day_range}",
        "a chain broken after position 0 that AL-based alerts miss at small k (SGLang's V4 MTP k=3 bug: AL 2.17 "
        "against BelowBaseline's {v4_pro_k3_degraded_floor}), from start-up or on a rollout's new pods",
        "healthy conditionals are >= 0.41 (the fixed V4-Flash k=2 sampling; V4-Pro 0.74, golden curves 0.61-0.80); "
        "the SGLang bug 0.25",
        "20-23 min (its 5m positions recorded every 3 min; 15 min for AcceptanceDropped on a new pod, 8 in service, "
        "where there is a healthy hour to compare with)",
    ),
    "AcceptanceBelowBaseline": (
        "AL over {window} < 1 + `degraded_fraction` ({degraded_fraction}) x (profile AL - 1), with traffic",
        "the same partial degradations where a profile matches (both files)",
        "profiles hold the lowest healthy figure; {degraded_fraction} leaves the ~15 % workload swing above it. V4-Flash "
        "k=2 fixed (AL 1.99) is quiet (threshold {v4_flash_k2_degraded_floor})",
        "17-19 min",
    ),
    "AcceptanceDropped": (
        "AL - 1 over {window} more than `drop_fraction` ({drop_percent}) below the model's best hour of the last day "
        "**at the same k**, kept per namespace and model (a rollout keeps it), with traffic; held {for}",
        "any regression against the model's own history: a broken rollout, a head degrading in service",
        "beyond the ~31 % workload alone moves it (V4-Flash k=1: 0.66-0.96), well short of a collapse (~95 %); a k "
        "change starts a new history for the new k (usable an hour later)",
        "6-8 min; on a new server 9-15 min (its k held {dropped_settle} first: warm-up requests stay out); a slow fall (AL 2.61 -> 1.80 over 30 min) 29 min",
    ),
    "AcceptanceShifted": (
        "the AL - 1 over 15m of a model's newcomers (servers that came or changed k within {hourly_window}: a rollout, "
        "a restart; once k has held for the 15m) more than `shift_fraction` ({shift_percent}) below the settled servers' "
        "over the same 15m (once they no longer serve beside them, their last at `reference_min_drafts_per_second` within "
        "{hourly_window}), same namespace, model and k, with traffic (both at `min_drafts_per_second`)",
        "a drift within the workload's spread that came with a rollout (every position 74.15 % -> 57.80 % at k=3: "
        "the gain 22 % lower, under AcceptanceDropped's {drop_percent}); a degraded canary at 5 % of the traffic; a "
        "head degraded at a new k set in place; while the newcomers are new (an hour)",
        "the gate (same traffic, same time), not the threshold, keeps workload out: the spread left is a healthy "
        "server's rank to rank (~5 %); the drift reads 1.5x over it. A traffic-mix shift on the same pods or just "
        "before a rollout, a k change and a healthy rolling update stay quiet",
        "~25 min after the rollout (k held 12 min, then {for})",
    ),
    "NotDrafting": (
        "generation > {min_generation_tokens_per_second} token/s, no drafts over {window}, the model drafted within a day "
        "in its namespace (any pod)",
        "speculative decoding switched off, including by a rollout onto new pods",
        "",
        "15 min",
    ),
    "TargetDown": (
        "the target answers wrongly (HTTP error incl. 401/403, not Prometheus text, too large, bad URL) for {for}, "
        "or is unreachable (refused, timeout) for {unreachable_after}",
        "a misconfiguration; a vLLM that never came back",
        "vLLM refuses connections while loading weights (DeepSeek-V4: 10-30 min): a 15-min reload, or a new pod's "
        "first load, stays quiet, a wrong answer is a misconfiguration no waiting fixes",
        "6 min (wrong answer), 30 min (unreachable)",
    ),
    "TargetInconsistent": (
        "over {inconsistent_window}, inconsistent engine polls >= {inconsistent_percent} of the successful polls",
        "two servers behind one URL, a producer whose counters dip, an engine over `MAX_DRAFTS_PER_SECOND`: its "
        "figures are not counted",
        "a real glitch is one poll in hours (1 in 120: quiet)",
        "17 min",
    ),
    "ExporterAbsent": ("no `{family:exporter_build_info}` for {for}", "the exporter not scraped", "", "15 min"),
    "CounterInvariantViolated": ("invariant violations seen in 10m", "a broken producer or partial scrapes", "", "at once"),
    "NoBaseline": (
        "a model drafts with no profile found by its served name, its /v1/models root or an alias",
        "a deployment whose head may be partly broken from the start with nothing to compare it with",
        "not a fault but a blind spot: said after {for}, so a profile set right after a deployment stays silent",
        "31 min from the first drafts (promtool)",
    ),
    "SpeculativeTokensWasted": (
        "last position accepted in < {wasted_percent} of drafts over {hourly_window}, with traffic",
        "a k larger than the draft can use",
        "",
        "",
    ),
    "AcceptanceSuspiciouslyHigh": (
        "acceptance > {suspicious_percent} over {trend_window} with traffic",
        "repetition loops",
        "",
        "",
    ),
    "RequestAcceptanceExtreme": (
        "over {request_extremes_window}, > {request_percent} of >= {request_min} finished requests at or below "
        "{request_low_percent} or above {request_high_percent} per-request acceptance (only with vLLM PR #44487's "
        "histogram; vllm-direct needs bucket edges {request_low} and {request_high})",
        "garbled output (low end), repetition loops (high end)",
        "not yet calibrated on real traffic: no vLLM release has the histogram",
        "from onset at steady traffic: 21 min (every request extreme) to 45 min (20 % of them): the "
        "{request_extremes_window} share passes {request_percent}, then {for} (judged every {long_interval}: up to {long_interval} more)",
    ),
}


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def flags_table() -> str:
    from ..settings import flags_markdown

    return flags_markdown()


def metrics_table() -> str:
    from ..metrics import FAMILIES

    rows = ["| metric | type | labels | meaning |", "|---|---|---|---|"]
    for f in FAMILIES.values():
        labels = (*f.labels, f.name) if f.type == "stateset" else f.labels
        meaning = f.help.rstrip(".") + (f" ({METRIC_NOTES[f.short]})." if f.short in METRIC_NOTES else ".")
        rows.append(f"| `{f.sample}` | {f.type} | {', '.join(labels) or '-'} | {_cell(meaning)} |")
    rows.append("| `process_*`, `python_*` | | | the standard process and Python collectors, on the exporter's own registry |")
    return "\n".join(rows)


def _filled(text: str, figures: dict[str, str]) -> str:
    from ..metrics import FAMILIES

    text = re.sub(r"\{family:(\w+)\}", lambda m: FAMILIES[m[1]].sample, text)
    return re.sub(r"\{(\w+)\}", lambda m: figures[m[1]], text)


def alerts_table(o: Options | None = None) -> str:
    """docs/alerts.md's table, its figures from ``o`` (default: the shipped options the rules are built from)."""
    o = o or default_options()
    rows = [
        "| alert | severity | for | fires when | catches | threshold and why | onset to firing |",
        "|---|---|---|---|---|---|---|",
    ]
    for a in ALERTS:
        notes = ALERT_NOTES.get(a.name.removeprefix(PREFIX), (a.summary, "", "", ""))
        when, catches, why, onset = (_filled(n, alert_figures(o, a.name)) for n in notes)
        when += " (sidecar)" if a.sidecar_only else ""
        link = f"[`{a.name}`](../alerts/runbook.md#{a.name.lower()})"
        rows.append("| " + " | ".join([link, a.severity, o.fors[a.name], *map(_cell, (when, catches, why, onset))]) + " |")
    return "\n".join(rows)


def command_help(command: str) -> str:
    from ..cli import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    old = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = str(COLUMNS)
    try:
        text = sub.choices[command].format_help() if command else parser.format_help()
    finally:
        if old is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = old
    return "```\n$ vllm-specdec-exporter " + (f"{command} " if command else "") + "--help\n" + text.rstrip() + "\n```"


def command_output(args: list[str], root: Path) -> str:
    """The real text output of `report` / `diff` on files of the repository."""
    from ..cli import main

    if not args or args[0] not in ("report", "diff") or any("://" in a or a.startswith("-") for a in args[1:]):
        raise ValueError(f"output: only report/diff on files of the repository, not {' '.join(args)}")
    out, err = io.StringIO(), io.StringIO()
    cwd = Path.cwd()
    os.chdir(root)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            status = main(args)
    finally:
        os.chdir(cwd)
    if status != 0:
        raise ValueError(f"output: vllm-specdec-exporter {' '.join(args)} exited {status}: {err.getvalue()}")
    return "```\n$ vllm-specdec-exporter " + " ".join(args) + "\n" + out.getvalue().rstrip() + "\n```"


KINDS: dict[str, Callable[[list[str], Path], str]] = {
    "flags": lambda a, r: flags_table(),
    "metrics": lambda a, r: metrics_table(),
    "alerts": lambda a, r: alerts_table(),
    "help": lambda a, r: command_help(a[0] if a else ""),
    "output": command_output,
}


def render_block(spec: str, root: Path) -> str:
    kind, *args = spec.split()
    if kind not in KINDS:
        raise ValueError(f"unknown generated block {kind!r} (known: {', '.join(KINDS)})")
    return KINDS[kind](args, root)


def with_blocks(text: str, root: Path) -> str:
    """The text with every generated block replaced by what it is generated from."""
    out, pos = [], 0
    for m in BEGIN.finditer(text):
        if m.start() < pos:
            continue
        end = text.find(END, m.end())
        if end < 0:
            raise ValueError(f"generated block {m['spec']!r} has no {END}")
        out += [text[pos : m.end()], render_block(m["spec"], root), "\n"]
        pos = end
    return "".join(out) + text[pos:]


def blocks(text: str) -> list[str]:
    return [m["spec"] for m in BEGIN.finditer(text)]


def doc_files(root: Path) -> list[Path]:
    return [root / "README.md", *sorted((root / "docs").glob("*.md"))]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m vllm_specdec_exporter.generators.pages")
    parser.add_argument("--root", default=".", help="the repository (README.md and docs/)")
    parser.add_argument("--check", action="store_true", help="fail if a generated block differs")
    args = parser.parse_args(argv)
    root = Path(args.root).resolve()
    stale = []
    for path in doc_files(root):
        text = path.read_text()
        try:
            new = with_blocks(text, root)
        except ValueError as e:
            print(f"{path}: {e}", file=sys.stderr)
            return 2
        if new != text:
            if args.check:
                stale.append(str(path))
            else:
                path.write_text(new)
    return exit_status(stale)


if __name__ == "__main__":
    sys.exit(main())
