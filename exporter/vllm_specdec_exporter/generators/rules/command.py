"""``python -m vllm_specdec_exporter.generators.rules [--check] [OUT_DIR]``: write the rule files,
the Helm chart's copies, the runbook (from OUT_DIR's runbook.template.md) and the generated part of
the chart's schema."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ...settings import default_profiles
from ..output import exit_status, update_or_check, write_or_check
from ..schema import with_schema_config
from .files import render_all, render_chart_files
from .references import DanglingReference
from .registry import default_options
from .text import RUNBOOK_TEMPLATE, runbook, with_schema_alerts


def _alias(text: str) -> tuple[str, str]:
    served, sep, model = text.partition("=")
    if not sep or not served.strip() or not model.strip():
        raise ValueError(f"--alias {text!r}: expected SERVED=MODEL, e.g. DSV4-W4A16-FP8-MTP=deepseek-ai/DeepSeek-V4-Pro")
    if not any(p.model.search(model.strip()) for p in default_profiles()):
        raise ValueError(f"--alias {text!r}: no shipped profile matches the model {model.strip()!r}")
    return served.strip(), model.strip()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m vllm_specdec_exporter.generators.rules")
    parser.add_argument("out_dir", nargs="?", default="alerts")
    parser.add_argument("--chart-files", help="also write the Helm chart's copies into this folder")
    parser.add_argument("--chart-schema", help="the Helm chart's values.schema.json: its alert names")
    parser.add_argument("--check", action="store_true", help="fail if the committed files differ")
    parser.add_argument(
        "--alias",
        action="append",
        default=[],
        metavar="SERVED=MODEL",
        help="a served name (--served-model-name) and the model it serves, which the shipped profiles match: "
        "the vllm-direct baseline rules then cover that served name (repeatable). Without it a served name no "
        "profile matches has no baseline, and a head partly broken from the start goes unseen",
    )
    args = parser.parse_args(argv)
    try:
        aliases = tuple(_alias(a) for a in args.alias)
    except ValueError as e:
        parser.error(str(e))
    try:
        files, chart_files = render_all(default_options(aliases=aliases) if aliases else None), render_chart_files()
    except DanglingReference as e:
        print(f"cannot generate: {e}", file=sys.stderr)
        return 2
    stale = write_or_check(files, Path(args.out_dir), args.check)
    if args.chart_files:
        stale += write_or_check(chart_files, Path(args.chart_files), args.check)
    template = Path(args.out_dir) / RUNBOOK_TEMPLATE
    if template.exists():  # the runbook, from its template and the shipped options (never the aliases)
        try:
            stale += write_or_check({"runbook.md": runbook(template.read_text())}, Path(args.out_dir), args.check)
        except ValueError as e:
            print(f"cannot generate: {e}", file=sys.stderr)
            return 2
    if args.chart_schema:  # the alert names from ALERTS, `config` from the settings module
        stale += update_or_check(Path(args.chart_schema), lambda t: with_schema_config(with_schema_alerts(t)), args.check)
    return exit_status(stale)
