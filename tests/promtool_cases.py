"""promtool unit tests for the alerts, for both rule variants.

The input series are built here (counters growing at hand-chosen per-minute
rates, including the real healthy and broken DeepSeek-V4 figures of the README's
detection table); the expected
alerts, labels and fully rendered annotations are written out by hand below.
``python tests/promtool_cases.py`` writes alerts/tests/*.yaml; the test suite
checks the committed files are current and runs ``promtool test rules`` on them.
"""

from __future__ import annotations

import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
RUNBOOK = "https://github.com/vllm-specdec-exporter/vllm-specdec-exporter/blob/main/alerts/runbook.md"
NS = "llm"
PRO = "deepseek-ai/DeepSeek-V4-Pro"
FLASH = "deepseek-ai/DeepSeek-V4-Flash"

NAMES = {
    "sidecar": {
        "drafts": "vllm_specdec_drafts_total",
        "tokens": "vllm_specdec_draft_tokens_total",
        "accepted": "vllm_specdec_accepted_tokens_total",
        "pos": "vllm_specdec_position_accepted_tokens_total",
        "gen": "vllm_specdec_generation_tokens_total",
    },
    "vllm-direct": {
        "drafts": "vllm:spec_decode_num_drafts_total",
        "tokens": "vllm:spec_decode_num_draft_tokens_total",
        "accepted": "vllm:spec_decode_num_accepted_tokens_total",
        "pos": "vllm:spec_decode_num_accepted_tokens_per_pos_total",
        "gen": "vllm:generation_tokens_total",
    },
}


def fmt(v: float) -> str:
    return format(round(v, 6), ".12g")


def series(segments) -> str:
    """promtool notation for a counter: [(per_minute, minutes) | ('restart',) | ('absent', minutes)]."""
    out, value, first = [], 0.0, True
    for seg in segments:
        if seg[0] == "restart":
            value = 0.0  # the next sample is the first minute after the restart
            continue
        if seg[0] == "absent":
            out.append(f"_x{seg[1]}")
            continue
        rate, minutes = seg
        if first:
            out.append(f"{fmt(value)}+{fmt(rate)}x{minutes}")
            value += rate * minutes
            first = False
        else:
            value += rate
            out.append(f"{fmt(value)}+{fmt(rate)}x{minutes - 1}" if minutes > 1 else fmt(value))
            value += rate * (minutes - 1)
    return " ".join(out)


# Pods that stand for a deployment of their own, each in a namespace of its own: the rules keep a
# model's history per namespace and model (so that a rollout keeps it), and these cases must be
# judged without the history of the other cases of the same model.
ALONE: set[str] = set()


def ns_of(pod: str) -> str:
    return pod if pod in ALONE else NS


def mix(drafts: float, per_pos: list[float], k: int | None = None, gen: float | None = None) -> dict:
    """Per-minute increments of one engine: drafts, and accepted counts per position."""
    k = k or len(per_pos)
    accepted = sum(per_pos)
    return {
        "drafts": drafts,
        "tokens": drafts * k,
        "accepted": accepted,
        "pos": per_pos,
        "gen": drafts + accepted if gen is None else gen,
    }


def deployment(
    variant: str, pod: str | None, model: str, phases, engine: str = "0", skip=(), extra=None, target: str = "vllm"
) -> list[dict]:
    """Series of one engine through phases: [(mix, minutes) | ('restart',) | ('absent-drafts', mix, minutes) |
    ('gone', minutes)].
    A phase with fewer positions than k (k lowered across a restart) leaves the others absent.
    No pod: a static scrape outside Kubernetes, without namespace and pod labels."""
    n = NAMES[variant]
    labels = {
        **(extra or {}),
        **({"namespace": ns_of(pod), "pod": pod} if pod else {}),
        "model_name": model,
        "engine": engine,
        "job": "vllm-specdec-exporter" if variant == "sidecar" else "vllm",
    }
    if variant == "sidecar":
        labels["target"] = target

    def sel(metric: str, extra: dict | None = None) -> str:
        body = ",".join(f'{k}="{v}"' for k, v in {**labels, **(extra or {})}.items())
        return f"{metric}{{{body}}}"

    def segs(key, index=None):
        out = []
        for phase in phases:
            if phase[0] == "restart":
                out.append(("restart",))
                continue
            if phase[0] == "gone":  # the pod does not exist yet (or any more)
                out.append(("absent", phase[1]))
                continue
            if phase[0] == "absent-drafts":
                _, m, minutes = phase
                if key == "gen":
                    out.append((m["gen"], minutes))
                else:
                    out.append(("absent", minutes))
                continue
            m, minutes = phase
            if index is not None and index >= len(m[key]):
                out.append(("absent", minutes))
                continue
            value = m[key] if index is None else m[key][index]
            out.append((value, minutes))
        return out

    k = max(len(p[0]["pos"]) for p in phases if p[0] not in ("restart", "absent-drafts", "gone"))
    out = [
        {"series": sel(n[key]), "values": series(segs(key))} for key in ("drafts", "tokens", "accepted", "gen") if key not in skip
    ]
    if "pos" not in skip:
        out += [{"series": sel(n["pos"], {"position": str(i)}), "values": series(segs("pos", i))} for i in range(k)]
    return out


def gauge(metric: str, labels: dict, values: str) -> dict:
    body = ",".join(f'{k}="{v}"' for k, v in labels.items())
    return {"series": f"{metric}{{{body}}}", "values": values}


def sidecar_gauges(pod: str, model: str, k: int, baseline: float | None, profile: str | None) -> list[dict]:
    base = {"namespace": ns_of(pod), "pod": pod, "model_name": model, "job": "vllm-specdec-exporter", "target": "vllm"}
    out = [gauge("vllm_specdec_num_speculative_tokens", base, f"{k}x300")]
    if baseline is not None:
        out.append(gauge("vllm_specdec_baseline_mean_acceptance_length", {**base, "profile": profile}, f"{baseline}x300"))
    return out


# --- The traffic mixes (per minute, one engine) ---
PRO_HEALTHY = mix(6590, [6590 * 0.924, 6590 * 0.687])  # native V4-Pro k=2: AL 2.611
PRO_BROKEN = mix(6590, [235, 5])  # the broken conversion: AL 1.0364, acceptance 1.82 %
FLASH_SAMPLING_BUG = mix(1000, [149, 57])  # V4-Flash k=2 sampling bug: AL 1.206
FLASH_MISWIRED = mix(1000, [70, 15, 5])  # V4-Flash k=3 mis-wired draft layer: AL 1.09
BOUNDARY_FIRE = mix(1000, [90, 8])  # AL 1.098: just under 1.1
BOUNDARY_QUIET = mix(1000, [94, 8])  # AL 1.102: just over
IDLE_BROKEN = mix(30, [1, 0])  # 0.5 drafts/s: under the traffic floor
FLASH_HEALTHY = mix(1000, [800, 700])  # AL 2.5
FLASH_DIP = mix(1000, [650, 550])  # AL 2.2: a 20 % lower gain, a traffic-mix change
FLASH_IDLE_BROKEN = mix(30, [5, 1])
K3_WASTED = mix(1000, [900, 700, 20])  # last position 2 %
K3_WASTED_IDLE = mix(30, [27, 21, 0.6])
LOOP = mix(1000, [995, 985])  # 99 % acceptance
HIGH_OVER = mix(1000, [985, 977])  # 98.1 %: just over 98 %
HIGH_UNDER = mix(1000, [983, 975])  # 97.9 %: just under
K3_WASTED_OVER = mix(1000, [900, 700, 49])  # last position 4.9 %: fires
K3_WASTED_UNDER = mix(1000, [900, 700, 51])  # 5.1 %: quiet
HIGH_IDLE = mix(30, [29.85, 29.55])
NINETY_SEVEN = mix(1000, [975, 965])  # 97 %


# The likely-cause annotation of each alert (issue 15), written out by hand.
GARBAGE = (
    "the draft head produces garbage (a broken quantised conversion or loader): AL below 1.1 means position 0 "
    "was accepted in under 10 % of drafts"
)
ONE_RANK = "one rank: its siblings on the same server are healthy (a rank-specific load, device or node)."
LIKELY = {
    "VLLMSpecDecodeTargetInconsistent": "two servers behind one URL (scrape the pods, not a Service), a producer whose "
    "counters go down without a restart, or an engine faster than "
    "MAX_DRAFTS_PER_SECOND.",
    "VLLMSpecDecodeAcceptanceCollapsed": f"{GARBAGE}; or a configuration change, if it began with a restart or a new k.",
    "VLLMSpecDecodeAcceptanceCollapsedFast": f"{GARBAGE}; or a configuration change, if it began with a restart or a new k.",
    "VLLMSpecDecodeEngineCollapsed": ONE_RANK,
    "VLLMSpecDecodeEngineLagging": ONE_RANK,
    "VLLMSpecDecodeFirstPositionAcceptanceLow": "a partly broken draft head (conversion, loader, draft sampling or context) if it has been low since a deployment; a workload shift (synthetic random-token load, temperature, traffic mix) if it fell without one: the counters alone cannot tell them apart.",
    "VLLMSpecDecodeAcceptanceBelowBaseline": "a partly broken draft head if it has been below its profile since a deployment; a workload shift (traffic mix, temperature, synthetic load) if it fell without one; if position 0 is healthy, the chain breaks after it.",
    "VLLMSpecDecodeAcceptanceDropped": "a configuration change (a new artifact, version or rollout at the same k) if "
    "it began with one; a head degrading in service, or a workload shift beyond "
    "what workload alone explains, if not.",
    "VLLMSpecDecodeAcceptanceShifted": "what was rolled out (a new artifact, quantisation, version or flag): the new "
    "servers serve the same traffic at the same time as their predecessors; a traffic-mix shift that came with the "
    "rollout, if one did.",
    "VLLMSpecDecodeDraftChainBroken": "the chain breaks after position 0: a mis-wired or unloaded later MTP layer, a "
    "backend bug in how later draft positions are built, or k beyond what the draft "
    "was trained for.",
    "VLLMSpecDecodeSpeculativeTokensWasted": "the draft chain breaks before the last position: k beyond what the "
    "draft was trained for, or a mis-wired later layer.",
    "VLLMSpecDecodeAcceptanceSuspiciouslyHigh": "too good to be true: repetition loops, a broken detector or broken metrics.",
    "VLLMSpecDecodeRequestAcceptanceExtreme": "very low per-request acceptance: garbled or rare-character output (the "
    "target rejects the draft); very high: repetition loops (a corrupted "
    "state in a high-confidence loop) -- or a workload that is one or the "
    "other by design.",
}


def alert(name: str, severity: str, labels: dict, summary: str, description: str) -> dict:
    ann = {"summary": summary, "description": description, "runbook_url": f"{RUNBOOK}#{name.lower()}"}
    if name in LIKELY:
        ann["likely_cause"] = LIKELY[name]
    return {"exp_labels": {"severity": severity, **labels}, "exp_annotations": ann}


VARIANT = {"v": "sidecar"}  # the variant being rendered: sidecar alerts also carry `target`


def pod_labels(pod: str | None, model: str, target: str = "vllm", **extra) -> dict:
    out = {**extra, **({"namespace": ns_of(pod), "pod": pod} if pod else {}), "model_name": model}
    if VARIANT["v"] == "sidecar":
        out["target"] = target
    return out


def where(pod: str | None, model: str, target: str = "vllm") -> str:
    if pod:
        return f"{model} on {ns_of(pod)}/{pod}"
    return f"{model} (target {target})" if VARIANT["v"] == "sidecar" else model  # a static scrape


# What the head costs (issue 34), as the collapse pages and degradation tickets say it after their
# description: the figures written out by hand from each case's inputs (healthy reference AL / AL now,
# 1 - AL now / healthy, both to the rounding shown; below the break-even 1 + 0.05 x k, the advice).
SLOWER = (
    " Speculative decoding is currently slower than no speculative decoding: consider turning it off until the head "
    "is fixed."
)
UNKNOWN = " Cost unknown: no healthy reference (no baseline profile, nor an hour of history at this k)."


