"""The sidecar's settings: flags > VLLM_SPECDEC_EXPORTER_* environment > YAML file > defaults.

Every error names the key and what would be valid; ``serve`` exits 2 on one
before binding anything.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from importlib import resources
from typing import Any
from urllib.parse import urlsplit

from . import config
from .adapters import PRODUCERS
from .errors import ConfigError, clip, shown, shown_key
from .health import named_profile
from .model import BaselineProfile
from .sources import redact_url

_NAME_RE = re.compile(r"[A-Za-z0-9_.-]{1,64}")  # a target's name (the Helm schema's pattern is generated from it)
CONFIG_MAX_DEPTH = 32  # YAML nesting: the deepest real key (baselines.profiles[i].model) is 4 levels down


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
    "baselines.profiles[].k": Limit(1, config.MAX_K, integer=True),
    # AL = 1 + accepted / drafts <= k + 1 (checked per profile too).
    "baselines.profiles[].mean_acceptance_length": Limit(1.0, config.MAX_K + 1),
}
TARGET_KEYS = ("name", "url", "method", "bearer_token_file", "producer", "model", "k", "profile")
PROFILE_KEYS = ("name", "model", "k", "method", "mean_acceptance_length")
PROFILE_REQUIRED = ("name", "model", "k", "mean_acceptance_length")


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
    profile: str | None = None  # a baseline profile's name: used instead of matching one (health.find_profile)


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

    @property
    def health_window(self) -> str:
        return self.detection.window

    @property
    def min_drafts(self) -> int:
        return self.detection.min_drafts

    @property
    def listen_address(self) -> str:
        return f"{self.listen_host or ''}:{self.listen_port}"

    def window_seconds(self, label: str) -> float:
        return dict(self.windows)[label]


# --- small validators, each raising ConfigError(key, ...) ---


def _duration(key: str, value: Any) -> float:
    try:
        return config.parse_duration(value)
    except ValueError as e:  # its message quotes the value whole: quoted here as every other one
        raise ConfigError(key, str(e).replace(repr(value), shown(value), 1)) from None


def canonical_duration(seconds: float) -> str:
    """The one spelling of a duration: the largest unit that divides it (300 -> '5m', 90 -> '90s')."""
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    return f"{seconds * 1000:g}ms"


def _limited(key: str, value: Any, limit_key: str | None = None) -> float:
    """``value`` checked against LIMITS[limit_key or key]; errors name ``key``."""
    limit = LIMITS[limit_key or key]
    return _number(key, value, limit.low, limit.high, limit.integer)


def _number(key: str, value: Any, low: float, high: float, integer: bool = False) -> float:
    kind = "an integer" if integer else "a number"
    if isinstance(value, bool) or not isinstance(value, int if integer else (int, float)):
        raise ConfigError(key, f"{shown(value)} is not {kind} (valid: {low:g} to {high:g})")
    if not low <= value <= high:
        raise ConfigError(key, f"{shown(value)} is out of range (valid: {low:g} to {high:g})")
    return value


def _choice(key: str, value: Any, choices: Sequence[str]) -> str:
    if value not in choices:
        raise ConfigError(key, f"{shown(value)} is not one of {', '.join(choices)}")
    return str(value)


def _mapping(key: str, value: Any, allowed: Sequence[str]) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ConfigError(key, f"expected a mapping with keys {', '.join(allowed)}")
    for k in value:
        if k not in allowed:
            raise ConfigError(f"{key}.{shown_key(k)}" if key else shown_key(k), f"unknown key (valid: {', '.join(allowed)})")
    return value


def _url(key: str, value: Any) -> str:
    if not isinstance(value, str):
        raise ConfigError(key, f"{shown(value)} is not a URL")
    try:
        parts = urlsplit(value)
        ok = parts.scheme in ("http", "https") and bool(parts.hostname) and parts.port != 0  # ports 1-65535
    except ValueError:  # e.g. http://[::1/ or a port over 65535
        ok = False
    if not ok:  # redacted: the URL may carry a password
        raise ConfigError(
            key, f"{shown(redact_url(value))} is not an http(s) URL with a host (e.g. http://127.0.0.1:8000/metrics)"
        )
    return value


def parse_listen_address(key: str, value: Any) -> tuple[str, int]:
    if not isinstance(value, str) or ":" not in value:
        raise ConfigError(key, f"{shown(value)} is not HOST:PORT or :PORT (e.g. {config.DEFAULT_LISTEN_ADDRESS})")
    host, _, port = value.rpartition(":")
    host = host.strip("[]")
    if not (port.isascii() and port.isdigit() and len(port) <= 5) or not 0 <= int(port) <= 65535:
        raise ConfigError(key, f"{shown(value)}: port must be 1-65535 (or 0: any free port)")
    return host, int(port)


def _targets_from_urls(key: str, urls: Sequence[str]) -> list[dict[str, str]]:
    """'URL' or 'NAME=URL' per entry; one unnamed target is called 'vllm'."""
    out = []
    for i, entry in enumerate(urls):
        name, sep, url = entry.partition("=")
        if not sep or "://" in name:
            name, url = (config.DEFAULT_TARGET_NAME if len(urls) == 1 else f"{config.DEFAULT_TARGET_NAME}-{i}"), entry
        out.append({"name": name, "url": url})
    return out


def _deployment(key_of: Callable[[str], str], raw: Mapping[str, Any]) -> dict[str, Any]:
    """A target's method, model, k and profile where given, checked (a profile's name against
    the profiles by _named); ``key_of`` names a key in errors."""
    out: dict[str, Any] = {}
    method = raw.get("method")
    if method is not None and not isinstance(method, str):
        raise ConfigError(key_of("method"), f"{shown(method)} is not a string (e.g. mtp, eagle3)")
    for key, what in (("model", "vLLM's --model: an HF id or a weights path"), ("profile", "a baseline profile's name")):
        value = raw.get(key)
        if value is not None and (not isinstance(value, str) or not 0 < len(value) <= config.MAX_LABEL_VALUE_LENGTH):
            raise ConfigError(
                key_of(key), f"{shown(value)} is not a string of 1 to {config.MAX_LABEL_VALUE_LENGTH} characters ({what})"
            )
        out[key] = value
    k = raw.get("k")
    return {**out, "method": method, "k": None if k is None else int(_limited(key_of("k"), k, "baselines.profiles[].k"))}


def _named(key: str, target: Target, profiles: Sequence[BaselineProfile]) -> None:
    """A profile named outright exists, and is for the target's k and method where declared."""
    if target.profile is None:
        return
    p = named_profile(profiles, target.profile)
    if p is None:
        known = ", ".join(dict.fromkeys(q.name for q in profiles)) or "none"
        raise ConfigError(key, f"{shown(target.profile)} is not a baseline profile (known: {clip(known, 1000)})")
    if target.k is not None and p.k != target.k:
        raise ConfigError(key, f"{p.name} is for k={p.k}, the target's k is {target.k}: name the profile for k={target.k}")
    if not p.fits(p.k, target.method):  # matching's rule for the method
        raise ConfigError(key, f"{p.name} is for method {p.method}, the target's method is {target.method}")


