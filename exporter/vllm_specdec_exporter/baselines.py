"""Which baseline profile (the lowest healthy figure of a model at a k) a served model is judged
against, and how it was found: named by its target, matched by its served name, by the model it
serves (vLLM's /v1/models root), or by the operator's alias. Pure: the profiles are loaded by
settings/profiles.py, read by the verdict (health.py) and the views."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from .model import BaselineProfile


def match_profile(profiles: Sequence[BaselineProfile], model_name: str, k: int, method: str | None) -> BaselineProfile | None:
    return next((p for p in profiles if p.matches(model_name, k, method)), None)


# How a model's profile was found (the model_info series' profile_matched_by label).
MATCHED_BY = ("config", "served_name", "root", "alias", "none")
# What having no profile hides, and the way out: the sidecar's log and landing page and the
# NoBaseline alert all say it in these words.
NO_BASELINE = (
    "a head that is partly broken from the start cannot be detected until a day of history exists; "
    "set baselines.aliases (served name: a model a profile matches) or a profile of its own"
)


def named_profile(profiles: Sequence[BaselineProfile], name: str) -> BaselineProfile | None:
    """The profile a target names outright (targets[].profile): the first of that name, so a
    user profile comes before a shipped one."""
    return next((p for p in profiles if p.name == name), None)


def find_profile(
    profiles: Sequence[BaselineProfile],
    aliases: Mapping[str, str],
    served: str,
    root: str | None,
    k: int,
    method: str | None,
    named: str | None = None,
) -> tuple[BaselineProfile | None, str]:
    """The profile of a served model and how it was found: the one the target names outright
    (``named``, the target's ``profile``: it alone is tried, and applies only at its own k),
    else by the served name, then by the model it serves (``root``: vLLM's /v1/models
    ``root`` or the target's ``model``, its --model argument, an HF id or a weights path),
    then by the operator's mapping (baselines.aliases). Served names rarely name the model
    (``--served-model-name dsv4``); the root usually does."""
    if named is not None:
        profile = named_profile(profiles, named)
        return (profile, "config") if profile is not None and profile.fits(k, method) else (None, "none")
    for how, name in (("served_name", served), ("root", root), ("alias", aliases.get(served))):
        if name and (profile := match_profile(profiles, name, k, method)) is not None:
            return profile, how
    return None, "none"