def cost(factor: str = "", wasted: str = "", *, unknown: bool = False, slower: bool = False) -> str:
    """The cost sentences: factor ("2.5") and wasted ("60") for a known cost; neither when nothing is
    wasted (a head at or above its reference); ``unknown`` without a reference; ``slower`` below the
    break-even."""
    assert not (unknown and (factor or wasted)) and bool(factor) == bool(wasted)
    known = f" Decode needs {factor}x the steps of a healthy head: {wasted} % of decode work wasted." if factor else ""
    return known + (UNKNOWN if unknown else "") + (SLOWER if slower else "")


def collapsed(pod: str | None, model: str, value: str, cost: str, target: str = "vllm") -> dict:
    return alert(
        "VLLMSpecDecodeAcceptanceCollapsed",
        "critical",
        pod_labels(pod, model, target=target),
        "Speculative-decoding acceptance has collapsed: draft tokens are almost never accepted.",
        f"Mean acceptance length of {where(pod, model, target)} is {value} over 5m (1.0 means no draft token is "
        f"accepted) with real traffic. Decoding still works but runs at non-speculative speed: suspect the "
        f"draft head (quantised conversion, loader) or draft sampling.{cost}",
    )


def below_baseline(pod: str, model: str, value: str, cost: str) -> dict:
    return alert(
        "VLLMSpecDecodeAcceptanceBelowBaseline",
        "warning",
        pod_labels(pod, model),
        "Speculative-decoding acceptance is below the baseline profile's expectation.",
        f"Mean acceptance length of {where(pod, model)} is {value} over 5m, below 1 + 0.75 x (baseline - 1) "
        f"for its baseline profile (namespace_pod_model_name:vllm_specdec_baseline_mean_acceptance_length:max).{cost}",
    )


def first_low(pod: str, model: str, value: str, **extra) -> dict:
    return alert(
        "VLLMSpecDecodeFirstPositionAcceptanceLow",
        "warning",
        pod_labels(pod, model, **extra),
        "The first draft position is rarely accepted: a broken draft path, or synthetic load.",
        f"Position 0 of {where(pod, model)} was accepted in {value} of drafts over 5m (healthy MTP: 66 % or "
        f"more, whatever k): below what its profile allows (at most 0.5), or below 0.5 after the model was "
        f"at 0.5 or more within 1d. Either a broken draft path (draft sampling, missing draft context, a "
        f"partly broken head), or synthetic random-token load such as a benchmark, which gives the same "
        f"counters.",
    )


def engine_collapsed(pod: str, model: str, engine: str, value: str, **extra) -> dict:
    return alert(
        "VLLMSpecDecodeEngineCollapsed",
        "critical",
        pod_labels(pod, model, engine=engine, **extra),
        "One engine's speculative decoding has collapsed while its siblings are healthy.",
        f"Engine {engine} of {where(pod, model)} has a mean acceptance length of {value} over 5m with real "
        f"traffic, while the server as a whole has not collapsed: one data-parallel rank decodes at "
        f"non-speculative speed (its draft head failed to load or is corrupt on that rank).",
    )


def engine_lagging(pod: str, model: str, engine: str, value: str) -> dict:
    return alert(
        "VLLMSpecDecodeEngineLagging",
        "warning",
        pod_labels(pod, model, engine=engine),
        "One engine's speculative gain lags far behind its siblings'.",
        f"The speculative gain (mean acceptance length - 1) of engine {engine} of {where(pod, model)} is "
        f"{value} over 5m, below 0.75 x the whole server's. Engines of one server share traffic and weights "
        f"and differ by a few percent: this rank is broken.",
    )


def dropped(pod: str, model: str, value: str, cost: str) -> dict:
    return alert(
        "VLLMSpecDecodeAcceptanceDropped",
        "warning",
        pod_labels(pod, model),
        "Speculative-decoding acceptance fell sharply against the model's own best hour of the day.",
        f"The speculative gain (mean acceptance length - 1) of {where(pod, model)} is {value} over 5m, more "
        f"than 0.4 below the model's best hour of the last 1d at the same k.{cost}",
    )


def chain_broken(pod: str, model: str, value: str) -> dict:
    return alert(
        "VLLMSpecDecodeDraftChainBroken",
        "warning",
        pod_labels(pod, model),
        "The draft chain breaks after its first token: position 1 is rarely accepted while position 0 is healthy.",
        f"Of the drafts of {where(pod, model)} whose position 0 was accepted, position 1 was accepted in "
        f"{value} over 5m (healthy: 41 % or more), while position 0 is healthy: the draft chain breaks after "
        f"its first token.",
    )


def not_drafting(pod: str, model: str, value: str) -> dict:
    return alert(
        "VLLMSpecDecodeNotDrafting",
        "warning",
        pod_labels(pod, model),
        "vLLM generates tokens but speculative decoding has stopped drafting.",
        f"{where(pod, model)} generates {value} tokens/s with no drafts over 5m, although it was drafting "
        f"within the last day: speculative decoding is off or silently disabled.",
    )


def wasted(pod: str, model: str, position: str, value: str) -> dict:
    return alert(
        "VLLMSpecDecodeSpeculativeTokensWasted",
        "info",
        pod_labels(pod, model, position=position),
        "The last speculative position is almost never accepted: a smaller k would save draft compute.",
        f"The last draft position (position {position}) of {where(pod, model)} was accepted in {value} of "
        f"drafts over 1h. Each draft still pays for it; consider num_speculative_tokens = {position}.",
    )


def high(pod: str, model: str, value: str) -> dict:
    return alert(
        "VLLMSpecDecodeAcceptanceSuspiciouslyHigh",
        "info",
        pod_labels(pod, model),
        "Speculative-decoding acceptance is suspiciously close to 100 %.",
        f"Draft acceptance of {where(pod, model)} is {value} over 30m. Sustained acceptance this high goes "
        f"with repetition loops (draft and target agree on repeating text).",
    )


def check(eval_time: str, name: str, alerts: list[dict]) -> dict:
    return {"eval_time": eval_time, "alertname": name, "exp_alerts": alerts}


def group(name: str, series_: list[dict], tests: list[dict]) -> dict:
    return {"name": name, "interval": "1m", "input_series": series_, "alert_rule_test": tests}


def collapse_group(v: str) -> dict:
    s = []
    s += deployment(v, "pro-healthy", PRO, [(PRO_HEALTHY, 120)])
    s += deployment(v, "pro-broken", PRO, [(PRO_HEALTHY, 60), (PRO_BROKEN, 60)])
    s += deployment(v, "pro-boundary-fire", PRO, [(BOUNDARY_FIRE, 120)])
    s += deployment(v, "pro-boundary-quiet", PRO, [(BOUNDARY_QUIET, 120)])
    s += deployment(v, "pro-idle", PRO, [(IDLE_BROKEN, 120)])
    s += deployment(v, "pro-restart", PRO, [(PRO_HEALTHY, 40), ("restart",), (PRO_HEALTHY, 80)])
    s += deployment(v, "flash-sampling-bug", FLASH, [(FLASH_SAMPLING_BUG, 120)])
    s += deployment(v, "flash-miswired", FLASH, [(FLASH_MISWIRED, 120)])
    C, B, F = (
        "VLLMSpecDecodeAcceptanceCollapsed",
        "VLLMSpecDecodeAcceptanceBelowBaseline",
        "VLLMSpecDecodeFirstPositionAcceptanceLow",
    )
    # Against the profiles (V4-Pro k=2 2.27, V4-Flash k=3 1.99), below the break-evens 1.1 (k=2) and 1.15 (k=3):
    # 2.27 / 1.098 = 2.07, 1 - 1.098 / 2.27 = 52 %; 1.99 / 1.09 = 1.83, 45 %; 2.27 / 1.0364 = 2.19, 54 %.
    at_1098, at_1090, at_1036 = cost("2.1", "52", slower=True), cost("1.8", "45", slower=True), cost("2.2", "54", slower=True)
    early = [collapsed("pro-boundary-fire", PRO, "1.098", at_1098), collapsed("flash-miswired", FLASH, "1.090", at_1090)]
    tests = [
        check("50m", C, early),
        check("64m", C, early),  # pro-broken: its 5m window still holds healthy minutes
        check("80m", C, [*early, collapsed("pro-broken", PRO, "1.036", at_1036)]),
        check("115m", C, [*early, collapsed("pro-broken", PRO, "1.036", at_1036)]),
    ]
    if v == "sidecar":
        for pod in ("pro-healthy", "pro-broken", "pro-boundary-fire", "pro-boundary-quiet", "pro-idle", "pro-restart"):
            s += sidecar_gauges(pod, PRO, 2, 2.27, "deepseek-v4-pro-mtp-k2")
        s += sidecar_gauges("flash-sampling-bug", FLASH, 2, 1.99, "deepseek-v4-flash-mtp-k2")
        s += sidecar_gauges("flash-miswired", FLASH, 3, 1.99, "deepseek-v4-flash-mtp-k3")
    # Profiles (both variants: the direct file carries them as rules): V4-Pro k=2 2.27 ->
    # threshold 1 + 0.75 x 1.27 = 1.9525; V4-Flash k=2 and k=3 1.99 -> 1.7425.
    # 1.102: 2.27 / 1.102 = 2.06, 51 %, over the break-even; 1.206 against 1.99 (k=2): 1.65, 39 %.
    steady = [
        below_baseline("pro-boundary-fire", PRO, "1.098", at_1098),
        below_baseline("pro-boundary-quiet", PRO, "1.102", cost("2.1", "51")),
        below_baseline("flash-sampling-bug", FLASH, "1.206", cost("1.7", "39")),
        below_baseline("flash-miswired", FLASH, "1.090", at_1090),
    ]
    # Position 0 (k-independent): 9 %, 9.4 %, 14.9 %, 7 %, and the broken head's 235/6590.
    low = [
        first_low("pro-boundary-fire", PRO, "9%"),
        first_low("pro-boundary-quiet", PRO, "9.4%"),
        first_low("flash-sampling-bug", FLASH, "14.9%"),
        first_low("flash-miswired", FLASH, "7%"),
    ]
    tests += [
        check("50m", B, steady),
        check("90m", B, [*steady, below_baseline("pro-broken", PRO, "1.036", at_1036)]),
        check("50m", F, low),
        check("90m", F, [*low, first_low("pro-broken", PRO, "3.566%")]),
    ]
    return group("collapse and baseline: the real broken V4-Pro head, boundaries, idle, restart", s, tests)


