"""Where payloads come from: an http(s) URL, a file, or stdin ('-').

``fetch_metrics`` is the one HTTP fetch, shared by the CLI and the sidecar: it caps
the body while streaming, so an endless response cannot exhaust memory.
"""

from __future__ import annotations

import sys
from http import HTTPStatus
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit, urlunsplit

from . import config
from .errors import clip
from .parser import PayloadTooLarge
from .redaction import credentials, redact_url, scrub

if TYPE_CHECKING:  # aiohttp is imported where a URL is fetched: `report FILE` starts without it (~250 ms)
    import aiohttp

TARGET_TEXT_CHARS = 120  # what an error quotes of a target's own text (aiohttp quotes the bytes it could not read)
ACCEPT = "text/plain;version=0.0.4;q=0.9,application/openmetrics-text;version=1.0.0;q=0.5,*/*;q=0.1"


class SourceError(Exception):
    """A source could not be read; the message is one line naming it.

    ``kind`` is a stable word for metrics labels: http_error, timeout,
    connect_error, invalid_url, error.
    """

    def __init__(self, message: str, kind: str = "error"):
        super().__init__(message)
        self.kind = kind


def is_url(source: str) -> bool:
    return source.startswith(("http://", "https://"))


async def fetch_metrics(
    session: aiohttp.ClientSession,
    url: str,
    *,
    max_bytes: int = config.DEFAULT_MAX_PAYLOAD_BYTES,
    timeout: float = config.DEFAULT_HTTP_TIMEOUT_SECONDS,  # noqa: ASYNC109 -- aiohttp's ClientTimeout for this request
    headers: dict[str, str] | None = None,
) -> bytes:
    import aiohttp

    shown = redact_url(url)
    try:
        async with session.get(
            url,
            timeout=aiohttp.ClientTimeout(total=timeout),
            headers={"Accept": ACCEPT, **(headers or {})},
            # Redirects are never followed: a target could send the poller to any
            # host (a cloud metadata endpoint) and its answer would end up on the
            # landing page and in the logs. Use the final URL in the config.
            allow_redirects=False,
        ) as resp:
            if 300 <= resp.status < 400:
                raise SourceError(
                    f"{shown} answered HTTP {resp.status} (a redirect; redirects are not followed: configure the final URL)",
                    "http_error",
                )
            if resp.status != 200:
                # The standard phrase, not the target's: its reason text could be anything.
                phrase = HTTPStatus(resp.status).phrase if resp.status in HTTPStatus._value2member_map_ else ""
                raise SourceError(f"{shown} answered HTTP {resp.status} {phrase}".rstrip(), "http_error")
            if resp.content_length is not None and resp.content_length > max_bytes:
                raise PayloadTooLarge(resp.content_length, max_bytes, shown)
            body = bytearray()
            async for chunk in resp.content.iter_chunked(1 << 16):
                body += chunk
                if len(body) > max_bytes:  # stop reading: the real size stays unknown
                    raise PayloadTooLarge(None, max_bytes, shown)
            return bytes(body)
    except TimeoutError:
        raise SourceError(f"{shown} did not answer within {timeout:g} s", "timeout") from None
    except aiohttp.ClientConnectorError as e:
        raise SourceError(f"cannot connect to {shown}: {e.os_error or e}", "connect_error") from None
    except aiohttp.InvalidURL:
        raise SourceError(f"invalid URL {shown}", "invalid_url") from None
    except (aiohttp.ClientResponseError, aiohttp.ClientPayloadError, aiohttp.ServerDisconnectedError) as e:
        # The target's answer, not a fault of ours: one aiohttp cannot read (headers that never end, a
        # body cut short, a hang-up). Its own "400" would read as if the target had answered 400.
        # Its text quotes the target's bytes (a status line of 8 KB reached the log and the page): cut.
        # Scrubbed whole, then cut: a secret cut first would leave its first characters unmatched.
        what = clip(scrub(str(getattr(e, "message", None) or type(e).__name__), credentials(url)), TARGET_TEXT_CHARS)
        raise SourceError(f"{shown} sent an answer that is not readable HTTP ({what!r})", "http_error") from None
    except aiohttp.ClientError as e:  # its text may quote the whole URL
        text = clip(scrub(str(e), credentials(url)), TARGET_TEXT_CHARS)
        raise SourceError(f"{shown}: {type(e).__name__}: {text}") from None


