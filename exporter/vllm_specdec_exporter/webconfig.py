"""TLS and basic auth for the exporter's own endpoints, in the Prometheus
exporter-toolkit web-config file format (``--web.config.file``), with its semantics
(github.com/prometheus/exporter-toolkit, web/tls_config.go and web/handler.go):

    tls_server_config:
      cert_file: server.crt                          # or cert: <PEM> inline is refused (see below)
      key_file: server.key
      client_auth_type: RequireAndVerifyClientCert   # NoClientCert (default) or VerifyClientCertIfGiven;
                                                     # RequestClientCert, RequireAnyClientCert: refused
      client_ca_file: ca.crt                         # or client_ca: <PEM>
      client_allowed_sans: [prometheus.monitoring]   # the client cert must carry one of these SANs (IPs: any spelling)
      min_version: TLS12                             # TLS12 (default) or TLS13
      max_version: TLS13                             # TLS12 or TLS13 (default)
      cipher_suites: [TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256]   # Go names; TLS 1.3 suites as in Go: fixed
      prefer_server_cipher_suites: true              # default true
      curve_preferences: [X25519]                    # one curve: Python's ssl sets no list of them
    http_server_config:
      headers: {X-Frame-Options: deny}               # the toolkit's five security headers
      http2: false                                   # this server speaks HTTP/1.1 only: true is refused
    rate_limit: {interval: 100ms, burst: 10}         # token bucket per client address, 429 beyond it
    basic_auth_users:
      prometheus: $2y$10$...                         # bcrypt hashes, as htpasswd -B makes

Anything the exporter cannot honour is a config error naming the key, never ignored.
The file and every file it names are re-read when they change (checked at most once
a second, on new connections and requests): new connections get the new
certificate, open ones keep theirs. The config fails closed, as exporter-toolkit's
never falls back to plaintext: a reload that does not load, or that would weaken
the config (turn TLS off, remove every user, stop requiring or verifying client
certificates, drop client_allowed_sans, lower min_version, remove or loosen
rate_limit, remove or change a header), keeps the last good config and logs one
error line naming the file; a deliberate weakening takes a restart. An unchanged
refused file is not read again. /healthz and /readyz stay open: a kubelet probe
carries no password, and neither says anything about vLLM.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import hashlib
import hmac
import ipaddress
import os
import secrets
import ssl
import stat
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import bcrypt
import structlog
import yaml
from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

from . import config
from .errors import ConfigError, shown, shown_key
from .yamlsafe import load as load_yaml

log = structlog.get_logger("vllm_specdec_exporter")

# exporter-toolkit name -> (OpenSSL verify flags, verify the chain against client_ca_file)
_SHOWN = 60  # what an error message quotes of one value from the web config
CLIENT_AUTH = {
    "NoClientCert": (ssl.CERT_NONE, False),
    "VerifyClientCertIfGiven": (ssl.CERT_OPTIONAL, True),
    "RequireAndVerifyClientCert": (ssl.CERT_REQUIRED, True),
}
# The toolkit's modes that accept a client certificate without verifying it -> what to
# use instead. Python's ssl module verifies every certificate it asks for (CERT_OPTIONAL,
# CERT_REQUIRED) and has no API to ask for one and accept it unverified: refused.
CLIENT_AUTH_REFUSED = {
    "RequestClientCert": "VerifyClientCertIfGiven",
    "RequireAnyClientCert": "RequireAndVerifyClientCert",
    "RequireClientCert": "RequireAndVerifyClientCert",  # the toolkit's old name for RequireAnyClientCert
}
# TLS 1.0/1.1: OpenSSL 3's default security level refuses them whatever the config says.
TLS_VERSIONS = {"TLS12": ssl.TLSVersion.TLSv1_2, "TLS13": ssl.TLSVersion.TLSv1_3}
# Go's tls.CipherSuites() names -> OpenSSL names. The three TLS 1.3 suites are accepted
# and, as in Go, change nothing: TLS 1.3 suites are not configurable there either.
CIPHERS = {
    "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256": "ECDHE-ECDSA-AES128-GCM-SHA256",
    "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384": "ECDHE-ECDSA-AES256-GCM-SHA384",
    "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256": "ECDHE-RSA-AES128-GCM-SHA256",
    "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384": "ECDHE-RSA-AES256-GCM-SHA384",
    "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256": "ECDHE-ECDSA-CHACHA20-POLY1305",
    "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256": "ECDHE-RSA-CHACHA20-POLY1305",
    "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA": "ECDHE-ECDSA-AES128-SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA": "ECDHE-ECDSA-AES256-SHA",
    "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA": "ECDHE-RSA-AES128-SHA",
    "TLS_ECDHE_RSA_WITH_AES_256_CBC_SHA": "ECDHE-RSA-AES256-SHA",
    "TLS_AES_128_GCM_SHA256": None,
    "TLS_AES_256_GCM_SHA384": None,
    "TLS_CHACHA20_POLY1305_SHA256": None,
}
# Go's names -> OpenSSL's short names, as SSLContext.set_ecdh_curve takes them. That is
# Python's only curve setting, and it sets one curve (the only group offered): a list of
# several, an order of preference, is refused.
CURVES = {"CurveP256": "prime256v1", "CurveP384": "secp384r1", "CurveP521": "secp521r1", "X25519": "X25519"}
# The toolkit's configurable response headers; a list holds the only valid values.
HEADERS: dict[str, tuple[str, ...]] = {
    "Strict-Transport-Security": (),
    "X-Content-Type-Options": ("nosniff",),
    "X-Frame-Options": ("deny", "sameorigin"),
    "X-XSS-Protection": (),
    "Content-Security-Policy": (),
}
TLS_KEYS = (
    "cert_file",
    "key_file",
    "client_auth_type",
    "client_ca_file",
    "client_ca",
    "client_allowed_sans",
    "min_version",
    "max_version",
    "cipher_suites",
    "prefer_server_cipher_suites",
    "curve_preferences",
)
OPEN_PATHS = frozenset({"/healthz", "/readyz"})
WEB_CONFIG_MAX_BYTES = 1 << 20  # a web config is a few hundred bytes; more is refused unread
WEB_CONFIG_MAX_DEPTH = 32  # nesting: the deepest real key is 3 levels down
RATE_LIMIT_CLIENTS = 1024
# bcrypt checks waiting or running (one worker, ~0.1-0.2 s each at cost 10) per client
# address, and client addresses with checks pending; beyond them a request is refused
# (429) without one. The checks take turns by address (Authenticator.verify), so the right
# password waits for at most one check per other address, never for the pile a few
# addresses can keep queued: a bound on checks in all let 8 addresses refuse it every time.
BCRYPT_MAX_PENDING_PER_CLIENT = 4
BCRYPT_MAX_CLIENTS = 32  # ~3-6 s of checks ahead at most: inside a scrape timeout
# That 429 comes after this pause: a client sending again as soon as answered gets a few
# a second per connection, not thousands (which would cost the event loop what bcrypt no longer does).
BCRYPT_REFUSAL_DELAY_SECONDS = 0.2  # rate-limit buckets kept (least recently used dropped first)


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
        if new.ssl_context and new.ssl_context.minimum_version < old.ssl_context.minimum_version:
            out.append(f"lower the TLS version floor ({_tls_name(old.ssl_context)} -> {_tls_name(new.ssl_context)})")
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


def _tls_name(ctx: ssl.SSLContext) -> str:
    return next((name for name, v in TLS_VERSIONS.items() if v == ctx.minimum_version), str(ctx.minimum_version))


def _rate_name(rate: tuple[float, int]) -> str:
    return f"interval {rate[0]:g}s, burst {rate[1]}"


# --- Loading ------------------------------------------------------------------------


def _path(key: str, value: object, base: Path, files: list[str]) -> str:
    """The file ``value`` names; added to ``files`` (watched for changes) before it is checked."""
    if not isinstance(value, str) or not value:
        raise ConfigError(key, "must be a file path")
    path = (base / value) if not Path(value).is_absolute() else Path(value)
    files.append(str(path))
    _regular_file(key, str(path))
    return str(path)


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


def _regular_file(key: str, path: str) -> os.stat_result:
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


def _read_capped(key: str, path: str, limit: int = WEB_CONFIG_MAX_BYTES) -> bytes:
    """The file's bytes, if it is a regular file of at most ``limit`` bytes. Opened
    without blocking (a FIFO swapped in after the stat opens at once, and is refused
    by its fstat), read no further than the limit."""
    if _regular_file(key, path).st_size > limit:
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


def _names(key: str, value: object, valid: Mapping[str, object]) -> list[str]:
    if not isinstance(value, list) or not value:
        raise ConfigError(key, "expected a non-empty list")
    for name in value:
        if name not in valid:
            raise ConfigError(key, f"unknown {shown(name, _SHOWN)} (valid: {', '.join(valid)})")
    return value


def _version(tls: dict[str, object], key: str, default: str) -> ssl.TLSVersion:
    value = tls.get(key, default)
    if value not in TLS_VERSIONS:
        raise ConfigError(
            f"tls_server_config.{key}",
            f"{shown(value, _SHOWN)} is not one of TLS12, TLS13 (OpenSSL here refuses TLS 1.0 and 1.1)",
        )
    return TLS_VERSIONS[value]


def _tls_context(tls: object, base: Path, files: list[str]) -> tuple[ssl.SSLContext, frozenset[str] | None]:
    if not isinstance(tls, dict):
        raise ConfigError("tls_server_config", "expected a mapping")
    for k in tls:
        if k not in TLS_KEYS:
            hint = "; put the PEM in a file and use cert_file/key_file" if k in ("cert", "key") else ""
            raise ConfigError(
                f"tls_server_config.{shown_key(k, _SHOWN)}", f"unknown or unsupported key{hint} (valid: {', '.join(TLS_KEYS)})"
            )
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.minimum_version = _version(tls, "min_version", "TLS12")
    ctx.maximum_version = _version(tls, "max_version", "TLS13")
    if ctx.minimum_version > ctx.maximum_version:
        raise ConfigError("tls_server_config.min_version", "is above max_version")
    cert = _path("tls_server_config.cert_file", tls.get("cert_file"), base, files)
    key = _path("tls_server_config.key_file", tls.get("key_file"), base, files)
    try:
        ctx.load_cert_chain(cert, key)
    except ssl.SSLError as e:  # never quote the files: one of them is a private key
        raise ConfigError("tls_server_config.cert_file", f"cannot load the certificate and key ({e.reason})") from None
    auth = tls.get("client_auth_type", "NoClientCert")
    if isinstance(auth, str) and auth in CLIENT_AUTH_REFUSED:
        raise ConfigError(
            "tls_server_config.client_auth_type",
            f"{auth} (accept a client certificate without verifying it) cannot be honoured: Python's "
            f"ssl module verifies every certificate it asks for; use {CLIENT_AUTH_REFUSED[auth]} "
            "with client_ca_file",
        )
    if auth not in CLIENT_AUTH:
        raise ConfigError("tls_server_config.client_auth_type", f"{shown(auth, _SHOWN)} is not one of {', '.join(CLIENT_AUTH)}")
    mode, verify = CLIENT_AUTH[auth]
    has_ca = "client_ca_file" in tls or "client_ca" in tls
    if has_ca and mode == ssl.CERT_NONE:
        raise ConfigError("tls_server_config.client_ca_file", "set without a client_auth_type that asks for a client certificate")
    if verify and not has_ca:
        # exporter-toolkit would fall back to the system roots: any publicly issued
        # certificate would pass. Stricter here.
        raise ConfigError("tls_server_config.client_ca_file", f"required with client_auth_type {auth}")
    try:
        if "client_ca_file" in tls:
            ctx.load_verify_locations(cafile=_path("tls_server_config.client_ca_file", tls["client_ca_file"], base, files))
        elif "client_ca" in tls:
            ctx.load_verify_locations(cadata=str(tls["client_ca"]))
    except ssl.SSLError as e:
        raise ConfigError("tls_server_config.client_ca_file", f"cannot load the CA certificates ({e.reason})") from None
    ctx.verify_mode = mode
    if "cipher_suites" in tls:
        wanted = [CIPHERS[n] for n in _names("tls_server_config.cipher_suites", tls["cipher_suites"], CIPHERS)]
        tls12 = [n for n in wanted if n]
        if tls12:
            ctx.set_ciphers(":".join(tls12))
        else:  # only TLS 1.3 suites listed: as in Go, no TLS 1.2 handshake can succeed
            ctx.minimum_version = ssl.TLSVersion.TLSv1_3
    prefer = tls.get("prefer_server_cipher_suites", True)
    if not isinstance(prefer, bool):
        raise ConfigError("tls_server_config.prefer_server_cipher_suites", "must be true or false")
    ctx.options = (ctx.options | ssl.OP_CIPHER_SERVER_PREFERENCE) if prefer else (ctx.options & ~ssl.OP_CIPHER_SERVER_PREFERENCE)
    if "curve_preferences" in tls:
        curves = _names("tls_server_config.curve_preferences", tls["curve_preferences"], CURVES)
        if len(curves) > 1:
            raise ConfigError(
                "tls_server_config.curve_preferences",
                f"{len(curves)} curves listed: Python's ssl module sets one curve, not an order of "
                f"preference; list one (e.g. [{curves[0]}]) or leave the key out for OpenSSL's defaults",
            )
        try:
            ctx.set_ecdh_curve(CURVES[curves[0]])
        except (ValueError, ssl.SSLError):
            raise ConfigError("tls_server_config.curve_preferences", f"OpenSSL here refuses {curves[0]}") from None
    sans = tls.get("client_allowed_sans")
    if sans is not None:
        if not isinstance(sans, list) or not all(isinstance(s, str) for s in sans):
            raise ConfigError("tls_server_config.client_allowed_sans", "expected a list of strings")
        if mode == ssl.CERT_NONE:
            raise ConfigError(
                "tls_server_config.client_allowed_sans", "needs a client_auth_type that asks for a client certificate"
            )
    return ctx, None if sans is None else frozenset(form for san in sans for form in san_forms(san))


def san_forms(san: str) -> set[str]:
    """``san`` and, for an IP address, every form the client certificate's SAN can take
    in Python's ``getpeercert()`` (which server.py compares): Python writes an IPv6 SAN
    as 2001:DB8:0:0:0:0:0:5, upper case and uncompressed, and an IPv4 address carried
    in 16 bytes as IPv6. exporter-toolkit compares Go's normalized form; here any
    spelling of an allowed address matches the same address in the certificate."""
    try:
        ip = ipaddress.ip_address(san.strip())
    except ValueError:
        return {san}
    v4: ipaddress.IPv4Address | None
    if isinstance(ip, ipaddress.IPv4Address):
        v4, v6 = ip, ipaddress.IPv6Address(b"\0" * 10 + b"\xff\xff" + ip.packed)
    else:
        v4, v6 = ip.ipv4_mapped, ip
    out = {san, _python_ip(v6)}
    if v4 is not None:
        out.add(str(v4))
    return out


def _python_ip(ip: ipaddress.IPv6Address) -> str:
    """An IPv6 address as CPython's ssl module shows it in a certificate's SAN."""
    return ":".join(format(int.from_bytes(ip.packed[i : i + 2], "big"), "X") for i in range(0, 16, 2))


def _http_server_config(http: object) -> dict[str, str]:
    if not isinstance(http, dict):
        raise ConfigError("http_server_config", "expected a mapping")
    for k, v in http.items():
        if k == "http2":
            if v is not False:
                raise ConfigError("http_server_config.http2", "this exporter serves HTTP/1.1 only: set false or leave it out")
        elif k != "headers":
            raise ConfigError(f"http_server_config.{shown_key(k, _SHOWN)}", "unknown key (valid: headers, http2)")
    headers = http.get("headers") or {}
    if not isinstance(headers, dict):
        raise ConfigError("http_server_config.headers", "expected a mapping of header: value")
    for name, value in headers.items():
        if name not in HEADERS:
            raise ConfigError(
                f"http_server_config.headers.{shown_key(name, _SHOWN)}", f"cannot be configured (valid: {', '.join(HEADERS)})"
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
            raise ConfigError(key, f"{shown(value, _SHOWN)} is not one of {', '.join(HEADERS[name])}")
    return {str(k): str(v) for k, v in headers.items() if v not in (None, "")}


def _rate_limit(rate: object) -> tuple[float, int] | None:
    if not isinstance(rate, dict) or set(rate) - {"interval", "burst"}:
        raise ConfigError("rate_limit", "expected a mapping with interval and burst")
    interval = rate.get("interval", 0)
    if interval in (0, "0", "0s"):
        return None  # as in the toolkit: interval 0 turns the limiter off
    try:
        seconds = config.parse_duration(interval)
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
    text = _read_capped(key, path)
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
            raise ConfigError(f"web config {shown_key(k, _SHOWN)}", f"unknown key (valid: {', '.join(valid)})")
    base = Path(path).parent
    ctx, sans = (None, None)
    if data.get("tls_server_config"):
        ctx, sans = _tls_context(data["tls_server_config"], base, files)
    headers = _http_server_config(data["http_server_config"]) if data.get("http_server_config") else {}
    rate = _rate_limit(data["rate_limit"]) if data.get("rate_limit") else None
    users_in = data.get("basic_auth_users") or {}
    if not isinstance(users_in, dict):
        raise ConfigError("basic_auth_users", "expected a mapping of user: bcrypt hash")
    users = {}
    for user, hashed in users_in.items():
        if not isinstance(hashed, str) or not hashed.startswith(("$2a$", "$2b$", "$2y$")) or len(hashed) != 60:
            raise ConfigError(
                f"basic_auth_users.{shown_key(user, _SHOWN)}", "must be a bcrypt hash (htpasswd -nBC 10 '' | tr -d ':\\n')"
            )
        users[str(user)] = hashed.replace("$2y$", "$2b$", 1).encode()
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


# --- Basic auth -----------------------------------------------------------------------


@dataclass(frozen=True)
class Credentials:
    user: str
    password: bytes
    hashed: bytes  # the user's hash, or the fake one for an unknown user
    known: bool
    digest: bytes  # HMAC of user, hash and password: the success cache's key


class Authenticator:
    """Basic-auth checks with bcrypt on a small thread pool, never on the event loop.

    Only successes are cached (an LRU of HMAC digests under a per-process key, never
    the password): a flood of wrong passwords cannot fill the cache, and every wrong
    password costs the attacker a full bcrypt. The checks pending are bounded per
    client, and so is the number of clients (``verify`` answers None beyond): the queue
    cannot grow. Clients take turns: one check each at a time."""

    def __init__(
        self,
        workers: int = config.BCRYPT_WORKERS,
        cache_size: int = config.AUTH_CACHE_SIZE,
        max_clients: int = BCRYPT_MAX_CLIENTS,
        max_pending_per_client: int = BCRYPT_MAX_PENDING_PER_CLIENT,
    ):
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="bcrypt")
        self._key = secrets.token_bytes(32)
        self._ok: OrderedDict[bytes, None] = OrderedDict()
        self._size = cache_size
        self._max_clients, self._max_per_client = max_clients, max_pending_per_client
        self._pending: dict[str, int] = {}  # client -> checks waiting or running
        self._turns: dict[str, asyncio.Lock] = {}  # client -> its one check in the pool's queue
        self.refused = 0  # checks refused as over the bound

    def credentials(self, cfg: WebConfig, header: str | None) -> Credentials | None:
        """The request's basic-auth credentials; None when it has none or they are malformed."""
        if not header or not header.startswith("Basic "):
            return None
        try:
            user, _, password = base64.b64decode(header[6:], validate=True).decode("utf-8").partition(":")
        except (binascii.Error, UnicodeDecodeError):
            return None
        hashed = cfg.users.get(user, cfg.fake_hash)
        digest = hmac.new(self._key, b"\0".join((user.encode(), hashed, password.encode())), hashlib.sha256).digest()
        return Credentials(user, password.encode(), hashed, user in cfg.users, digest)

    def cached(self, creds: Credentials) -> bool:
        """Checked successfully before (no bcrypt needed)."""
        if creds.digest in self._ok:
            self._ok.move_to_end(creds.digest)
            return True
        return False

    async def verify(self, creds: Credentials, client: str = "-") -> bool | None:
        """True if right, False if wrong, None if too many checks are pending (for
        ``client``, or in all): refuse the request without one."""
        if self.cached(creds):
            return True
        pending = self._pending.get(client, 0)
        if pending >= self._max_per_client or (not pending and len(self._pending) >= self._max_clients):
            self.refused += 1
            return None
        self._pending[client] = pending + 1
        turn = self._turns.setdefault(client, asyncio.Lock())
        try:
            # One check per client in the pool's first-come queue makes it round-robin by
            # client: a client's next check queues behind every other client's current one.
            async with turn:
                loop = asyncio.get_running_loop()
                ok = await loop.run_in_executor(self._pool, bcrypt.checkpw, creds.password, creds.hashed) and creds.known
        finally:
            self._pending[client] -= 1
            if not self._pending[client]:  # nobody holds or waits for its turn
                del self._pending[client], self._turns[client]
        if ok:
            self._ok[creds.digest] = None
            while len(self._ok) > self._size:
                self._ok.popitem(last=False)
        return ok

    async def check(self, cfg: WebConfig, header: str | None, client: str = "-") -> bool | None:
        creds = self.credentials(cfg, header)
        return creds is not None and await self.verify(creds, client)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