def _target(key: str, raw: Any) -> Target:
    raw = _mapping(key, raw, TARGET_KEYS)
    if "url" not in raw:
        raise ConfigError(f"{key}.url", "missing (an http(s) URL of vLLM's /metrics)")
    name = raw.get("name", config.DEFAULT_TARGET_NAME)
    if not isinstance(name, str) or not _NAME_RE.fullmatch(name):
        raise ConfigError(f"{key}.name", f"{shown(name)} is not 1-64 of A-Z a-z 0-9 _ . -")
    token_file = raw.get("bearer_token_file")
    if token_file is not None and not isinstance(token_file, str):
        raise ConfigError(f"{key}.bearer_token_file", "must be a file path")
    producer = raw.get("producer")
    if producer is not None and producer not in PRODUCERS:
        raise ConfigError(
            f"{key}.producer",
            f"{shown(producer)} is not a known producer (one of {', '.join(PRODUCERS)}; leave it out to detect it)",
        )
    deployment = _deployment(lambda k: f"{key}.{k}", raw)
    return Target(name, _url(f"{key}.url", raw["url"]), bearer_token_file=token_file, producer=producer, **deployment)


def _profile(key: str, raw: Any) -> BaselineProfile:
    raw = _mapping(key, raw, PROFILE_KEYS)
    for required in PROFILE_REQUIRED:
        if required not in raw:
            raise ConfigError(f"{key}.{required}", "missing")
    try:
        pattern = re.compile(_safe_pattern(f"{key}.model", str(raw["model"])))
    except re.error as e:
        raise ConfigError(f"{key}.model", f"{shown(raw['model'])} is not a regular expression: {clip(str(e))}") from None
    k = int(_limited(f"{key}.k", raw["k"], "baselines.profiles[].k"))
    al = float(
        _limited(f"{key}.mean_acceptance_length", raw["mean_acceptance_length"], "baselines.profiles[].mean_acceptance_length")
    )
    if al > k + 1:
        raise ConfigError(f"{key}.mean_acceptance_length", f"{al:g} exceeds k+1={k + 1}")
    return BaselineProfile(str(raw["name"]), pattern, k, al, raw.get("method"))


