"""Leader election through PostgreSQL: of the candidates of one election, one leads.

Every candidate (``Election``) holds a connection of its own, stands by until it wins
(``acquire``), then keeps leadership every ``renew_s`` until it loses it (``watch``);
``run`` campaigns forever, calling hooks when elected and deposed. What leadership is
held by differs with what losing it must mean:

- ``LeaderLease`` (the scheduler, whose decisions must be fenced): a row in
  ``scheduler_leases`` with a time to live the leader renews. A standby takes it over
  when it expired (the leader paused, cut off, or too slow) or at once when the leader's
  database session is gone (it died: its backend left ``pg_stat_activity``). Each new
  leader raises the epoch; the scheduler's writes check it in their transaction and
  agents refuse bindings of a lower one, so a leader that lost the lease without knowing
  it can neither store nor carry out a decision. A leader that cannot renew before its
  lease runs out stops leading, as kube-scheduler does on a lost lease.
- ``AdvisoryLock`` (the monitor's replicas, which only export metrics): a session
  advisory lock, held as long as the candidate's connection lives, so a replica that
  dies or loses its connection frees it at once (one paused keeps it: nothing to fence).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable
from typing import Any

import asyncpg

from shared.errors import is_transient
from shared.logging import get_logger
from shared.outbox import asyncpg_dsn

log = get_logger(__name__)

Hook = Callable[[], Awaitable[None]]


class Election(ABC):
    def __init__(self, database_url: str, holder: str, name: str, *, poll_s: float,
                 renew_s: float) -> None:
        self._dsn = asyncpg_dsn(database_url)
        self.holder = holder
        self.name = name
        self.poll_s = poll_s  # a standby's tries
        self.renew_s = renew_s  # the leader's renewals
        self.epoch = 0
        self.leading = False
        self._conn: Any = None  # asyncpg.Connection

    async def _connection(self, timeout_s: float) -> Any:
        if self._conn is None or self._conn.is_closed():
            self._conn = await asyncpg.connect(self._dsn, timeout=timeout_s)
        return self._conn

    @abstractmethod
    async def _claim(self) -> bool:
        """Try once to take leadership (setting ``epoch``)."""

    @abstractmethod
    async def still_leader(self) -> bool:
        """Keep leadership for another ``renew_s``: False once it is lost."""

    @abstractmethod
    async def _give_up(self, conn: Any) -> None:
        """Hand leadership over at once on a clean stop, before the connection closes."""

    async def acquire(self, poll_s: float | None = None) -> int:
        """Wait until this candidate leads; returns its epoch (a lease's; 0 for a lock)."""
        waiting_logged = False
        while True:
            try:
                won = await self._claim()
            except Exception as exc:
                if not is_transient(exc):
                    raise  # a bug or a schema not migrated: exit and say why
                log.warning("election: database unreachable, retrying", election=self.name,
                            error=repr(exc)[:200])
                won = False
            if won:
                self.leading = True
                log.info("leadership acquired", election=self.name, epoch=self.epoch,
                         holder=self.holder)
                return self.epoch
            if not waiting_logged:
                log.info("another candidate leads; standing by", election=self.name,
                         holder=self.holder)
                waiting_logged = True
            await asyncio.sleep(self.poll_s if poll_s is None else poll_s)

    async def watch(self) -> None:
        """Returns as soon as leadership is lost."""
        while await self.still_leader():
            await asyncio.sleep(self.renew_s)
        self.leading = False
        log.warning("leadership lost", election=self.name, epoch=self.epoch,
                    holder=self.holder)

    async def run(self, elected: Hook, deposed: Hook) -> None:
        """Forever: stand by, lead (``elected``) until leadership is lost, stand down
        (``deposed``), stand by again. Leadership is released when this ends."""
        try:
            while True:
                await self.acquire()
                await elected()
                await self.watch()
                await deposed()
                await asyncio.sleep(self.poll_s)
        finally:
            await self.release()

    async def release(self) -> None:
        """Give leadership up (a clean stop): a standby need not wait for it."""
        self.leading = False
        conn = self._conn
        if conn is None or conn.is_closed():
            return
        try:
            async with asyncio.timeout(3):
                await self._give_up(conn)
        except Exception as exc:
            log.warning("leadership release failed", election=self.name, error=repr(exc)[:200])
        with contextlib.suppress(Exception):
            async with asyncio.timeout(3):
                await conn.close()


_TAKE = """
INSERT INTO scheduler_leases AS l (name, epoch, holder, acquired_at, expires_at,
                                   holder_pid, holder_since)
VALUES ($1, 1, $2, now(), now() + make_interval(secs => $3), pg_backend_pid(),
        (SELECT backend_start FROM pg_stat_activity WHERE pid = pg_backend_pid()))
ON CONFLICT (name) DO UPDATE SET epoch = l.epoch + 1, holder = EXCLUDED.holder,
    acquired_at = now(), expires_at = EXCLUDED.expires_at,
    holder_pid = EXCLUDED.holder_pid, holder_since = EXCLUDED.holder_since
WHERE l.expires_at IS NULL OR l.expires_at < now() OR NOT EXISTS (
    SELECT 1 FROM pg_stat_activity a WHERE a.pid = l.holder_pid
    AND a.backend_start = l.holder_since)
RETURNING epoch"""
# the session renewing is the one a standby checks from now on: a leader that had to
# reconnect (a renewal timed out, a blip) must not look dead by its old session
_RENEW = """
UPDATE scheduler_leases SET expires_at = now() + make_interval(secs => $3),
    holder_pid = pg_backend_pid(),
    holder_since = (SELECT backend_start FROM pg_stat_activity WHERE pid = pg_backend_pid())
WHERE name = $1 AND epoch = $2 RETURNING epoch"""
_EXPIRE = "UPDATE scheduler_leases SET expires_at = now() WHERE name = $1 AND epoch = $2"


class LeaderLease(Election):
    """A lease row with a time to live and a fencing epoch (see the module's note)."""

    def __init__(self, database_url: str, holder: str, name: str = "scheduler",
                 ttl_s: float = 15.0, renew_s: float = 2.0, poll_s: float = 1.0) -> None:
        super().__init__(database_url, holder, name, poll_s=poll_s, renew_s=renew_s)
        self.ttl_s = ttl_s
        self._valid_until = 0.0  # monotonic: past it, this process must not lead

    async def _claim(self) -> bool:
        conn = await self._connection(timeout_s=10)
        started = time.monotonic()
        epoch = await conn.fetchval(_TAKE, self.name, self.holder, self.ttl_s)
        if epoch is None:
            return False
        self.epoch = int(epoch)
        self._valid_until = started + self.ttl_s
        return True

    async def still_leader(self) -> bool:
        """Renew the lease. A renewal that fails for a while is retried until the lease
        would run out, by our own clock."""
        while time.monotonic() < self._valid_until:
            try:
                conn = await self._connection(timeout_s=5)
                started = time.monotonic()
                async with asyncio.timeout(5):
                    renewed = await conn.fetchval(_RENEW, self.name, self.epoch, self.ttl_s)
            except Exception as exc:
                if not is_transient(exc):
                    raise
                log.warning("lease renewal failed, retrying", election=self.name,
                            error=repr(exc)[:200])
                await asyncio.sleep(min(1.0, self.renew_s))
                continue
            if renewed is None:  # another took it (ours expired while we were away)
                return False
            self._valid_until = started + self.ttl_s
            return True
        return False

    def valid(self) -> bool:
        """The lease still holds by this process's clock (which runs on while it is
        paused): past it, another may lead, even before a renewal says so."""
        return time.monotonic() < self._valid_until

    async def _give_up(self, conn: Any) -> None:
        await conn.execute(_EXPIRE, self.name, self.epoch)


class AdvisoryLock(Election):
    """A session advisory lock on ``key`` (see the module's note); its liveness is checked
    every ``poll_s``."""

    def __init__(self, database_url: str, holder: str, key: int, name: str,
                 poll_s: float = 2.0) -> None:
        super().__init__(database_url, holder, name, poll_s=poll_s, renew_s=poll_s)
        self.key = key

    async def _claim(self) -> bool:
        conn = await self._connection(timeout_s=5)
        return bool(await conn.fetchval("SELECT pg_try_advisory_lock($1)", self.key))

    async def still_leader(self) -> bool:
        """The lock lives as long as the session: alive while the connection answers."""
        conn = self._conn
        if conn is None or conn.is_closed():
            return False
        try:
            async with asyncio.timeout(3):
                await conn.fetchval("SELECT 1")
            return True
        except Exception:
            return False

    async def _give_up(self, conn: Any) -> None:
        """Nothing to do: closing the session frees the lock."""