def dropped_group(v: str) -> dict:
    pods = (
        "flash-drop",
        "flash-steady-low",
        "flash-dip",
        "flash-idle-broken",
        "flash-restart",
        "flash-k-lowered",
        "flash-k-raised",
        "flash-slow",
    )
    ALONE.update(pods)
    s = []
    s += deployment(v, "flash-drop", FLASH, [(FLASH_HEALTHY, 180), (FLASH_SAMPLING_BUG, 60)])
    s += deployment(v, "flash-steady-low", FLASH, [(FLASH_SAMPLING_BUG, 240)])  # no history to drop from
    s += deployment(v, "flash-dip", FLASH, [(FLASH_HEALTHY, 180), (FLASH_DIP, 60)])
    s += deployment(v, "flash-idle-broken", FLASH, [(FLASH_HEALTHY, 180), (FLASH_IDLE_BROKEN, 60)])
    s += deployment(v, "flash-restart", FLASH, [(FLASH_HEALTHY, 180), ("restart",), (FLASH_HEALTHY, 60)])
    # k lowered from 3 to 1 on the same traffic: AL must fall with k, this is no drop.
    s += deployment(v, "flash-k-lowered", FLASH, [(mix(1000, [800, 600, 400]), 180), ("restart",), (mix(1000, [800]), 60)])
    # k raised from 1 to 3 at 60m (AL 1.8 -> 2.8), then the head breaks at 170m (AL 1.21): the
    # history since the change (k=3 hours from ~63m) is the reference, not a day of k=1.
    s += deployment(
        v,
        "flash-k-raised",
        FLASH,
        [(mix(1000, [800]), 60), ("restart",), (mix(1000, [800, 600, 400]), 110), (mix(1000, [149, 57, 0]), 70)],
    )
    s += slow_fall(v)
    if v == "sidecar":
        for pod in ("flash-drop", "flash-steady-low", "flash-dip", "flash-idle-broken", "flash-restart"):
            s += sidecar_gauges(pod, FLASH, 2, None, None)
        for pod, ks in (("flash-k-lowered", "3x180 1x60"), ("flash-k-raised", "1x60 3x180")):
            base = {"namespace": ns_of(pod), "pod": pod, "model_name": FLASH, "job": "vllm-specdec-exporter", "target": "vllm"}
            s.append(gauge("vllm_specdec_num_speculative_tokens", base, ks))
    D = "VLLMSpecDecodeAcceptanceDropped"
    # flash-drop: the 5m gain falls under 0.6 x 1.5 = 0.9 within 3 broken minutes (t=183m), then
    # holds for 3m: firing from t=186-187m. flash-k-raised the same from its break at 170m.
    # flash-slow: firing from 209m, 29 minutes after its fall began (test_rules times its onset:
    # its value is still moving then, and promtool's groups may read it a minute apart).
    # The cost against the healthy reference: the sidecar's pods here have no profile, so the model's best
    # hour at the same k (flash-k-raised 2.8 at k=3: 2.8 / 1.206 = 2.32, 57 %; flash-drop 2.5: 2.07, 52 %;
    # flash-slow 2.611 / 1.8 = 1.45, 31 %); vLLM-direct matches the shipped profiles by model and k
    # (V4-Flash k=2 and k=3 1.99: 1.65, 39 %; V4-Pro k=2 2.27 / 1.8 = 1.26, 21 %). All over the break-even.
    side = v == "sidecar"
    raised = dropped("flash-k-raised", FLASH, "0.206", cost("2.3", "57") if side else cost("1.7", "39"))
    drop = dropped("flash-drop", FLASH, "0.206", cost("2.1", "52") if side else cost("1.7", "39"))
    slow = dropped("flash-slow", PRO, "0.800", cost("1.5", "31") if side else cost("1.3", "21"))
    return group(
        "dropped against the model's best hour of the day at the same k",
        s,
        [
            check("170m", D, []),
            check("184m", D, [raised]),  # flash-drop pending
            check("190m", D, [drop, raised]),
            check("207m", D, [drop, raised]),  # flash-slow pending
            check("235m", D, [drop, raised, slow]),
            # No rollout here (the k changes come with no other server at the new k): nothing shifted.
            *[check(f"{t}m", "VLLMSpecDecodeAcceptanceShifted", []) for t in range(20, 240, 10)],
        ],
    )


SLOW_FALL_START = 180


def slow_fall(v: str) -> list[dict]:
    """A slow degradation (issue 30): V4-Pro native k=2 (AL 2.611) for 180m, falling evenly to AL
    1.80 over the next 30 minutes, then staying there. The 5m gain is under 0.6 x 1.611 = 0.967
    from ~206m (AL 1.966 at 203.9m, plus half the window)."""
    ALONE.add("flash-slow")
    ramp = [
        (mix(6590, [6590 * (0.924 - (0.924 - 0.62) * m / 30), 6590 * (0.687 - (0.687 - 0.18) * m / 30)]), 1) for m in range(1, 31)
    ]
    s = deployment(v, "flash-slow", PRO, [(PRO_HEALTHY, SLOW_FALL_START), *ramp, (mix(6590, [6590 * 0.62, 6590 * 0.18]), 30)])
    return s + (sidecar_gauges("flash-slow", PRO, 2, None, None) if v == "sidecar" else [])


def rollout_group(v: str) -> dict:
    """Issue 30: a rolling update replaces every pod under new names. The healthy pods' history
    (kept per namespace and model) is the reference of the broken rollout's new pods: a partly
    broken head (position 0 at 20 %, no profile: a served name), a chain broken after position 0,
    speculative decoding silently off, all from the new pods' first minute."""
    healthy = k7([924, 687, 500, 350, 250, 180, 130])
    off = mix(0, [0] * 7, gen=6590)
    s = []
    for old, new, broken in (
        ("old-a", "new-a", k7([200, 60, 25, 12, 7, 4, 2])),
        ("old-b", "new-b", k7([894, 200, 48, 20, 9, 4, 2])),
        ("old-c", "new-c", off),
    ):
        s += deployment(v, old, SERVED, [(healthy, 120)])
        s += deployment(v, new, SERVED, [("gone", 120), (broken, 60)])
        if v == "sidecar":
            s += sidecar_gauges(old, SERVED, 7, None, None)
    # A k=1 canary of the same model, busier than the rest: its position-0 acceptances have no
    # position 1, and must not dilute the model's chain history (which would keep C quiet).
    s += deployment(v, "canary-k1", SERVED, [(mix(6000, [5400]), 180)])
    if v == "sidecar":
        s += sidecar_gauges("canary-k1", SERVED, 1, None, None)
    F, C, N = ("VLLMSpecDecodeFirstPositionAcceptanceLow", "VLLMSpecDecodeDraftChainBroken", "VLLMSpecDecodeNotDrafting")
    return group(
        "a rollout onto new pods keeps the model's history (no profile)",
        s,
        [
            check("130m", F, []),  # pending (for: 15m)
            check("140m", F, [first_low("new-a", SERVED, "20%")]),
            check("140m", C, [chain_broken("new-b", SERVED, "22.37%")]),
            check("140m", N, [not_drafting("new-c", SERVED, "109.8")]),
        ],
    )


# An upgrade drift of every position at k=3 (issue 30 item 9): acceptance 74.15 % -> 57.80 %, AL
# 3.2245 -> 2.734, the gain 2.2245 -> 1.734 (22 % lower): within the workload's spread.
DRIFT_HEALTHY = mix(1000, [900, 750, 574.5])
DRIFT_BROKEN = mix(1000, [800, 550, 384])


def shifted(model: str, value: str, k: int) -> dict:
    labels = {"namespace": NS, "model_name": model, "num_speculative_tokens": str(k)}
    if VARIANT["v"] == "sidecar":
        labels["target"] = "vllm"
    return alert(
        "VLLMSpecDecodeAcceptanceShifted",
        "warning",
        labels,
        "A rollout's new servers draft worse than the servers they join or replace, at the same k.",
        f"The speculative gain (mean acceptance length - 1) of the servers of {model} in {NS} that started or "
        f"changed k within the last 1h is {value} over 15m at k={k}: more than 0.15 below the servers they join or "
        "replace over the same 15m (or, once those no longer serve beside them, their last 15m at production traffic within the last 1h, same k). What was rolled out drafts worse "
        "on the same traffic.",
    )


def shift_group(v: str) -> dict:
    """Issue 30 item 9: the upgrade drift rolled out onto new pods (two old pods replaced at 90m by
    two new ones, a minute's overlap) under a served name no profile matches. AcceptanceDropped
    (40 %) stays quiet: 22 % is within what workload alone moves. The newcomers against the
    servers they replace warn. Quiet beside it: the same drift on the same pods (a traffic-mix
    shift, no rollout), a rollout that lowers k (3 -> 2, a lower AL by design), and, found by
    attacking the first form (which compared a newcomer's whole life with the best hour of up to
    2 h back): a traffic-mix shift on every pod 10 minutes before a healthy rollout, k raised in
    place beside a settled pod at the new k, and a rollout beside settled pods that still serve,
    under the reference floor (compared with nothing, not with their hour-old figure). Caught: k
    lowered in place with the head at the new k degraded, a degraded canary at 5 % of the traffic,
    and a degraded blue/green switch (the old pods left idle or with a trickle of health checks
    that draft otherwise: not serving beside the new ones, their last figure at production traffic
    is the reference; helper-43), quiet when the switch is healthy. In promtool every group runs each
    minute, so a new pod stays a newcomer for 18 minutes and its k must hold for 4 before it is
    compared (production: 54 and 12 of the 15m window, which keeps a new pod's first minutes of
    warm-up requests out; promtool's 4 cannot show that). A k change keeps a server a newcomer
    for the hour whatever the group's interval (changes over [1h])."""
    s: list[dict] = []

    def pods(model: str, phases_by_pod: dict[str, list], ks: dict[str, str]) -> None:
        for pod, phases in phases_by_pod.items():
            s.extend(deployment(v, pod, model, phases))
            if v == "sidecar":
                base = {"namespace": NS, "pod": pod, "model_name": model, "job": "vllm-specdec-exporter", "target": "vllm"}
                s.append(gauge("vllm_specdec_num_speculative_tokens", base, ks[pod]))

    harder = mix(1000, [800, 550, 384])  # the same gain as the drift, from the traffic
    k2 = mix(1000, [900, 750])  # k=2 on the same traffic: a lower AL by design
    k2_degraded = mix(1000, [800, 380])  # the gain 1.65 -> 1.18 at k=2
    for i in range(2):
        pods("DSV4-Flash-upgrade", {f"upgrade-old-{i}": [(DRIFT_HEALTHY, 90)],
                                     f"upgrade-new-{i}": [("gone", 90), (DRIFT_BROKEN, 60)]},
             {f"upgrade-old-{i}": "3x90", f"upgrade-new-{i}": "_x90 3x59"})
        pods("DSV4-Flash-mix", {f"mix-{i}": [(DRIFT_HEALTHY, 90), (DRIFT_BROKEN, 60)]}, {f"mix-{i}": "3x150"})
        pods("DSV4-Flash-k", {f"k-old-{i}": [(DRIFT_HEALTHY, 90)], f"k-new-{i}": [("gone", 90), (k2, 60)]},
             {f"k-old-{i}": "3x90", f"k-new-{i}": "_x90 2x59"})
        pods("DSV4-Flash-harder", {f"harder-old-{i}": [(DRIFT_HEALTHY, 80), (harder, 10)],
                                    f"harder-new-{i}": [("gone", 90), (harder, 60)]},
             {f"harder-old-{i}": "3x90", f"harder-new-{i}": "_x90 3x59"})
    # k changed in place: raised 2 -> 3 beside a settled k=3 pod (healthy), lowered 3 -> 2 beside
    # a settled k=2 pod with the head degraded at k=2.
    pods("DSV4-Flash-raised", {"raised": [(k2, 60), ("restart",), (DRIFT_HEALTHY, 90)],
                               "raised-peer": [(DRIFT_HEALTHY, 150)]},
         {"raised": "2x60 3x89", "raised-peer": "3x150"})
    pods("DSV4-Flash-lowered", {"lowered": [(DRIFT_HEALTHY, 60), ("restart",), (k2_degraded, 90)],
                                "lowered-peer": [(k2, 150)]},
         {"lowered": "3x60 2x89", "lowered-peer": "2x150"})
    # A canary at 5 % of the traffic (2.5 drafts/s), degraded, beside three settled pods.
    canary = mix(150, [120, 82.5, 57.6])  # the drift's positions
    pods("DSV4-Flash-canary", {**{f"canary-peer-{i}": [(DRIFT_HEALTHY, 150)] for i in range(3)},
                               "canary": [("gone", 90), (canary, 60)]},
         {**{f"canary-peer-{i}": "3x150" for i in range(3)}, "canary": "_x90 3x59"})
    # A rollout at night (stop 51's helper-41): the settled pods' traffic falls under the reference
    # floor together at 60m (2 x 200 drafts/min, 6.7/s against 10), and shifts to harder at 80m;
    # the newcomers serve the same traffic at the same gain. The settled pods are still there, so
    # the newcomers are not compared with the healthy figure they left before the lull.
    quiet, lull = mix(200, [180, 150, 114.9]), mix(200, [160, 110, 76.8])
    for i in range(2):
        pods("DSV4-Flash-lull", {f"lull-old-{i}": [(DRIFT_HEALTHY, 60), (quiet, 20), (lull, 70)],
                                 f"lull-new-{i}": [("gone", 90), (harder, 60)]},
             {f"lull-old-{i}": "3x150", f"lull-new-{i}": "_x90 3x59"})
    # Blue/green: the old pods stay, idle, when the traffic moves to the new ones.
    for i in range(2):
        pods("DSV4-Flash-bluegreen", {f"blue-{i}": [(DRIFT_HEALTHY, 90), (mix(0, [0, 0, 0]), 60)],
                                      f"green-{i}": [("gone", 90), (DRIFT_BROKEN, 60)]},
             {f"blue-{i}": "3x150", f"green-{i}": "_x90 3x59"})
    # ... or left with health checks (45 drafts/min a pod, 1.5/s against the new pods' 33), which
    # draft otherwise: the gain 1.0 (the degraded switch must still warn) or 2.9 (a healthy one must not).
    low, high = mix(45, [30, 10, 5]), mix(45, [44.5, 43.5, 42.5])
    for model, trickle, after in (("DSV4-Flash-trickle", low, DRIFT_BROKEN), ("DSV4-Flash-trickle-ok", high, DRIFT_HEALTHY)):
        for i in range(2):
            pods(model, {f"{model}-blue-{i}": [(DRIFT_HEALTHY, 90), (trickle, 60)],
                         f"{model}-green-{i}": [("gone", 90), (after, 60)]},
                 {f"{model}-blue-{i}": "3x150", f"{model}-green-{i}": "_x90 3x59"})
    S, D = "VLLMSpecDecodeAcceptanceShifted", "VLLMSpecDecodeAcceptanceDropped"
    # The new pods' k holds for the shift window's 4 evaluations from 93m; their 15m AL is theirs
    # alone (2.734, the gain 1.734 under 0.85 x 2.2245 = 1.891); held for 10m: firing from 103m.
    # They are newcomers until their k has been recorded at 18 evaluations (107m). In place, the
    # lowered server is a newcomer at k=2 from its k change for the hour (61m in the sidecar's gauge,
    # ~66m where vLLM-direct counts positions, the third going stale): 1.18 under 0.85 x 1.65 =
    # 1.4025 once k has not changed over the 15m window, firing from ~86m / ~93m until ~121m / ~126m.
    up, canary_alert = shifted("DSV4-Flash-upgrade", "1.734", 3), shifted("DSV4-Flash-canary", "1.734", 3)
    green, trickle = shifted("DSV4-Flash-bluegreen", "1.734", 3), shifted("DSV4-Flash-trickle", "1.734", 3)
    lowered = shifted("DSV4-Flash-lowered", "1.180", 2)
    return group(
        "a rollout that drifts within the workload's spread: the newcomers against their predecessors",
        s,
        [check("60m", S, []), check("70m", S, [])]
        + [check(f"{t}m", S, [lowered]) for t in (95, 101)]
        + [check("105m", S, [up, canary_alert, green, trickle, lowered]), check("115m", S, [lowered])]
        + [check(f"{t}m", S, []) for t in (130, 140)]
        + [check(f"{t}m", D, []) for t in range(90, 150, 5)],
    )