def _aliases(key: str, raw: Any) -> dict[str, str]:
    if raw is None:
        return {}
    if not isinstance(raw, Mapping) or not all(isinstance(k, str) and isinstance(v, str) for k, v in raw.items()):
        raise ConfigError(
            key,
            "expected a mapping of served model name to the model name profiles match, "
            "e.g. {DSV4-W4A16-FP8-MTP: deepseek-ai/DeepSeek-V4-Pro}",
        )
    return dict(raw)


def _safe_pattern(key: str, text: str) -> str:
    """Refuse patterns that can backtrack catastrophically against a hostile model name:
    a repeat inside a repeat ((a+)+), a repeated alternation ((a|a)*), or more than
    three open-ended repeats (.*.*.*.*: polynomial). Names are capped at
    MAX_LABEL_VALUE_LENGTH, so what is left matches in well under a millisecond."""
    # Python's own pattern parser: private modules typeshed does not describe.
    from re import _constants as c  # type: ignore[attr-defined]
    from re import _parser  # type: ignore[attr-defined]

    repeats = (c.MAX_REPEAT, c.MIN_REPEAT, getattr(c, "POSSESSIVE_REPEAT", c.MAX_REPEAT))
    count = [0]

    def walk(node: object, inside_repeat: bool) -> None:
        if isinstance(node, _parser.SubPattern):
            for op, av in node.data:
                if op in repeats and av[1] > 1:
                    if inside_repeat:
                        raise ConfigError(
                            key,
                            f"{shown(text)}: a repeat inside a repeat can take forever to match; simplify it (e.g. (a+)+ -> a+)",
                        )
                    count[0] += 1
                    walk(av[2], True)
                elif op is c.BRANCH and inside_repeat:
                    raise ConfigError(key, f"{shown(text)}: a repeated alternation can take forever to match")
                else:
                    walk(av, inside_repeat)
        elif isinstance(node, (list, tuple)):
            for item in node:
                walk(item, inside_repeat)

    walk(_parser.parse(text), False)
    if count[0] > 3:
        raise ConfigError(key, f"{shown(text)}: more than 3 open-ended repeats can take very long to match")
    return text


def default_profiles() -> list[BaselineProfile]:
    # Here, not at the top: `report FILE` builds serve's flags from this module but reads no YAML.
    from .yamlsafe import load

    text = resources.files(__package__).joinpath("data/baselines.yaml").read_text()
    raw = load(text, CONFIG_MAX_DEPTH)
    assert isinstance(raw, list), "data/baselines.yaml holds a list"
    return [_profile(f"default baselines[{i}]", p) for i, p in enumerate(raw)]


def _path(key: str, value: Any) -> str | None:
    if value is not None and (not isinstance(value, str) or not value):
        raise ConfigError(key, f"{shown(value)} is not a file path")
    return value


