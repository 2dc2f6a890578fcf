"""The one place for names, defaults and thresholds: the parser, the adapters, the sidecar, the
CLI, the alert rules and the dashboards read them here, so a rename or a new threshold is a
one-line change that every artefact picks up."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, Self, TypeVar

# --- What vLLM V1 exposes (sample names exactly as they appear on the wire) ---
VLLM_V1_DRAFTS = "vllm:spec_decode_num_drafts_total"
VLLM_V1_DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens_total"
VLLM_V1_ACCEPTED = "vllm:spec_decode_num_accepted_tokens_total"
VLLM_V1_ACCEPTED_PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
VLLM_V1_GENERATION_TOKENS = "vllm:generation_tokens_total"
# When an engine's counters started (unix seconds): the drafts counter's _created twin. A new
# value is a restart, known rather than guessed from counters going down; absent in vLLM's
# multiprocess mode (more than one API server), where the counters alone tell.
VLLM_V1_DRAFTS_CREATED = "vllm:spec_decode_num_drafts_created"
# Per-request acceptance histogram (open vLLM PR #44487; optional: absent changes nothing).
VLLM_V1_REQUEST_ACCEPTANCE = "vllm:request_spec_decode_acceptance_rate"
# The same histogram under the name in the vLLM change's own code (a reviewer proposed the
# one above): both are read, the first present wins, and the output says which.
VLLM_V1_REQUEST_ACCEPTANCE_NAMES = (VLLM_V1_REQUEST_ACCEPTANCE, "vllm:spec_decode_request_acceptance_rate")
# Requests below / above these per-request acceptances are flagged (PR #44487: very low
# goes with garbled output, very high with repetition loops). Read at bucket edges:
# the nearest edge at or below LOW, at or above HIGH (and below 1, the largest rate).
REQUEST_ACCEPTANCE_LOW = 0.05
REQUEST_ACCEPTANCE_HIGH = 0.98

# Label names used by vLLM.
LABEL_MODEL = "model_name"
LABEL_ENGINE = "engine"
LABEL_POSITION = "position"

# --- Input limits ---
# A TP=8/DP=8 endpoint serves about 0.36 MB; 32 MiB is ~90x that, enough for any
# real server and small enough that a runaway response cannot eat the pod's memory.
DEFAULT_MAX_PAYLOAD_BYTES = 32 * 1024 * 1024
DEFAULT_HTTP_TIMEOUT_SECONDS = 10.0

# --- Invariant checking: counters are integers carried as floats; beyond this relative slack
# a difference is a real violation, not float noise. ---
INVARIANT_RELATIVE_TOLERANCE = 1e-9

BAR_WIDTH = 30  # the command line's bars, in characters

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
DEFAULT_STALENESS = "60s"  # the derived gauges of a target that stopped answering vanish after this

# --- Hostile input and scale: hard bounds on what the sidecar holds (docs/reliability.md) ---
# Largest k accepted. vLLM's largest real k is about 10; position series at or
# beyond this are refused with a warning, so positions per engine are bounded.
MAX_K = 64
# A counter value above 2**53 cannot count by one any more (float64), and sums of
# such values could overflow to +Inf: a series above it is refused as not a counter.
MAX_COUNTER_VALUE = float(2**53)
# Model/engine series held per target (per poll and in the windows). The engine
# unseen the longest, among those missing from two polls in a row, is forgotten to
# make room for a new one; if there is none, the new one is refused (admission.admit).
# Both are counted and warned about once.
DEFAULT_MAX_SERIES_PER_TARGET = 512
MAX_SERIES_TOTAL = 4096  # ... and over all targets together: each target holds at most this / targets
MAX_MODELS_PER_TARGET = 64  # per target: series of further models are refused
# Longest model or engine label value kept; longer series are refused. It also
# bounds the work of matching a baseline-profile pattern against a model name.
MAX_LABEL_VALUE_LENGTH = 256
MIN_POLL_INTERVAL_SECONDS = 0.1  # faster polls are refused: they would only burn CPU
# Drafts one engine can make per second, generously: 2,048 running sequences at ~122 verification
# steps/s (1,024 at 100 steps/s is 102,400). Not higher: a second, older server behind the same URL
# is told from growth only when its lead exceeds this times the poll interval (1.25 M drafts at 5 s).
# A poll whose drafts grew faster, or that "restarted" to more than this many per second since the
# last poll, is inconsistent (history.py); VLLMSpecDecodeTargetInconsistent says so if it lasts.
MAX_DRAFTS_PER_SECOND = 250_000
# Without a start time, a restart's drafts are at most this share of the base's: the old process
# drafted for longer than its successor did between two polls (its boot alone takes tens of seconds).
# A dip of one draft during a lull read as a restart would add the engine's whole life to the windows.
RESTART_MAX_SHARE = 0.5
# Start times (_created) closer than this are one start: a restart reads the old process, then
# loads the new one (seconds); a smaller move is jitter (read as restarts, it added whole lives).
START_TIME_SLACK_SECONDS = 1.0
# Upstream warnings quote label values (a duplicate series, a TRT-LLM value): each is cut to
# this many characters; a target logs each once, remembering WARNINGS_REMEMBERED as 16-byte
# digests (~100 KB), then counts new ones (..._exporter_warnings_suppressed_total), unlogged.
MAX_WARNING_CHARS = 1000
WARNINGS_REMEMBERED = 1000
# Samples of the spec-decode families read per engine held, at most: k positions and a few
# counters (vLLM V1 has four). A parse stops past max_series_per_target x this (the rest could
# not be held anyway): a hostile payload's parse time and memory are bounded (parser.parse).
MAX_SAMPLES_PER_ENGINE = MAX_K + 8
# An engine's per-request histogram buckets, at most (vLLM's: 21; each poll's copy is kept for an hour).
MAX_REQUEST_HISTOGRAM_BUCKETS = 64
# A vLLM target's /v1/models (what each served name serves: baselines.find_profile) is read on the first
# poll, after a restart, on a new model name, and this often; its answer is capped (64 models fit).
VLLM_PRODUCERS = ("vllm-v1", "vllm-v0")
SERVED_MODELS_REFRESH_SECONDS = 300.0
MAX_SERVED_MODELS_BYTES = 1024 * 1024
# Where a payload is parsed, per target by its own cost (parse_pool.read): on the event loop
# while its parses cost under PARSE_ON_LOOP_SECONDS (a real TP=8/DP=8 payload, 0.36 MB: ~0.6 ms)
# and it is at most PARSE_ON_LOOP_MAX_BYTES (not yet measured: PARSE_IN_WORKER_BYTES); otherwise
# in a worker process, so /healthz and /metrics answer while a 32 MiB payload is read (linear
# time, parser.py). A parse over the cost keeps the target off the loop for PARSE_HEAVY_HOLD_SECONDS:
# a hostile target stalls the loop for one parse (~30 ms at 256 KiB of new series), not every poll.
PARSE_IN_WORKER_BYTES = 256 * 1024
PARSE_ON_LOOP_MAX_BYTES = 512 * 1024  # 512 KiB of new series: 80-100 ms on the loop, once
PARSE_ON_LOOP_SECONDS = 0.01
# ... by one of two processes: a target whose payload is over PARSE_BIG_BYTES, or whose last
# parse took over PARSE_BUDGET_SECONDS, parses in the heavy one for PARSE_HEAVY_HOLD_SECONDS, the
# others in the light one: a real server's payload never waits behind a hostile target's.
PARSE_BIG_BYTES = 4 * 1024 * 1024
PARSE_BUDGET_SECONDS = 0.25
PARSE_HEAVY_HOLD_SECONDS = 300.0
# A parse that takes longer (the worker died, or the machine is starved) fails the
# poll as result="error" and the worker process is replaced. Counts the parse alone, not
# its wait for the process.
PARSE_TIMEOUT_SECONDS = 120


class Arithmetic(Protocol):
    """What the shared threshold formulas below compute with: a float in the sidecar, a PromQL expression in
    the rule generator (rules/context.py Expr): the alerts' PromQL comes from the definition the sidecar uses."""

    def __sub__(self, other: int, /) -> Self: ...
    def __radd__(self, other: int, /) -> Self: ...
    def __mul__(self, other: Self, /) -> Self: ...
    def __truediv__(self, other: Self, /) -> Self: ...


