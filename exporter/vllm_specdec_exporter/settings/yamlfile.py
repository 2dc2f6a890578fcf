"""The YAML sources: the --config.file file and the packaged baselines (data/baselines.yaml),
read with the one safe loader (yamlsafe). yaml is imported only when one is read: `report FILE`
builds serve's flags from this package but reads no YAML."""

from __future__ import annotations

from importlib import resources
from typing import Any

from ..errors import ConfigError, clip

CONFIG_MAX_DEPTH = 32  # YAML nesting: the deepest real key (baselines.profiles[i].model) is 4 levels down


def packaged_baselines() -> list[Any]:
    """data/baselines.yaml's list of profiles, unchecked (profiles.default_profiles checks them)."""
    from ..yamlsafe import load

    package = __name__.rsplit(".", 2)[0]  # data/ is the top package's (this module is <package>.settings.yamlfile)
    text = resources.files(package).joinpath("data/baselines.yaml").read_text()
    raw = load(text, CONFIG_MAX_DEPTH)
    assert isinstance(raw, list), "data/baselines.yaml holds a list"
    return raw


def load_file(path: str) -> dict[str, Any]:
    import yaml

    from ..localfiles import read_capped
    from ..yamlsafe import Refused, load

    # A regular file of at most 1 MiB, opened without blocking: a FIFO with no writer hung start-up.
    text = read_capped("--config.file", path)
    try:
        # Without aliases: a few hundred bytes of them expanded to 10^9 strings, quoted
        # whole in an error (issue 29 item 7); a config file writes each value out.
        data = load(text.decode("utf-8"), CONFIG_MAX_DEPTH)
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
