"""rate_limit's token buckets: one per client address (an IPv6 /64 counted as one) and
per kind of request, the least recently used dropped beyond a bound."""

from __future__ import annotations

import ipaddress
from collections import OrderedDict
from collections.abc import Callable

RATE_LIMIT_CLIENTS = 1024  # rate-limit buckets kept (least recently used dropped first)


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
