"""LiveWebConfig: the web config re-read when the file or any file it names changes, in
a thread of its own, failing closed: a reload that does not load or that would weaken the
config (``weakenings``) keeps the last good config and logs one error line naming the file."""

from __future__ import annotations

import asyncio
import contextlib
import os
import ssl
import threading
import time
from collections.abc import Callable, Iterable

import structlog

from .. import config
from ..errors import ConfigError
from .load import WebConfig, load_web_config
from .tls import CIPHERS, CLIENT_AUTH, tls_name

log = structlog.get_logger("vllm_specdec_exporter")


def weakenings(old: WebConfig, new: WebConfig) -> list[str]:
    """What ``new`` would give up of ``old``'s protection (empty: nothing)."""
    out = []
    if old.ssl_context and not new.ssl_context:
        out.append("turn TLS off")
    elif old.ssl_context:
        (old_mode, old_verify), (new_mode, new_verify) = CLIENT_AUTH[old.client_auth], CLIENT_AUTH[new.client_auth]
        if old_mode == ssl.CERT_REQUIRED and new_mode != ssl.CERT_REQUIRED:
            out.append(f"stop requiring a client certificate ({old.client_auth} -> {new.client_auth})")
        if old_verify and not new_verify:
            out.append(f"stop verifying client certificates ({old.client_auth} -> {new.client_auth})")
        if old.allowed_sans is not None and new.allowed_sans is None:
            out.append("drop client_allowed_sans")
        o, n = old.ssl_context, new.ssl_context
        if n and n.minimum_version < o.minimum_version:
            out.append(f"lower the TLS version floor ({tls_name(o.minimum_version)} -> {tls_name(n.minimum_version)})")
        if n and n.maximum_version < o.maximum_version:
            out.append(f"lower the TLS version ceiling ({tls_name(o.maximum_version)} -> {tls_name(n.maximum_version)})")
        # TLS 1.3's suites are fixed: only where the new config lets TLS 1.2 in do its suites count.
        tls12 = n is not None and n.minimum_version <= ssl.TLSVersion.TLSv1_2
        added = sorted({c["name"] for c in n.get_ciphers()} - {c["name"] for c in o.get_ciphers()}) if n and tls12 else []
        if added:
            go_names = {v: k for k, v in CIPHERS.items()}
            out.append(f"allow cipher suites not allowed before ({', '.join(go_names.get(c, c) for c in added)})")
    if old.users and not new.users:
        out.append("remove every basic_auth_users entry")
    if old.rate_limit and not new.rate_limit:
        out.append("remove rate_limit")
    elif old.rate_limit and new.rate_limit and (new.rate_limit[0] < old.rate_limit[0] or new.rate_limit[1] > old.rate_limit[1]):
        out.append(f"loosen rate_limit ({_rate_name(old.rate_limit)} -> {_rate_name(new.rate_limit)})")
    # Any change to a header set counts: telling a stronger value from a weaker one
    # (a CSP, an HSTS max-age) takes parsing each; a deliberate change takes a restart.
    dropped = [h for h in old.headers if h not in new.headers]
    changed = [h for h in old.headers if h in new.headers and new.headers[h] != old.headers[h]]
    if dropped:
        out.append(f"remove the header{'s' if len(dropped) > 1 else ''} {', '.join(dropped)}")
    if changed:
        out.append(f"change the header{'s' if len(changed) > 1 else ''} {', '.join(changed)}")
    return out


def _rate_name(rate: tuple[float, int]) -> str:
    return f"interval {rate[0]:g}s, burst {rate[1]}"


_Signature = tuple[tuple[object, ...], ...]  # per file: path, inode, mtime, size (path alone if unreadable)


def _signature(files: Iterable[str]) -> _Signature:
    out: list[tuple[object, ...]] = []
    for f in files:
        try:
            st = os.stat(f)  # follows symlinks: a Kubernetes Secret swaps its ..data link
            out.append((f, st.st_ino, st.st_mtime_ns, st.st_size))
        except OSError:
            out.append((f, None))
    return tuple(out)