def chain_group(v: str) -> dict:
    """Issue 30: a chain that breaks after position 0 from start-up (SGLang's DeepSeek-V4 MTP k=3
    bug: .894 / .223 / .054 against .999 / .710 / .333 healthy; AL 2.171, above BelowBaseline's
    1 + 0.75 x 1.49 = 2.1175 for the V4-Pro k=3 profile). Beside it the healthy figures with the
    lowest position-1 conditionals of baselines.md, which stay quiet: the fixed V4-Flash k=2
    sampling (0.29 / 0.70 = 41 %), the V4-Pro thinking-on golden curve at k=3, and a steady
    EAGLE3 drafter with no profile and no history (vLLM's Qwen3-VL reference: 60 / 290)."""
    cases = (
        ("sglang-chain", PRO, mix(1000, [894, 223, 54]), ("deepseek-v4-pro-mtp-k3", 2.49)),
        ("pro-k3-healthy", PRO, mix(1000, [999, 710, 333]), ("deepseek-v4-pro-mtp-k3", 2.49)),
        ("flash-k2-fixed", FLASH, mix(1000, [700, 290]), ("deepseek-v4-flash-mtp-k2", 1.99)),
        ("pro-golden-on-k3", PRO, golden(GOLDEN["on"], 3), ("deepseek-v4-pro-mtp-k3", 2.49)),
        ("qwen-eagle3", "Qwen/Qwen3-VL-8B-Instruct", mix(1000, [290, 60, 10]), None),
    )
    ALONE.update(case[0] for case in cases)
    s = []
    for pod, model, m, profile in cases:
        s += deployment(v, pod, model, [(m, 60)])
        if v == "sidecar":
            s += sidecar_gauges(pod, model, len(m["pos"]), profile[1] if profile else None, profile[0] if profile else None)
    C = "VLLMSpecDecodeDraftChainBroken"
    return group(
        "the chain breaks after position 0 from start-up, against the profile",
        s,
        [
            check("15m", C, []),  # pending (for: 15m)
            check("30m", C, [chain_broken("sglang-chain", PRO, "24.94%")]),
        ],
    )


def chain_blend_group(v: str) -> dict:
    """Issue 30: a busy server whose chain is broken from the start (position 1's conditional
    7 / 552 = 1.27 %), carrying 30 % of the model's drafts beside a healthy server (914 / 1,288 =
    71 %), no profile. The model's chain history, blended, read (914 + 7) / (1,288 + 552) = 0.50,
    under the gate (2 x 0.3) and kept the broken server quiet; the best server's 0.71 opens it
    once it has served a full hour: 18 evaluations of the 3m group (promtool evaluates every group
    each minute, so 18 minutes here), then the alert's 15 minutes. The healthy server stays quiet."""
    cases = (("blend-ok", mix(1400, [1288, 914])), ("blend-broken", mix(600, [552, 7])))
    s = []
    for pod, m in cases:
        s += deployment(v, pod, "Blend/Model", [(m, 60)])
        if v == "sidecar":
            s += sidecar_gauges(pod, "Blend/Model", 2, None, None)
    C = "VLLMSpecDecodeDraftChainBroken"
    return group(
        "a busy server with a broken chain beside a healthy one, no profile: the best server's history",
        s,
        [check("30m", C, []), check("40m", C, [chain_broken("blend-broken", "Blend/Model", "1.268%")])],
    )


def gappy(v: str, pod: str, m: dict, minutes: int, engine: str, gaps: dict[str, set[int]]) -> list[dict]:
    """One engine's counters minute by minute, with the minutes in ``gaps[key]`` missing from
    that series only (a missed scrape, or one series of a ratio sampled and the other not); the
    counters keep counting through a gap, as vLLM's do."""
    labels = {
        "namespace": ns_of(pod),
        "pod": pod,
        "model_name": m.get("model", PRO),
        "engine": engine,
        "job": "vllm-specdec-exporter" if v == "sidecar" else "vllm",
        **({"target": "vllm"} if v == "sidecar" else {}),
    }
    out = []
    for key, per_minute, extra in [(k, m[k], {}) for k in ("drafts", "tokens", "accepted", "gen")] + [
        ("pos", p, {"position": str(i)}) for i, p in enumerate(m["pos"])
    ]:
        body = ",".join(f'{a}="{b}"' for a, b in {**labels, **extra}.items())
        values = " ".join("_" if t in gaps.get(key, ()) else fmt(per_minute * t) for t in range(minutes + 1))
        out.append({"series": f"{NAMES[v][key]}{{{body}}}", "values": values})
    return out


def gaps_group(v: str) -> dict:
    """Issue 30 item 7: scrape and poll gaps on a healthy rank beside a dead one, with the
    production windows: every series of the healthy rank missing for 2 minutes, its accepted
    tokens alone missing for 4 minutes (the drafts sampled), its drafts alone missing for 4
    minutes, and a gap every other minute. Only the dead rank pages."""
    ALONE.add("dp2-gaps")
    healthy = set(range(20, 22)) | set(range(40, 44))
    gaps = {
        "drafts": healthy | set(range(70, 74)) | set(range(90, 120, 2)),
        "accepted": healthy | set(range(55, 59)) | set(range(90, 120, 2)),
        "tokens": healthy,
        "gen": healthy,
        "pos": healthy,
    }
    s = gappy(v, "dp2-gaps", PRO_HEALTHY, 120, "0", gaps) + gappy(v, "dp2-gaps", PRO_BROKEN, 120, "1", {})
    if v == "sidecar":
        s += sidecar_gauges("dp2-gaps", PRO, 2, 2.27, "deepseek-v4-pro-mtp-k2")
    dead = engine_collapsed("dp2-gaps", PRO, "1", "1.036")
    return group(
        "gaps on a healthy rank beside a dead one: only the dead one pages",
        s,
        [check(f"{t}m", "VLLMSpecDecodeEngineCollapsed", [dead]) for t in (25, 45, 60, 75, 95, 118)]
        + [check(f"{t}m", "VLLMSpecDecodeAcceptanceCollapsed", []) for t in (25, 45, 60, 75, 95, 118)],
    )


def quiet_rollout_group(v: str) -> dict:
    """Issue 30: the quiet scenarios around a rollout. A healthy rolling update (three old pods
    replaced one by one by three new ones, same head, new names, each new pod up a minute before
    its old one leaves), a pod leaving mid-window, a pod whose k is lowered at a restart and a
    weak steady drafter beside them: no detection alert at any minute."""
    healthy = PRO_HEALTHY
    s = []
    for i in range(3):
        s += deployment(v, f"roll-old-{i}", PRO, [(healthy, 60 + 10 * i)])  # gone after it: no more samples
        s += deployment(v, f"roll-new-{i}", PRO, [("gone", 59 + 10 * i), (healthy, 120 - 59 - 10 * i)])
    s += deployment(v, "roll-leaves", PRO, [(healthy, 47)])
    s += deployment(v, "roll-k-lowered", PRO, [(mix(6590, [6090, 4530, 3020]), 70), ("restart",), (mix(6590, [6090]), 50)])
    s += deployment(v, "roll-weak", "Qwen/Qwen3-VL-8B-Instruct", [(mix(1000, [290, 60, 10]), 120)])
    # No hour that is not the model's figure becomes its reference (found attacking the rules): a
    # warm-up's first 10 minutes of easy traffic (AL 2.85, then 2.1 for good: its "hour" was 10
    # minutes long), and a night's trickle of easy requests (1.1 drafts/s at AL 2.94 for 70
    # minutes, then 1,000 a minute at 2.1): under reference_min_drafts_per_second (10).
    ALONE.update({"warm-up", "night"})
    s += deployment(v, "warm-up", PRO, [(mix(1000, [950, 900]), 10), (mix(1000, [700, 400]), 110)])
    s += deployment(v, "night", PRO, [(mix(66, [64, 60]), 70), (mix(1000, [700, 400]), 50)])
    if v == "sidecar":
        for pod in [f"roll-{a}-{i}" for a in ("old", "new") for i in range(3)] + ["roll-leaves"]:
            s += sidecar_gauges(pod, PRO, 2, 2.27, "deepseek-v4-pro-mtp-k2")
        for pod in ("warm-up", "night"):
            s += sidecar_gauges(pod, PRO, 2, None, None)
        base = {"namespace": NS, "pod": "roll-k-lowered", "model_name": PRO, "job": "vllm-specdec-exporter", "target": "vllm"}
        s.append(gauge("vllm_specdec_num_speculative_tokens", base, "3x70 1x50"))
    alerts = (
        *DETECTION_ALERTS,
        "VLLMSpecDecodeAcceptanceDropped",
        "VLLMSpecDecodeAcceptanceShifted",
        "VLLMSpecDecodeDraftChainBroken",
        "VLLMSpecDecodeNotDrafting",
    )
    return group(
        "quiet: a healthy rolling update, a pod leaving mid-window, k lowered, a weak steady drafter",
        s,
        [check(f"{t}m", a, []) for a in alerts for t in range(45, 120, 5)],
    )


def not_drafting_group(v: str) -> dict:
    off = mix(0, [0, 0], gen=6590)
    s = []
    s += deployment(v, "pro-off", PRO, [(PRO_HEALTHY, 60), (off, 60)])
    ALONE.add("pro-never-drafted")  # a deployment of its own that never drafted (its model drafted elsewhere)
    s += deployment(v, "pro-never-drafted", PRO, [(off, 120)], skip=("drafts", "tokens", "accepted", "pos"))
    s += deployment(v, "pro-idle", PRO, [(mix(0, [0, 0], gen=0), 120)])
    s += deployment(v, "pro-healthy", PRO, [(PRO_HEALTHY, 120)])
    N = "VLLMSpecDecodeNotDrafting"
    # spec decode switched off by a redeploy: the drafts families vanish, generation goes on
    # (the sidecar keeps exporting vLLM's generation tokens when the families are gone)
    s += deployment(v, "pro-vanished", PRO, [(PRO_HEALTHY, 60), ("absent-drafts", off, 60)])
    firing = [not_drafting("pro-off", PRO, "109.8"), not_drafting("pro-vanished", PRO, "109.8")]  # 6590 tokens/min
    return group(
        "not drafting while generating",
        s,
        [
            check("50m", N, []),
            check("66m", N, []),  # pending, not yet firing
            check("80m", N, firing),
        ],
    )


