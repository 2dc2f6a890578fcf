"""The exported metric families: ONE registry of names, types, help texts and labels.

The collector builds every family it exports from here (collector.family), the rule
generator reads its counter names from here, and tests import names from here, so a
family is renamed in one line. Names are without the vllm_specdec_ prefix; a counter's
samples end in _total (sample()).
"""

from __future__ import annotations

from dataclasses import dataclass

from . import config

T, M, E, W, POS = config.LABEL_TARGET, config.LABEL_MODEL, config.LABEL_ENGINE, config.LABEL_WINDOW, config.LABEL_POSITION


@dataclass(frozen=True, slots=True)
class Family:
    short: str
    type: str  # counter, gauge, stateset, histogram
    labels: tuple[str, ...]
    help: str

    @property
    def name(self) -> str:
        return f"{config.PREFIX}_{self.short}"

    @property
    def sample(self) -> str:
        """The name of its samples on the wire (a counter's carry _total)."""
        return f"{self.name}_total" if self.type == "counter" else self.name


FAMILIES: dict[str, Family] = {
    f.short: f
    for f in (
        Family(
            "drafts", "counter", (T, M, E), "Speculative-decoding drafts (verification steps with >= 1 draft token), from vLLM."
        ),
        Family("draft_tokens", "counter", (T, M, E), "Draft tokens proposed, from vLLM."),
        Family("accepted_tokens", "counter", (T, M, E), "Draft tokens accepted (bonus token not counted), from vLLM."),
        Family(
            "position_accepted_tokens",
            "counter",
            (T, M, E, POS),
            "Drafts in which at least position+1 draft tokens were accepted, from vLLM.",
        ),
        Family(
            "generation_tokens", "counter", (T, M, E), "Generation tokens (accepted draft and bonus tokens included), from vLLM."
        ),
        Family(
            "mean_acceptance_length",
            "gauge",
            (T, M, W),
            "Mean acceptance length 1 + accepted/drafts over the window, summed over engines.",
        ),
        Family(
            "acceptance_ratio", "gauge", (T, M, W), "Draft acceptance accepted/draft_tokens over the window, summed over engines."
        ),
        Family(
            "position_acceptance_ratio",
            "gauge",
            (T, M, W, POS),
            "Share of drafts with at least position+1 tokens accepted over the window.",
        ),
        Family(
            "position_conditional_acceptance_ratio",
            "gauge",
            (T, M, W, POS),
            "Acceptance at a position given the previous one was accepted, over the window.",
        ),
        Family("effective_draft_length", "gauge", (T, M, W), "Draft tokens per draft over the window (<= k)."),
        Family(
            "acceptance_count_ratio",
            "gauge",
            (T, M, W, "accepted"),
            "Share of drafts (verify steps) that accepted exactly `accepted` draft tokens over the window, summed over engines (0..k; sums to 1).",
        ),
        Family("window_drafts", "gauge", (T, M, W), "Drafts in the window: the sample size behind the ratio gauges."),
        Family("window_span_seconds", "gauge", (T, M, W), "Seconds actually covered by the window (shorter just after start)."),
        Family("engine_mean_acceptance_length", "gauge", (T, M, E, W), "Mean acceptance length of one engine over the window."),
        Family("engine_acceptance_ratio", "gauge", (T, M, E, W), "Draft acceptance of one engine over the window."),
        Family("num_speculative_tokens", "gauge", (T, M), "k, the number of speculative tokens, from the position series."),
        Family(
            "decode_step_factor_ratio",
            "gauge",
            (T, M, W),
            "Decode steps the output took against a healthy head's (healthy AL / AL) over the window; healthy: the "
            "matched profile's AL (absent without a profile).",
        ),
        Family(
            "decode_steps_wasted_ratio",
            "gauge",
            (T, M, W),
            "Share of the decode steps that re-did what a healthy head would have produced (1 - AL / healthy AL, at "
            "least 0) over the window (absent without a profile).",
        ),
        Family(
            "healthy_output_tokens_per_second",
            "gauge",
            (T, M, W),
            "Output tokens per second the same decode steps would have produced with a healthy head (drafts/s x "
            "healthy AL) over the window (absent without a profile).",
        ),
        Family(
            "engine_decode_step_factor_ratio",
            "gauge",
            (T, M, E, W),
            "Decode steps one engine's output took against a healthy head's (healthy AL / the engine's AL) over the window.",
        ),
        Family(
            "engine_decode_steps_wasted_ratio",
            "gauge",
            (T, M, E, W),
            "Share of one engine's decode steps that re-did what a healthy head would have produced, over the window.",
        ),
        Family(
            "break_even_mean_acceptance_length",
            "gauge",
            (T, M),
            "The mean acceptance length under which drafting costs more than it returns: 1 + health.draft_step_cost x k.",
        ),
        Family(
            "baseline_mean_acceptance_length",
            "gauge",
            (T, M, "profile"),
            "Expected mean acceptance length of the matched baseline profile.",
        ),
        Family(
            "model_info",
            "gauge",
            (T, M, "root", "profile", "profile_matched_by"),
            "What a served model is: its root as vLLM's /v1/models names it (--model, an HF id or a weights path; "
            "else the target's model; empty when unknown), the baseline profile found for it (empty: none) and how "
            "it was found (config: the target names it, served_name, root, alias, or none: no healthy reference, so "
            "a head partly broken from the start cannot be told from a healthy one). Always 1.",
        ),
        Family(
            "health",
            "stateset",
            (T, M),
            "Speculative-decoding health of the model over the health window (ok, degraded, collapsed, idle, unknown).",
        ),
        Family(
            "engine_health",
            "stateset",
            (T, M, E),
            "Speculative-decoding health of one engine over the health window (ok, degraded, collapsed, idle, unknown).",
        ),
        Family(
            "diagnosis_info",
            "gauge",
            (T, M, "cause"),
            "A likely cause of the health verdict over the health window (a hint, not a certainty; several when several fit): "
            + ", ".join(config.CAUSES)
            + ". Always 1.",
        ),
        Family(
            "request_acceptance_below_ratio",
            "gauge",
            (T, M, W, "edge"),
            "Share of finished requests with acceptance at or below `edge` (the histogram's nearest bucket edge at or below 0.05) over the window.",
        ),
        Family(
            "request_acceptance_above_ratio",
            "gauge",
            (T, M, W, "edge"),
            "Share of finished requests with acceptance above `edge` (the histogram's nearest bucket edge at or above 0.98) over the window.",
        ),
        Family(
            "window_requests", "gauge", (T, M, W), "Finished requests in the per-request acceptance histogram over the window."
        ),
        Family("up", "gauge", (T,), "1 if the last poll of the vLLM target read its /metrics, else 0."),
        Family("exporter_polls", "counter", (T, "result"), "Polls of a vLLM target by result."),
        Family("exporter_poll_duration_seconds", "histogram", (T,), "Time to fetch and parse one poll."),
        Family("exporter_last_success_timestamp_seconds", "gauge", (T,), "Unix time of the last successful poll."),
        Family("exporter_engine_restarts", "counter", (T,), "vLLM engine restarts: counters going down, or a later start time."),
        Family("exporter_invariant_violations", "counter", (T,), "Counter invariant violations seen in poll-to-poll increments."),
        # Gauges of the last successful poll, not counters: a payload that stays malformed
        # would otherwise count its lines again on every poll (poll x items, not events).
        Family(
            "exporter_last_poll_parse_errors",
            "gauge",
            (T,),
            "Malformed or duplicate lines among the families read, in the last successful poll.",
        ),
        Family(
            "exporter_last_poll_series_refused",
            "gauge",
            (T,),
            "Model/engine series refused by the bounds (max_series_per_target, models per poll), in the last successful poll.",
        ),
        Family(
            "target_info",
            "gauge",
            (T, "producer", "approximate"),
            "The producer detected (or configured) for a target, and which of its figures are approximate (comma-separated; empty: all exact); the value is always 1.",
        ),
        Family(
            "exporter_series_forgotten",
            "counter",
            (T,),
            "Held model/engine series forgotten to make room for new ones (max_series_per_target).",
        ),
        Family(
            "exporter_inconsistent_polls",
            "counter",
            (T,),
            "Engine polls neither consistent nor a restart (a glitch): nothing added to any window.",
        ),
        Family(
            "exporter_warnings_suppressed",
            "counter",
            (T,),
            f"New upstream warnings not logged: the target already had {config.WARNINGS_REMEMBERED:,} distinct ones logged.",
        ),
        Family("exporter_poll_task_restarts", "counter", (T,), "Times a target's poll loop failed and was restarted."),
        Family(
            "exporter_served_models_failures",
            "counter",
            (T,),
            "Reads of a vLLM target's /v1/models that failed, or were due and not made for want of the poll's time (profiles are then matched by the served name alone).",
        ),
        Family(
            "exporter_connections_evicted",
            "counter",
            (),
            "Client connections closed to stay within the connection cap (served keep-alive clients first).",
        ),
        Family(
            "exporter_connections_timed_out",
            "counter",
            (),
            "Client connections closed for not sending their request headers within the header timeout.",
        ),
        Family(
            "exporter_requests_refused",
            "counter",
            (),
            "Client requests refused as malformed (HTTP 400 from the request parser); logged one line at a bounded rate.",
        ),
        # Only with --web.config.file, like Prometheus's config_last_reload_successful.
        Family(
            "exporter_web_config_last_reload_successful",
            "gauge",
            (),
            "Whether the last web config reload applied (1) or was refused, the last good config kept (0).",
        ),
        Family(
            "exporter_web_config_reload_failures",
            "counter",
            (),
            "Web config reloads refused (did not load, or would turn TLS off, drop every user, weaken client checks, lower the TLS version floor, loosen or drop the rate limit, or change the headers).",
        ),
        Family(
            "exporter_build_info",
            "gauge",
            ("version", "revision", "python_version"),
            "Build of the exporter; the value is always 1.",
        ),
    )
}


def name(short: str) -> str:
    """vllm_specdec_<short>; a KeyError for a family that is not exported."""
    return FAMILIES[short].name


def sample(short: str) -> str:
    return FAMILIES[short].sample
