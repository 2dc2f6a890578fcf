"""The overrides over the file: each flag's value, or where it is unset its environment
variable (VLLM_SPECDEC_EXPORTER_<NAME>, named by flags.Flag.env)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from .. import config
from ..errors import ConfigError
from .flags import FLAGS


def pick_overrides(flags: Mapping[str, Any], env: Mapping[str, str] = os.environ) -> dict[str, Any]:
    """Flags first; an unset flag falls back to VLLM_SPECDEC_EXPORTER_<NAME>. A variable of that
    prefix that names no flag is refused, as a mistyped flag or key is (it was ignored)."""
    known = {f.env for f in FLAGS} | {config.REVISION_ENV}
    unknown = sorted(k for k in env if k.startswith(config.ENV_PREFIX) and k not in known)
    if unknown:
        valid = ", ".join(f.env.removeprefix(config.ENV_PREFIX) for f in FLAGS)
        raise ConfigError(unknown[0], f"unknown variable (valid: {config.ENV_PREFIX} and one of {valid})")
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
