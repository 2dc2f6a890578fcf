"""The one place for names, defaults and thresholds.

The parser, the adapters, the CLI and (later) the collector, the alert rules and
the dashboards all read their metric names and limits from here, so a rename or a
new threshold is a one-line change that every artefact picks up.
"""

from __future__ import annotations

# --- What vLLM V1 exposes (sample names exactly as they appear on the wire) ---
VLLM_V1_DRAFTS = "vllm:spec_decode_num_drafts_total"
VLLM_V1_DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens_total"
VLLM_V1_ACCEPTED = "vllm:spec_decode_num_accepted_tokens_total"
VLLM_V1_ACCEPTED_PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
VLLM_V1_GENERATION_TOKENS = "vllm:generation_tokens_total"

# Label names used by vLLM.
LABEL_MODEL = "model_name"
LABEL_ENGINE = "engine"
LABEL_POSITION = "position"

# --- Input limits ---
# A TP=8/DP=8 endpoint serves about 0.36 MB; 32 MiB is ~90x that, enough for any
# real server and small enough that a runaway response cannot eat the pod's memory.
DEFAULT_MAX_PAYLOAD_BYTES = 32 * 1024 * 1024
DEFAULT_HTTP_TIMEOUT_SECONDS = 10.0

# --- Invariant checking ---
# Counters are integers carried as floats; anything beyond this relative slack is
# a real violation, not float noise.
INVARIANT_RELATIVE_TOLERANCE = 1e-9

# --- Terminal rendering ---
BAR_WIDTH = 30

_DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_duration(text: str) -> float:
    """'500ms', '60s', '5m', '1h', '1d' or plain seconds -> seconds (> 0)."""
    raw = str(text).strip()
    unit = next((u for u in ("ms", "s", "m", "h", "d") if raw.endswith(u)), "")
    try:
        value = float(raw[: len(raw) - len(unit)]) * _DURATION_UNITS.get(unit, 1.0)
    except ValueError:
        raise ValueError(f"{text!r} is not a duration (use e.g. 500ms, 60s, 5m, 1h)") from None
    if not value > 0 or value == float("inf"):
        raise ValueError(f"{text!r} is not a positive duration")
    return value