def wasted_and_high_group(v: str) -> dict:
    s = []
    s += deployment(v, "pro-k3-wasted", PRO, [(K3_WASTED, 120)])
    s += deployment(v, "pro-k3-wasted-idle", PRO, [(K3_WASTED_IDLE, 120)])
    s += deployment(v, "pro-healthy", PRO, [(PRO_HEALTHY, 120)])
    s += deployment(v, "pro-loop", PRO, [(LOOP, 120)])
    s += deployment(v, "pro-high-idle", PRO, [(HIGH_IDLE, 120)])
    s += deployment(v, "pro-97", PRO, [(NINETY_SEVEN, 120)])
    s += deployment(v, "pro-high-over", PRO, [(HIGH_OVER, 120)])
    s += deployment(v, "pro-high-under", PRO, [(HIGH_UNDER, 120)])
    s += deployment(v, "pro-loop-restart", PRO, [(LOOP, 10), ("restart",), (LOOP, 110)])
    s += deployment(v, "pro-k3-wasted-over", PRO, [(K3_WASTED_OVER, 120)])
    s += deployment(v, "pro-k3-wasted-under", PRO, [(K3_WASTED_UNDER, 120)])
    s += deployment(v, "pro-k3-restart", PRO, [(K3_WASTED_UNDER, 50), ("restart",), (K3_WASTED_UNDER, 70)])
    if v == "sidecar":
        for pod, k in (
            ("pro-k3-wasted", 3),
            ("pro-k3-wasted-idle", 3),
            ("pro-healthy", 2),
            ("pro-loop", 2),
            ("pro-high-idle", 2),
            ("pro-97", 2),
            ("pro-high-over", 2),
            ("pro-high-under", 2),
            ("pro-loop-restart", 2),
            ("pro-k3-wasted-over", 3),
            ("pro-k3-wasted-under", 3),
            ("pro-k3-restart", 3),
        ):
            s += sidecar_gauges(pod, PRO, k, None, None)
    W, H = "VLLMSpecDecodeSpeculativeTokensWasted", "VLLMSpecDecodeAcceptanceSuspiciouslyHigh"
    # Boundaries: 4.9 % fires and 5.1 % does not; 98.1 % fires and 97.9 % does not. A
    # restart mid-window neither fires nor silences (the loop keeps firing across it).
    return group(
        "wasted last position and suspiciously high acceptance",
        s,
        [
            check("20m", W, []),  # condition true, still pending (for: 30m)
            check("60m", W, [wasted("pro-k3-wasted", PRO, "2", "2%"), wasted("pro-k3-wasted-over", PRO, "2", "4.9%")]),
            check("100m", W, [wasted("pro-k3-wasted", PRO, "2", "2%"), wasted("pro-k3-wasted-over", PRO, "2", "4.9%")]),
            check("3m", H, []),
            check(
                "20m",
                H,
                [high("pro-loop", PRO, "99%"), high("pro-high-over", PRO, "98.1%"), high("pro-loop-restart", PRO, "99%")],
            ),
            check(
                "60m",
                H,
                [high("pro-loop", PRO, "99%"), high("pro-high-over", PRO, "98.1%"), high("pro-loop-restart", PRO, "99%")],
            ),
        ],
    )


def sidecar_only_group() -> dict:
    base = {"namespace": NS, "pod": "pro-0", "job": "vllm-specdec-exporter", "instance": "10.0.0.7:9746"}

    def polls(target: str, result: str, values: str) -> dict:
        return gauge("vllm_specdec_exporter_polls_total", {**base, "target": target, "result": result}, values)

    s = [
        # A 15-min weight reload: connection refused from 11m to 25m, then back.
        gauge("vllm_specdec_up", {**base, "target": "reload"}, "1x10 0x14 1x35"),
        polls("reload", "connect_error", "0x10 1+1x14 15x35"),
        # A misconfiguration (401 from vLLM's --api-key, a wrong path): vLLM answers, wrongly, from 11m.
        gauge("vllm_specdec_up", {**base, "target": "misconfigured"}, "1x10 0x50"),
        polls("misconfigured", "http_error", "0x10 1+1x50"),
        # Unreachable for good from 11m: longer than any reload.
        gauge("vllm_specdec_up", {**base, "target": "gone"}, "1x10 0x50"),
        polls("gone", "connect_error", "0x10 1+1x50"),
        gauge("vllm_specdec_up", {**base, "target": "rank1"}, "1x60"),
        # A new pod (a rollout): its sidecar reads up 0 from its first poll at 10m while vLLM loads its
        # weights for 16 min; another new pod's vLLM never comes up.
        gauge("vllm_specdec_up", {**base, "target": "newpod"}, "_x10 0x16 1x34"),
        gauge("vllm_specdec_up", {**base, "target": "newdead"}, "_x10 0x50"),
        gauge("vllm_specdec_exporter_build_info", {**base, "version": "0.1.0", "python_version": "3.11.7"}, "1x30 _x30"),
        gauge("vllm_specdec_exporter_invariant_violations_total", {**base, "target": "vllm"}, "0x20 1x40"),
        # Polls every 5 s (12 a minute). "twin": two servers behind one URL from 11m, every
        # poll inconsistent; "glitchy": one glitch every 10 min, the real-life rate: quiet.
        polls("twin", "success", "0+12x60"),
        gauge("vllm_specdec_exporter_inconsistent_polls_total", {**base, "target": "twin"}, "0x10 12+12x50"),
        polls("glitchy", "success", "0+12x60"),
        gauge("vllm_specdec_exporter_inconsistent_polls_total", {**base, "target": "glitchy"}, "0x9 1x10 2x10 3x10 4x10 5x10"),
    ]
    T, A, I = "VLLMSpecDecodeTargetDown", "VLLMSpecDecodeExporterAbsent", "VLLMSpecDecodeCounterInvariantViolated"
    N = "VLLMSpecDecodeTargetInconsistent"
    twin = alert(
        N,
        "warning",
        {**base, "target": "twin"},
        "Most polls of a target are inconsistent: its figures are not counted.",
        "Target twin of the exporter at 10.0.0.7:9746 gave 120 inconsistent engine polls in 10m (counters "
        "that went down without a restart, drafts faster than any engine, two servers behind one URL): "
        "they are not counted, so its figures and alerts are blind. See the sidecar's log (target_warning) "
        "for the reason.",
    )

    def down(target: str) -> dict:
        return alert(
            T,
            "warning",
            {**base, "target": target},
            "The vllm-specdec-exporter sidecar cannot read vLLM's /metrics.",
            f"Target {target} of the exporter at 10.0.0.7:9746 either answers with something that is not "
            f"vLLM's metrics (an HTTP error, an auth failure, a body that is not Prometheus text: a "
            f"misconfiguration), or has been unreachable for 30m, longer than any weight reload. See "
            f"vllm_specdec_exporter_polls_total by result and the sidecar's log.",
        )

    absent = alert(
        A,
        "warning",
        {},
        "No vllm-specdec-exporter series at all: MTP acceptance is not monitored.",
        "Prometheus has no vllm_specdec_exporter_build_info series: the sidecar is not running, not "
        "scraped, or its series are dropped.",
    )
    invariant = alert(
        I,
        "info",
        {**base, "target": "vllm"},
        "vLLM's speculative-decoding counters break their own invariants.",
        "The exporter at 10.0.0.7:9746 (target vllm) saw 1 invariant violations in 10m: a partial "
        "scrape, a parse problem or a broken producer. The figures of the affected engine are suspect.",
    )
    return group(
        "sidecar health: target down (reload, misconfiguration, gone), exporter absent, invariants",
        s,
        [
            check("15m", T, []),  # misconfigured since 11m: pending
            check("17m", T, [down("misconfigured")]),  # 6 min after onset
            check("24m", T, [down("misconfigured")]),  # the reload, 13 min in, and the new pod, 14: quiet
            check("39m", T, [down("misconfigured")]),  # gone for 28 min, the new pod that never came up 29: not yet
            check("42m", T, [down("misconfigured"), down("gone"), down("newdead")]),  # gone for 31 min, 32
            check("40m", A, []),  # series gone at 31m; absent after the 5m staleness, pending for 10m
            check("50m", A, [absent]),
            check("15m", I, []),
            check("25m", I, [invariant]),
            check("35m", I, []),  # no new violation in the last 10m
            check("20m", N, []),  # inconsistent since 11m: half the 10m window at ~16m, then pending for 10m
            check("28m", N, [twin]),
            check("60m", N, [twin]),  # "glitchy" (1 in 120 polls) never
        ],
    )


def direct_two_jobs_group() -> dict:
    """A pod scraped by two jobs (a PodMonitor and a leftover static job): each position twice.
    k is the number of distinct positions, not of series."""
    v = "vllm-direct"
    s = deployment(v, "pro-twice", PRO, [(PRO_HEALTHY, 30)])
    s += [
        {**x, "series": x["series"].replace('job="vllm"', 'job="vllm-static"')}
        for x in deployment(v, "pro-twice", PRO, [(PRO_HEALTHY, 30)])
    ]
    k = "namespace_pod_model_name:vllm_specdec_num_speculative_tokens:max"
    return {
        "name": "direct: a pod scraped by two jobs keeps its k",
        "interval": "1m",
        "input_series": s,
        "promql_expr_test": [
            {
                "expr": k,
                "eval_time": "20m",
                "exp_samples": [{"labels": f'{k}{{model_name="{PRO}",namespace="{NS}",pod="pro-twice"}}', "value": 2}],
            }
        ],
    }


def direct_invariant_group() -> dict:
    """The invariants on each engine's totals at one instant (issue 35 item 3: not rates over 5m)."""
    v = "vllm-direct"
    bad = {"drafts": 1000, "tokens": 2000, "accepted": 3000, "pos": [1000, 1000], "gen": 4000}  # accepted > tokens
    # accepted within the draft tokens, but not the sum of the positions (1,500 against 1,100)
    mismatch = {"drafts": 1000, "tokens": 2000, "accepted": 1500, "pos": [1000, 100], "gen": 2500}
    # accepted above the draft tokens (2,100 against 2,000 a minute) and equal to the positions' sum:
    # only the first invariant sees it
    over = {"drafts": 1000, "tokens": 2000, "accepted": 2100, "pos": [1100, 1000], "gen": 3100}
    # one accepted token a minute more than the positions' sum (10,617.49 against 10,616.49): a gap of
    # 0.0094 % of the totals, under the 0.1 % slack a rate needed, over the totals' 1e-9
    off = {**PRO_HEALTHY, "accepted": PRO_HEALTHY["accepted"] + 1}
    s = deployment(v, "pro-bad-producer", PRO, [(bad, 30)]) + deployment(v, "pro-healthy", PRO, [(PRO_HEALTHY, 30)])
    s += deployment(v, "pro-pos-mismatch", PRO, [(mismatch, 30)])
    s += deployment(v, "pro-slightly-off", PRO, [(off, 30)])
    I = "VLLMSpecDecodeCounterInvariantViolated"

    # One engine of eight broken, beside seven healthy ones: a per-server sum would hide it.
    s += [x for e in range(1, 8) for x in deployment(v, "pro-one-of-eight", PRO, [(mismatch if e == 7 else PRO_HEALTHY, 30)],
                                                       engine=str(e))]
    # Engine 3 of four counts more accepted than draft tokens; its siblings' margin (13,180 draft tokens
    # against 10,616 accepted a minute each) would hide it in a per-server sum.
    s += [x for e in range(4) for x in deployment(v, "pro-over-draft", PRO, [(over if e == 3 else PRO_HEALTHY, 30)],
                                                    engine=str(e))]
    # Healthy, restarted after 15 minutes (every counter back to zero together): nothing, while the
    # restart is inside the 5m window (18m) and after (25m).
    s += [x for e in range(2) for x in deployment(v, "pro-restarted", PRO, [(PRO_HEALTHY, 15), ("restart",), (PRO_HEALTHY, 15)],
                                                    engine=str(e))]
    # A fresh engine from 16m: nothing accepted yet (0 / 0 is no sample), then a few tokens a minute
    # (totals of 3 to 12 accepted tokens: exact, no slack needed): nothing.
    s += deployment(v, "pro-fresh", PRO, [("gone", 16), (mix(2, [0, 0]), 2), (mix(3, [2, 1]), 4)])

    def violated(pod: str, engine: str = "0") -> dict:
        return alert(I, "info", {"namespace": NS, "pod": pod, "model_name": PRO, "engine": engine},
                     "vLLM's speculative-decoding counters break their own invariants.",
                     f"Engine {engine} of {where(pod, PRO)} reports accepted tokens that exceed its draft tokens or differ "
                     f"from the sum of its per-position counts: a partial scrape or a broken producer.")

    broken = [violated("pro-bad-producer"), violated("pro-one-of-eight", "7"), violated("pro-over-draft", "3"),
              violated("pro-pos-mismatch"), violated("pro-slightly-off")]
    return group(
        "direct: counters that break vLLM's invariants",
        s,
        [check("18m", I, broken), check("20m", I, broken), check("25m", I, broken)],
    )


