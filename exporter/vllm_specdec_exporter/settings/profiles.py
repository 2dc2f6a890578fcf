"""Baseline profiles checked into BaselineProfile (the file's and the packaged ones), and a
target's profile named outright checked against them."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from ..baselines import named_profile
from ..errors import ConfigError, clip, shown
from ..model import BaselineProfile, speculative_method
from .checks import _limited, _mapping
from .values import PROFILE_KEYS, PROFILE_REQUIRED, Target
from .yamlfile import packaged_baselines


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


def _profile(key: str, raw: Any) -> BaselineProfile:
    raw = _mapping(key, raw, PROFILE_KEYS)
    for required in PROFILE_REQUIRED:
        if required not in raw:
            raise ConfigError(f"{key}.{required}", "missing")
    # Text where text goes: a list as a name or method was taken as "[1, 2]", a method no target has.
    for text_key in ("name", "model", "method"):
        if text_key in raw and not (isinstance(raw[text_key], str) and raw[text_key].strip()):
            raise ConfigError(f"{key}.{text_key}", f"{shown(raw[text_key])} is not a non-empty string")
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
    method = raw.get("method")
    return BaselineProfile(str(raw["name"]), pattern, k, al, None if method is None else speculative_method(method))


def _safe_pattern(key: str, text: str) -> str:
    """Refuse patterns that can backtrack catastrophically against a hostile model name:
    a variable-length repeat inside a repeat ((a+)+, (a?){40}), a repeated alternation
    ((a|a)*), or more than three variable-length repeats (.*.*.*.*: polynomial). Fixed counts
    (\\d{4}) do not backtrack. Names are capped at MAX_LABEL_VALUE_LENGTH, so what is left
    matches in well under a millisecond."""
    # Python's own pattern parser: private modules typeshed does not describe.
    from re import _constants as c  # type: ignore[attr-defined]
    from re import _parser  # type: ignore[attr-defined]

    repeats = (c.MAX_REPEAT, c.MIN_REPEAT, getattr(c, "POSSESSIVE_REPEAT", c.MAX_REPEAT))
    count = [0]

    def walk(node: object, inside_repeat: bool) -> None:
        if isinstance(node, _parser.SubPattern):
            for op, av in node.data:
                if op in repeats:
                    low, high, sub = av
                    if low != high and inside_repeat:
                        raise ConfigError(
                            key,
                            f"{shown(text)}: a repeat inside a repeat can take forever to match; simplify it (e.g. (a+)+ -> a+)",
                        )
                    count[0] += low != high and high > 1
                    walk(sub, inside_repeat or high > 1)
                elif op is c.BRANCH and inside_repeat:
                    raise ConfigError(key, f"{shown(text)}: a repeated alternation can take forever to match")
                else:
                    walk(av, inside_repeat)
        elif isinstance(node, (list, tuple)):
            for item in node:
                walk(item, inside_repeat)

    walk(_parser.parse(text), False)
    if count[0] > 3:
        raise ConfigError(
            key, f"{shown(text)}: more than 3 variable-length repeats (.*, a+, a{{1,9}}) can take very long to match"
        )
    return text


def default_profiles() -> list[BaselineProfile]:
    """The packaged profiles (data/baselines.yaml), checked as the file's are."""
    return [_profile(f"default baselines[{i}]", p) for i, p in enumerate(packaged_baselines())]
