"""The web config file -> a WebConfig value: every key checked, anything the exporter
cannot honour a ConfigError naming the key (the TLS section in tls.py, the files through
files.py)."""

from __future__ import annotations

import secrets
import ssl
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import bcrypt
import yaml

from .. import durations
from ..errors import ConfigError, shown, shown_key
from ..localfiles import read_capped
from ..yamlsafe import load as load_yaml
from .files import SHOWN
from .tls import tls_context

# The toolkit's configurable response headers; a list holds the only valid values.
HEADERS: dict[str, tuple[str, ...]] = {
    "Strict-Transport-Security": (),
    "X-Content-Type-Options": ("nosniff",),
    "X-Frame-Options": ("deny", "sameorigin"),
    "X-XSS-Protection": (),
    "Content-Security-Policy": (),
}
WEB_CONFIG_MAX_DEPTH = 32  # nesting: the deepest real key is 3 levels down


@dataclass(frozen=True)
class WebConfig:
    ssl_context: ssl.SSLContext | None = None
    users: Mapping[str, bytes] = field(default_factory=dict)
    # An unknown user is checked against this (same cost as the real hashes), so
    # that the answer takes as long as for a known user: no user names by timing.
    fake_hash: bytes = b""
    headers: Mapping[str, str] = field(default_factory=dict)
    rate_limit: tuple[float, int] | None = None  # (seconds between requests, burst)
    allowed_sans: frozenset[str] | None = None
    files: tuple[str, ...] = ()  # everything read: re-read when one changes
    client_auth: str = "NoClientCert"


def _http_server_config(http: object) -> dict[str, str]:
    if not isinstance(http, dict):
        raise ConfigError("http_server_config", "expected a mapping")
    for k, v in http.items():
        if k == "http2":
            if v is not False:
                raise ConfigError("http_server_config.http2", "this exporter serves HTTP/1.1 only: set false or leave it out")
        elif k != "headers":
            raise ConfigError(f"http_server_config.{shown_key(k, SHOWN)}", "unknown key (valid: headers, http2)")
    headers = http.get("headers") or {}
    if not isinstance(headers, dict):
        raise ConfigError("http_server_config.headers", "expected a mapping of header: value")
    for name, value in headers.items():
        if name not in HEADERS:
            raise ConfigError(
                f"http_server_config.headers.{shown_key(name, SHOWN)}", f"cannot be configured (valid: {', '.join(HEADERS)})"
            )
        key = f"http_server_config.headers.{name}"
        if value is not None and (not isinstance(value, str | int | float) or isinstance(value, bool)):
            raise ConfigError(key, f"expected a string, not a {type(value).__name__}")
        if isinstance(value, str) and any((c < " " and c != "\t") or c >= "\x7f" for c in value):
            # aiohttp would refuse to send it: every response, /healthz included, would fail.
            raise ConfigError(
                key,
                "contains a control character (CR, LF, NUL, ...) or a non-ASCII one: a header "
                "value is one line of printable ASCII",
            )
        if HEADERS[name] and value not in HEADERS[name]:
            raise ConfigError(key, f"{shown(value, SHOWN)} is not one of {', '.join(HEADERS[name])}")
    return {str(k): str(v) for k, v in headers.items() if v not in (None, "")}


def _rate_limit(rate: object) -> tuple[float, int] | None:
    if not isinstance(rate, dict) or set(rate) - {"interval", "burst"}:
        raise ConfigError("rate_limit", "expected a mapping with interval and burst")
    interval = rate.get("interval", 0)
    if interval in (0, "0", "0s"):
        return None  # as in the toolkit: interval 0 turns the limiter off
    try:
        seconds = durations.parse_duration(interval)
    except ValueError as e:
        raise ConfigError("rate_limit.interval", str(e)) from None
    burst = rate.get("burst", 0)
    if not isinstance(burst, int) or isinstance(burst, bool) or burst < 1:
        raise ConfigError("rate_limit.burst", "must be an integer >= 1")
    return seconds, burst


_FAKE_HASHES: dict[bytes, bytes] = {}


def _fake_hash(cost: bytes) -> bytes:
    if cost not in _FAKE_HASHES:
        _FAKE_HASHES[cost] = bcrypt.hashpw(secrets.token_bytes(16), b"$2b$" + cost + b"$" + bcrypt.gensalt()[7:])
    return _FAKE_HASHES[cost]


