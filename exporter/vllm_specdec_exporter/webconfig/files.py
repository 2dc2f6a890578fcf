"""The files the web config names: regular files only (localfiles), watched for changes."""

from __future__ import annotations

from pathlib import Path

from ..errors import ConfigError
from ..localfiles import regular_file

SHOWN = 60  # what an error message quotes of one value from the web config


def named_file(key: str, value: object, base: Path, files: list[str]) -> str:
    """The file ``value`` names; added to ``files`` (watched for changes) before it is checked."""
    if not isinstance(value, str) or not value:
        raise ConfigError(key, "must be a file path")
    path = (base / value) if not Path(value).is_absolute() else Path(value)
    files.append(str(path))
    regular_file(key, str(path))
    return str(path)
