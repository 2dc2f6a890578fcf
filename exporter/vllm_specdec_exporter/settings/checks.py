"""Small validators of one value each, raising ConfigError(key, ...): the key names the bad
input (a config key or a flag) and the message what would be valid."""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import urlsplit

from .. import config, durations
from ..errors import ConfigError, shown, shown_key
from ..redaction import redact_url
from .values import LIMITS


def _duration(key: str, value: Any) -> float:
    try:
        return durations.parse_duration(value)
    except ValueError as e:  # its message quotes the value clipped, as every other one
        raise ConfigError(key, str(e)) from None


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
        # No blank or control character: urlsplit keeps a trailing space in the path (polled as
        # /metrics%20: a 404 the operator then hunts for).
        ok = ok and value.isprintable() and not any(ch.isspace() for ch in value)
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
    if port_number(port) is None:
        raise ConfigError(key, f"{shown(value)}: port must be 1-65535 (or 0: any free port)")
    bracketed = host.startswith("[") and host.endswith("]")
    host = host[1:-1] if bracketed else host
    if not (_ip(host) if bracketed else host == "" or _ip(host) or _HOSTNAME.fullmatch(host)):
        # checked here, not at bind: a config error exits 2 before anything is polled or bound
        raise ConfigError(key, f"{shown(value)}: the host is not an IP address ([...] for IPv6) or a host name")
    return host, int(port)


def port_number(text: str) -> int | None:
    """A port as written (0: any free port), or None."""
    return int(text) if text.isascii() and text.isdigit() and len(text) <= 5 and int(text) <= 65535 else None


_HOSTNAME = re.compile(
    r"(?=.{1,253}$)[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*\.?"
)


def _ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


def _path(key: str, value: Any) -> str | None:
    if value is not None and (not isinstance(value, str) or not value):
        raise ConfigError(key, f"{shown(value)} is not a file path")
    return value


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