N = TypeVar("N", bound=Arithmetic)


# The 'collapsed' and 'degraded' thresholds: ONE definition each, read by the sidecar's health
# (Detection), its status page and the demo, and rendered as PromQL in the alerts
# (AcceptanceCollapsed*, AcceptanceBelowBaseline, FirstPositionAcceptanceLow) and the dashboards.
def collapse_floor(margin: N) -> N:
    """The mean acceptance length under which a model is collapsed: 1 + ``margin``."""
    return 1 + margin


def degraded_gain(fraction: N, profile_al: N) -> N:
    """The speculative gain (AL - 1) under which a model is degraded: ``fraction`` of its profile's."""
    return fraction * (profile_al - 1)


def degraded_floor(fraction: N, profile_al: N) -> N:
    """The mean acceptance length under which a model is degraded: 1 + its degraded gain."""
    return 1 + degraded_gain(fraction, profile_al)


def position0_share(fraction: N, profile_al: N, k: N) -> N:
    """The least position-0 acceptance of a model its profile (AL ``profile_al`` at ``k``) calls
    healthy: AL - 1 <= k x position 0, so a degraded gain / k (Detection.position0_floor_under)."""
    return degraded_gain(fraction, profile_al) / k


# --- Detection: ONE set of thresholds, read by the sidecar's health (health.py) and by
# the generated alerts (rules.py). The YAML config's `health:` keys and the Helm chart's
# `config.health` use these very names; each value is reasoned from public healthy and
# broken DeepSeek-V4 figures, quoted below (docs/alerts.md's detection table names them). ---
@dataclass(frozen=True, slots=True)
class Detection:
    # The window every verdict is taken over (the health window; the alerts' 5m rates).
    window: str = "5m"
    # Traffic floor, per model and per engine: below it a window is `idle`, never
    # judged. 1 draft/s is 300 drafts in 5m, where one accepted token moves acceptance
    # by 0.3 point at most; one request decoding at 50 tok/s already makes ~20 drafts/s.
    min_drafts_per_second: float = 1.0
    # Collapsed: AL - 1 below this (critical). 0.10 puts every broken figure that is a
    # real collapse below it -- the broken MTP head (AL 1.03-1.04), the mis-wired k=3
    # layer (1.09) -- and every healthy figure above it, including V4-Flash on
    # random-token benchmark prompts (AL 1.19-1.21): synthetic load never pages.
    collapse_margin: float = 0.10
    # Degraded (k-independent): position 0's acceptance (per_pos[0] / drafts) below
    # this. Position 0 does not depend on k and is the first thing a broken draft head
    # destroys. Healthy: >= 0.66 (V4-Flash k=1 on its worst workload; V4-Pro 0.92, fixed
    # V4-Flash 0.70, V3 paper 0.85-0.90). Broken partial degradations: <= 0.33 (AL - 1
    # bounds position 0 from above: the sampling bug 0.149, missing draft context AL
    # <= 1.32, MTP-3 at 1.2, a k=7 drafter at 1.31). 0.5 sits between with a 1.3x
    # margin on the healthy side and 1.5x on the broken side.
    position0_floor: float = 0.5
    # Degraded (against a profile): the speculative gain AL - 1 below this fraction of
    # the matched profile's. Profiles hold the LOWEST healthy figure of their model and
    # k; workload alone moves AL by ~15 % above it (V4-Flash k=2 on code: 2.35 to
    # 2.70), so 0.75 leaves room and still catches the k=2 sampling bug (AL 1.21 against
    # a threshold of 1 + 0.75 x 0.99 = 1.74).
    degraded_fraction: float = 0.75
    # Degraded (one engine): an engine's gain below this fraction of its model's gain
    # on the same target. Data-parallel engines share traffic and weights: healthy
    # engines differ by noise (~5 %); a rank at the broken-head figures among seven
    # healthy ones has a gain of 0.036 against 1.41.
    engine_lag_fraction: float = 0.75
    # What drafting one token adds to a decode step, as a share of a plain step (the draft pass
    # and verifying one more token): below AL = 1 + draft_step_cost x k, speculative decoding is
    # slower than none (capacity.py). 0.05: DeepSeek-V3's MTP at k=1 (85-90 % acceptance, AL
    # 1.85-1.90) decoded 1.8x as fast, so a step cost 1.03-1.06 plain steps; a draft model costs more.
    draft_step_cost: float = 0.05
    # Drafts a window needs before it is judged or gets ratio gauges (the YAML config's
    # top-level `min_drafts`, not a `health:` key).
    min_drafts: int = DEFAULT_MIN_DRAFTS

    def position0_floor_under(self, profile_al: float, k: int) -> float:
        """Position 0's floor where a profile (AL ``profile_al`` at ``k``) matches: AL - 1 <= k x
        position 0, so a model the profile calls healthy (gain >= degraded_fraction x the
        profile's) has position 0 >= degraded_fraction x (profile AL - 1) / k; at most
        position0_floor. The V4-Flash k=7 profile (1.99) allows 0.106, V4-Pro k=2 (2.27) 0.476.
        FirstPositionAcceptanceLow's PromQL is generated from the same formula (position0_share)."""
        return min(self.position0_floor, position0_share(self.degraded_fraction, profile_al, float(k)))

    def degraded_gain_under(self, profile_al: float) -> float:
        """The gain (AL - 1) under which a model whose profile's AL is ``profile_al`` is degraded."""
        return degraded_gain(self.degraded_fraction, profile_al)

    def degraded_floor_under(self, profile_al: float) -> float:
        """The AL under which a model whose profile's AL is ``profile_al`` is degraded (AcceptanceBelowBaseline's)."""
        return degraded_floor(self.degraded_fraction, profile_al)


