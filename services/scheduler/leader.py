"""Leadership: one active scheduler, holding a PostgreSQL advisory lock on its own
connection. Each new leader raises the epoch it stamps on every binding, so agents
refuse the decisions of a leader that lost the lock but does not know it yet."""

from __future__ import annotations

import asyncio

import asyncpg

from shared.logging import get_logger
from shared.outbox import asyncpg_dsn

log = get_logger(__name__)
LOCK_KEY = 0x4B53_4348  # "KSCH"


class LeaderLease:
    def __init__(self, database_url: str, holder: str, name: str = "scheduler") -> None:
        self._dsn = asyncpg_dsn(database_url)
        self.holder = holder
        self.name = name
        self.epoch = 0
        self._conn: asyncpg.Connection | None = None

    async def acquire(self, poll_s: float = 1.0) -> int:
        """Wait until this process is the leader; returns its new epoch."""
        self._conn = await asyncpg.connect(self._dsn)
        waiting_logged = False
        while not await self._conn.fetchval("SELECT pg_try_advisory_lock($1)", LOCK_KEY):
            if not waiting_logged:
                log.info("another scheduler leads; standing by", holder=self.holder)
                waiting_logged = True
            await asyncio.sleep(poll_s)
        self.epoch = int(await self._conn.fetchval(
            """INSERT INTO scheduler_leases (name, epoch, holder, acquired_at)
               VALUES ($1, 1, $2, now())
               ON CONFLICT (name) DO UPDATE SET epoch = scheduler_leases.epoch + 1,
                   holder = EXCLUDED.holder, acquired_at = now()
               RETURNING epoch""", self.name, self.holder))
        log.info("leadership acquired", epoch=self.epoch, holder=self.holder)
        return self.epoch

    async def still_leader(self) -> bool:
        """The lock lives as long as its connection; a dead connection means we lost it."""
        if self._conn is None or self._conn.is_closed():
            return False
        try:
            await asyncio.wait_for(self._conn.fetchval("SELECT 1"), 3)
            return True
        except Exception:
            return False

    async def watch(self, interval_s: float = 2.0) -> None:
        """Returns (ending the service) as soon as leadership is lost."""
        while await self.still_leader():
            await asyncio.sleep(interval_s)
        log.error("leadership lost; stopping so a fresh process can stand by")

    async def release(self) -> None:
        if self._conn is not None and not self._conn.is_closed():
            await self._conn.close()