def rounded(rule: str, at: str, samples: list[dict]) -> dict:
    """A promql_expr_test of ``rule`` to 6 decimals (promtool compares floats exactly)."""
    return {"expr": f"round({rule} * 1e6) / 1e6", "eval_time": at, "exp_samples": samples}


def cost_group(v: str) -> dict:
    """Issue 34: what a head costs, per server and per model, against the healthy reference: the
    profile where one matches (V4-Pro k=2: 2.27), otherwise the model's best hour at the same k
    (a served name healthy at 2.611 for two hours); none without either. Expected values worked by
    hand from the per-minute counts: broken AL = 1 + (235 + 5) / 6590."""
    broken_al = 1 + 240 / 6590
    s = deployment(v, "cost-pro", PRO, [(PRO_BROKEN, 30)])
    s += deployment(v, "cost-served", SERVED, [(PRO_HEALTHY, 120), (PRO_BROKEN, 30)])
    s += deployment(v, "cost-none", "Unprofiled/Model", [(PRO_BROKEN, 150)])
    # Attacked: an idle server (0.5 drafts/s) has no figure; a model with a busy server that has no
    # reference (a k=3 pod of a served name whose history is at k=2) has no model figure.
    s += deployment(v, "cost-idle", PRO, [(IDLE_BROKEN, 30)])
    s += deployment(v, "cost-mixed-a", "Mixed/Model", [(PRO_HEALTHY, 150)])
    s += deployment(v, "cost-mixed-b", "Mixed/Model", [("gone", 100), (mix(6590, [235, 5, 1]), 50)])
    if v == "sidecar":
        s += sidecar_gauges("cost-idle", PRO, 2, 2.27, "deepseek-v4-pro-mtp-k2")
        s += sidecar_gauges("cost-mixed-a", "Mixed/Model", 2, None, None)
        b = {"namespace": NS, "pod": "cost-mixed-b", "model_name": "Mixed/Model", "job": "vllm-specdec-exporter", "target": "vllm"}
        s.append(gauge("vllm_specdec_num_speculative_tokens", b, "_x100 3x50"))  # from its first poll
        s += sidecar_gauges("cost-pro", PRO, 2, 2.27, "deepseek-v4-pro-mtp-k2")
        s += sidecar_gauges("cost-served", SERVED, 2, None, None) + sidecar_gauges("cost-none", "Unprofiled/Model", 2, None, None)
    tgt = {"target": "vllm"} if v == "sidecar" else {}

    def sample(value: float, **labels) -> dict:
        body = ",".join(f'{k}="{x}"' for k, x in sorted({**labels, **tgt}.items()))
        return {"labels": f"{{{body}}}", "value": round(value * 1e6) / 1e6}  # round() drops the name

    server, model = "namespace_pod_model_name:vllm_specdec_", "namespace_model_name:vllm_specdec_"
    pro = {"namespace": NS, "pod": "cost-pro", "model_name": PRO}
    served = {"namespace": NS, "pod": "cost-served", "model_name": SERVED}
    drafts = 6590 / 60  # per second
    tests = [
        # the profile: 2.27 / 1.0364 = 2.19 the steps, 54 % of them wasted
        rounded(f"{server}decode_step_factor:ratio_rate5m{{pod='cost-pro'}}", "20m", [sample(2.27 / broken_al, **pro)]),
        rounded(f"{server}decode_steps_wasted:ratio_rate5m{{pod='cost-pro'}}", "20m", [sample(1 - broken_al / 2.27, **pro)]),
        rounded(f"{server}healthy_output_tokens:rate5m{{pod='cost-pro'}}", "20m", [sample(drafts * 2.27, **pro)]),
        rounded(f"{model}decode_step_factor:ratio_rate5m{{model_name='{PRO}'}}", "20m",
             [sample(2.27 / broken_al, namespace=NS, model_name=PRO)]),
        # the break-even for k=2: 1 + 0.05 x 2
        rounded(f"{server}break_even_mean_acceptance_length:max{{pod='cost-pro'}}", "20m", [sample(1.1, **pro)]),
        # the model's best hour at k=2 (2.611), after 20 broken minutes: 2.52 the steps, 60 % wasted
        rounded(f"{server}decode_step_factor:ratio_rate5m{{pod='cost-served'}}", "140m", [sample(2.611 / broken_al, **served)]),
        rounded(f"{model}decode_steps_wasted:ratio_rate5m{{model_name='{SERVED}'}}", "140m",
             [sample(1 - broken_al / 2.611, namespace=NS, model_name=SERVED)]),
        # while healthy, against its own best hour: no step wasted
        rounded(f"{server}decode_steps_wasted:ratio_rate5m{{pod='cost-served'}}", "110m", [sample(0, **served)]),
        # no profile and no full hour of history yet: no figure at all (not 1, not 0)
        rounded(f"{server}decode_step_factor:ratio_rate5m{{pod='cost-none'}}", "12m", []),
        rounded(f"{model}decode_steps_wasted:ratio_rate5m{{model_name='Unprofiled/Model'}}", "12m", []),
        rounded(f"{server}decode_step_factor:ratio_rate5m{{pod='cost-idle'}}", "20m", []),
        rounded(f"{model}decode_steps_wasted:ratio_rate5m{{model_name='Mixed/Model'}}", "90m",
             [sample(0, namespace=NS, model_name="Mixed/Model")]),
        rounded(f"{model}decode_steps_wasted:ratio_rate5m{{model_name='Mixed/Model'}}", "110m", []),
        rounded(f"{server}decode_steps_wasted:ratio_rate5m{{pod='cost-mixed-a'}}", "110m",
             [sample(0, namespace=NS, pod="cost-mixed-a", model_name="Mixed/Model")]),
        # ... and once its first full hour is history, a head broken from the start is its own reference:
        # nothing looks wasted (what VLLMSpecDecodeNoBaseline warns of: set an alias or a profile)
        rounded(f"{server}decode_step_factor:ratio_rate5m{{pod='cost-none'}}", "140m",
             [sample(1.0, namespace=NS, pod="cost-none", model_name="Unprofiled/Model")]),
    ]
    # The pages say it (issue 34 item 3), from the same series: cost-pro against its profile (2.27 / 1.0364 =
    # 2.19, 54 %); cost-none before any reference exists (15 minutes of k: under the 18 an hour needs) says
    # so, with no figure; cost-mixed-b the same at k=3 (16 minutes of it); once its own broken hour is
    # cost-none's reference nothing looks wasted; cost-served against its best hour at k=2, 2.611 / 1.0364
    # = 2.52, 60 %. Every one of them under its break-even (1.1 at k=2, 1.15 at k=3).
    C = "VLLMSpecDecodeAcceptanceCollapsed"
    none_yet = collapsed("cost-none", "Unprofiled/Model", "1.036", cost(unknown=True, slower=True))
    none_own = collapsed("cost-none", "Unprofiled/Model", "1.036", cost(slower=True))
    alerts = [
        check("15m", C, [collapsed("cost-pro", PRO, "1.036", cost("2.2", "54", slower=True)), none_yet]),
        check("116m", C, [none_own, collapsed("cost-mixed-b", "Mixed/Model", "1.037", cost(unknown=True, slower=True))]),
        check("140m", C, [none_own, collapsed("cost-mixed-b", "Mixed/Model", "1.037", cost(slower=True)),
                          collapsed("cost-served", SERVED, "1.036", cost("2.5", "60", slower=True))]),
    ]
    return {
        "name": "what a head costs against its healthy reference",
        "interval": "1m",
        "input_series": s,
        "promql_expr_test": tests,
        "alert_rule_test": alerts,
    }


# --- One source of truth: the same counters through promtool and through the sidecar's
# classifier (tests/test_rules.py runs health.judge on each case's 5m counters and
# asserts the hand-written verdict; promtool asserts the hand-written alerts). ---
def noisy(drafts: float, pos: list[float], f: float, d: float = 1.0) -> dict:
    """PRO_HEALTHY-like engine with its acceptance scaled by f and its traffic by d (normal DP noise)."""
    return mix(drafts * d, [drafts * d * p * f for p in pos])


NOISE = [(1.00, 1.0), (0.97, 1.1), (1.03, 0.9), (0.96, 1.05), (1.04, 0.95), (0.98, 1.0), (1.02, 1.1), (0.95, 0.92)]
DETECTION_ALERTS = (
    "VLLMSpecDecodeAcceptanceCollapsed",
    "VLLMSpecDecodeAcceptanceCollapsedFast",
    "VLLMSpecDecodeEngineCollapsed",
    "VLLMSpecDecodeEngineLagging",
    "VLLMSpecDecodeFirstPositionAcceptanceLow",
    "VLLMSpecDecodeAcceptanceBelowBaseline",
)
CRITICAL = {"VLLMSpecDecodeAcceptanceCollapsed", "VLLMSpecDecodeAcceptanceCollapsedFast", "VLLMSpecDecodeEngineCollapsed"}
SERVED = "DSV4-W4A16-FP8-MTP"  # --served-model-name: matches no profile regex


def k7(per_thousand: list[float]) -> dict:
    return mix(1000, per_thousand)


