"""The Helm chart's values.schema.json for `config`, from the exporter's own settings module.

The exporter refuses a bad config at start-up (the pod would crash-loop); the chart must
refuse the same values at `helm install`. So `config`'s keys, the `health:` keys, every numeric
range (settings.LIMITS, the one table build_settings checks against), the producers and the
target-name pattern are written here from settings.py, never by hand. rules.py's --chart-schema
applies this (with the alert names) and --check fails on drift.
"""

from __future__ import annotations

import json
from typing import Any

from .. import config as c
from .. import settings as s
from ..adapters import PRODUCERS

Schema = dict[str, Any]
# A positive duration in Prometheus's grammar (durations.parse_duration; "0" and "" are refused there too).
DURATION: Schema = {
    "type": "string",
    "minLength": 1,
    "pattern": "^([0-9]+y)?([0-9]+w)?([0-9]+d)?([0-9]+h)?([0-9]+m)?([0-9]+s)?([0-9]+ms)?$",
    "not": {"pattern": "^(0+(y|w|d|h|m|s|ms))+$"},  # all zero: 0s (no lookahead in helm's RE2)
}

# Text the exporter refuses empty or blank (settings._profile, _deployment).
TEXT: Schema = {"type": "string", "minLength": 1, "pattern": "\\S"}


def limit(key: str) -> Schema:
    """A numeric key's schema from settings.LIMITS: the same type and range the exporter checks."""
    lim = s.LIMITS[key]
    if lim.integer:
        return {"type": "integer", "minimum": int(lim.low), "maximum": int(lim.high)}
    return {"type": "number", "minimum": float(lim.low), "maximum": float(lim.high)}


def config_schema(old: Schema) -> Schema:
    """`config`'s schema; what settings.py does not decide (descriptions of targets, web) is kept from ``old``."""
    props = old.get("properties", {})
    target = props["targets"]["items"]
    target_props = {k: target["properties"].get(k, {"type": "string"}) for k in s.TARGET_KEYS}
    target_props["name"] = {"type": "string", "pattern": f"^{s._NAME_RE.pattern}$"}
    # Checked in templates/configmap.yaml, not by a pattern here: helm quotes a value that fails
    # one, and a URL may hold a password.
    target_props["url"] = {"type": "string", "description": "an http(s) URL with a host (vLLM's /metrics)"}
    target_props["producer"] = {"description": "optional: detected from the payload when left out", "enum": list(PRODUCERS)}
    # Text the exporter refuses empty (settings._target, _deployment; a blank method too).
    target_props["bearer_token_file"] = {**target_props["bearer_token_file"], "type": "string", "minLength": 1}
    target_props["method"] = {**target_props["method"], **TEXT}
    # What the deployment runs: the exporter's own checks (settings._deployment); descriptions kept.
    for key in ("model", "profile"):
        target_props[key] = {**target_props[key], "type": "string", "minLength": 1, "maxLength": c.MAX_LABEL_VALUE_LENGTH}
    target_props["k"] = {**target_props["k"], **limit("baselines.profiles[].k")}
    health: Schema = {
        "window": {
            **DURATION,
            "description": f"the alerts judge over {c.DETECTION.window}: the chart refuses any other (templates/configmap.yaml)",
        },
        **{k: limit(f"health.{k}") for k in c.DETECTION_KEYS if k != "window"},
    }
    profile: Schema = {
        "type": "object",
        "required": list(s.PROFILE_REQUIRED),
        "additionalProperties": False,
        "properties": {
            k: (limit(f"baselines.profiles[].{k}") if f"baselines.profiles[].{k}" in s.LIMITS else TEXT) for k in s.PROFILE_KEYS
        },
    }
    out: Schema = {
        "targets": {
            **props["targets"],
            "items": {**target, "required": ["url"], "additionalProperties": False, "properties": target_props},
        },
        "web": {  # listen_address is refused by templates/configmap.yaml (set from `port`)
            **props["web"],
            "additionalProperties": False,
            "properties": {
                "listen_address": props["web"]["properties"]["listen_address"],
                "config": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {"file": {"type": "string", "minLength": 1}},
                },
            },
        },
        "poll": {
            "type": "object",
            "additionalProperties": False,
            "properties": {k: DURATION for k in ("interval", "timeout", "max_backoff")},
        },
        "windows": {"type": "array", "minItems": 1, "items": DURATION},
        "min_drafts": limit("min_drafts"),
        "staleness": DURATION,
        "max_payload_bytes": limit("max_payload_bytes"),
        "max_series_per_target": limit("max_series_per_target"),
        "health": {
            "type": "object",
            "additionalProperties": False,
            "description": props["health"]["description"],
            "properties": health,
        },
        "baselines": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "include_defaults": {"type": "boolean"},
                "profiles": {"type": "array", "items": profile},
                "aliases": {"type": "object", "additionalProperties": {"type": "string"}},
            },
        },
        "log": {
            "type": "object",
            "additionalProperties": False,
            "properties": {"format": {"enum": list(c.LOG_FORMATS)}, "level": {"enum": list(c.LOG_LEVELS)}},
        },
    }
    assert list(out) == list(s.TOP_KEYS), "config's keys are settings.TOP_KEYS"
    return {
        **old,
        "description": "the exporter's YAML config, passed as-is: only what differs from the exporter's "
        "defaults. Its keys, health keys, numeric ranges, producers and target-name pattern are generated from "
        "the exporter's settings module, so the chart refuses what the exporter would refuse at start-up",
        "additionalProperties": False,
        "properties": out,
    }


def with_schema_config(text: str) -> str:
    """values.schema.json with `config` generated from the settings module."""
    schema = json.loads(text)
    schema["properties"]["config"] = config_schema(schema["properties"]["config"])
    return json.dumps(schema, indent=2) + "\n"
