"""Render a PNG preview of the overview dashboard's key panels from a real Prometheus.

This is NOT a Grafana screenshot (no Grafana server runs here): it evaluates the
overview dashboard's own panel queries (read from the committed JSON, template
variables substituted) against a Prometheus over a time range and plots them
with matplotlib.

    python tests/render_preview.py --prometheus http://127.0.0.1:9090 --start T0 --end T1 --out docs/overview-preview.png
    python tests/render_preview.py --live --out docs/overview-preview.png   # runs its own stack (~12 min)
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
KEY_PANELS = (
    "Mean acceptance length vs baseline and ceiling: $model_name",
    "Per-position acceptance",
    "Mean acceptance length per engine",
    "Drafted, accepted and rejected tokens",
)
SUBSTITUTE = {"$cluster": ".*", "$namespace": ".*", "$model_name": ".*", "$engine": ".*", "$target": ".*", "$window": "5m",
              "$__rate_interval": "1m"}


def substitute(expr: str, values: dict[str, str] = SUBSTITUTE) -> str:
    for key in sorted(values, key=len, reverse=True):  # $model_name before $model
        expr = expr.replace(key, values[key])
    return expr


def panels(dashboard: dict) -> list[dict]:
    return [p for p in dashboard["panels"] if p.get("type") != "row"]


def query_range(base: str, expr: str, start: float, end: float, step: float) -> list[dict]:
    url = (f"{base}/api/v1/query_range?query={urllib.parse.quote(expr)}&start={start}&end={end}&step={step}")
    with urllib.request.urlopen(url, timeout=30) as resp:
        return json.load(resp)["data"]["result"]


def legend(fmt: str, labels: dict) -> str:
    """Grafana's legend templating: {{label}}, empty when the series lacks the label."""
    out = re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: labels.get(m.group(1), ""), fmt)
    return " ".join(out.split()) or ",".join(f"{k}={v}" for k, v in labels.items())


def render(base: str, start: float, end: float, out: Path, step: float = 5.0) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    dashboard = json.loads((REPO / "dashboards" / "vllm-specdec-overview.json").read_text())
    by_title = {p["title"]: p for p in panels(dashboard)}
    fig, axes = plt.subplots(2, 2, figsize=(14, 8.5))
    for ax, title in zip(axes.flat, KEY_PANELS, strict=False):

        panel = by_title[title]
        unit = panel["fieldConfig"]["defaults"].get("unit", "none")
        for t in panel["targets"]:
            for series in query_range(base, substitute(t["expr"]), start, end, step):
                xs = [(float(ts) - start) / 60 for ts, _ in series["values"]]
                ys = [float(v) for _, v in series["values"]]
                if unit == "percentunit":
                    ys = [100 * y for y in ys]
                ax.plot(xs, ys, label=legend(t.get("legendFormat", ""), series["metric"]), linewidth=1.6)
        ax.set_title(title.replace(": $model_name", ""), fontsize=11)
        ax.set_xlabel("minutes")
        ax.set_ylabel("%" if unit == "percentunit" else ("tokens/s" if unit == "short" else ""))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="best")
    fig.suptitle("Speculative decoding / Overview -- PREVIEW rendered from real Prometheus data with the "
                 "dashboard's own queries (not a Grafana screenshot)", fontsize=11)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=90)


# The first 5 minutes only fill the recording rules' 5m window (a shorter run
# shows Prometheus's partial-window rates); the plot starts after them.
WARM_UP = 300.0
LIVE_SCENARIO = """
description: preview -- healthy, engine 5 breaks at 6m, every engine collapses at 8m
model_name: deepseek-ai/DeepSeek-V4-Pro
engines: 8
k: 2
drafts_per_second: 40
per_position: [0.924, 0.687]
phases:
  - at: 6m
    engines: [5]
    per_position: [0.0357, 0.0008]
  - at: 8m
    per_position: [0.0357, 0.0008]
"""


def live(out: Path, seconds: float) -> None:
    from prom_harness import stack  # the same harness the tests use (beside this file, so importable)

    rules_text = (REPO / "alerts" / "rules.yaml").read_text()
    with stack(LIVE_SCENARIO, rules_text, scrape_simulator=True) as st:
        start = time.time()
        time.sleep(WARM_UP + seconds)
        render(st.prom.base, start + WARM_UP, time.time(), out)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--prometheus")
    parser.add_argument("--start", type=float)
    parser.add_argument("--end", type=float)
    parser.add_argument("--live", action="store_true", help="run simulator + exporter + Prometheus, then render")
    parser.add_argument("--seconds", type=float, default=420, help="plotted time after the 5 min warm-up")
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "overview-preview.png")
    args = parser.parse_args()
    if args.live:
        live(args.out, args.seconds)
    else:
        render(args.prometheus, args.start, args.end, args.out)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