_BCRYPT_ALPHABET = frozenset("./ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789")
BCRYPT_COSTS = range(4, 18)  # htpasswd's own: 4-17 (a cost of 31 took days to hash at start-up)


def _bcrypt_hash(key: str, hashed: object) -> bytes:
    """A bcrypt hash as htpasswd -B writes it, checked whole here: one that bcrypt refuses (a
    character outside its alphabet in the salt) loaded, then answered every request with HTTP 500."""
    if not (
        isinstance(hashed, str)
        and len(hashed) == 60
        and hashed[:4] in ("$2a$", "$2b$", "$2y$")
        and hashed[6] == "$"
        and set(hashed[7:]) <= _BCRYPT_ALPHABET
        and hashed[28] in ".Oeu"  # the salt's last character carries 2 bits: 16 bytes in 22 characters
    ):
        raise ConfigError(key, "must be a bcrypt hash (htpasswd -nBC 10 '' | tr -d ':\\n')")
    cost = hashed[4:6]
    if not (cost.isascii() and cost.isdigit() and int(cost) in BCRYPT_COSTS):
        raise ConfigError(key, f"bcrypt cost {cost!r} outside {BCRYPT_COSTS.start}-{BCRYPT_COSTS.stop - 1} (htpasswd's own)")
    return hashed.replace("$2y$", "$2b$", 1).encode()


def load_web_config(path: str, seen: list[str] | None = None) -> WebConfig:
    """The web config in ``path``; ``seen`` gets every file it read or looked for,
    also when it fails (a reload waits for one of them to change)."""
    try:
        return _load_web_config(path, [] if seen is None else seen)
    except ConfigError:
        raise
    except Exception as e:  # a value of a type no check above expected (a list where a name goes, ...)
        raise ConfigError("--web.config.file", f"{path}: a value of an unexpected type ({type(e).__name__})") from None


def _load_web_config(path: str, files: list[str]) -> WebConfig:
    key = "--web.config.file"
    files.append(str(Path(path)))
    text = read_capped(key, path)
    try:
        data = load_yaml(text.decode("utf-8"), WEB_CONFIG_MAX_DEPTH) or {}
    except (UnicodeDecodeError, yaml.YAMLError) as e:
        first = getattr(e, "problem", None) or getattr(e, "strerror", None) or type(e).__name__
        raise ConfigError(key, f"cannot read {path}: {first}") from None  # never quote the file: it may hold a key
    if not isinstance(data, dict):
        raise ConfigError(key, "expected a mapping with tls_server_config and/or basic_auth_users")
    valid = ("tls_server_config", "http_server_config", "rate_limit", "basic_auth_users")
    for k in data:
        if k not in valid:
            raise ConfigError(f"web config {shown_key(k, SHOWN)}", f"unknown key (valid: {', '.join(valid)})")
    for k in valid:  # a section left empty (null) is left out; any other non-mapping was ignored unsaid
        if data.get(k) is not None and not isinstance(data[k], dict):
            raise ConfigError(k, f"expected a mapping, not {shown(data[k], SHOWN)}")
    base = Path(path).parent
    ctx, sans = (None, None)
    if data.get("tls_server_config"):
        ctx, sans = tls_context(data["tls_server_config"], base, files)
    headers = _http_server_config(data["http_server_config"]) if data.get("http_server_config") else {}
    rate = _rate_limit(data["rate_limit"]) if data.get("rate_limit") else None
    users = {}
    for user, hashed in (data.get("basic_auth_users") or {}).items():
        if not isinstance(user, str):  # YAML reads yes as True, 0123 as 83, ~ as None: a name nobody can send
            raise ConfigError(
                f"basic_auth_users.{shown_key(user, SHOWN)}",
                f"a user name must be a string (YAML read a {type(user).__name__}): quote it",
            )
        users[user] = _bcrypt_hash(f"basic_auth_users.{shown_key(user, SHOWN)}", hashed)
    fake = _fake_hash(max(h[4:6] for h in users.values())) if users else b""
    auth = data["tls_server_config"].get("client_auth_type", "NoClientCert") if ctx else "NoClientCert"
    return WebConfig(
        ssl_context=ctx,
        users=users,
        fake_hash=fake,
        headers=headers,
        rate_limit=rate,
        allowed_sans=sans,
        files=tuple(dict.fromkeys(files)),
        client_auth=auth,
    )
