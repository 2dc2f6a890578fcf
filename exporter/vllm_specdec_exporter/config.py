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

# --- The sidecar: defaults (every one can be set in the YAML config) ---
DEFAULT_LISTEN_ADDRESS = ":9746"  # unassigned in the Prometheus default-port list
DEFAULT_TARGET_NAME = "vllm"
DEFAULT_POLL_INTERVAL = "5s"  # a fifth of a 1m window: enough points, trivial load
DEFAULT_POLL_TIMEOUT = "4s"  # below the interval, so one poll never overlaps the next
DEFAULT_MAX_BACKOFF = "60s"
DEFAULT_WINDOWS = ("1m", "5m", "15m", "1h")
# Samples kept per window: the window's start is known to within 1/60 of it.
WINDOW_RESOLUTION = 60
# A window with fewer drafts than this gets no ratio gauges: at 100 drafts one
# accepted token moves acceptance by <= 1 point, below that it is noise.
DEFAULT_MIN_DRAFTS = 100
# Derived gauges of a target that stopped answering vanish after this long.
DEFAULT_STALENESS = "60s"
# Label values per label name before new ones are refused (issue: a flood of engines).
DEFAULT_MAX_SERIES_PER_TARGET = 4096

# --- Health (vllm_specdec_health) ---
DEFAULT_HEALTH_WINDOW = "5m"
# Collapsed: mean acceptance length within this of 1.0, i.e. drafts almost never
# accepted. 0.10 puts the broken MTP head (AL 1.03-1.04) and the mis-wired layer
# (1.09) below it, and healthy V4-Flash on random-token prompts (AL 1.19-1.21)
# above it, so synthetic load does not read as a collapse.
DEFAULT_COLLAPSE_MARGIN = 0.10
# Degraded: the speculative gain (AL - 1) below this fraction of the matched
# profile's expected gain. Workload alone moves AL by ~15 % (V4-Flash k=2 on code:
# 2.35 to 2.70), so 0.75 leaves room for traffic mix and catches real breakage
# (the k=2 sampling bug: AL 1.21 against 1.99 fixed).
DEFAULT_DEGRADED_FRACTION = 0.75
HEALTH_STATES = ("ok", "degraded", "collapsed", "idle", "unknown")

# --- What the sidecar exports (public contract) ---
PREFIX = "vllm_specdec"
LABEL_TARGET = "target"
LABEL_WINDOW = "window"
LABEL_STATE = "state"
LOG_FORMATS = ("auto", "json", "console")
LOG_LEVELS = ("debug", "info", "warning", "error")
ENV_PREFIX = "VLLM_SPECDEC_EXPORTER_"
