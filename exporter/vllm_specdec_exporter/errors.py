"""The configuration error: a leaf, so that what only reports one (the web config, the
simulator's scenarios) does not import the settings and every producer adapter with them."""

from __future__ import annotations


class ConfigError(ValueError):
    """A refused configuration value, named by its key (a YAML path, a flag, an environment variable)."""

    def __init__(self, key: str, message: str):
        super().__init__(f"config: {key}: {message}")
        self.key = key
