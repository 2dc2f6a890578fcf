"""Speculative decoding / Overview: is MTP healthy, which position broke, on which engine."""

from __future__ import annotations

import grafanalib.core as g

from .. import config as c
from .. import metrics as m
from .grafana import Json, Layout, bars, finalize, fleet_selects, multi_select, stat, steps, targets, timeseries, variables
from .overview_cost import cost_row
from .rules.context import Expr
from .rules.options import MODEL_LEVEL, SERVER, Options, base_window, name
from .rules.references import WINDOW_VARIABLE
from .rules.registry import default_options

UID = "vllm-specdec-overview"
NS, POD, ENG = MODEL_LEVEL, SERVER, f"{SERVER}_engine"
MODEL = c.LABEL_MODEL
DIAGNOSIS = m.name("diagnosis_info")
BELOW, ABOVE = m.name("request_acceptance_below_ratio"), m.name("request_acceptance_above_ratio")
AL_STEPS = steps((None, "red"), (c.collapse_floor(c.DETECTION.collapse_margin), "orange"), (1.5, "green"))
RATE_STEPS = steps((None, "red"), (0.05, "orange"), (0.4, "green"))
NEUTRAL = steps((None, "blue"))
HEALTH = m.name("health")  # an OpenMetrics StateSet: the state is in a label named after the family