class _Bucket:
    """A token bucket: ``burst`` requests at once, then one per ``interval``."""

    def __init__(self, interval: float, burst: int, mono: Callable[[], float]):
        self.interval, self.burst, self.mono = interval, burst, mono
        self.tokens, self.at = float(burst), mono()

    def allow(self) -> bool:
        now = self.mono()
        self.tokens = min(self.burst, self.tokens + (now - self.at) / self.interval)
        self.at = now
        if self.tokens >= 1:
            self.tokens -= 1
            return True
        return False


def client_key(remote: str | None) -> str:
    """Whom a rate-limit bucket belongs to: the client's IPv4 address, or its IPv6 /64
    (one host commonly holds a whole /64)."""
    if not remote:
        return "-"
    try:
        ip = ipaddress.ip_address(remote.split("%", 1)[0])
    except ValueError:
        return remote  # a Unix socket's path
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped:
            return str(ip.ipv4_mapped)
        return str(ipaddress.IPv6Network((ip, 64), strict=False))
    return str(ip)


class RateLimiter:
    """rate_limit's token bucket, one per client address and per kind of request
    (authenticated or not), the least recently used dropped beyond ``max_clients``
    (its client starts again with a full burst: dropping one never refuses anybody)."""

    def __init__(self, mono: Callable[[], float], max_clients: int = RATE_LIMIT_CLIENTS):
        self.mono, self.max_clients = mono, max_clients
        self._rate: tuple[float, int] | None = None
        self._buckets: OrderedDict[tuple[str, str], _Bucket] = OrderedDict()

    def allow(self, rate: tuple[float, int], kind: str, client: str) -> bool:
        if rate != self._rate:  # a reload changed the limit: start again
            self._rate = rate
            self._buckets.clear()
        key = (kind, client)
        bucket = self._buckets.get(key)
        if bucket is None:
            bucket = self._buckets[key] = _Bucket(*rate, self.mono)
            while len(self._buckets) > self.max_clients:
                self._buckets.popitem(last=False)
        else:
            self._buckets.move_to_end(key)
        return bucket.allow()


