"""The simulator's scenarios (data/scenarios/ or a YAML file): their keys, checked into a
Scenario (the parameters every engine starts with, and the phases that change them)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from . import config, durations
from .errors import ConfigError, clip
from .localfiles import read_capped
from .yamlsafe import load as load_yaml

PARAM_KEYS = ("drafts_per_second", "per_position", "effective_draft_length", "step_latency_seconds")
PHASE_KEYS = ("at", "engines", "restart", *PARAM_KEYS)
SCENARIO_KEYS = ("description", "model_name", "engines", "k", "form", "output_tokens_per_request", "phases", *PARAM_KEYS)


@dataclass(frozen=True, slots=True)
class Params:
    drafts_per_second: float
    per_position: tuple[float, ...]  # survival: share of drafts with >= i+1 accepted
    effective_draft_length: float
    step_latency_seconds: float


@dataclass(frozen=True, slots=True)
class Phase:
    at: float
    engines: tuple[int, ...] | None  # None: all
    restart: bool
    changes: Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class Scenario:
    name: str
    description: str
    model_name: str
    engines: int
    k: int
    form: str  # single-process | multiprocess
    output_tokens_per_request: int
    params: Params
    phases: tuple[Phase, ...]


def _check_params(key: str, p: Params, k: int) -> Params:
    if len(p.per_position) != k:
        raise ConfigError(f"{key}.per_position", f"needs k={k} values, got {len(p.per_position)}")
    if any(not 0.0 <= v <= 1.0 for v in p.per_position) or list(p.per_position) != sorted(p.per_position, reverse=True):
        raise ConfigError(f"{key}.per_position", "must be non-increasing values in [0, 1] (a survival curve)")
    if not sum(p.per_position) <= p.effective_draft_length <= k:
        raise ConfigError(
            f"{key}.effective_draft_length",
            f"{p.effective_draft_length:g} must lie between sum(per_position)={sum(p.per_position):g} and k={k}",
        )
    if p.drafts_per_second < 0 or p.step_latency_seconds <= 0:
        raise ConfigError(key, "drafts_per_second must be >= 0 and step_latency_seconds > 0")
    return p


def _float(key: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(key, f"{value!r} is not a number")
    return float(value)


SCENARIO_MAX_DEPTH = 8  # YAML nesting: the deepest real key (phases[i].per_position[j]) is 3 levels down


def parse_scenario(data: Any, name: str = "scenario") -> Scenario:
    if not isinstance(data, dict):
        raise ConfigError(name, "a scenario is a YAML mapping")
    for key in data:
        if key not in SCENARIO_KEYS:
            raise ConfigError(f"{name}.{key}", f"unknown key (valid: {', '.join(SCENARIO_KEYS)})")
    k = int(_float(f"{name}.k", data.get("k", 2)))
    engines = int(_float(f"{name}.engines", data.get("engines", 1)))
    if not 1 <= k <= config.MAX_K or not 1 <= engines <= 512:
        raise ConfigError(name, f"k must be 1-{config.MAX_K} and engines 1-512")
    form = data.get("form", "single-process")
    if form not in ("single-process", "multiprocess"):
        raise ConfigError(f"{name}.form", f"{form!r} is not single-process or multiprocess")
    per_position = data.get("per_position", [0.9 ** (i + 1) for i in range(k)])
    params = _check_params(
        name,
        Params(
            _float(f"{name}.drafts_per_second", data.get("drafts_per_second", 50)),
            tuple(_float(f"{name}.per_position", v) for v in per_position),
            _float(f"{name}.effective_draft_length", data.get("effective_draft_length", k)),
            _float(f"{name}.step_latency_seconds", data.get("step_latency_seconds", 0.03)),
        ),
        k,
    )
    phases = []
    for i, raw in enumerate(data.get("phases") or []):
        key = f"{name}.phases[{i}]"
        if not isinstance(raw, dict) or "at" not in raw:
            raise ConfigError(key, "a phase is a mapping with at least 'at' (e.g. at: 2m)")
        for pk in raw:
            if pk not in PHASE_KEYS:
                raise ConfigError(f"{key}.{pk}", f"unknown key (valid: {', '.join(PHASE_KEYS)})")
        at = 0.0 if raw["at"] in (0, "0", "0s") else durations.parse_duration(raw["at"])
        which = raw.get("engines")
        if which is not None and (not isinstance(which, list) or any(not 0 <= int(e) < engines for e in which)):
            raise ConfigError(f"{key}.engines", f"must be a list of engine numbers 0..{engines - 1}")
        changes = {pk: raw[pk] for pk in PARAM_KEYS if pk in raw}
        if "per_position" in changes:
            changes["per_position"] = tuple(_float(f"{key}.per_position", v) for v in changes["per_position"])
        _check_params(key, replace(params, **changes), k)
        phases.append(
            Phase(at, tuple(int(e) for e in which) if which is not None else None, bool(raw.get("restart", False)), changes)
        )
    return Scenario(
        name=name,
        description=str(data.get("description", "")),
        model_name=str(data.get("model_name", "simulated")),
        engines=engines,
        k=k,
        form=form,
        output_tokens_per_request=int(_float(f"{name}.output_tokens_per_request", data.get("output_tokens_per_request", 512))),
        params=params,
        phases=tuple(sorted(phases, key=lambda p: p.at)),
    )


def builtin_scenarios() -> list[str]:
    folder = resources.files(__package__).joinpath("data/scenarios")
    return sorted(p.name.removesuffix(".yaml") for p in folder.iterdir() if p.name.endswith(".yaml"))


def load_scenario(ref: str) -> Scenario:
    """A built-in scenario name (see builtin_scenarios) or a YAML file path."""
    if ref in builtin_scenarios():
        text = resources.files(__package__).joinpath(f"data/scenarios/{ref}.yaml").read_text()
        return parse_scenario(load_yaml(text, SCENARIO_MAX_DEPTH), ref)  # the safe loader every YAML goes through
    path = Path(ref)
    if not path.exists():
        raise ConfigError("--scenario", f"{ref!r} is neither a file nor one of {', '.join(builtin_scenarios())}")
    raw = read_capped("--scenario", ref)  # a regular file of at most 1 MiB, as the config file
    try:
        data = load_yaml(raw.decode("utf-8"), SCENARIO_MAX_DEPTH)
    except UnicodeDecodeError:
        raise ConfigError("--scenario", f"{ref} is not UTF-8 text") from None
    except yaml.YAMLError as e:
        raise ConfigError("--scenario", f"{ref} is not valid YAML: {clip(str(e).splitlines()[0])}") from None
    try:
        return parse_scenario(data, path.stem)
    except (TypeError, ValueError) as e:  # a value of a type no check expected (phases: 5): one line, no traceback
        if isinstance(e, ConfigError):
            raise
        raise ConfigError("--scenario", f"{ref}: a value of an unexpected type or form ({clip(str(e))})") from None