def dashboard(o: Options | None = None) -> Json:
    """The overview over the rules ``o`` generates: its labels, its recorded windows."""
    o = o or default_options()
    # Each label's variable is named after the label; the cluster variable exists when the
    # rules keep a cluster label (Options.cluster_label).
    CL, NSL, PODL = o.cluster_label, o.namespace_label, o.pod_label
    SEL = (f'{CL}=~"${CL}", ' if CL else "") + f'{NSL}=~"${NSL}", {MODEL}=~"${MODEL}"'
    BY = (f"{CL}, " if CL else "") + f"{NSL}, {MODEL}"
    LEGEND = "{{" + MODEL + "}}"
    ENGINE_LEGEND = "{{" + PODL + "}} engine {{" + c.LABEL_ENGINE + "}}"
    first = name(NS, "drafts", f"rate{o.windows[0]}")  # what the variables' values are read from

    def rule(level: str, metric: str, op: str, extra: str = "") -> str:
        return f"{name(level, metric, op)}{{{SEL}{', ' + extra if extra else ''}}}"

    def ratio(metric: str, level: str = NS, extra: str = "") -> str:
        return rule(level, metric, f"ratio_rate{WINDOW_VARIABLE}", extra)

    def rate(metric: str, level: str = NS) -> str:
        return rule(level, metric, f"rate{WINDOW_VARIABLE}")

    K = f"max by ({BY}) ({rule(POD, 'num_speculative_tokens', 'max')})"
    BASELINE = f"max by ({BY}) ({rule(POD, 'baseline_mean_acceptance_length', 'max')})"

    def engine_al(extra: str = "") -> str:
        """Per engine only the shortest window is recorded (docs/scale.md): over $window, the mean of
        its recorded rates, averaged at query time (the panel reads a few engines, the rules all)."""
        b = f"rate{base_window(o)}"
        acc, drafts = rule(ENG, "accepted_tokens", b, extra), rule(ENG, "drafts", b, extra)
        return f"1 + avg_over_time({acc}[{WINDOW_VARIABLE}]) / (avg_over_time({drafts}[{WINDOW_VARIABLE}]) > 0)"

    ENGINE_AL = engine_al()

    lay = Layout()
    lay.row("Health now")
    lay.add(
        stat(
            "Health",
            "Speculative-decoding health per model over the exporter's health window (sidecar only): ok, "
            "degraded (an engine collapsed or lagging, position 0 rarely accepted, or below the baseline profile), "
            "collapsed (acceptance length near 1.0), idle (too few drafts) or unknown (no profile, or counters that "
            "break vLLM's invariants). Bad: collapsed or degraded.",
            targets((f"max by ({BY}, {HEALTH}) ({HEALTH}{{{SEL}}} == 1)", f"{LEGEND}: {{{{" + HEALTH + "}}"), instant=True),
            "none",
            NEUTRAL,
            text_mode="name",
        ),
        5,
        5,
    )
    lay.add(
        stat(
            "Worst engine",
            "The lowest acceptance length of any single engine (data-parallel rank) over $window, and "
            "which one: a dead rank hides behind its siblings in every per-model figure. Healthy: close to the model's "
            "figure. Bad: near 1.0 (that rank collapsed) or far below its siblings.",
            targets((f"bottomk(1, {ENGINE_AL})", ENGINE_LEGEND), instant=True),
            "none",
            AL_STEPS,
            text_mode="value_and_name",
            decimals=3,
        ),
        5,
        5,
    )
    lay.add(
        stat(
            "Mean acceptance length",
            "Tokens per decode step: 1 + accepted / drafts, summed over engines, over $window. "
            "Healthy DeepSeek-V4 MTP k=2: 2.3 to 2.6. Bad: near 1.0 (drafts never accepted).",
            targets((ratio("mean_acceptance_length"), LEGEND)),
            "none",
            AL_STEPS,
            decimals=3,
        ),
        4,
        5,
    )
    lay.add(
        stat(
            "Acceptance rate",
            "Accepted / proposed draft tokens over $window. Healthy V4-Pro MTP k=2: about 80 %. Bad: a few percent.",
            targets((ratio("acceptance_ratio"), LEGEND)),
            "percentunit",
            RATE_STEPS,
            decimals=1,
        ),
        4,
        5,
    )
    lay.add(
        stat(
            "k and effective draft length",
            "k (speculative tokens, from the position series) and draft tokens per "
            "draft over $window; the effective length is below k when drafts get trimmed. Bad: k not what you deployed.",
            targets((K, f"k {LEGEND}"), (ratio("effective_draft_length"), f"effective {LEGEND}")),
            "none",
            NEUTRAL,
            decimals=2,
        ),
        3,
        5,
    )
    lay.add(
        stat(
            "Output from drafts",
            "Share of generated tokens that were accepted draft tokens (accepted / generation "
            "tokens) over $window: the work speculation saved. Bad: falling towards 0.",
            targets((ratio("draft_token_share"), LEGEND)),
            "percentunit",
            RATE_STEPS,
            decimals=1,
        ),
        3,
        5,
    )

    lay.row("Acceptance over time")
    al_vs_baseline = timeseries(
        f"Mean acceptance length vs baseline and ceiling: ${MODEL}",
        "Acceptance length over $window against the matched baseline profile (sidecar only; the band reaches down "
        "to the degraded threshold) and the ceiling k+1. One panel per model. Bad: leaving the band, or near 1.0.",
        targets(
            (ratio("mean_acceptance_length"), "acceptance length"),
            (BASELINE, "baseline"),
            (str(c.degraded_floor(Expr(f"{c.DETECTION.degraded_fraction:g}"), Expr(BASELINE))), "degraded below"),
            (f"{K} + 1", "ceiling k+1"),
        ),
        "none",
        min_=1,
        overrides=[
            {
                "matcher": {"id": "byName", "options": "baseline"},
                "properties": [
                    {"id": "custom.fillBelowTo", "value": "degraded below"},
                    {"id": "custom.lineStyle", "value": {"fill": "dash", "dash": [10, 10]}},
                    {"id": "color", "value": {"mode": "fixed", "fixedColor": "green"}},
                ],
            },
            {
                "matcher": {"id": "byName", "options": "degraded below"},
                "properties": [{"id": "color", "value": {"mode": "fixed", "fixedColor": "orange"}}],
            },
            {
                "matcher": {"id": "byName", "options": "ceiling k+1"},
                "properties": [
                    {"id": "custom.lineStyle", "value": {"fill": "dot", "dash": [0, 10]}},
                    {"id": "color", "value": {"mode": "fixed", "fixedColor": "text"}},
                ],
            },
        ],
    )
    # One copy per selected model, so the band's series names are fixed.
    al_vs_baseline.extraJson = {"repeat": MODEL, "repeatDirection": "h", "maxPerRow": 2}
    lay.add(al_vs_baseline, 12, 9)
    lay.add(
        timeseries(
            "Acceptance rate",
            "Accepted / proposed draft tokens over $window per model. Healthy: tens of percent. "
            "Bad: a collapse to a few percent, or above 98 % (repetition loops).",
            targets((ratio("acceptance_ratio"), LEGEND)),
            "percentunit",
            min_=0,
            max_=1,
        ),
        12,
        9,
    )

    lay.row("Per position")
    # The survival curve and the conditional acceptance, now (bars) and over time.
    survival, conditional = ratio("position_acceptance_ratio"), ratio("position_conditional_acceptance_ratio")
    position = f"{LEGEND} position {{{{position}}}}"
    for title, about, expr in (
        (
            "Per-position acceptance now",
            "Share of drafts with at least position+1 tokens accepted (a survival curve; "
            "it adds exactly that much to the acceptance length) over $window. Bad: position 0 near zero.",
            survival,
        ),
        (
            "Conditional acceptance now",
            "Acceptance at a position given the previous one was accepted, over $window: "
            "shows which position got worse. Bad: one position far below the others.",
            conditional,
        ),
    ):
        lay.add(bars(title, about, targets((expr, position), instant=True), "percentunit", RATE_STEPS), 6, 8)
    for title, about, expr in (
        (
            "Per-position acceptance",
            "Survival per position over $window. Bad: position 0 collapsing; a last "
            "position that stays under 5 % wastes draft compute (a smaller k would do).",
            survival,
        ),
        (
            "Conditional acceptance",
            "Conditional acceptance per position over $window. Bad: a step down at one position while the others hold.",
            conditional,
        ),
    ):
        lay.add(timeseries(title, about, targets((expr, position)), "percentunit", min_=0, max_=1), 6, 8)

    lay.add(
        timeseries(
            "Acceptance-count distribution",
            "Share of drafts (verify steps) that accepted exactly 0, 1, ... k draft "
            "tokens over $window (per_pos[j-1] - per_pos[j] over drafts): the acceptance histogram of benchmark tools, "
            "over time. Healthy MTP: most steps accept all k or k-1. Bad: everything at 0 (the draft head produces "
            "garbage), or piled at 1 (the chain breaks after the first position).",
            targets((ratio("acceptance_count_ratio"), f"{LEGEND} accepted {{{{accepted}}}}")),
            "percentunit",
            min_=0,
            max_=1,
        ),
        16,
        8,
    )
    lay.add(
        stat(
            "Likely cause",
            "The sidecar's hint at why acceptance fell, over its health window (a hint, not a certainty; "
            "every cause that fits is shown): draft_head_garbage, chain_break, one_rank, configuration_change, "
            "workload_shift, too_good. Empty: nothing fell. Bad: any cause shown while acceptance is low; "
            "what to check first is in the runbook's section per cause.",
            targets((f"max by ({BY}, cause) ({DIAGNOSIS}{{{SEL}}})", f"{LEGEND}: {{{{cause}}}}"), instant=True),
            "none",
            NEUTRAL,
            text_mode="name",
        ),
        8,
        8,
    )
    # vLLM's per-request histogram (open PR #44487): empty on a vLLM without it.
    req, low, high = c.VLLM_V1_REQUEST_ACCEPTANCE, f"{c.REQUEST_ACCEPTANCE_LOW:g}", f"{c.REQUEST_ACCEPTANCE_HIGH:g}"
    count = f"sum by ({BY}) (increase({req}_count{{{SEL}}}[$window]))"

    def le(edge: str) -> str:
        return f'sum by ({BY}) (increase({req}_bucket{{{SEL}, le="{edge}"}}[$window]))'

    lay.add(
        timeseries(
            "Requests at the acceptance extremes",
            f"Share of finished requests whose own acceptance was at or below "
            f"{low} or above {high}, over $window, from vLLM's per-request histogram (vllm:request_spec_decode_acceptance_"
            f"rate, vLLM PR #44487; empty without it). vLLM series need its /metrics scraped and bucket edges at {low} "
            f"and {high}; the sidecar's series ({o.request_extremes_window} window) read at the nearest edge, named in the legend. Bad: very low "
            f"goes with garbled output, very high with repetition loops.",
            targets(
                (f"{le(low)} / {count}", f"{LEGEND} <= {low}"),
                (f"1 - {le(high)} / {count}", f"{LEGEND} > {high}"),
                (
                    f'max by ({BY}, edge) ({BELOW}{{{SEL}, {c.LABEL_WINDOW}="{o.request_extremes_window}"}})',
                    f"{LEGEND} <= {{{{edge}}}} (sidecar)",
                ),
                (
                    f'max by ({BY}, edge) ({ABOVE}{{{SEL}, {c.LABEL_WINDOW}="{o.request_extremes_window}"}})',
                    f"{LEGEND} > {{{{edge}}}} (sidecar)",
                ),
            ),
            "percentunit",
            min_=0,
            max_=1,
        ),
        24,
        8,
    )

    lay.row("Throughput")
    lay.add(
        timeseries(
            "Drafted, accepted and rejected tokens",
            "Draft tokens proposed, accepted and rejected per second over "
            "$window. Bad: rejected close to drafted (compute spent for nothing).",
            targets(
                (rate("draft_tokens"), f"drafted {LEGEND}"),
                (rate("accepted_tokens"), f"accepted {LEGEND}"),
                (f"{rate('draft_tokens')} - {rate('accepted_tokens')}", f"rejected {LEGEND}"),
            ),
            "short",
            min_=0,
        ),
        12,
        8,
    )
    lay.add(
        timeseries(
            "Drafts and generated tokens",
            "Verification steps with a draft and generated tokens per second over "
            "$window. Bad: generated tokens with no drafts (speculative decoding off).",
            targets((rate("drafts"), f"drafts {LEGEND}"), (rate("generation_tokens"), f"generated {LEGEND}")),
            "short",
            min_=0,
        ),
        12,
        8,
    )

    lay.row("Engines")
    per_engine = engine_al(f'{c.LABEL_ENGINE}=~"$engine"')
    lay.add(
        timeseries(
            "Mean acceptance length per engine",
            "Per data-parallel engine (rank) of each pod: its recorded 5-minute "
            "rates averaged over $window. "
            "Bad: one rank standing out below the others.",
            targets((per_engine, ENGINE_LEGEND)),
            "none",
            min_=1,
        ),
        14,
        9,
    )
    lay.add(
        bars(
            "Acceptance length per engine now",
            "Per engine over $window, lowest first. Bad: one engine far below the rest.",
            targets((f"sort({per_engine})", ENGINE_LEGEND), instant=True),
            "none",
            AL_STEPS,
            max_=c.MAX_SPECULATIVE_TOKENS + 1,
        ),
        10,
        9,
    )

    itl = "vllm:inter_token_latency_seconds"
    isel = SEL
    step_mean = f"sum by ({BY}) (rate({itl}_sum{{{isel}}}[$window])) / sum by ({BY}) (rate({itl}_count{{{isel}}}[$window]))"
    step_p99 = f"histogram_quantile(0.99, sum by ({BY}, le) (rate({itl}_bucket{{{isel}}}[$window])))"
    lay.row("Latency (needs vLLM's own /metrics scraped)")
    lay.add(
        timeseries(
            "Inter-token latency per decode step",
            "vLLM's inter-token latency is observed once per decode step, so "
            "with speculative decoding it times steps, not tokens: mean and p99 over $window. Bad: rising while "
            "acceptance falls.",
            targets((step_mean, f"mean step {LEGEND}"), (step_p99, f"p99 step {LEGEND}")),
            "s",
            min_=0,
        ),
        12,
        8,
    )
    lay.add(
        timeseries(
            "Latency per output token",
            "Mean step latency divided by the mean acceptance length: the time each "
            "output token really costs. Bad: approaching the step latency (acceptance length near 1).",
            targets(
                (f"({step_mean}) / on({BY}) ({ratio('mean_acceptance_length')})", f"per token {LEGEND}"),
                (step_mean, f"per step {LEGEND}"),
            ),
            "s",
            min_=0,
        ),
        12,
        8,
    )

    cost_row(lay, o, rule, BY, LEGEND)

    return finalize(
        g.Dashboard(
            title="Speculative decoding / Overview",
            uid=UID,
            description="Speculative-decoding (MTP, EAGLE, ...) acceptance on vLLM, from vllm-specdec-exporter's "
            "recording rules (sidecar or vLLM-direct variant).",
            tags=["vllm", "speculative-decoding", "mtp"],
            timezone="browser",
            refresh="30s",
            time=g.Time("now-3h", "now"),
            panels=lay.panels,
            graphTooltip=1,
            templating=variables(
                *fleet_selects(first, CL, NSL),
                multi_select(MODEL, "Model", f'label_values({first}{{{NSL}=~"${NSL}"}}, {MODEL})'),
                multi_select(
                    "engine", "Engine", f"label_values({name(ENG, 'drafts', f'rate{o.windows[0]}')}{{{SEL}}}, {c.LABEL_ENGINE})"
                ),
                g.Template(
                    name=WINDOW_VARIABLE[1:],
                    label="Window",
                    type="custom",
                    query=",".join(o.windows),
                    default=o.detection_window if o.detection_window in o.windows else o.windows[0],
                ),
            ),
            annotations=g.Annotations(
                list=[
                    {
                        "name": "Firing speculative-decoding alerts",
                        "enable": True,
                        "iconColor": "red",
                        "datasource": {"type": "prometheus", "uid": "${datasource}"},
                        "expr": f'ALERTS{{alertname=~"VLLMSpecDecode.*", alertstate="firing", {SEL}}}',
                        "titleFormat": "{{alertname}}",
                        "textFormat": f"{LEGEND} {{{{{PODL}}}}}",
                        "step": "60s",
                        "useValueForTime": False,
                    }
                ]
            ),
        )
    )
