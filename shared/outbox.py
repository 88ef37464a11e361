"""Transactional outbox: the event row commits with the business row; a relay publishes.

Published rows are kept for a replay window so a broker that comes back empty can be
refilled (``replay``); consumers' idempotency makes the replay harmless. One relay
publishes at a time (advisory lock) so per-key order holds across admission replicas.
"""

from __future__ import annotations

import asyncio
import contextlib
from datetime import datetime, timedelta

import asyncpg
from sqlalchemy import text
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from shared import metrics
from shared.bus import Producer
from shared.events import Envelope, Event, utcnow
from shared.logging import get_logger
from shared.topics import topic_for

log = get_logger(__name__)
CHANNEL = "kairos_outbox"
_RELAY_LOCK = 0x4B4F_5554  # "KOUT"


async def add_to_outbox(conn: AsyncConnection, event: Event, source: str,
                        event_id: str | None = None) -> Envelope:
    """Insert the event in the caller's transaction; it is published after commit."""
    env = Envelope.wrap(event, source, event_id)
    await conn.execute(
        text("INSERT INTO outbox (event_id, topic, key, payload) VALUES (:i, :t, :k, :p)"
             " ON CONFLICT (event_id) DO NOTHING"),
        {"i": env.id, "t": topic_for(event).name, "k": env.key, "p": env.encode()},
    )
    await conn.execute(text(f"NOTIFY {CHANNEL}"))
    return env


def asyncpg_dsn(sqlalchemy_url: str) -> str:
    return make_url(sqlalchemy_url).set(drivername="postgresql").render_as_string(
        hide_password=False)


class OutboxRelay:
    def __init__(self, engine: AsyncEngine, producer: Producer, database_url: str,
                 replay_window: timedelta = timedelta(hours=24), batch: int = 500) -> None:
        self._engine = engine
        self._producer = producer
        self._dsn = asyncpg_dsn(database_url)
        self._window = replay_window
        self._batch = batch
        self._wake = asyncio.Event()

    async def run(self) -> None:
        listener = await asyncpg.connect(self._dsn)
        await listener.add_listener(CHANNEL, lambda *_: self._wake.set())
        last_purge = utcnow()
        try:
            while True:
                published = await self.publish_pending()
                if published == self._batch:
                    metrics.OUTBOX_PENDING.set(await self.pending())
                    continue
                metrics.OUTBOX_PENDING.set(0)
                if published:
                    continue
                if utcnow() - last_purge > timedelta(minutes=5):
                    await self.purge()
                    last_purge = utcnow()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), 0.5)
                self._wake.clear()
        finally:
            await listener.close()

    async def publish_pending(self) -> int:
        """Publish one batch of unpublished rows in order; returns how many."""
        async with self._engine.begin() as conn:
            got = await conn.scalar(text("SELECT pg_try_advisory_xact_lock(:k)"),
                                    {"k": _RELAY_LOCK})
            if not got:
                return 0
            rows = (await conn.execute(
                text("SELECT seq, topic, payload FROM outbox WHERE published_at IS NULL"
                     " ORDER BY seq LIMIT :n"), {"n": self._batch})).all()
            if not rows:
                return 0
            await self._producer.publish_many(
                [(Envelope.decode(bytes(r.payload)), r.topic) for r in rows])
            await conn.execute(
                text("UPDATE outbox SET published_at = now() WHERE seq = ANY(:s)"),
                {"s": [r.seq for r in rows]})
            return len(rows)

    async def pending(self) -> int:
        async with self._engine.connect() as conn:
            return int(await conn.scalar(
                text("SELECT count(*) FROM outbox WHERE published_at IS NULL")) or 0)

    async def purge(self) -> int:
        async with self._engine.begin() as conn:
            res = await conn.execute(
                text("DELETE FROM outbox WHERE published_at < :t"),
                {"t": utcnow() - self._window})
            return res.rowcount or 0


async def replay(engine: AsyncEngine, since: datetime) -> int:
    """Mark rows published since ``since`` for publishing again (refill an empty broker)."""
    async with engine.begin() as conn:
        res = await conn.execute(
            text("UPDATE outbox SET published_at = NULL WHERE created_at >= :t"
                 " AND published_at IS NOT NULL"), {"t": since})
        await conn.execute(text(f"NOTIFY {CHANNEL}"))
        return res.rowcount or 0
