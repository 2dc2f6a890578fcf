"""The sidecar's settings: flags > VLLM_SPECDEC_EXPORTER_* environment > YAML file > defaults.

Every error names the key and what would be valid; ``serve`` exits 2 on one
before binding anything.

The sources are apart from the checks: ``flags`` (serve's flags, one table), ``overrides``
(each flag or its environment variable), ``yamlfile`` (the config file and the packaged
baselines); ``validate`` builds the ``Settings`` value (``values``) from them with the small
checks of ``checks``, ``targets`` and ``profiles``. What other modules import is here.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from ..errors import ConfigError
from .checks import parse_listen_address
from .flags import FLAGS, Flag, flags_markdown
from .overrides import pick_overrides
from .profiles import default_profiles
from .validate import build_settings
from .values import (
    _NAME_RE,
    LIMITS,
    PROFILE_KEYS,
    PROFILE_REQUIRED,
    RENAMED,
    TARGET_KEYS,
    TOP_KEYS,
    Limit,
    Settings,
    Target,
)
from .yamlfile import CONFIG_MAX_DEPTH, load_file

__all__ = [
    "CONFIG_MAX_DEPTH",
    "FLAGS",
    "LIMITS",
    "PROFILE_KEYS",
    "PROFILE_REQUIRED",
    "RENAMED",
    "TARGET_KEYS",
    "TOP_KEYS",
    "_NAME_RE",
    "ConfigError",
    "Flag",
    "Limit",
    "Settings",
    "Target",
    "build_settings",
    "default_profiles",
    "flags_markdown",
    "load_file",
    "load_settings",
    "named_by_source",
    "parse_listen_address",
    "pick_overrides",
]


def load_settings(flags: Mapping[str, Any], env: Mapping[str, str] = os.environ) -> Settings:
    overrides = pick_overrides(flags, env)
    try:
        file_data = load_file(overrides["config_file"]) if "config_file" in overrides else {}
        settings = build_settings(file_data, overrides)
        urls = next(f for f in FLAGS if f.dest == "urls")
        if settings.file_targets_replaced and flags.get(urls.dest) in (None, []):
            return replace(settings, file_targets_replaced_by=urls.env)
        return settings
    except ConfigError as e:
        raise named_by_source(e, flags, env) from None


def named_by_source(e: ConfigError, flags: Mapping[str, Any], env: Mapping[str, str] = os.environ) -> ConfigError:
    """``e`` naming where its value came from when a flag was not given: the variable
    VLLM_SPECDEC_EXPORTER_<NAME>, else the config file's key (a web config named there)."""
    flag = next((f for f in FLAGS if e.key.split("[", 1)[0] == f.flag and flags.get(f.dest) in (None, [])), None)
    if flag is None:
        return e
    source = flag.env if env.get(flag.env) else flag.key
    return e if source is None else ConfigError(source + e.key[len(flag.flag) :], e.message)
