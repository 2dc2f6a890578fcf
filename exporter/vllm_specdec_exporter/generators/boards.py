"""Write the dashboards' JSON beside their grafanalib sources (or --check for drift).

    python dashboards/generate.py [--check]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import exporter  # noqa: E402
import overview  # noqa: E402

DASHBOARDS = {f"{overview.UID}.json": overview.dashboard, f"{exporter.UID}.json": exporter.dashboard}
# The Helm chart ships byte-identical copies (its ConfigMaps read them with .Files.Get).
CHART_COPY = HERE.parent / "helm" / "vllm-specdec-exporter" / "files" / "dashboards"


def render() -> dict[str, str]:
    return {filename: json.dumps(build(), indent=2, sort_keys=True) + "\n" for filename, build in DASHBOARDS.items()}


def main(argv: list[str]) -> int:
    stale = []
    for filename, text in render().items():
        for path in (HERE / filename, CHART_COPY / filename):
            if "--check" in argv:
                if not path.exists() or path.read_text() != text:
                    stale.append(str(path.relative_to(HERE.parent)))
            else:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(text)
    if stale:
        print(f"out of date (run make generate): {', '.join(stale)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