async def _fetch_once(url: str, max_bytes: int, timeout: float) -> bytes:  # noqa: ASYNC109 -- passed to fetch_metrics
    import aiohttp

    async with aiohttp.ClientSession() as session:
        return await fetch_metrics(session, url, max_bytes=max_bytes, timeout=timeout)


def read_source(
    source: str,
    max_bytes: int = config.DEFAULT_MAX_PAYLOAD_BYTES,
    timeout: float = config.DEFAULT_HTTP_TIMEOUT_SECONDS,
) -> bytes:
    """Bytes of a URL, a file, or stdin, refusing more than ``max_bytes``."""
    if is_url(source):
        import asyncio

        return asyncio.run(_fetch_once(source, max_bytes, timeout))
    if "://" in source:
        raise SourceError(f"unsupported source {redact_url(source)!r}: use an http(s) URL, a file, or '-'")
    if source == "-":
        data = sys.stdin.buffer.read(max_bytes + 1)
    else:
        path = Path(source)
        try:
            with path.open("rb") as f:
                data = f.read(max_bytes + 1)
        except FileNotFoundError:
            raise SourceError(f"no such file: {redact_url(source)}") from None
        except IsADirectoryError:
            raise SourceError(f"{redact_url(source)} is a directory, not a /metrics dump") from None
        except OSError as e:
            raise SourceError(f"cannot read {redact_url(source)}: {e.strerror}") from None
    if len(data) > max_bytes:
        size = None if source == "-" else Path(source).stat().st_size
        size = size if size and size > max_bytes else None  # a pipe or a file still growing
        raise PayloadTooLarge(size, max_bytes, "stdin" if source == "-" else source)
    return data


# vLLM's OpenAI server names what it serves at /v1/models: each served `id` (the
# --served-model-name, or the --model argument) and its `root` (the --model argument: an
# HF id or a weights path). Read from the same base URL as /metrics.
MODELS_PATH = "/v1/models"


def models_url(metrics_url: str) -> str | None:
    """The /v1/models URL beside a /metrics URL (same scheme, host and credentials; the
    path's last segment replaced), or None for a file, stdin or a URL that is not http(s)."""
    if not is_url(metrics_url):
        return None
    parts = urlsplit(metrics_url)
    base = parts.path.rsplit("/", 1)[0]  # /metrics -> '', /vllm/metrics -> /vllm
    return urlunsplit((parts.scheme, parts.netloc, base + MODELS_PATH, parts.query, ""))


def read_served_models(body: bytes) -> dict[str, str]:
    """Served model id -> root from a /v1/models answer; ValueError, one line, when the
    answer is not of that shape. Bounded: at most MAX_MODELS_PER_TARGET models, and a
    name or root over MAX_LABEL_VALUE_LENGTH characters is refused, as a label would be."""
    import json

    try:
        data = json.loads(body)
    except (ValueError, RecursionError):
        raise ValueError("not JSON") from None
    models = data.get("data") if isinstance(data, dict) else None
    if not isinstance(models, list):
        raise ValueError("no 'data' list of models (is it vLLM's OpenAI server?)")
    served: dict[str, str] = {}
    for entry in models[: config.MAX_MODELS_PER_TARGET]:
        if not isinstance(entry, dict) or not isinstance(entry.get("id"), str):
            raise ValueError("a model without a string 'id'")
        root = entry.get("root")
        root = root if isinstance(root, str) else entry["id"]  # an older server: no root
        if max(len(entry["id"]), len(root)) > config.MAX_LABEL_VALUE_LENGTH:
            continue
        served[entry["id"]] = root
    return served
