"""Secrets never in output: a target's URL as shown anywhere (redact_url), the forms its
credentials could come back in (credentials), and target text with them taken out (scrub).
The one place for it: the CLI, the sidecar's poller, its logs, pages and errors all go through it."""

from __future__ import annotations

import base64
import re
from typing import TypeVar
from urllib.parse import unquote, unquote_plus, urlsplit, urlunsplit


def _redact_query(query: str) -> str:
    return "&".join(f"{p.split('=', 1)[0]}=<redacted>" if p.partition("=")[2] else p for p in query.split("&"))


def redact_url(url: str) -> str:
    """The URL as shown anywhere (landing page, summary, logs, errors): without any
    user:password part, and with every query value replaced by <redacted> (a
    ``?token=...`` is a password too). A file path is returned as is, unless it looks like a
    URL with its scheme mistyped (``user:pw@host``, ``http//``, ``http:/``)."""
    if "://" not in url:
        return _redact_mistyped(url)
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 -- raises ValueError on a port over 65535
    except ValueError:  # e.g. http://[::1/, a port over 65535, or user:pw cut at a comma: never echo a secret
        return url.split("://", 1)[0] + "://<invalid URL>"
    netloc = parts.netloc.rpartition("@")[2]
    return urlunsplit((parts.scheme, netloc, parts.path, _redact_query(parts.query), parts.fragment))


def _redact_mistyped(text: str) -> str:
    """``text`` with no "://": a file name as is; a URL whose scheme is missing or mistyped (an '@' in
    it, or it starts with "http") without what comes before its last '@' and its query values."""
    if "@" not in text and not text.lower().startswith("http"):
        return text
    if "@" in text:
        text = "<redacted>@" + text.rpartition("@")[2]
    head, q, query = text.partition("?")
    return head + q + _redact_query(query) if q else text


def credentials(url: str, token: str | None = None) -> tuple[str, ...]:
    """Every form in which a target's credentials could come back in its own answer
    (an echoed header, a quoted first line): the URL's password and query values, raw
    and decoded, the Basic header built from the password, and the bearer token."""
    try:
        parts = urlsplit(url)
        user, password = parts.username, parts.password
    except ValueError:
        user = password = None
    query = url.partition("?")[2].partition("#")[0] if "://" in url else ""  # not a file name's '?'
    found = [token] if token else []
    if password:
        pair = f"{unquote(user or '')}:{unquote(password)}".encode()
        found += [password, unquote(password), base64.b64encode(pair).decode()]
    for key, _, value in (p.partition("=") for p in query.split("&")):
        # A value under a credential-like key, or long enough to be a generated secret; not
        # `format=text`, which would turn every "not Prometheus text" into "<redacted>".
        if _SECRET_KEY.search(unquote_plus(key)) or len(value) >= 12:
            found += [value, unquote(value), unquote_plus(value)]
    return tuple(s for s in dict.fromkeys(found) if len(s) >= 4)


_SECRET_KEY = re.compile(r"(?i)token|key|secret|pass|pwd|auth|sig|cred|session|bearer|jwt")


_Text = TypeVar("_Text", str, str | None)


def scrub(text: _Text, secrets: tuple[str, ...]) -> _Text:
    """``text`` with every secret replaced: target-supplied text shown anywhere goes
    through this. Also a secret's first 8+ characters: a quoted line may be cut short."""
    for secret in secrets:
        for end in range(len(secret), min(len(secret), 8) - 1, -1):  # a short secret whole
            if text and secret[:end] in text:
                text = text.replace(secret[:end], "<redacted>")
    return text
