"""A target checked into a Target: from the file's targets: or from --vllm.url entries, and
what its deployment runs (method, model, k, profile)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any
from urllib.parse import urlsplit

from .. import config
from ..adapters import PRODUCERS
from ..errors import ConfigError, shown
from ..model import speculative_method
from .checks import _limited, _mapping, _url
from .values import _NAME_RE, TARGET_KEYS, Target


def _targets_from_urls(key: str, urls: Sequence[str]) -> list[dict[str, str]]:
    """'URL' or 'NAME=URL' per entry; one unnamed target is called 'vllm'."""
    out = []
    for i, entry in enumerate(urls):
        name, sep, url = entry.partition("=")
        if not sep or not _NAME_RE.fullmatch(name):  # an '=' inside a URL (a mistyped one's password too)
            name, url = (config.DEFAULT_TARGET_NAME if len(urls) == 1 else f"{config.DEFAULT_TARGET_NAME}-{i}"), entry
        out.append({"name": name, "url": url})
    return out


def _deployment(key_of: Callable[[str], str], raw: Mapping[str, Any]) -> dict[str, Any]:
    """A target's method, model, k and profile where given, checked (a profile's name against
    the profiles by _named); ``key_of`` names a key in errors."""
    out: dict[str, Any] = {}
    method = raw.get("method")
    if method is not None and not (isinstance(method, str) and method.strip()):
        raise ConfigError(key_of("method"), f"{shown(method)} is not a non-empty string (e.g. mtp, eagle3)")
    for key, what in (("model", "vLLM's --model: an HF id or a weights path"), ("profile", "a baseline profile's name")):
        value = raw.get(key)
        if value is not None and (not isinstance(value, str) or not 0 < len(value) <= config.MAX_LABEL_VALUE_LENGTH):
            raise ConfigError(
                key_of(key), f"{shown(value)} is not a string of 1 to {config.MAX_LABEL_VALUE_LENGTH} characters ({what})"
            )
        out[key] = value
    k = raw.get("k")
    method = None if method is None else speculative_method(method)
    return {**out, "method": method, "k": None if k is None else int(_limited(key_of("k"), k, "baselines.profiles[].k"))}


def _target(key: str, raw: Any) -> Target:
    raw = _mapping(key, raw, TARGET_KEYS)
    if "url" not in raw:
        raise ConfigError(f"{key}.url", "missing (an http(s) URL of vLLM's /metrics)")
    name = raw.get("name", config.DEFAULT_TARGET_NAME)
    if not isinstance(name, str) or not _NAME_RE.fullmatch(name):
        raise ConfigError(f"{key}.name", f"{shown(name)} is not 1-64 of A-Z a-z 0-9 _ . -")
    token_file = raw.get("bearer_token_file")
    if token_file is not None and not (isinstance(token_file, str) and token_file):
        raise ConfigError(f"{key}.bearer_token_file", "must be a file path")
    url = _url(f"{key}.url", raw["url"])
    if token_file is not None and urlsplit(url).username is not None:  # aiohttp refuses both on every poll
        raise ConfigError(key, "user:password in the url and a bearer_token_file: give one of the two")
    producer = raw.get("producer")
    if producer is not None and producer not in PRODUCERS:
        raise ConfigError(
            f"{key}.producer",
            f"{shown(producer)} is not a known producer (one of {', '.join(PRODUCERS)}; leave it out to detect it)",
        )
    deployment = _deployment(lambda k: f"{key}.{k}", raw)
    return Target(name, url, bearer_token_file=token_file, producer=producer, **deployment)
