"""Leadership: one active scheduler, holding a lease row in PostgreSQL.

The lease has a time to live the leader renews every ``renew_s``. A standby takes it
over when it expired (the leader paused, cut off, or too slow) or at once when the
leader's database session is gone (it died: its backend left ``pg_stat_activity``).
Each new leader raises the epoch; the scheduler's writes check it in their transaction
(``SchedulerService.persist``) and agents refuse bindings of a lower one, so a leader
that lost the lease without knowing it can neither store nor carry out a decision.
A leader that cannot renew before its lease runs out stops (exits) by itself, as
kube-scheduler does on a lost lease: its supervisor starts it again as a standby.
"""

from __future__ import annotations

import asyncio
import time

import asyncpg

from shared.errors import is_transient
from shared.logging import get_logger
from shared.outbox import asyncpg_dsn

log = get_logger(__name__)

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


class LeaderLease:
    def __init__(self, database_url: str, holder: str, name: str = "scheduler",
                 ttl_s: float = 15.0, renew_s: float = 2.0) -> None:
        self._dsn = asyncpg_dsn(database_url)
        self.holder = holder
        self.name = name
        self.ttl_s = ttl_s
        self.renew_s = renew_s
        self.epoch = 0
        self._conn: asyncpg.Connection | None = None
        self._valid_until = 0.0  # monotonic: past it, this process must not lead

    async def acquire(self, poll_s: float = 1.0) -> int:
        """Wait until this process is the leader; returns its new epoch."""
        waiting_logged = False
        while True:
            try:
                if self._conn is None or self._conn.is_closed():
                    self._conn = await asyncpg.connect(self._dsn, timeout=10)
                started = time.monotonic()
                epoch = await self._conn.fetchval(_TAKE, self.name, self.holder, self.ttl_s)
            except Exception as exc:
                if not is_transient(exc):
                    raise  # a bug or a schema not migrated: exit and say why
                log.warning("lease: database unreachable, retrying", error=repr(exc)[:200])
                epoch = None
            if epoch is not None:
                self.epoch = int(epoch)
                self._valid_until = started + self.ttl_s
                log.info("leadership acquired", epoch=self.epoch, holder=self.holder)
                return self.epoch
            if not waiting_logged:
                log.info("another scheduler leads; standing by", holder=self.holder)
                waiting_logged = True
            await asyncio.sleep(poll_s)

    async def still_leader(self) -> bool:
        """Renew the lease. True while it is ours; a renewal that fails for a while is
        retried until the lease would run out, by our own clock."""
        while time.monotonic() < self._valid_until:
            try:
                if self._conn is None or self._conn.is_closed():
                    self._conn = await asyncpg.connect(self._dsn, timeout=5)
                started = time.monotonic()
                renewed = await asyncio.wait_for(self._conn.fetchval(
                    _RENEW, self.name, self.epoch, self.ttl_s), 5)
            except Exception as exc:
                if not is_transient(exc):
                    raise
                log.warning("lease renewal failed, retrying", error=repr(exc)[:200])
                await asyncio.sleep(min(1.0, self.renew_s))
                continue
            if renewed is None:  # another took it (ours expired while we were away)
                return False
            self._valid_until = started + self.ttl_s
            return True
        return False

    async def watch(self) -> None:
        """Returns (ending the service) as soon as leadership is lost."""
        while await self.still_leader():
            await asyncio.sleep(self.renew_s)
        log.error("leadership lost; stopping so a fresh process can stand by",
                  epoch=self.epoch)

    async def release(self) -> None:
        """Give the lease up at once (a clean stop): a standby need not wait for it."""
        if self._conn is not None and not self._conn.is_closed():
            try:
                await asyncio.wait_for(self._conn.execute(
                    "UPDATE scheduler_leases SET expires_at = now() WHERE name = $1"
                    " AND epoch = $2", self.name, self.epoch), 3)
            except Exception as exc:
                log.warning("lease release failed", error=repr(exc)[:200])
            await self._conn.close()
