"""What the settings build (Settings, Target) and the tables their keys are checked against:
the numeric limits and the keys of each mapping in the config file."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from .. import config
from ..model import BaselineProfile

_NAME_RE = re.compile(r"[A-Za-z0-9_.-]{1,64}")  # a target's name (the Helm schema's pattern is generated from it)


@dataclass(frozen=True, slots=True)
class Limit:
    """The valid range of one numeric key, both ends included."""

    low: float
    high: float
    integer: bool = False


# The one table of numeric limits, by config key ("[]": each item of a list). build_settings
# checks every one of these keys against it, and the Helm chart's values.schema.json is
# generated from it (generators/schema.py, `make generate`; tests check both for drift), so
# the chart refuses what the exporter would refuse at start-up.
LIMITS: dict[str, Limit] = {
    "min_drafts": Limit(1, 1e12, integer=True),
    "max_payload_bytes": Limit(1024, 1 << 31, integer=True),
    "max_series_per_target": Limit(1, 1e6, integer=True),
    "health.min_drafts_per_second": Limit(0.0, 1e9),
    "health.collapse_margin": Limit(0.0, 1.0),
    "health.position0_floor": Limit(0.0, 1.0),
    "health.degraded_fraction": Limit(0.0, 1.0),
    "health.engine_lag_fraction": Limit(0.0, 1.0),
    "health.draft_step_cost": Limit(0.0, 0.5),  # at 1 a step of k drafts would need AL k + 1 to pay
    "baselines.profiles[].k": Limit(1, config.MAX_K, integer=True),
    # AL = 1 + accepted / drafts <= k + 1 (checked per profile too).
    "baselines.profiles[].mean_acceptance_length": Limit(1.0, config.MAX_K + 1),
}
TARGET_KEYS = ("name", "url", "method", "bearer_token_file", "producer", "model", "k", "profile")
PROFILE_KEYS = ("name", "model", "k", "method", "mean_acceptance_length")
PROFILE_REQUIRED = ("name", "model", "k", "mean_acceptance_length")
TOP_KEYS = (
    "targets",
    "web",
    "poll",
    "windows",
    "min_drafts",
    "staleness",
    "max_payload_bytes",
    "max_series_per_target",
    "health",
    "baselines",
    "log",
)
# Keys renamed when flags and keys were made to map one way: a one-line error names the new key.
RENAMED = {"listen_address": "web.listen_address", "web_config_file": "web.config.file"}


@dataclass(frozen=True, slots=True)
class Target:
    name: str
    url: str
    method: str | None = None  # mtp, eagle3, dspark, ...: vLLM does not expose it
    bearer_token_file: str | None = None
    producer: str | None = None  # one of adapters.PRODUCERS; None: detected from each payload
    # What the deployment runs, from its own arguments (the Helm chart passes them), and a profile named outright.
    model: str | None = None  # vLLM's --model (HF id or weights path): matched as /v1/models' root where that names none
    k: int | None = None  # num_speculative_tokens: a named profile must be for it
    profile: str | None = None  # a baseline profile's name: used instead of matching one (baselines.find_profile)


@dataclass(frozen=True, slots=True)
class Settings:
    targets: tuple[Target, ...]
    listen_host: str
    listen_port: int
    poll_interval: float
    poll_timeout: float
    max_backoff: float
    windows: tuple[tuple[str, float], ...]  # (label, seconds), shortest first
    staleness: float
    max_payload_bytes: int
    max_series_per_target: int
    # The health: keys (same names as the rules generator's thresholds) and min_drafts.
    detection: config.Detection
    baselines: tuple[BaselineProfile, ...]
    log_format: str
    log_level: str
    web_config_file: str | None = None  # TLS / basic auth, exporter-toolkit format
    # Served model name -> the name baseline profiles are matched against
    # (e.g. --served-model-name DSV4-W4A16-FP8-MTP -> deepseek-ai/DeepSeek-V4-Pro).
    profile_aliases: Mapping[str, str] = field(default_factory=dict)
    # How many of the config file's targets --vllm.url (or its variable, then named here) replaced:
    # serve says so in its log.
    file_targets_replaced: int = 0
    file_targets_replaced_by: str = "--vllm.url"

    @property
    def methods_without_profile(self) -> dict[str, str]:
        """Targets whose declared method no profile is for (a typo, or a method with no
        shipped baseline), by name: their models get none."""
        known = {p.method for p in self.baselines}
        return {t.name: t.method for t in self.targets if t.method is not None and None not in known and t.method not in known}

    @property
    def health_window(self) -> str:
        return self.detection.window

    @property
    def min_drafts(self) -> int:
        return self.detection.min_drafts

    @property
    def listen_address(self) -> str:
        return f"{self.listen_host or ''}:{self.listen_port}"
