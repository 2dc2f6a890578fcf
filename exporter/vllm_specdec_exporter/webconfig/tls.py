"""tls_server_config -> the SSLContext new connections get: TLS versions, Go's cipher
suite and curve names, exporter-toolkit's client-certificate modes (the ones Python's ssl
module cannot honour refused), and client_allowed_sans in every form a certificate's SAN
can take."""

from __future__ import annotations

import ipaddress
import ssl
from collections.abc import Mapping
from pathlib import Path

from ..errors import ConfigError, shown, shown_key
from .files import SHOWN, named_file

# exporter-toolkit name -> (OpenSSL verify flags, verify the chain against client_ca_file)
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


def _names(key: str, value: object, valid: Mapping[str, object]) -> list[str]:
    if not isinstance(value, list) or not value:
        raise ConfigError(key, "expected a non-empty list")
    for name in value:
        if not isinstance(name, str) or name not in valid:
            raise ConfigError(key, f"unknown {shown(name, SHOWN)} (valid: {', '.join(valid)})")
    return value


def _version(tls: dict[str, object], key: str, default: str) -> ssl.TLSVersion:
    value = tls.get(key, default)
    if not isinstance(value, str) or value not in TLS_VERSIONS:
        raise ConfigError(
            f"tls_server_config.{key}",
            f"{shown(value, SHOWN)} is not one of TLS12, TLS13 (OpenSSL here refuses TLS 1.0 and 1.1)",
        )
    return TLS_VERSIONS[value]


def tls_context(tls: object, base: Path, files: list[str]) -> tuple[ssl.SSLContext, frozenset[str] | None]:
    if not isinstance(tls, dict):
        raise ConfigError("tls_server_config", "expected a mapping")
    for k in tls:
        if k not in TLS_KEYS:
            hint = "; put the PEM in a file and use cert_file/key_file" if k in ("cert", "key") else ""
            raise ConfigError(
                f"tls_server_config.{shown_key(k, SHOWN)}", f"unknown or unsupported key{hint} (valid: {', '.join(TLS_KEYS)})"
            )
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.minimum_version = _version(tls, "min_version", "TLS12")
    ctx.maximum_version = _version(tls, "max_version", "TLS13")
    if ctx.minimum_version > ctx.maximum_version:
        raise ConfigError("tls_server_config.min_version", "is above max_version")
    cert = named_file("tls_server_config.cert_file", tls.get("cert_file"), base, files)
    key = named_file("tls_server_config.key_file", tls.get("key_file"), base, files)
    try:
        ctx.load_cert_chain(cert, key)
    except ssl.SSLError as e:  # never quote the files: one of them is a private key
        why = e.reason or "not a PEM certificate and its matching private key: swapped, or another key?"
        raise ConfigError("tls_server_config.cert_file", f"cannot load the certificate and key ({why})") from None
    auth = tls.get("client_auth_type", "NoClientCert")
    if isinstance(auth, str) and auth in CLIENT_AUTH_REFUSED:
        raise ConfigError(
            "tls_server_config.client_auth_type",
            f"{auth} (accept a client certificate without verifying it) cannot be honoured: Python's "
            f"ssl module verifies every certificate it asks for; use {CLIENT_AUTH_REFUSED[auth]} "
            "with client_ca_file",
        )
    if not isinstance(auth, str) or auth not in CLIENT_AUTH:
        raise ConfigError("tls_server_config.client_auth_type", f"{shown(auth, SHOWN)} is not one of {', '.join(CLIENT_AUTH)}")
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
            ctx.load_verify_locations(cafile=named_file("tls_server_config.client_ca_file", tls["client_ca_file"], base, files))
        elif "client_ca" in tls:
            ctx.load_verify_locations(cadata=str(tls["client_ca"]))
    except ssl.SSLError as e:
        which = "client_ca_file" if "client_ca_file" in tls else "client_ca"
        raise ConfigError(
            f"tls_server_config.{which}", f"cannot load the CA certificates ({e.reason or 'not PEM certificates'})"
        ) from None
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
    if sans is not None and (not isinstance(sans, list) or not all(isinstance(s, str) for s in sans)):
        raise ConfigError("tls_server_config.client_allowed_sans", "expected a list of strings")
    if not sans:  # as in exporter-toolkit, an empty list restricts nothing (it refused every client)
        return ctx, None
    if mode == ssl.CERT_NONE:
        raise ConfigError("tls_server_config.client_allowed_sans", "needs a client_auth_type that asks for a client certificate")
    return ctx, frozenset(form for san in sans for form in san_forms(san))


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


def tls_name(version: ssl.TLSVersion) -> str:
    return next((name for name, v in TLS_VERSIONS.items() if v == version), str(version))