def _too_many(retry_after: int | None = None) -> web.Response:
    return web.Response(
        status=429, text="too many requests\n", headers={"Retry-After": str(retry_after)} if retry_after else None
    )


def auth_middleware(live: LiveWebConfig, authenticator: Authenticator, mono: Callable[[], float] = time.monotonic) -> Middleware:
    """Basic auth and rate_limit. exporter-toolkit takes one bucket for every request
    before auth, so a client without the password could use up the real scrapes'
    share; here each client address has its own buckets, and requests without valid
    credentials (none, malformed, wrong, or not yet known to be right) draw on a
    bucket of their own: they can neither use up nor wait for an authenticated one's."""
    limiter = RateLimiter(mono)

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        cfg = live.current()
        try:
            response = await _guarded(request, handler, cfg)
        except web.HTTPException as e:  # 404 and friends get the configured headers too
            e.headers.update(cfg.headers)
            raise
        response.headers.update(cfg.headers)
        return response

    async def _guarded(request: web.Request, handler: Handler, cfg: WebConfig) -> web.StreamResponse:
        if request.path in OPEN_PATHS:
            return await handler(request)
        client = client_key(request.remote)
        if not cfg.users:
            if cfg.rate_limit and not limiter.allow(cfg.rate_limit, "any", client):
                return _too_many()
            return await handler(request)
        creds = authenticator.credentials(cfg, request.headers.get("Authorization"))
        if creds is not None and authenticator.cached(creds):
            if cfg.rate_limit and not limiter.allow(cfg.rate_limit, "authenticated", client):
                return _too_many()
            return await handler(request)
        # Not known to be right: its own bucket, taken before the bcrypt it would cost.
        if cfg.rate_limit and not limiter.allow(cfg.rate_limit, "unauthenticated", client):
            return _too_many()
        if creds is not None:
            ok = await authenticator.verify(creds, client)
            if ok is None:  # too many password checks pending: refused without one
                await asyncio.sleep(BCRYPT_REFUSAL_DELAY_SECONDS)
                return _too_many(retry_after=1)
            if ok:
                return await handler(request)
        return web.Response(
            status=401, text="unauthorized\n", headers={"WWW-Authenticate": 'Basic realm="vllm-specdec-exporter"'}
        )

    return middleware