# (pod, model, per-engine mixes, the matching profile (name, AL) or None, verdict, expected
# alerts as (alertname, engine or None, rendered $value)). All written by hand from
# baselines.md's figures and the thresholds in config.Detection.
VERDICT_CASES = [
    ("dp8-healthy-noise", PRO, [noisy(6590, [0.924, 0.687], f, d) for f, d in NOISE], ("deepseek-v4-pro-mtp-k2", 2.27), "ok", []),
    (
        "dp8-dead-rank",
        PRO,
        [PRO_BROKEN if e == 3 else PRO_HEALTHY for e in range(8)],
        ("deepseek-v4-pro-mtp-k2", 2.27),
        "degraded",
        [("VLLMSpecDecodeEngineCollapsed", "3", "1.036")],
    ),
    (
        "dp8-lagging-rank",
        PRO,
        [mix(6590, [3954, 1977]) if e == 5 else PRO_HEALTHY for e in range(8)],
        ("deepseek-v4-pro-mtp-k2", 2.27),
        "degraded",
        [("VLLMSpecDecodeEngineLagging", "5", "0.900")],
    ),
    # The fixed V4-Flash k=2 sampling (AL 1.99, per position 0.70 / 0.29): healthy.
    ("flash-k2-fixed", FLASH, [mix(1000, [700, 290])], ("deepseek-v4-flash-mtp-k2", 1.99), "ok", []),
    ("flash-k1-worst-workload", FLASH, [mix(1000, [660])], ("deepseek-v4-flash-mtp-k1", 1.66), "ok", []),
    ("pro-k3-golden-thinking-on", PRO, [mix(1000, [800, 450, 240])], ("deepseek-v4-pro-mtp-k3", 2.49), "ok", []),
    (
        "pro-k8-golden-thinking-off",
        PRO,
        [mix(1000, [900, 700, 500, 350, 250, 180, 130, 100])],
        ("deepseek-v4-pro-mtp-k8", 2.58),
        "ok",
        [],
    ),
    # Random-token benchmark load on healthy V4-Flash gives the sampling bug's counters:
    # it warns (naming both readings) and never pages.
    (
        "flash-random-tokens",
        FLASH,
        [FLASH_SAMPLING_BUG],
        ("deepseek-v4-flash-mtp-k2", 1.99),
        "degraded",
        # 1.99 / 1.206 = 1.65, 39 % wasted
        [("VLLMSpecDecodeFirstPositionAcceptanceLow", None, "14.9%"), ("VLLMSpecDecodeAcceptanceBelowBaseline", None, "1.206", cost("1.7", "39"))],
    ),
    (
        "flash-missing-context",
        FLASH,
        [mix(1000, [220, 100])],
        ("deepseek-v4-flash-mtp-k2", 1.99),
        "degraded",
        # 1.99 / 1.32 = 1.51, 34 %
        [("VLLMSpecDecodeFirstPositionAcceptanceLow", None, "22%"), ("VLLMSpecDecodeAcceptanceBelowBaseline", None, "1.320", cost("1.5", "34"))],
    ),
    (
        "pro-mtp3-at-1.2",
        PRO,
        [mix(1000, [150, 40, 10])],
        ("deepseek-v4-pro-mtp-k3", 2.49),
        "degraded",
        # 2.49 / 1.2 = 2.075, 52 %; over the k=3 break-even (1.15)
        [("VLLMSpecDecodeFirstPositionAcceptanceLow", None, "15%"), ("VLLMSpecDecodeAcceptanceBelowBaseline", None, "1.200", cost("2.1", "52"))],
    ),
    (
        "flash-k7-at-1.31",
        FLASH,
        [k7([200, 60, 25, 12, 7, 4, 2])],
        ("deepseek-v4-flash-mtp-k7", 1.99),
        "degraded",
        # Position 0 at 20 % is what the k=7 profile (1.99) allows: its floor is 0.75 x 0.99 / 7 = 0.106.
        # 1.99 / 1.31 = 1.52, 34 %, and under the k=7 break-even (1 + 0.05 x 7 = 1.35): drafting is slower than none
        [("VLLMSpecDecodeAcceptanceBelowBaseline", None, "1.310", cost("1.5", "34", slower=True))],
    ),
    # A served name no profile regex matches, low from the start with nothing better seen: a
    # steady weak drafter and a partly broken one cannot be told apart, so nothing is raised
    # (issue 21); after a fall it warns (position0_fall_group). Likewise vLLM's own CI
    # reference for a Qwen3-VL EAGLE3 speculator: AL 1.36, position 0 at 0.29, no profile.
    ("served-name-k7-at-1.31", SERVED, [k7([200, 60, 25, 12, 7, 4, 2])], None, "unknown", []),
    ("qwen3-vl-eagle3-steady", "Qwen/Qwen3-VL-8B-Instruct", [mix(1000, [290, 60, 10])], None, "unknown", []),
    ("served-name-healthy", SERVED, [PRO_HEALTHY], None, "unknown", []),
    ("pro-idle-broken", PRO, [IDLE_BROKEN], ("deepseek-v4-pro-mtp-k2", 2.27), "idle", []),
    # More healthy figures of baselines.md: native V4-Pro k=1 (91.1 %), V4-Flash k=2 on
    # code at both ends (2.35, 2.70), DeepSeek-V3 (second token 85-90 %, no profile).
    ("pro-native-k1", PRO, [mix(1000, [911])], ("deepseek-v4-pro-mtp-k1", 1.79), "ok", []),
    ("flash-k2-code-low", FLASH, [mix(1000, [700, 650])], ("deepseek-v4-flash-mtp-k2", 1.99), "ok", []),
    ("flash-k2-code-high", FLASH, [mix(1000, [850, 850])], ("deepseek-v4-flash-mtp-k2", 1.99), "ok", []),
    ("v3-k1", "deepseek-ai/DeepSeek-V3", [mix(1000, [850])], None, "unknown", []),
]


def golden(al_by_k: list[float], k: int) -> dict:
    """A healthy per-minute mix at k from a reference curve of AL per k: position 0 is
    k-independent, so it is the curve's k=1 gain; the rest of AL(k) - AL(1) falls
    geometrically over positions 1..k-1 (a survival curve, never rising)."""
    p0, rest = al_by_k[0] - 1, al_by_k[k - 1] - al_by_k[0]
    lo, hi = 0.0, 1.0
    for _ in range(60):  # the ratio q with p0 * (q + ... + q^(k-1)) = rest
        q = (lo + hi) / 2
        lo, hi = (q, hi) if p0 * sum(q**i for i in range(1, k)) < rest else (lo, q)
    return mix(10000, [10000 * p0 * q**i for i in range(k)])


# The reference curves of baselines.md (AL for k = 1..8): every point must stay quiet.
GOLDEN = {
    "on": [1.79, 2.27, 2.49, 2.54, 2.55, 2.55, 2.54, 2.58],
    "off": [1.92, 2.61, 2.97, 3.00, 3.10, 3.16, 3.00, 3.11],
    "dspark": [1.84, 2.51, 3.01, 3.36, 3.61, 3.77, 3.73, 3.47],
}
PRO_AL = GOLDEN["on"]
VERDICT_CASES += [
    (
        f"pro-golden-{curve}-k{k}",
        PRO if curve != "dspark" else PRO + "-0813",
        [golden(als, k)],
        (f"deepseek-v4-pro-mtp-k{k}", PRO_AL[k - 1]),
        "ok",
        [],
    )
    for curve, als in GOLDEN.items()
    for k in range(1, 9)
]

# Each builder takes the expected alert's (alertname, engine, value[, cost]) after pod and model.
BUILDERS = {
    "VLLMSpecDecodeAcceptanceCollapsed": lambda pod, model, engine, value, cost: collapsed(pod, model, value, cost),
    "VLLMSpecDecodeEngineCollapsed": lambda pod, model, engine, value: engine_collapsed(pod, model, engine, value),
    "VLLMSpecDecodeEngineLagging": lambda pod, model, engine, value: engine_lagging(pod, model, engine, value),
    "VLLMSpecDecodeFirstPositionAcceptanceLow": lambda pod, model, engine, value: first_low(pod, model, value),
    "VLLMSpecDecodeAcceptanceBelowBaseline": lambda pod, model, engine, value, cost: below_baseline(pod, model, value, cost),
}


def verdict_group(v: str) -> dict:
    ALONE.update(case[0] for case in VERDICT_CASES)  # each judged on its own, as the sidecar's health judges it
    s = []
    for pod, model, engines, profile, _, _ in VERDICT_CASES:
        for e, m in enumerate(engines):
            s += deployment(v, pod, model, [(m, 45)], engine=str(e))
        if v == "sidecar":
            k = len(engines[0]["pos"])
            s += sidecar_gauges(pod, model, k, profile[1] if profile else None, profile[0] if profile else None)
    tests = []
    for alertname in DETECTION_ALERTS:
        expected = [
            BUILDERS[expect[0]](pod, model, *expect[1:])
            for pod, model, _, _, _, alerts in VERDICT_CASES
            for expect in alerts
            if expect[0] == alertname
        ]
        tests.append(check("40m", alertname, expected))
    return group(
        "verdicts shared with the sidecar's health: dead and lagging ranks, partial degradations, healthy "
        "figures, synthetic load",
        s,
        tests,
    )


def fleet_group(v: str) -> dict:
    """Two clusters with the same namespace/pod/model, and (sidecar) two targets behind one
    exporter with the same engine "0": never merged."""
    s = []
    s += deployment(v, "pro-0", PRO, [(PRO_BROKEN, 60)], extra={"cluster": "east"})
    s += deployment(v, "pro-0", PRO, [(PRO_HEALTHY, 60)], extra={"cluster": "west"})
    # The cost of east's collapse, read for its own cluster: the sidecar exported no k and no profile here, so
    # no figure (and no break-even); vLLM-direct matches the V4-Pro k=2 profile (2.27 / 1.0364 = 2.19, 54 %).
    side = v == "sidecar"
    east = cost(unknown=True) if side else cost("2.2", "54", slower=True)
    expected = [
        alert(
            "VLLMSpecDecodeAcceptanceCollapsed",
            "critical",
            pod_labels("pro-0", PRO, cluster="east"),
            "Speculative-decoding acceptance has collapsed: draft tokens are almost never accepted.",
            collapsed("pro-0", PRO, "1.036", east)["exp_annotations"]["description"],
        )
    ]
    # A static scrape outside Kubernetes: no namespace, no pod; the alert still says where. Its cost is
    # read with the alert's own (empty) labels: vLLM-direct knows k (2) from the positions, no profile
    # matches, and 40 broken minutes are its own best hour: nothing wasted against it, but slower than none.
    s += deployment(v, None, "static-model", [(PRO_BROKEN, 60)], target="static")
    expected.append(collapsed(None, "static-model", "1.036", cost(unknown=True) if side else cost(slower=True), target="static"))
    if v == "sidecar":
        s += deployment(v, "standalone", PRO, [(PRO_BROKEN, 60)], target="rank0")
        s += deployment(v, "standalone", PRO, [(PRO_HEALTHY, 60)], target="rank1")
        expected.append(collapsed("standalone", PRO, "1.036", cost(unknown=True), target="rank0"))
    return group(
        "fleets: two clusters, two targets behind one exporter", s, [check("40m", "VLLMSpecDecodeAcceptanceCollapsed", expected)]
    )


def collapsed_fast(pod: str, model: str, value: str, cost: str) -> dict:
    return alert(
        "VLLMSpecDecodeAcceptanceCollapsedFast",
        "critical",
        pod_labels(pod, model),
        "Speculative-decoding acceptance has collapsed at production traffic: draft tokens are almost never accepted.",
        f"Mean acceptance length of {where(pod, model)} is {value} over the last 2m with at least 10 "
        f"drafts/s: enough drafts to make it certain. Decoding runs at non-speculative speed: suspect the "
        f"draft head (quantised conversion, loader) or draft sampling.{cost}",
    )


def per_second(drafts: float, survival: list[float]) -> dict:
    """A mix at `drafts` per second (per-minute increments), positions as survival shares."""
    return mix(60 * drafts, [60 * drafts * x for x in survival])