def load_file(path: str) -> dict[str, Any]:
    import yaml

    from .yamlsafe import Refused, load

    try:
        with open(path, encoding="utf-8") as f:
            # Without aliases: a few hundred bytes of them expanded to 10^9 strings, quoted
            # whole in an error (issue 29 item 7); a config file writes each value out.
            data = load(f, CONFIG_MAX_DEPTH)
    except FileNotFoundError:
        raise ConfigError("--config.file", f"no such file: {path}") from None
    except OSError as e:
        raise ConfigError("--config.file", f"cannot read {path}: {e.strerror}") from None
    except UnicodeDecodeError as e:
        raise ConfigError("--config.file", f"{path} is not UTF-8 text (byte {e.start})") from None
    except Refused as e:
        raise ConfigError("--config.file", f"{path}: {e.problem}") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None) or getattr(e, "context_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise ConfigError("--config.file", f"{path} is not valid YAML{where}: {clip(problem)}") from None
    except ValueError as e:  # a value PyYAML could not build: a date such as 2001-13-45, an int of 5,000 digits
        raise ConfigError("--config.file", f"{path} has a value that cannot be read: {clip(str(e))}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError("--config.file", f"{path} must hold a mapping at the top level")
    return data


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


def build_settings(file_data: Mapping[str, Any], overrides: Mapping[str, Any]) -> Settings:
    """Settings from the YAML mapping, with flag/env ``overrides`` (already picked) on top."""
    for old, new in RENAMED.items():
        if isinstance(file_data, Mapping) and old in file_data:
            raise ConfigError(old, f"renamed to {new} (the key of the --{new.replace('_', '-')} flag)")
    data = _mapping("", file_data, TOP_KEYS)
    web = _mapping("web", data.get("web"), ("listen_address", "config"))
    web_config = _mapping("web.config", web.get("config"), ("file",))
    poll = _mapping("poll", data.get("poll"), ("interval", "timeout", "max_backoff"))
    health = _mapping("health", data.get("health"), config.DETECTION_KEYS)
    log = _mapping("log", data.get("log"), ("format", "level"))
    baselines = _mapping("baselines", data.get("baselines"), ("include_defaults", "profiles", "aliases"))

    if "urls" in overrides:
        raw_targets: Any = _targets_from_urls("--vllm.url", overrides["urls"])
        target_key = "--vllm.url"
    else:
        raw_targets, target_key = data.get("targets"), "targets"
    if not raw_targets or not isinstance(raw_targets, list):
        raise ConfigError(target_key, "at least one vLLM /metrics URL is needed (--vllm.url or targets: in the file)")
    # --vllm.model, --vllm.k, ...: one key set on every target (over the file's).
    given = {key: f for f in FLAGS if (key := f.target_key) and f.dest in overrides}
    flagged = {key: _flag_value(f, overrides[f.dest]) for key, f in given.items()}
    deployment = {k: v for k, v in _deployment(lambda k: given[k].flag, flagged).items() if k in given}
    targets = tuple(replace(_target(f"{target_key}[{i}]", t), **deployment) for i, t in enumerate(raw_targets))
    names: set[str] = set()
    for t in targets:
        if t.name in names:
            raise ConfigError(target_key, f"target names must be unique, got {t.name!r} twice")
        names.add(t.name)

    listen_key = "--web.listen-address" if "listen_address" in overrides else "web.listen_address"
    host, port = parse_listen_address(
        listen_key, overrides.get("listen_address", web.get("listen_address", config.DEFAULT_LISTEN_ADDRESS))
    )

    interval_key = "--poll.interval" if "poll_interval" in overrides else "poll.interval"
    interval = _duration(interval_key, overrides.get("poll_interval", poll.get("interval", config.DEFAULT_POLL_INTERVAL)))
    if interval < config.MIN_POLL_INTERVAL_SECONDS:
        raise ConfigError(interval_key, f"{interval:g}s is below the floor of {config.MIN_POLL_INTERVAL_SECONDS:g}s")
    timeout = _duration("poll.timeout", poll.get("timeout", config.DEFAULT_POLL_TIMEOUT))
    timeout = min(timeout, interval) if "timeout" not in poll else timeout
    max_backoff = _duration("poll.max_backoff", poll.get("max_backoff", config.DEFAULT_MAX_BACKOFF))
    if max_backoff < interval:
        raise ConfigError("poll.max_backoff", f"must be at least poll.interval ({interval:g}s)")

    raw_windows = data.get("windows", list(config.DEFAULT_WINDOWS))
    if not isinstance(raw_windows, list) or not raw_windows:
        raise ConfigError("windows", "expected a non-empty list of durations, e.g. [1m, 5m, 15m, 1h]")
    # Labels are canonical (300s -> 5m): the window label is part of the exported contract.
    written: dict[float, Any] = {}  # seconds -> as written
    for i, w in enumerate(raw_windows):
        seconds = _duration(f"windows[{i}]", w)
        if seconds in written:
            raise ConfigError("windows", f"durations must be distinct, got {shown(written[seconds])} and {shown(w)}")
        written[seconds] = w
    windows = sorted(((canonical_duration(d), d) for d in written), key=lambda w: w[1])
    if windows[0][1] < interval:
        raise ConfigError("windows", f"the shortest window ({clip(windows[0][0])}) is shorter than poll.interval")

    health_window = canonical_duration(_duration("health.window", health.get("window", config.DEFAULT_HEALTH_WINDOW)))
    if health_window not in dict(windows):
        raise ConfigError(
            "health.window", f"{shown(health_window)} is not one of the windows {clip(str([w for w, _ in windows]))}"
        )
    detection = config.Detection(
        window=health_window,
        min_drafts=int(_limited("min_drafts", data.get("min_drafts", config.DETECTION.min_drafts))),
        **{
            k: float(_limited(f"health.{k}", health.get(k, getattr(config.DETECTION, k))))
            for k in config.DETECTION_KEYS
            if k != "window"
        },
    )

    profiles = [_profile(f"baselines.profiles[{i}]", p) for i, p in enumerate(baselines.get("profiles") or [])]
    include_defaults = baselines.get("include_defaults", True)
    if not isinstance(include_defaults, bool):
        raise ConfigError("baselines.include_defaults", f"{shown(include_defaults)} is not true or false")
    if include_defaults:
        profiles += default_profiles()
    for i, t in enumerate(targets):
        _named(given["profile"].flag if "profile" in given else f"{target_key}[{i}].profile", t, profiles)

    fmt_key = "--log.format" if "log_format" in overrides else "log.format"
    level_key = "--log.level" if "log_level" in overrides else "log.level"
    return Settings(
        targets=targets,
        listen_host=host,
        listen_port=port,
        poll_interval=interval,
        poll_timeout=timeout,
        max_backoff=max_backoff,
        windows=tuple(windows),
        staleness=_duration("staleness", data.get("staleness", config.DEFAULT_STALENESS)),
        max_payload_bytes=int(_limited("max_payload_bytes", data.get("max_payload_bytes", config.DEFAULT_MAX_PAYLOAD_BYTES))),
        max_series_per_target=int(
            _limited("max_series_per_target", data.get("max_series_per_target", config.DEFAULT_MAX_SERIES_PER_TARGET))
        ),
        detection=detection,
        baselines=tuple(profiles),
        profile_aliases=_aliases("baselines.aliases", baselines.get("aliases")),
        log_format=_choice(fmt_key, overrides.get("log_format", log.get("format", "auto")), config.LOG_FORMATS),
        log_level=_choice(level_key, overrides.get("log_level", log.get("level", "info")), config.LOG_LEVELS),
        web_config_file=_path("web.config.file", overrides.get("web_config_file", web_config.get("file"))),
    )


@dataclass(frozen=True, slots=True)
class Flag:
    """One `serve` flag, declared once: argparse, the environment and the README's table read this.

    One rule maps a flag to its config key and environment variable: --web.listen-address is the
    key web.listen_address (each '.' a level of the YAML, '-' written '_') and the variable
    VLLM_SPECDEC_EXPORTER_WEB_LISTEN_ADDRESS ('.' and '-' written '_', upper case)."""

    flag: str
    dest: str  # the override (and argparse) name build_settings reads
    metavar: str
    help: str
    in_file: bool = True  # False: a flag with no key (the file's own name; --vllm.url, whose file form is targets:)
    repeat: bool = False
    target_key: str | None = None  # the key of every target this flag sets (--vllm.model: targets[].model)

    @property
    def key(self) -> str | None:
        return self.flag.removeprefix("--").replace("-", "_") if self.in_file else None

    @property
    def env(self) -> str:
        return config.ENV_PREFIX + self.flag.removeprefix("--").replace(".", "_").replace("-", "_").upper()


FLAGS = (
    Flag(
        "--vllm.url",
        "urls",
        "[NAME=]URL",
        "vLLM /metrics URL (repeatable; the variable takes a comma-separated list; the file's form is targets:)",
        in_file=False,
        repeat=True,
    ),
    # What the deployment runs, for every target: the Helm chart passes its vLLM's own arguments.
    Flag(
        "--vllm.model",
        "vllm_model",
        "MODEL",
        "vLLM's --model, an HF id or a weights path: profiles are matched by it where /v1/models names none "
        "(every target's; the file's form is targets[].model)",
        in_file=False,
        target_key="model",
    ),
    Flag(
        "--vllm.method",
        "vllm_method",
        "METHOD",
        "the speculative method: mtp, eagle3, ... (every target's; the file's form is targets[].method)",
        in_file=False,
        target_key="method",
    ),
    Flag(
        "--vllm.k",
        "vllm_k",
        "K",
        "num_speculative_tokens: a named profile must be for it (every target's; the file's form is targets[].k)",
        in_file=False,
        target_key="k",
    ),
    Flag(
        "--vllm.profile",
        "vllm_profile",
        "NAME",
        "the baseline profile, named outright instead of matched (every target's; the file's form is targets[].profile)",
        in_file=False,
        target_key="profile",
    ),
    Flag("--web.listen-address", "listen_address", "[HOST]:PORT", f"where to serve (default {config.DEFAULT_LISTEN_ADDRESS})"),
    Flag(
        "--web.config.file",
        "web_config_file",
        "FILE",
        "TLS and basic auth for /metrics, in the Prometheus exporter-toolkit web-config format",
    ),
    Flag("--poll.interval", "poll_interval", "DURATION", f"time between polls (default {config.DEFAULT_POLL_INTERVAL})"),
    Flag("--log.format", "log_format", "|".join(config.LOG_FORMATS), "default auto"),
    Flag("--log.level", "log_level", "|".join(config.LOG_LEVELS), "default info"),
    Flag("--config.file", "config_file", "FILE", "YAML config: everything the flags set and more", in_file=False),
)


def _flag_value(flag: Flag, value: Any) -> Any:
    """A flag's text as its key's type: --vllm.k 2 is the integer 2 (anything else is refused as not one)."""
    if flag.target_key == "k" and isinstance(value, str) and value.isascii() and value.isdigit():
        return int(value)
    return value


def flags_markdown() -> str:
    """The README's table of serve's flags (tests/test_serve.py checks the README carries it)."""
    rows = ["| flag | config key | environment variable | meaning |", "|---|---|---|---|"]
    for f in FLAGS:
        key = f"`{f.key}`" if f.key else "none"
        metavar = f.metavar.replace("|", "\\|")  # a | inside a table cell
        rows.append(f"| `{f.flag} {metavar}` | {key} | `{f.env}` | {f.help} |")
    return "\n".join(rows)


def pick_overrides(flags: Mapping[str, Any], env: Mapping[str, str] = os.environ) -> dict[str, Any]:
    """Flags first; an unset flag falls back to VLLM_SPECDEC_EXPORTER_<NAME>."""
    out: dict[str, Any] = {}
    for f in FLAGS:
        value = flags.get(f.dest)
        if value in (None, []):
            env_value = env.get(f.env)
            if env_value:
                value = [u.strip() for u in env_value.split(",") if u.strip()] if f.repeat else env_value
        if value not in (None, []):
            out[f.dest] = value
    return out


def load_settings(flags: Mapping[str, Any], env: Mapping[str, str] = os.environ) -> Settings:
    overrides = pick_overrides(flags, env)
    file_data = load_file(overrides["config_file"]) if "config_file" in overrides else {}
    return build_settings(file_data, overrides)
