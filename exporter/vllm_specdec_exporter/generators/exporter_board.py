"""Speculative decoding / Exporter: is the sidecar itself reading vLLM, and how well."""

from __future__ import annotations

import grafanalib.core as g

from .. import config as c
from .. import metrics as m
from .grafana import Json, Layout, finalize, fleet_selects, multi_select, stat, steps, targets, timeseries, variables
from .rules.options import Options
from .rules.registry import default_options

UID = "vllm-specdec-exporter"
UP, POLLS = m.name("up"), m.sample("exporter_polls")
TG = c.LABEL_TARGET  # the target variable is named after its label


def dashboard(o: Options | None = None) -> Json:
    """The sidecar's own board, with the fleet labels ``o`` names (a cluster variable when it keeps one)."""
    o = o or default_options()
    CL, NSL, PODL = o.cluster_label, o.namespace_label, o.pod_label
    SEL = (f'{CL}=~"${CL}", ' if CL else "") + f'{NSL}=~"${NSL}", {TG}=~"${TG}"'
    BY = (f"{CL}, " if CL else "") + f"{NSL}, {PODL}, {TG}"
    LEGEND = f"{{{{{PODL}}}}} {{{{{TG}}}}}"
    lay = Layout()
    lay.row("Targets")
    lay.add(
        stat(
            "Targets up",
            "1 when the sidecar's last poll read the vLLM target's /metrics. Bad: 0 (see errors by kind).",
            targets((f"{UP}{{{SEL}}}", LEGEND), instant=True),
            "none",
            steps((None, "red"), (1, "green")),
            mappings=[
                g.StatValueMappings(g.StatValueMappingItem("up", "1", "green"), g.StatValueMappingItem("down", "0", "red"))
            ],
        ),
        8,
        5,
    )
    lay.add(
        stat(
            "Seconds since the last successful poll",
            "Age of the newest good poll per target. Bad: more than a few "
            "poll intervals (derived gauges vanish after the staleness timeout).",
            targets((f"time() - {m.name('exporter_last_success_timestamp_seconds')}{{{SEL}}}", LEGEND), instant=True),
            "s",
            steps((None, "green"), (30, "orange"), (60, "red")),
        ),
        8,
        5,
    )
    lay.add(
        stat(
            "Exporter builds",
            f"Version of each running sidecar ({m.name('exporter_build_info')}). Bad: mixed versions "
            "after a rollout that should have finished.",
            targets(
                (
                    f'count by (version, revision) ({m.name("exporter_build_info")}{{{NSL}=~"${NSL}"}})',
                    "{{version}} {{revision}}",
                ),
                instant=True,
            ),
            "none",
            steps((None, "blue")),
            text_mode="value_and_name",
        ),
        8,
        5,
    )

    lay.row("Polls")
    lay.add(
        timeseries(
            "Poll duration",
            "Time to fetch and parse one vLLM /metrics, p50 and p99 per target. Bad: near the poll timeout.",
            targets(
                (
                    f"histogram_quantile(0.5, sum by ({BY}, le) (rate({m.name('exporter_poll_duration_seconds')}_bucket{{{SEL}}}[$__rate_interval])))",
                    "p50 " + LEGEND,
                ),
                (
                    f"histogram_quantile(0.99, sum by ({BY}, le) (rate({m.name('exporter_poll_duration_seconds')}_bucket{{{SEL}}}[$__rate_interval])))",
                    "p99 " + LEGEND,
                ),
            ),
            "s",
            min_=0,
        ),
        12,
        8,
    )
    lay.add(
        timeseries(
            "Poll errors by kind",
            "Failed polls per second by result: http_error, timeout, connect_error, too_large, "
            "not_prometheus, no_spec_decode, error. Bad: anything above zero for long.",
            targets(
                (f'sum by ({BY}, result) (rate({POLLS}{{{SEL}, result!="success"}}[$__rate_interval]))', "{{result}} " + LEGEND)
            ),
            "reqps",
            min_=0,
        ),
        12,
        8,
    )

    lay.row("What the sidecar noticed in vLLM's counters")
    for title, metric, what in (
        ("Engine restarts", "engine_restarts", "vLLM engines seen restarting (counters going down)."),
        (
            "Invariant violations",
            "invariant_violations",
            "Counter invariants broken in poll-to-poll increments: a partial scrape or a broken producer.",
        ),
    ):
        lay.add(
            timeseries(
                title,
                f"{what} Per target, increase over 1h. Bad: any sustained increase.",
                targets((f"increase({m.sample('exporter_' + metric)}{{{SEL}}}[1h])", LEGEND)),
                "short",
                min_=0,
            ),
            6,
            7,
        )
    for title, metric, what in (
        ("Parse errors", "last_poll_parse_errors", "Malformed or duplicate lines among the spec-decode families read."),
        ("Series refused", "last_poll_series_refused", "Model/engine series refused by the bounds (max_series_per_target)."),
    ):
        lay.add(
            timeseries(
                title,
                f"{what} Per target, in the last successful poll. Bad: above zero for long.",
                targets((f"max_over_time({m.name('exporter_' + metric)}{{{SEL}}}[$__rate_interval])", LEGEND)),
                "short",
                min_=0,
            ),
            6,
            7,
        )

    return finalize(
        g.Dashboard(
            title="Speculative decoding / Exporter",
            uid=UID,
            description="The vllm-specdec-exporter sidecar's own health: targets, polls, errors.",
            tags=["vllm", "speculative-decoding", "exporter"],
            timezone="browser",
            refresh="30s",
            time=g.Time("now-6h", "now"),
            panels=lay.panels,
            graphTooltip=1,
            templating=variables(
                *fleet_selects(UP, CL, NSL),
                multi_select(TG, "Target", f'label_values({UP}{{{NSL}=~"${NSL}"}}, {TG})'),
            ),
        )
    )