DETECTION = Detection()

# --- Diagnosis: the likely cause of a fall, from the same counters (health.diagnose). A hint,
# never a certainty: where two causes fit, both are named. Figures from baselines.md. ---
CAUSES = (
    "draft_head_garbage",
    "draft_head_partial",
    "chain_break",
    "draft_shorter_than_k",
    "one_rank",
    "configuration_change",
    "workload_shift",
    "too_good",
)
# Draft head garbage: position 0 accepted in under 10 % of drafts on EVERY engine. Broken:
# the bad MTP conversion 3.6 % (235 / 6590), the mis-wired k=3 layer 7 %. Not broken: the
# lowest is random-token load at 14.9 % (healthy real traffic >= 66 %).
DIAG_GARBAGE_POSITION0 = 0.10
# Chain break: position 0 not garbage (>= DIAG_GARBAGE_POSITION0) but a later position's
# conditional acceptance under 10 %, whether or not the verdict fell. Healthy conditionals:
# V4-Pro 0.743 at position 1, the golden curves >= 0.2 up to k=5; a draft trained for 1
# step (or a mis-wired later layer) gives ~0 beyond it. A position at exactly 0 is not a
# break but a draft shorter than k (DSpark's 5-token block at k=7), or k lowered (diff).
DIAG_CHAIN_BREAK_CONDITIONAL = 0.10
# A workload shift needs a fall seen over time: AL - 1 over the health window below this
# fraction of the longest window's, with no restart or k change (the Dropped alert's 40 %).
DIAG_FALL_FRACTION = 0.6
# A drift, named as a hint and never a fall (no verdict, no alert): every position lower together
# and the gain below this fraction of the earlier figure at the same k. Workload alone moves AL by
# ~15 % (V4-Flash k=2 on code: 2.35 to 2.70), so less is the mix; more is worth naming, beside
# the restart it began with if one is in sight (an upgrade's drift: 74.15 % -> 57.80 % at k=3,
# the gain at 78 %). Not a verdict: a traffic mix moves the gain by up to ~31 %.
DIAG_DRIFT_FRACTION = 0.85
# Positions accepted in exactly 0 drafts name a draft shorter than k only when at least this
# many drafts reached the first of them (a real DSpark k=7 run: ~20 % of drafts reach
# position 5; behind a broken head 16 of 550 did, and zeros there are its consequence).
DIAG_MIN_REACHED = 50
# A position 0 under the floor is a fall (degraded, warns) only against a matched profile or
# when it was at or above the floor within this long (the alert's max_over_time(...[1d]));
# low from the start with neither, a weak drafter and a partly broken one look the same.
POSITION0_LOOKBACK_SECONDS = 86400.0
# Too good to be true: acceptance above this (the SuspiciouslyHigh alert's 98 %): repetition
# loops, a broken detector or broken metrics. No real workload in baselines.md exceeds 96 %.
DIAG_TOO_GOOD_ACCEPTANCE = 0.98
# The names shared by config.yaml's `health:`, Helm's `config.health` and rules.py.
DETECTION_KEYS = tuple(k for k in Detection.__dataclass_fields__ if k != "min_drafts")

