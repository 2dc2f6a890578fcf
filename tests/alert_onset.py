"""Minutes from onset to firing, per alert, for the broken figures of baselines.md.

Each figure runs 60 min healthy, then breaks (same traffic). promtool evaluates the
generated vllm-direct rules (the sidecar file has the same expressions and windows)
with "no alert" expected at every minute after the break; its failures say, minute
by minute, which alerts fire. Not part of the suite: ``python tests/alert_onset.py``
prints the table the README's detection table quotes.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml
from promtool_cases import FLASH, FLASH_SAMPLING_BUG, PRO, PRO_BROKEN, PRO_HEALTHY, deployment, mix

REPO = Path(__file__).resolve().parent.parent
ALERTS = ("VLLMSpecDecodeAcceptanceCollapsed", "VLLMSpecDecodeAcceptanceCollapsedFast", "VLLMSpecDecodeEngineCollapsed", "VLLMSpecDecodeEngineLagging",
          "VLLMSpecDecodeFirstPositionAcceptanceLow", "VLLMSpecDecodeAcceptanceBelowBaseline",
          "VLLMSpecDecodeAcceptanceDropped", "VLLMSpecDecodeDraftChainBroken")
BREAK, END = 60, 110



def per_second(drafts: float, survival: list[float]) -> dict:
    return mix(60 * drafts, [60 * drafts * x for x in survival])


# name -> (model, healthy engines, broken engines): each a list of per-engine mixes.
FIGURES = {
    **{f"broken V4-Pro head at {n:,} drafts/s": (PRO, [per_second(n, [0.924, 0.687])],
                                                 [per_second(n, [235 / 6590, 5 / 6590])]) for n in (10, 100, 1000)},
    "broken V4-Pro MTP head, k=2 (AL 1.036)": (PRO, [PRO_HEALTHY], [PRO_BROKEN]),
    "one dead rank of DP=8 at the broken-head figures (model AL 2.41)": (
        PRO, [PRO_HEALTHY] * 8, [PRO_BROKEN if e == 3 else PRO_HEALTHY for e in range(8)]),
    "V4-Flash draft-sampling bug, k=2 (AL 1.206; fixed 1.99)": (
        FLASH, [mix(1000, [700, 290])], [FLASH_SAMPLING_BUG]),
    "mis-wired V4-Flash draft layer, k=3 (AL 1.09; fixed 2.77)": (
        FLASH, [mix(1000, [980, 640, 150])], [mix(1000, [70, 15, 5])]),
    "missing draft context, V4-Flash k=2 (16 %, AL 1.32)": (
        FLASH, [mix(1000, [700, 290])], [mix(1000, [220, 100])]),
    "chain broken after position 0, V4-Pro k=3 (SGLang: .894 / .223 / .054; AL 2.17)": (
        PRO, [mix(1000, [999, 710, 333])], [mix(1000, [894, 223, 54])]),
}


def suite() -> dict:
    groups = []
    for i, (label, (model, healthy, broken)) in enumerate(FIGURES.items()):
        series = []
        for e, (h, b) in enumerate(zip(healthy, broken, strict=True)):

            series += deployment("vllm-direct", f"case{i}", model, [(h, BREAK), (b, END - BREAK)], engine=str(e))
        checks = [{"eval_time": f"{m}m", "alertname": a, "exp_alerts": []}
                  for a in ALERTS for m in range(BREAK, END)]
        groups.append({"name": label, "interval": "1m", "input_series": series, "alert_rule_test": checks})
    return {"rule_files": [str(REPO / "alerts" / "rules-vllm-direct.yaml")], "evaluation_interval": "1m",
            "tests": groups}


def measure() -> dict[str, dict[str, int]]:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "onset.yaml"
        path.write_text(yaml.safe_dump(suite(), width=1000))
        out = subprocess.run(["promtool", "test", "rules", str(path)], capture_output=True, text=True).stderr  # failures go to stderr
    first: dict[str, dict[str, int]] = {label: {} for label in FIGURES}
    # Each failure block: "name: <group>,\n    alertname: <a>, time: <t>, \n        exp:[], \n        got:[...]"
    for group, alert, t in re.findall(r"name: (.+?),\n\s+alertname: (\w+), time: ([0-9hm]+),", out):
        hours, minutes = re.match(r"(?:(\d+)h)?(?:(\d+)m)?", t).groups()
        minute = int(hours or 0) * 60 + int(minutes or 0)
        first[group][alert] = min(first[group].get(alert, minute), minute)
    return first


if __name__ == "__main__":
    for label, alerts in measure().items():
        fired = ", ".join(f"{a.removeprefix('VLLMSpecDecode')} {m - BREAK} min" for a, m in sorted(alerts.items(),
                                                                                              key=lambda x: x[1]))
        print(f"{label}: {fired or 'nothing'}")
    sys.exit(0)