class LiveWebConfig:
    """The web config, re-read when the file or any file it names changes.

    ``current()`` is called for every new connection and request; it looks at the
    files at most once per ``config.WEB_CONFIG_CHECK_SECONDS``. A change is loaded on a
    thread of its own (certificates, and a bcrypt hash for unknown users at a new cost,
    take time) while the old config goes on serving. A reload that fails, or that would
    weaken the config (``weakenings``), keeps the last good config and logs an error;
    the files it read are not read again until one of them changes.

    ``reload_failures`` counts refused reloads and ``last_reload_ok`` tells whether the
    last one applied (as exporter-toolkit's and Prometheus's config_last_reload_successful)."""

    def __init__(self, path: str, mono: Callable[[], float] = time.monotonic):
        self.path = path
        self.mono = mono
        self.config = load_web_config(path)
        self._signature = _signature(self.config.files)
        self._checked = mono()
        self._loading = False
        self._last_error: str | None = None
        self._refused: tuple[tuple[str, ...], _Signature] | None = None  # files of a refused reload, as they were
        self.reload_failures = 0
        self.last_reload_ok = True

    def current(self) -> WebConfig:
        now = self.mono()
        if now - self._checked >= config.WEB_CONFIG_CHECK_SECONDS and not self._loading:
            self._checked = now
            if _signature(self.config.files) != self._signature and not (
                self._refused and _signature(self._refused[0]) == self._refused[1]
            ):
                watched = self.config.files
                try:
                    loop = asyncio.get_running_loop()
                except RuntimeError:
                    self._loaded(*self._load(watched))
                else:
                    self._loading = True
                    threading.Thread(
                        target=self._load_in_thread, args=(loop, watched), name="web-config", daemon=True
                    ).start()  # a daemon: a stuck read never holds up the exit
        return self.config

    def _load_in_thread(self, loop: asyncio.AbstractEventLoop, watched: tuple[str, ...]) -> None:
        try:
            result = self._load(watched)
        except BaseException as e:  # never leave _loading set
            result = (ConfigError("--web.config.file", f"{self.path}: {type(e).__name__}"), watched, ())  # retried
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
            loop.call_soon_threadsafe(lambda: self._loaded(*result))

    def _load(self, watched: tuple[str, ...]) -> tuple[WebConfig | ConfigError, tuple[str, ...], _Signature]:
        """The new config (or why not), the files it read, and their signature taken
        before it read them: a change during the load is seen next time."""
        before = _signature(watched)
        seen: list[str] = []
        try:
            new: WebConfig | ConfigError = load_web_config(self.path, seen)
        except ConfigError as e:
            new = e
        extra = tuple(f for f in dict.fromkeys(seen) if f not in watched)
        return new, watched + extra, before + _signature(extra)

    def _loaded(self, new: WebConfig | ConfigError, files: tuple[str, ...], signature: _Signature) -> None:
        self._loading = False
        if isinstance(new, WebConfig) and (weaker := weakenings(self.config, new)):
            new = ConfigError(
                "--web.config.file",
                f"{self.path}: the new config would {' and '.join(weaker)}; refused (restart the exporter to do that on purpose)",
            )
        if isinstance(new, ConfigError):
            self._refused = (files, signature)
            self.reload_failures += 1
            self.last_reload_ok = False
            if str(new) != self._last_error:
                self._last_error = str(new)
                log.error("web_config_reload_failed", file=self.path, error=str(new), keeping="the last good config")
            return
        self._last_error = None
        self._refused = None
        self.last_reload_ok = True
        self.config = new
        known = {entry[0]: entry for entry in signature}
        self._signature = tuple(known[f] for f in new.files) if all(f in known for f in new.files) else _signature(new.files)
        log.info("web_config_reloaded", file=self.path, tls=bool(new.ssl_context), basic_auth=bool(new.users))
