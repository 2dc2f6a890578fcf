"""The overview's 'What it costs' row (issue 34): the capacity rules, recorded over the shortest
window only, against the healthy reference (the profile, else the model's best hour of the day)."""

from __future__ import annotations

from collections.abc import Callable

from .grafana import Layout, targets, timeseries
from .rules.options import MODEL_LEVEL, SERVER, Options, base_window


def cost_row(lay: Layout, o: Options, rule: Callable[[str, str, str], str], by: str, legend: str) -> None:
    """The row's panels, added to ``lay``: ``rule(level, metric, op)`` is a recorded series under the
    dashboard's variables, ``by`` its labels and ``legend`` a model's name."""
    cw = f"rate{base_window(o)}"
    span = o.range(base_window(o))
    server_legend = "{{" + o.pod_label + "}} " + legend
    lay.row("What it costs")
    lay.add(
        timeseries(
            "Decode steps wasted",
            f"Share of decode steps (verification steps) per model spent re-doing what a healthy draft head would "
            f"have produced: 1 - steps a healthy head would need / steps taken, over {span}, floored at 0; sums over "
            "the servers before the ratio. Healthy: the profile's acceptance length where one matches, otherwise "
            "the model's best hour of the day at the server's k; no line without a reference. Assumes the same "
            "batch composition. Bad: tens of percent (DeepSeek-V4-Pro's broken head: 60 %).",
            targets((rule(MODEL_LEVEL, "decode_steps_wasted", f"ratio_{cw}"), legend)),
            "percentunit",
            min_=0,
            max_=1,
        ),
        8,
        8,
    )
    lay.add(
        timeseries(
            "Decode-step factor per server",
            f"Decode steps needed for the same output against a healthy head (AL healthy / AL now) per server "
            f"(pod), over {span}. The rules keep no per-engine figure: an engine's own cost is not shown here "
            "(the Engines row shows its acceptance length). 1: as healthy. Bad: above 1.2; 2.5 means every token "
            "takes 2.5 times the decode steps; under 1: above the reference.",
            targets((rule(SERVER, "decode_step_factor", f"ratio_{cw}"), server_legend)),
            "none",
        ),
        8,
        8,
    )
    healthy_out = rule(SERVER, "healthy_output_tokens", cw)
    actual_out = f"({rule(SERVER, 'drafts', cw)} + {rule(SERVER, 'accepted_tokens', cw)})"
    lay.add(
        timeseries(
            "Output tokens/s forgone",
            f"Output tokens per second the same decode steps would have produced with a healthy head "
            f"(drafts/s x AL healthy) minus what they produced (drafts + accepted tokens per second), per model over "
            f"{span}: per server, floored at 0, then summed; none where a busy server of the model has no healthy "
            "reference (as the model's recorded figure). Assumes the same batch composition. Bad: a large share of "
            "the model's output rate.",
            targets(
                (
                    f"sum by ({by}) (clamp_min({healthy_out} - {actual_out}, 0)) and on({by}) "
                    f"{rule(MODEL_LEVEL, 'healthy_output_tokens', cw)}",
                    legend,
                )
            ),
            "short",
            min_=0,
        ),
        8,
        8,
    )
