"""TLS and basic auth for the exporter's own endpoints, in the Prometheus
exporter-toolkit web-config file format (``--web.config.file``):

    tls_server_config:
      cert_file: server.crt
      key_file: server.key
      client_auth_type: RequireAndVerifyClientCert   # optional
      client_ca_file: ca.crt                         # with a Verify* client_auth_type
      min_version: TLS12                             # TLS12 (default) or TLS13
    basic_auth_users:
      prometheus: $2y$10$...                         # bcrypt hashes, as htpasswd -B makes

/healthz and /readyz stay open: a kubelet probe carries no password, and neither
says anything about vLLM.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import ssl
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import bcrypt
import yaml
from aiohttp import web

from .settings import ConfigError

CLIENT_AUTH = {
    "NoClientCert": ssl.CERT_NONE,
    "RequestClientCert": ssl.CERT_OPTIONAL,
    "RequireAnyClientCert": ssl.CERT_REQUIRED,
    "VerifyClientCertIfGiven": ssl.CERT_OPTIONAL,
    "RequireAndVerifyClientCert": ssl.CERT_REQUIRED,
}
TLS_VERSIONS = {"TLS12": ssl.TLSVersion.TLSv1_2, "TLS13": ssl.TLSVersion.TLSv1_3}
OPEN_PATHS = frozenset({"/healthz", "/readyz"})
_CACHE_LIMIT = 256


@dataclass
class WebConfig:
    ssl_context: ssl.SSLContext | None = None
    users: Mapping[str, bytes] = field(default_factory=dict)
    # bcrypt costs ~0.1 s by design: remember verified credentials (by digest, never in clear).
    _verified: dict[bytes, bool] = field(default_factory=dict)

    def check(self, header: str | None) -> bool:
        if not self.users:
            return True
        if not header or not header.startswith("Basic "):
            return False
        try:
            user, _, password = base64.b64decode(header[6:], validate=True).decode("utf-8").partition(":")
        except (binascii.Error, UnicodeDecodeError):
            return False
        hashed = self.users.get(user)
        if hashed is None:
            return False
        digest = hashlib.sha256(f"{user}\0{password}".encode()).digest()
        for known, ok in self._verified.items():
            if hmac.compare_digest(known, digest):
                return ok
        ok = bcrypt.checkpw(password.encode(), hashed)
        if len(self._verified) < _CACHE_LIMIT:
            self._verified[digest] = ok
        return ok


def _file(key: str, value, base: Path) -> str:
    if not isinstance(value, str) or not value:
        raise ConfigError(key, "must be a file path")
    path = (base / value) if not Path(value).is_absolute() else Path(value)
    if not path.is_file():
        raise ConfigError(key, f"no such file: {path}")
    return str(path)


def load_web_config(path: str) -> WebConfig:
    key = "--web.config.file"
    try:
        data = yaml.safe_load(Path(path).read_text()) or {}
    except FileNotFoundError:
        raise ConfigError(key, f"no such file: {path}") from None
    except (OSError, yaml.YAMLError) as e:
        raise ConfigError(key, f"cannot read {path}: {str(e).splitlines()[0]}") from None
    if not isinstance(data, dict):
        raise ConfigError(key, "expected a mapping with tls_server_config and/or basic_auth_users")
    for k in data:
        if k not in ("tls_server_config", "basic_auth_users", "http_server_config"):
            raise ConfigError(f"web config {k}", "unknown key (valid: tls_server_config, basic_auth_users)")
    base = Path(path).parent
    config = WebConfig()
    tls = data.get("tls_server_config")
    if tls:
        allowed = ("cert_file", "key_file", "client_auth_type", "client_ca_file", "min_version")
        for k in tls:
            if k not in allowed:
                raise ConfigError(f"tls_server_config.{k}", f"unknown key (valid: {', '.join(allowed)})")
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        version = tls.get("min_version", "TLS12")
        if version not in TLS_VERSIONS:
            raise ConfigError("tls_server_config.min_version", f"{version!r} is not one of TLS12, TLS13")
        ctx.minimum_version = TLS_VERSIONS[version]
        try:
            ctx.load_cert_chain(_file("tls_server_config.cert_file", tls.get("cert_file"), base),
                                _file("tls_server_config.key_file", tls.get("key_file"), base))
        except ssl.SSLError as e:
            raise ConfigError("tls_server_config.cert_file", f"cannot load the certificate and key: {e}") from None
        auth = tls.get("client_auth_type", "NoClientCert")
        if auth not in CLIENT_AUTH:
            raise ConfigError("tls_server_config.client_auth_type", f"{auth!r} is not one of {', '.join(CLIENT_AUTH)}")
        ctx.verify_mode = CLIENT_AUTH[auth]
        if "Verify" in auth:
            ctx.load_verify_locations(_file("tls_server_config.client_ca_file", tls.get("client_ca_file"), base))
        config.ssl_context = ctx
    users = data.get("basic_auth_users") or {}
    if not isinstance(users, dict):
        raise ConfigError("basic_auth_users", "expected a mapping of user: bcrypt hash")
    for user, hashed in users.items():
        if not isinstance(hashed, str) or not hashed.startswith(("$2a$", "$2b$", "$2y$")):
            raise ConfigError(f"basic_auth_users.{user}", "must be a bcrypt hash (htpasswd -nB, or python -c "
                                                           "'import bcrypt; print(bcrypt.hashpw(b\"pw\", bcrypt.gensalt()))')")
        config.users = {**config.users, str(user): hashed.replace("$2y$", "$2b$", 1).encode()}
    return config


def auth_middleware(config: WebConfig):
    @web.middleware
    async def middleware(request: web.Request, handler):
        if request.path in OPEN_PATHS or config.check(request.headers.get("Authorization")):
            return await handler(request)
        return web.Response(status=401, text="unauthorized\n",
                            headers={"WWW-Authenticate": 'Basic realm="vllm-specdec-exporter"'})
    return middleware
