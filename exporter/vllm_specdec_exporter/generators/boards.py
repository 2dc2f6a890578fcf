"""Write the dashboards' JSON (or --check for drift).

    python -m vllm_specdec_exporter.generators.boards [--check] [OUT_DIR] [--chart-files DIR]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from . import exporter_board, overview

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
    stale = []
    for filename, text in render().items():
        for folder in (args.out_dir, args.chart_files):
            if folder is None:
                continue
            path = folder / filename
            if args.check:
                if not path.exists() or path.read_text() != text:
                    stale.append(str(path))
            else:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(text)
    if stale:
        print(f"out of date (run make generate): {', '.join(stale)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