# --- Health (vllm_specdec_health, a StateSet). ok: judged and fine against a profile; unknown:
# nothing wrong on the k-independent signals but no profile to compare with, or broken invariants. ---
HEALTH_STATES = ("ok", "degraded", "collapsed", "idle", "unknown")

# --- What the sidecar exports (public contract) ---
PREFIX = "vllm_specdec"
LABEL_TARGET = "target"
LABEL_WINDOW = "window"
LOG_FORMATS = ("auto", "json", "console")
LOG_LEVELS = ("debug", "info", "warning", "error")
ENV_PREFIX = "VLLM_SPECDEC_EXPORTER_"
REVISION_ENV = ENV_PREFIX + "REVISION"  # the image build's, not a setting (exporter_build_info)

# --- The sidecar's own server: slow and hostile clients (docs/security.md) ---
# A new connection must finish its TLS handshake and first request headers in this
# long (Prometheus sends them in one packet); then an idle keep-alive connection may
# wait this long for its next complete request (above Prometheus's 1m default scrape
# interval, so scrapes reuse their connection).
HEADER_TIMEOUT_SECONDS = 5.0
IDLE_TIMEOUT_SECONDS = 75.0
# Concurrent connections; also kept below the open-file limit minus a reserve for
# polls and files, so accept() never runs out of descriptors. At the cap a connection
# that was served is closed first, so a probe gets in (server.py's docstring says the order).
MAX_CONNECTIONS = 512
FD_RESERVE = 64
# Connections asyncio accepts per loop tick. An accepted socket reaches the cap's check a tick
# later and an evicted one frees its descriptor a tick after that: three batches are in the budget.
ACCEPT_BATCH = 16
ACCEPT_ERROR_LOG_INTERVAL_SECONDS = 10.0
# Basic auth: bcrypt (~0.1 s at cost 10) on this many threads, off the event loop;
# successful checks cached (LRU) so scrapes do not pay it each time.
BCRYPT_WORKERS = 1
AUTH_CACHE_SIZE = 100
# The web config and the files it names are looked at no more often than this.
WEB_CONFIG_CHECK_SECONDS = 1.0

