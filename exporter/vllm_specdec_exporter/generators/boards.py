"""Write the dashboards' JSON (or --check for drift).

    python -m vllm_specdec_exporter.generators.boards [--check] [OUT_DIR] [--chart-files DIR]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from . import exporter_board, overview
from .output import exit_status, write_or_check

DASHBOARDS = {f"{overview.UID}.json": overview.dashboard, f"{exporter_board.UID}.json": exporter_board.dashboard}


def render() -> dict[str, str]:
    return {filename: json.dumps(build(), indent=2, sort_keys=True) + "\n" for filename, build in DASHBOARDS.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m vllm_specdec_exporter.generators.boards")
    parser.add_argument("out_dir", nargs="?", default="dashboards", type=Path)
    # The Helm chart ships byte-identical copies (its ConfigMaps read them with .Files.Get).
    parser.add_argument("--chart-files", type=Path, help="also write the Helm chart's copies into this folder")
    parser.add_argument("--check", action="store_true", help="fail if the committed files differ")
    args = parser.parse_args(argv)
    files = render()
    stale = [p for folder in (args.out_dir, args.chart_files) if folder for p in write_or_check(files, folder, args.check)]
    return exit_status(stale)


if __name__ == "__main__":
    sys.exit(main())