def fast_collapse_group(v: str) -> dict:
    """The fast page: AL over 2m < 1.1 with >= 10 drafts/s, for 2m. Broken head: survival
    0.0357 / 0.0008 (235 / 5 of 6590 drafts)."""
    broken, healthy = [235 / 6590, 5 / 6590], [0.924, 0.687]
    s = []
    s += deployment(v, "pro-broken-110", PRO, [(PRO_HEALTHY, 60), (PRO_BROKEN, 60)])  # 6,590 drafts/min
    s += deployment(v, "pro-broken-1000", PRO, [(per_second(1000, healthy), 60), (per_second(1000, broken), 60)])
    s += deployment(v, "pro-broken-10.1", PRO, [(per_second(10.1, broken), 120)])  # just over the floor
    s += deployment(v, "pro-broken-9.9", PRO, [(per_second(9.9, broken), 120)])  # just under: the slow path
    s += deployment(v, "pro-boundary-fire", PRO, [(BOUNDARY_FIRE, 120)])  # AL 1.098 at 16.7 drafts/s
    s += deployment(v, "pro-boundary-quiet", PRO, [(BOUNDARY_QUIET, 120)])  # AL 1.102
    s += deployment(v, "pro-healthy", PRO, [(PRO_HEALTHY, 120)])
    s += deployment(v, "pro-restart", PRO, [(PRO_HEALTHY, 40), ("restart",), (PRO_HEALTHY, 80)])
    s += deployment(v, "pro-idle-broken", PRO, [(IDLE_BROKEN, 120)])
    s += deployment(v, "flash-random-tokens", FLASH, [(FLASH_SAMPLING_BUG, 120)])  # AL 1.206 at 16.7/s
    s += deployment(v, "flash-k1-worst", FLASH, [(mix(1000, [660]), 120)])
    s += deployment(v, "flash-k-lowered", FLASH, [(mix(1000, [800, 600, 400]), 60), ("restart",), (mix(1000, [800]), 60)])
    Q = "VLLMSpecDecodeAcceptanceCollapsedFast"
    # The cost is the recorded 5m figure's. The sidecar exported no k and no profile here: unknown. vLLM-direct
    # matches the V4-Pro k=2 profile: 2.27 / 1.0364 = 2.19, 54 %; 2.27 / 1.098 = 2.07, 52 %; both under the
    # break-even (1.1). 4 minutes after the onset the 5m range (both ends included) still holds one healthy
    # minute: AL 1 + (1.611 + 4 x 240 / 6590) / 5 = 1.351, 2.27 / 1.351 = 1.68, 40 %, over the break-even.
    side = v == "sidecar"
    at_1036 = cost(unknown=True) if side else cost("2.2", "54", slower=True)
    at_1098 = cost(unknown=True) if side else cost("2.1", "52", slower=True)
    onset = cost(unknown=True) if side else cost("1.7", "40")
    always = [collapsed_fast("pro-broken-10.1", PRO, "1.036", at_1036), collapsed_fast("pro-boundary-fire", PRO, "1.098", at_1098)]
    broke = [collapsed_fast("pro-broken-110", PRO, "1.036", c) for c in (onset, at_1036)]
    broke += [collapsed_fast("pro-broken-1000", PRO, "1.036", c) for c in (onset, at_1036)]
    return group(
        "fast page: a total collapse at >= 10 drafts/s within 5 minutes; nothing else pages",
        s,
        [
            check("3m", Q, []),
            check("50m", Q, always),
            check("63m", Q, always),  # 3 minutes after onset: the 2m window is broken, pending
            check("64m", Q, [*always, broke[0], broke[2]]),  # 4 minutes after onset
            check("110m", Q, [*always, broke[1], broke[3]]),
        ],
    )


def distribution_group(v: str) -> dict:
    """The acceptance-count distribution rule: drafts that accepted exactly j, as a share, by hand
    from the survival figures (exactly 0 = 1 - pos0, exactly j = pos[j-1] - pos[j], exactly k = pos[k-1]).
    Recorded where the dashboards read it (per namespace and model, not per server): each pod
    here runs in a namespace of its own name."""
    ALONE.update({"pro-native-k2", "pro-native-k1", "pro-broken"})
    s = deployment(v, "pro-native-k2", PRO, [(PRO_HEALTHY, 30)])  # 0.924 / 0.687
    s += deployment(v, "pro-native-k1", PRO, [(mix(1000, [911]), 30)])  # 91.1 %
    s += deployment(v, "pro-broken", PRO, [(PRO_BROKEN, 30)])  # 235 / 5 of 6590
    rule = "namespace_model_name:vllm_specdec_acceptance_count_ratio:ratio_rate5m"

    def sample(pod: str, accepted: int, value: float) -> dict:
        own = {k: x for k, x in pod_labels(pod, PRO).items() if k != "pod"}
        labels = ",".join(f'{k}="{x}"' for k, x in {**own, "namespace": pod, "accepted": str(accepted)}.items())
        return {"labels": f"{{{labels}}}", "value": value}

    # 1 - 0.924 = 0.076, 0.924 - 0.687 = 0.237, 0.687; 1 - 0.911 = 0.089, 0.911;
    # broken: (6590 - 235) / 6590 = 0.964340, (235 - 5) / 6590 = 0.034901, 5 / 6590 = 0.000759.
    # Compared to 6 decimals (promtool compares floats exactly).
    expected = [
        sample("pro-native-k2", 0, 0.076),
        sample("pro-native-k2", 1, 0.237),
        sample("pro-native-k2", 2, 0.687),
        sample("pro-native-k1", 0, 0.089),
        sample("pro-native-k1", 1, 0.911),
        sample("pro-broken", 0, 0.96434),
        sample("pro-broken", 1, 0.034901),
        sample("pro-broken", 2, 0.000759),
    ]
    return {
        "name": "the acceptance-count distribution",
        "interval": "1m",
        "input_series": s,
        "promql_expr_test": [rounded(rule, "20m", expected)],
    }


def extreme(pod: str, value: str) -> dict:
    return alert(
        "VLLMSpecDecodeRequestAcceptanceExtreme",
        "info",
        pod_labels(pod, PRO),
        "Many finished requests had almost no draft token accepted, or almost all.",
        f"Over 1h, {value} of the finished requests of {where(pod, PRO)} had a draft acceptance at or below "
        f"0.05 or above 0.98 (vLLM's per-request histogram). Very low goes with garbled output, very high "
        f"with repetition loops; look at the dashboard's extremes panel for which end.",
    )


def request_extremes_group(v: str) -> dict:
    """vLLM PR #44487's per-request histogram. Per minute: finished requests, how many at or below
    0.05, how many at or below 0.98 (vllm-direct: buckets; sidecar: its gauges, the same shares)."""
    cases = {  # pod: (finished per minute, <= 0.05, <= 0.98)
        "req-garbled": (10, 2, 10),  # 20 % at or below 5 %: fires
        "req-loops": (10, 0, 7),  # 30 % above 98 %: fires
        "req-over": (100, 11, 100),  # 11 %: fires
        "req-under": (100, 9, 100),  # 9 %: quiet
        "req-few": (0.25, 0.25, 0.25),  # all garbled, but 15 requests in 1h (< 20): quiet
        "req-healthy": (10, 0, 10),
        "req-other-name": (10, 2, 10),  # as req-garbled, under the name in vLLM's code: fires (vllm-direct)
    }
    s = []
    for pod, (n, low, high) in cases.items():
        if v == "sidecar":
            base = {
                "namespace": NS,
                "pod": pod,
                "model_name": PRO,
                "job": "vllm-specdec-exporter",
                "target": "vllm",
                "window": "1h",
            }
            s += [
                gauge("vllm_specdec_request_acceptance_below_ratio", {**base, "edge": "0.05"}, f"{low / n:g}x90"),
                gauge("vllm_specdec_request_acceptance_above_ratio", {**base, "edge": "0.98"}, f"{1 - high / n:g}x90"),
                gauge("vllm_specdec_window_requests", base, f"{60 * n:g}x90"),
            ]
        else:
            base = {"namespace": NS, "pod": pod, "model_name": PRO, "engine": "0", "job": "vllm"}
            h = (
                "vllm:spec_decode_request_acceptance_rate"
                if pod == "req-other-name"
                else "vllm:request_spec_decode_acceptance_rate"
            )
            s += [
                gauge(f"{h}_bucket", {**base, "le": "0.05"}, f"0+{low:g}x90"),
                gauge(f"{h}_bucket", {**base, "le": "0.98"}, f"0+{high:g}x90"),
                gauge(f"{h}_count", base, f"0+{n:g}x90"),
            ]
    if v == "sidecar":  # the sidecar read the low end at its nearest edge, 0: the same alert
        base = {
            "namespace": NS,
            "pod": "req-nearest-edge",
            "model_name": PRO,
            "job": "vllm-specdec-exporter",
            "target": "vllm",
            "window": "1h",
        }
        s += [
            gauge("vllm_specdec_request_acceptance_below_ratio", {**base, "edge": "0"}, "0.25x90"),
            gauge("vllm_specdec_window_requests", base, "600x90"),
        ]
    firing = [
        extreme("req-garbled", "20%"),
        extreme("req-loops", "30%"),
        extreme("req-over", "11%"),
        extreme("req-other-name", "20%"),
    ]
    if v == "sidecar":
        firing.append(extreme("req-nearest-edge", "25%"))
    name = "VLLMSpecDecodeRequestAcceptanceExtreme"
    return group(
        "per-request acceptance extremes (vLLM PR #44487)",
        s,
        [
            check("10m", name, []),  # true, still pending (for: 15m)
            check("40m", name, firing),
        ],
    )


def position0_fall_group(v: str) -> dict:
    """The served name with no profile, healthy for an hour (position 0 at 0.924), then at the
    k=7 drafter's 20 %: a fall was seen within the day, so position 0 warns (issue 21)."""
    healthy = k7([924, 687, 500, 350, 250, 180, 130])
    s = deployment(v, "served-fell", SERVED, [(healthy, 60), (k7([200, 60, 25, 12, 7, 4, 2]), 60)])
    name = "VLLMSpecDecodeFirstPositionAcceptanceLow"
    return group(
        "position 0 low after a fall, with no profile",
        s,
        [
            check("70m", name, []),  # low since ~63m, pending (for: 15m)
            check("85m", name, [first_low("served-fell", SERVED, "20%")]),  # 24 min from the fall
        ],
    )


def no_baseline_group() -> dict:
    """Issue 30: a served name no profile matches, whose /v1/models root matches none either
    (model_info profile_matched_by="none"), drafting: said after 30m, as info. Beside it the
    same name whose root matched a profile, and an unmatched one with no traffic: quiet."""
    s = []
    for pod, matched_by, traffic in (
        ("nobase", "none", FLASH_HEALTHY),
        ("rooted", "root", FLASH_HEALTHY),
        ("nobase-idle", "none", IDLE_BROKEN),
    ):
        s += deployment("sidecar", pod, SERVED, [(traffic, 90)])
        info = {
            "namespace": NS,
            "pod": pod,
            "model_name": SERVED,
            "job": "vllm-specdec-exporter",
            "target": "vllm",
            "root": f"/weights/{pod}",
            "profile": "" if matched_by == "none" else "deepseek-v4-pro-mtp-k2",
            "profile_matched_by": matched_by,
        }
        s.append(gauge("vllm_specdec_model_info", info, "1x90"))
    name = "VLLMSpecDecodeNoBaseline"
    said = alert(
        name,
        "info",
        pod_labels("nobase", SERVED),
        "A model drafts with no baseline profile: a head partly broken from the start goes unseen.",
        f"{SERVED} on {NS}/nobase drafts with no baseline profile: none matches its served name, the model "
        "vLLM's /v1/models names as its root, or an alias. A head that is partly broken from the start "
        "cannot be detected until a day of history exists; set baselines.aliases (served name: a model a "
        "profile matches) or a profile of its own (vllm_specdec_model_info shows the root).",
    )
    return group(
        "no baseline profile for a drafting model (sidecar)",
        s,
        [
            check("30m", name, []),  # pending (for: 30m)
            check("40m", name, [said]),
            check("80m", name, [said]),
        ],
    )


def suite(variant: str) -> dict:
    VARIANT["v"] = variant
    groups = [
        collapse_group(variant),
        verdict_group(variant),
        position0_fall_group(variant),
        fleet_group(variant),
        dropped_group(variant),
        rollout_group(variant),
        shift_group(variant),
        chain_group(variant),
        chain_blend_group(variant),
        gaps_group(variant),
        quiet_rollout_group(variant),
        not_drafting_group(variant),
        wasted_and_high_group(variant),
        distribution_group(variant),
        fast_collapse_group(variant),
        request_extremes_group(variant),
        cost_group(variant),
    ]
    groups += (
        [sidecar_only_group(), no_baseline_group()]
        if variant == "sidecar"
        else [direct_invariant_group(), direct_two_jobs_group()]
    )
    # The rule file's order at every step (recordings, then the alerts that read them): without it
    # promtool 2.42 evaluates the groups in a random order, and an alert (or its description's query)
    # may read the previous minute's recorded figure where that figure is moving (a fast page's onset).
    order = [f"vllm-specdec-{kind}-{variant}" for kind in ("recording", "recording-long", "alerts", "alerts-long")]
    rule_file = "../rules.yaml" if variant == "sidecar" else "../rules-vllm-direct.yaml"
    return {"rule_files": [rule_file], "evaluation_interval": "1m", "group_eval_order": order, "tests": groups}


HEADER = "# Generated by tests/promtool_cases.py (input series built there, expected alerts written by hand).\n"


def render() -> dict[str, str]:
    return {f"{v}.yaml": HEADER + yaml.safe_dump(suite(v), sort_keys=False, width=1000) for v in NAMES}


if __name__ == "__main__":
    out = REPO / "alerts" / "tests"
    out.mkdir(parents=True, exist_ok=True)
    for filename, text in render().items():
        (out / filename).write_text(text)
    sys.exit(0)
