"""Basic auth: a request's credentials checked against the users' bcrypt hashes, on a
small thread pool (never on the event loop), only successes cached, the checks pending
bounded per client address and taking turns by address."""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import hmac
import secrets
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import bcrypt

from .. import config
from .load import WebConfig

# bcrypt checks waiting or running (one worker, ~0.1-0.2 s each at cost 10) per client
# address, and client addresses with checks pending; beyond them a request is refused
# (429) without one. The checks take turns by address (Authenticator.verify), so the right
# password waits for at most one check per other address, never for the pile a few
# addresses can keep queued: a bound on checks in all let 8 addresses refuse it every time.
BCRYPT_MAX_PENDING_PER_CLIENT = 4
BCRYPT_MAX_CLIENTS = 32  # ~3-6 s of checks ahead at most: inside a scrape timeout
BCRYPT_MAX_PASSWORD_BYTES = 72  # what bcrypt reads of a password


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
        # bcrypt reads the first 72 bytes (htpasswd hashed no more, and Go's bcrypt, so exporter-toolkit,
        # compares no more); bcrypt 5 raises on a longer one, a 500 before any check.
        return Credentials(user, password.encode()[:BCRYPT_MAX_PASSWORD_BYTES], hashed, user in cfg.users, digest)

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
