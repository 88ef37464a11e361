"""Which monitor replica exports the cluster-wide series: the one holding a PostgreSQL
advisory lock on its own connection (as the scheduler's leader does). The lock lives as
long as the session, so a replica that dies or loses its connection frees it, and a
standby that keeps trying takes over."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable

import asyncpg

from shared.logging import get_logger
from shared.outbox import asyncpg_dsn

log = get_logger(__name__)
LOCK_KEY = 0x4B4D_4F4E  # "KMON"; the scheduler's is "KSCH"

Hook = Callable[[], Awaitable[None]]


class Election:
    def __init__(self, database_url: str, holder: str, poll_s: float = 2.0,
                 key: int = LOCK_KEY) -> None:
        self._dsn = asyncpg_dsn(database_url)
        self.holder = holder
        self.poll_s = poll_s
        self.key = key
        self.leading = False
        self._conn: asyncpg.Connection | None = None

    async def _try(self) -> bool:
        if self._conn is None or self._conn.is_closed():
            self._conn = await asyncpg.connect(self._dsn, timeout=5)
        return bool(await self._conn.fetchval("SELECT pg_try_advisory_lock($1)", self.key))

    async def _alive(self) -> bool:
        if self._conn is None or self._conn.is_closed():
            return False
        try:
            await asyncio.wait_for(self._conn.fetchval("SELECT 1"), 3)
            return True
        except Exception:
            return False

    async def run(self, elected: Hook, deposed: Hook) -> None:
        """Forever: stand by until the lock is ours, lead while the session lives."""
        try:
            while True:
                try:
                    won = await self._try()
                except (OSError, asyncpg.PostgresError) as exc:
                    log.warning("monitor election: database unreachable", error=repr(exc))
                    won = False
                if won:
                    self.leading = True
                    log.info("monitor elected: exporting the cluster-wide series",
                             holder=self.holder)
                    await elected()
                    while await self._alive():
                        await asyncio.sleep(self.poll_s)
                    self.leading = False
                    log.warning("monitor lost the election lock", holder=self.holder)
                    await deposed()
                await asyncio.sleep(self.poll_s)
        finally:
            await self.close()

    async def close(self) -> None:
        if self._conn is not None and not self._conn.is_closed():
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._conn.close(), 3)
