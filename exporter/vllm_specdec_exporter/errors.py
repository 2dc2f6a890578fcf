"""The configuration error: a leaf, so that what only reports one (the web config, the
simulator's scenarios) does not import the settings and every producer adapter with them."""

from __future__ import annotations


class ConfigError(ValueError):
    """A refused configuration value, named by its key (a YAML path, a flag, an environment variable)."""

    def __init__(self, key: str, message: str):
        super().__init__(f"config: {key}: {message}")
        self.key, self.message = key, message


SHOWN_CHARS = 100  # what an error message quotes of one value from a config file


def clip(text: str, limit: int = SHOWN_CHARS) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def shown(value: object, limit: int = SHOWN_CHARS) -> str:
    """``value`` for an error message: repr'd if a scalar, cut to ``limit`` characters (a value
    from a file is never quoted whole: it may be megabytes)."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 64:
        return f"an integer of {value.bit_length()} bits"  # repr refuses over 4,300 digits
    if isinstance(value, str | int | float | bool) or value is None:
        return clip(repr(value), limit)
    return f"a {type(value).__name__}"


def shown_key(name: object, limit: int = SHOWN_CHARS) -> str:
    """A key from a file for an error message: as written if it is short printable text."""
    return name if isinstance(name, str) and len(name) <= limit and name.isprintable() else shown(name, limit)