# --- Recording rules and alerts (alerts/*.yaml are generated from these) ---
# Windows the rules record; the key is the name suffix, the value the PromQL range.
RULE_WINDOWS = ("5m", "30m", "1h")
# Fleet labels, outermost first, kept at every level of the recording rules (in
# the spirit of kubernetes-mixin's clusterLabel; the generator takes others).
# Summing by a label that a series lacks is a no-op, so a single-cluster setup
# without a `cluster` label loses nothing. The sidecar variant also keeps `target`
# at every level: two vLLM servers behind one exporter never merge.
CLUSTER_LABEL = "cluster"
NAMESPACE_LABEL = "namespace"
POD_LABEL = "pod"
# Alerts fire per vLLM server (the pod level): a collapse on one replica is a real
# problem even when nine healthy ones would hide it in a fleet-wide ratio.
ALERT_LEVEL = "namespace_pod_model_name"
# Positions a generated rule covers (conditional and "last position" rules need
# one clause per position: PromQL cannot do arithmetic on label values). Not a second
# limit on k (MAX_K is the one): a target with a larger k is read, judged and exported,
# and the sidecar warns once that the wasted-tokens alert cannot fire for it.
MAX_SPECULATIVE_TOKENS = 8
assert MAX_SPECULATIVE_TOKENS <= MAX_K
# Ratio alerts need traffic: DETECTION.min_drafts_per_second (the same floor as health).
ALERT_MIN_GENERATION_TOKENS_PER_SECOND = 1.0
# How long each verdict must hold before its alert fires. Collapsed (critical): 10m,
# two full 5m windows, so one bad batch never pages. The warnings: 15m.
ALERT_COLLAPSE_FOR = "10m"
# The fast page (VLLMSpecDecodeAcceptanceCollapsedFast): the same AL < 1 + collapse_margin,
# over ALERT_FAST_COLLAPSE_RANGE, only with at least ALERT_FAST_COLLAPSE_MIN_DRAFTS_PER_SECOND,
# for ALERT_FAST_COLLAPSE_FOR: about 4 minutes from onset at a 1m evaluation interval. 10
# drafts/s x 2m = 1,200 drafts. AL - 1 >= position 0's share, so a window reads AL < 1.1 only
# if under 10 % of its drafts accepted position 0; the lowest non-broken position 0 in
# baselines.md is random-token benchmark load (0.149, AL 1.19-1.21; real traffic: >= 0.66).
# Binomial (Chernoff) bound: P(share < 0.10 | p = 0.149, n = 1,200) <= exp(-n KL(0.10 || 0.149))
# = exp(-1200 x 0.0105) = 3e-6 per window; at 100 drafts/s (12,000 drafts) e-126. The broken
# head (p = 0.036) reads >= 0.10 with P <= exp(-1200 x 0.0403) = e-48. Below the floor the
# slow path (5m, for 10m) still pages. The range must hold >= 2 scrapes (scrape interval <= 1m).
ALERT_FAST_COLLAPSE_RANGE = "2m"
ALERT_FAST_COLLAPSE_FOR = "2m"
ALERT_FAST_COLLAPSE_MIN_DRAFTS_PER_SECOND = 10.0
ALERT_ENGINE_COLLAPSE_FOR = "10m"
ALERT_BELOW_BASELINE_FOR = "15m"
ALERT_POSITION0_FOR = "15m"
ALERT_ENGINE_LAG_FOR = "15m"
# Dropped: the speculative gain (AL - 1) over 5m more than this fraction below the model's best
# hour of the day at the same k. Workload alone moves the gain by up to ~31 % (V4-Flash k=1:
# acceptance 0.66 to 0.96 by workload; V4-Pro thinking on against off: 21-24 % at k=2..3), so
# 0.4 stays beyond it; a collapse is ~95 %. Held for 3m (8 minutes of evidence with the 5m
# window; at 1 draft/s the 5m AL moves by ~0.05, a tenth of the margin): a slow fall (AL 2.61 ->
# 1.80 over 30 minutes) is warned 29 minutes after it began, a sudden one within 7.
ALERT_DROP_FRACTION = 0.4
ALERT_DROPPED_FOR = "3m"
# Dropped judges a server once its k has held this long: a new pod's warm-up requests (AL ~1.3 on
# random prompts) had every new pod warn. A head broken from the start waits as long (not the pages).
ALERT_DROPPED_SETTLE = "10m"
# Shifted: a rollout's newcomers (servers that came or changed k within the hour, once their k has
# held for the shift window: no warm-up, no blend of two k) with a gain over the shift window more
# than this fraction below the settled servers' over the same window (once those are gone, their
# last within the hour), at the same k. The gate, not the threshold, keeps workload out: the same
# traffic at the same time, so the spread is a healthy server's rank to rank (~5 %, the DP noise
# of the tests), not the workload's 31 %. An upgrade drift of every position (74.15 % -> 57.80 %
# at k=3: the gain 22 % lower) reads 1.5x over it; three times the healthy spread under it.
ALERT_SHIFT_FRACTION = 0.15
ALERT_SHIFT_WINDOW = "15m"
# The settled servers are "the same traffic at the same time" while they serve at least this share
# of the newcomers' drafts: the last old pod of ten in a rolling update still counts (1/9), and so
# do settled pods serving under the reference floor at night; a blue/green's old pods left with
# health checks (1.5 drafts/s against 33: helper-43) do not, and the newcomers are then compared
# with the settled figure they left at the reference floor within the hour.
ALERT_SHIFT_SETTLED_MIN_SHARE = 0.1
ALERT_SHIFTED_FOR = "10m"
# A server is settled over a range (the reference's full hour, the shift window's newcomers) once
# its k was recorded at this share of the long group's evaluations over it: a pod down for more
# than the rest (a tenth: 6 minutes of an hour) comes back as a newcomer.
ALERT_RECORDED_SHARE = 0.9
# An hour becomes the healthy reference only as a full hour of one server at one k with
# production traffic: at least this many drafts/s (one request decoding at 50 tok/s makes ~20).
# A warm-up's first minutes, or a night's trickle of easy requests, are not the model's figure.
ALERT_REFERENCE_MIN_DRAFTS_PER_SECOND = 10.0
# Chain broken: position 1 accepted in under this share of the drafts whose position 0 was
# accepted, with position 0 healthy. Healthy: 0.41 or more (the fixed V4-Flash k=2 sampling at
# temperature 1.0: 0.29 / 0.70; V4-Pro 0.74; the golden curves 0.61-0.80); broken: SGLang's
# DeepSeek-V4 MTP k=3 chain bug 0.25 (.223 / .894; healthy .710 / .999). 0.3 sits between
# (1.4x margin on the healthy side, 1.2x on the broken side).
ALERT_CHAIN_CONDITIONAL_FLOOR = 0.3
ALERT_CHAIN_BROKEN_FOR = "15m"
ALERT_NOT_DRAFTING_FOR = "10m"
# Target down. vLLM refuses connections while it loads weights (DeepSeek-V4: 10-30
# min), so "connection refused" or a timeout is a reload until it lasts longer than
# any reload: fires after TARGET_UNREACHABLE_AFTER. An answer that is wrong (an HTTP
# error such as 401/403/404, a body that is not Prometheus text, a payload over the
# cap, a bad URL) is a misconfiguration that no waiting fixes: fires after
# ALERT_TARGET_DOWN_FOR (about 5-6 min from onset, within 10).
TARGET_MISCONFIGURED_RESULTS = ("http_error", "not_prometheus", "too_large", "invalid_url", "error")
TARGET_UNREACHABLE_AFTER = "30m"
ALERT_TARGET_DOWN_FOR = "5m"
ALERT_EXPORTER_ABSENT_FOR = "10m"
# Inconsistent target: over 10m, inconsistent engine polls reach this share of the
# successful polls (two servers alternating behind one URL give every other poll,
# ~0.5: the margin keeps that case above it; one engine of eight always gives 1):
# its figures are not counted, so a collapse there is invisible. A real glitch is one
# poll in hours; a restart is not an inconsistent poll.
TARGET_INCONSISTENT_SHARE = 0.4
TARGET_INCONSISTENT_WINDOW = "10m"
ALERT_TARGET_INCONSISTENT_FOR = "10m"
# Wasted: the last draft position accepted in fewer than 5 % of drafts over 1h:
# it adds < 0.05 to the acceptance length while costing a full draft token.
ALERT_WASTED_POSITION_RATE = 0.05
ALERT_WASTED_FOR = "30m"
# Suspiciously high: > 98 % over 30m goes with repetition loops.
ALERT_HIGH_ACCEPTANCE_RATE = DIAG_TOO_GOOD_ACCEPTANCE
ALERT_HIGH_FOR = "5m"
ALERT_INVARIANT_FOR = "0m"
# The sidecar counts its invariant violations; its alert reads their increase over this window.
ALERT_INVARIANT_WINDOW = "10m"
# No baseline (info, sidecar): a model drafting with no profile found by its served name,
# its /v1/models root or an alias. Not a fault but a blind spot: a head partly broken from
# the start reads as healthy until a day of history exists. Said once it has lasted
# through a deployment's first half hour, so a profile set right after it stays silent.
ALERT_NO_BASELINE_FOR = "30m"
# Per-request extremes (info; vLLM PR #44487's histogram): more than this share of the
# requests finished over the window at or below REQUEST_ACCEPTANCE_LOW, or above
# REQUEST_ACCEPTANCE_HIGH, with at least this many finished. Not yet calibrated on real
# traffic: no vLLM release has the histogram.
ALERT_REQUEST_EXTREMES_SHARE = 0.1
ALERT_REQUEST_EXTREMES_MIN_REQUESTS = 20
ALERT_REQUEST_EXTREMES_WINDOW = "1h"  # a recorded window (RULE_WINDOWS) and a sidecar default window
# The recorded windows the other alerts read (each must be one of RULE_WINDOWS: generation
# fails on a rule that reads a series no rule records): AcceptanceDropped and
# AcceptanceSuspiciouslyHigh over the trend window; SpeculativeTokensWasted, NotDrafting's
# history and the day-long baseline (the mean of hourly rates) over the hourly window.
ALERT_TREND_WINDOW = "30m"
ALERT_HOURLY_WINDOW = "1h"
ALERT_REQUEST_EXTREMES_FOR = "15m"
RUNBOOK_BASE_URL = "https://github.com/vllm-specdec-exporter/vllm-specdec-exporter/blob/main/alerts/runbook.md"
DASHBOARD_URL = ""  # optional; when set, alerts carry a dashboard_url annotation
# Selector added to every series a rule reads (e.g. 'job="vllm-specdec-exporter"'),
# so that a pod scraped by two jobs is not counted twice.
RULE_SELECTOR = ""
