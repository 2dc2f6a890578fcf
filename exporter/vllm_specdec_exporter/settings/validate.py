"""The Settings value from the file's mapping and the overrides (flags, then environment)
picked over it, every key checked; an error names the flag or key that set the bad value."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from .. import config, durations
from ..errors import ConfigError, clip, shown
from .checks import _aliases, _choice, _duration, _limited, _mapping, _path, parse_listen_address
from .flags import FLAGS, _flag_value
from .profiles import _named, _profile, default_profiles
from .targets import _deployment, _target, _targets_from_urls
from .values import RENAMED, TOP_KEYS, Settings


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

    replaced = 0
    if "urls" in overrides:
        raw_targets: Any = _targets_from_urls("--vllm.url", overrides["urls"])
        target_key = "--vllm.url"
        file_targets = data.get("targets")
        replaced = len(file_targets) if isinstance(file_targets, list) else int(bool(file_targets))
    else:
        raw_targets, target_key = data.get("targets"), "targets"
    if raw_targets and not isinstance(raw_targets, list):
        raise ConfigError(target_key, f"expected a list of targets (- url: ...), not {shown(raw_targets)}")
    if not raw_targets:
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
    windows = sorted(((durations.format_duration(d), d) for d in written), key=lambda w: w[1])
    if windows[0][1] < interval:
        raise ConfigError("windows", f"the shortest window ({clip(windows[0][0])}) is shorter than poll.interval")

    health_window = durations.format_duration(_duration("health.window", health.get("window", config.DETECTION.window)))
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

    # At least two poll intervals: under one, the derived gauges vanished between two good polls.
    staleness = max(_duration("staleness", config.DEFAULT_STALENESS), 2 * interval)
    if "staleness" in data:
        staleness = _duration("staleness", data["staleness"])
    if staleness < 2 * interval:
        raise ConfigError("staleness", f"{staleness:g}s is under two poll intervals ({interval_key} {interval:g}s)")
    if timeout > staleness:  # a hung target would read up, its last figures served, past their staleness
        raise ConfigError("poll.timeout", f"{timeout:g}s is over staleness ({staleness:g}s): a poll may not outlast its figures")
    raw_profiles = baselines.get("profiles") or []
    if not isinstance(raw_profiles, list):
        raise ConfigError("baselines.profiles", f"{shown(raw_profiles)} is not a list of profiles")
    profiles = [_profile(f"baselines.profiles[{i}]", p) for i, p in enumerate(raw_profiles)]
    if len({p.name for p in profiles}) < len(profiles):  # one name, one profile (a default's name: yours wins)
        twice = next(p.name for i, p in enumerate(profiles) if p.name in {q.name for q in profiles[:i]})
        raise ConfigError("baselines.profiles", f"the name {twice!r} is given to two profiles")
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
        staleness=staleness,
        max_payload_bytes=int(_limited("max_payload_bytes", data.get("max_payload_bytes", config.DEFAULT_MAX_PAYLOAD_BYTES))),
        max_series_per_target=int(
            _limited("max_series_per_target", data.get("max_series_per_target", config.DEFAULT_MAX_SERIES_PER_TARGET))
        ),
        detection=detection,
        baselines=tuple(profiles),
        profile_aliases=_aliases("baselines.aliases", baselines.get("aliases")),
        log_format=_choice(fmt_key, overrides.get("log_format", log.get("format", "auto")), config.LOG_FORMATS),
        log_level=_choice(level_key, overrides.get("log_level", log.get("level", "info")), config.LOG_LEVELS),
        web_config_file=_path(
            "--web.config.file" if "web_config_file" in overrides else "web.config.file",
            overrides.get("web_config_file", web_config.get("file")),
        ),
        file_targets_replaced=replaced,
    )
