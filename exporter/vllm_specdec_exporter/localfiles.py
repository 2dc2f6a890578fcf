"""Local files the sidecar is told to read (its config file, the web config and the files it
names): regular files only (a FIFO would block whoever opens it, a device never ends), opened
without blocking, read no further than a cap."""

from __future__ import annotations

import os
import stat

from .errors import ConfigError

MAX_BYTES = 1 << 20  # a config is a few KB, a web config a few hundred bytes; more is refused unread


def _kind(mode: int) -> str:
    return (
        "a FIFO"
        if stat.S_ISFIFO(mode)
        else "a directory"
        if stat.S_ISDIR(mode)
        else "a device"
        if stat.S_ISCHR(mode) or stat.S_ISBLK(mode)
        else "a socket"
        if stat.S_ISSOCK(mode)
        else "not a file"
    )


def regular_file(key: str, path: str) -> os.stat_result:
    """``path``'s stat (symlinks followed, as a Kubernetes Secret's are), if it is a
    regular file: a FIFO would block whoever opens it, a device never ends."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise ConfigError(key, f"no such file: {path}") from None
    except OSError as e:
        raise ConfigError(key, f"cannot read {path}: {e.strerror or type(e).__name__}") from None
    if not stat.S_ISREG(st.st_mode):
        raise ConfigError(key, f"{path} is not a regular file ({_kind(st.st_mode)})")
    return st


def read_capped(key: str, path: str, limit: int = MAX_BYTES) -> bytes:
    """The file's bytes, if it is a regular file of at most ``limit`` bytes. Opened
    without blocking (a FIFO swapped in after the stat opens at once, and is refused
    by its fstat), read no further than the limit."""
    if regular_file(key, path).st_size > limit:
        raise ConfigError(key, f"{path} is larger than {limit:,} bytes")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError as e:
        raise ConfigError(key, f"cannot read {path}: {e.strerror or type(e).__name__}") from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise ConfigError(key, f"{path} is not a regular file ({_kind(mode)})")
        chunks, size = [], 0
        while size <= limit and (chunk := os.read(fd, min(65536, limit + 1 - size))):
            chunks.append(chunk)
            size += len(chunk)
    except OSError as e:
        raise ConfigError(key, f"cannot read {path}: {e.strerror or type(e).__name__}") from None
    finally:
        os.close(fd)
    if size > limit:
        raise ConfigError(key, f"{path} is larger than {limit:,} bytes")
    return b"".join(chunks)
