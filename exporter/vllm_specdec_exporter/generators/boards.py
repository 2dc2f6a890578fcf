"""Write the dashboards' JSON (or --check for drift).

    python -m vllm_specdec_exporter.generators.boards [--check] [OUT_DIR] [--chart-files DIR]

Every recorded series a panel, a variable or an annotation reads must be recorded by both
rule variants generated with the same options ($window taken over the window variable's
values): otherwise generation fails, naming the dashboard, the panel and the series.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from . import exporter_board, overview
from .grafana import Json
from .output import exit_status, write_or_check
from .rules.files import rule_file
from .rules.options import VARIANTS, Options
from .rules.references import DanglingReference, check_references, recorded
from .rules.registry import default_options

DASHBOARDS: dict[str, Callable[[Options], Json]] = {
    f"{overview.UID}.json": overview.dashboard,
    f"{exporter_board.UID}.json": exporter_board.dashboard,
}


def readers(board: Json) -> dict[str, str]:
    """Each query of a dashboard, named for an error message: panels' targets, variables, annotations."""
    out: dict[str, str] = {}

    def add(who: str, expr: Any) -> None:
        if isinstance(expr, str) and expr:
            out[who if who not in out else f"{who} ({len(out)})"] = expr

    for p in board.get("panels", []):
        for t in p.get("targets", []):
            add(f"panel {p.get('title')!r} query {t.get('refId')}", t.get("expr"))
    for v in board.get("templating", {}).get("list", []):
        add(f"variable {v.get('name')!r}", v.get("query"))
    for a in board.get("annotations", {}).get("list", []):
        add(f"annotation {a.get('name')!r}", a.get("expr"))
    return out


def check_dashboard(board: Json, o: Options) -> None:
    """Raise DanglingReference when the dashboard reads a recorded series a rule variant does not record."""
    defined = set.intersection(*(recorded(r for g in rule_file(v, o)["groups"] for r in g["rules"]) for v in VARIANTS))
    check_references(f"dashboard {board.get('title')!r}", defined, readers(board), o, o.windows)


def render(o: Options | None = None) -> dict[str, str]:
    o = o or default_options()
    out = {}
    for filename, build in DASHBOARDS.items():
        board = build(o)
        check_dashboard(board, o)
        out[filename] = json.dumps(board, indent=2, sort_keys=True) + "\n"
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m vllm_specdec_exporter.generators.boards")
    parser.add_argument("out_dir", nargs="?", default="dashboards", type=Path)
    # The Helm chart ships byte-identical copies (its ConfigMaps read them with .Files.Get).
    parser.add_argument("--chart-files", type=Path, help="also write the Helm chart's copies into this folder")
    parser.add_argument("--check", action="store_true", help="fail if the committed files differ")
    args = parser.parse_args(argv)
    try:
        files = render()
    except DanglingReference as e:
        print(f"cannot generate: {e}", file=sys.stderr)
        return 2
    stale = [p for folder in (args.out_dir, args.chart_files) if folder for p in write_or_check(files, folder, args.check)]
    return exit_status(stale)


if __name__ == "__main__":
    sys.exit(main())
