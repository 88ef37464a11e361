"""Transactional outbox: the event row commits with the business row; a relay publishes.

Every service that decides something (admission, queueing, the scheduler) writes its
events here in the transaction that records the decision, tagged with its ``source``;
its own relay publishes them after the commit, in order, one relay per source at a time
(advisory lock), so per-key order holds across replicas and a crash between the commit
and the publish loses nothing: the next relay of that source publishes what is left.

Published rows are kept for a replay window so a broker that comes back empty can be
refilled (``replay``, run by ``shared.refill``); consumers' idempotency makes the
replay harmless. A row that can never be published (over the event limit) is set aside
with its reason (``dead_reason``) and a dead letter, never blocking the rows behind it.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import zlib
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

import asyncpg
from aiokafka.errors import KafkaError
from sqlalchemy import text
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from shared import metrics
from shared.bus import Producer, check_size
from shared.errors import EventTooLarge, is_transient
from shared.events import DeadLetter, Envelope, Event, utcnow
from shared.logging import get_logger
from shared.retry import retry_transient
from shared.topics import BINDINGS, DEAD_LETTER, topic_for

log = get_logger(__name__)
_RELAY_LOCK = 0x4B4F_5554  # "KOUT", the high half of each source's lock key
DEFAULT_MAX_EVENT_BYTES = 1_000_000
# not refilled from the outbox: a replayed old binding could start a finished task on
# an agent that forgot it; the scheduler resends what its agents need instead
NOT_REPLAYED = (BINDINGS.name,)
_INSERT = text(
    "INSERT INTO outbox (event_id, topic, key, payload, source, dead_reason, published_at)"
    " VALUES (:i, :t, :k, :p, :s, CAST(:d AS text),"
    " CASE WHEN CAST(:d AS text) IS NULL THEN NULL ELSE now() END)"
    " ON CONFLICT (event_id) DO NOTHING")


def channel(source: str) -> str:
    """The NOTIFY channel that wakes ``source``'s relay."""
    return "kairos_outbox_" + re.sub(r"[^a-z0-9_]", "_", source.lower())


def lock_key(source: str) -> int:
    return (_RELAY_LOCK << 32) | zlib.crc32(source.encode())


def _letter(event_id: str, key: str, source: str, topic: str, reason: str,
            payload: bytes) -> Envelope:
    """The dead letter of an outbox row (its value cut to 64 KiB: the letter must fit)."""
    return Envelope.wrap(DeadLetter(
        topic=topic, partition=-1, offset=-1, msg_key=key, value=payload[:65536].decode(
            errors="replace"), reason="unpublishable", error=reason,
        consumer_group="outbox"), source, f"dead-{event_id}")


async def add_to_outbox(conn: AsyncConnection, event: Event, source: str,
                        event_id: str | None = None,
                        max_bytes: int = DEFAULT_MAX_EVENT_BYTES) -> Envelope:
    """Insert the event in the caller's transaction; it is published after commit. An
    event over ``max_bytes`` raises ``EventTooLarge`` (the caller refuses the request)."""
    env = Envelope.wrap(event, source, event_id)
    payload = check_size(env, max_bytes)
    await conn.execute(_INSERT, {"i": env.id, "t": topic_for(event).name, "k": env.key,
                                 "p": payload, "s": source, "d": None})
    await conn.execute(text(f"NOTIFY {channel(source)}"))
    return env


async def add_many(conn: AsyncConnection, items: Sequence[tuple[Envelope, str]], source: str,
                   max_bytes: int = DEFAULT_MAX_EVENT_BYTES) -> None:
    """Queue a service's decided events in its transaction. One that is over the limit
    is stored set aside (with a dead letter saying why) rather than failing the decision:
    it could never be published, and the decision itself stands."""
    if not items:
        return
    rows: list[dict[str, Any]] = []
    for env, topic in items:
        payload = env.encode()
        if len(payload) <= max_bytes:
            rows.append({"i": env.id, "t": topic, "k": env.key, "p": payload, "s": source,
                         "d": None})
            continue
        reason = f"{len(payload)} bytes, over the {max_bytes}-byte event limit"
        log.error("event set aside: too large to publish", event_id=env.id, topic=topic,
                  reason=reason)
        metrics.OUTBOX_DEADLETTERED.labels(source).inc()
        letter = _letter(env.id, env.key, source, topic, reason, payload)
        rows += [{"i": env.id, "t": topic, "k": env.key, "p": payload, "s": source,
                  "d": reason},
                 {"i": letter.id, "t": DEAD_LETTER.name, "k": letter.key,
                  "p": letter.encode(), "s": source, "d": None}]
    await conn.execute(_INSERT, rows)
    await conn.execute(text(f"NOTIFY {channel(source)}"))


def asyncpg_dsn(sqlalchemy_url: str) -> str:
    return make_url(sqlalchemy_url).set(drivername="postgresql").render_as_string(
        hide_password=False)


class OutboxRelay:
    """Publishes one source's rows. ``run`` is the background loop (woken by NOTIFY);
    ``flush`` publishes at once, for a service that just committed a decision."""

    def __init__(self, engine: AsyncEngine, producer: Producer, database_url: str | None = None,
                 replay_window: timedelta = timedelta(hours=24), batch: int = 500,
                 source: str | None = None) -> None:
        self._engine = engine
        self._producer = producer
        self._dsn = asyncpg_dsn(database_url or engine.url.render_as_string(
            hide_password=False))
        self._window = replay_window
        self._batch = batch
        self.source = source or producer.source
        self._wake = asyncio.Event()
        self._busy = asyncio.Lock()  # the loop and flush() of one process take turns

    async def run(self) -> None:
        await retry_transient(self._run, f"{self.source}.outbox")

    async def _run(self) -> None:
        listener = await asyncpg.connect(self._dsn)
        await listener.add_listener(channel(self.source), lambda *_: self._wake.set())
        last_purge = utcnow()
        try:
            while True:
                if listener.is_closed():  # PostgreSQL went away: reconnect via retry_transient()
                    raise ConnectionError("outbox listener connection closed")
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
            with contextlib.suppress(Exception):
                await asyncio.wait_for(listener.close(), 2)

    def wake(self) -> None:
        self._wake.set()

    async def flush(self) -> None:
        """Publish what this source has queued now; if the broker is away, leave it to
        the loop (the rows are safe in PostgreSQL)."""
        try:
            while await self.publish_pending() == self._batch:
                pass
        except Exception as exc:
            if not is_transient(exc):
                raise
            log.warning("publish deferred to the relay loop", source=self.source,
                        error=repr(exc)[:200])
            self.wake()

    async def publish_pending(self) -> int:
        """Publish one batch of unpublished rows in order; returns how many were handled
        (published or set aside). A transient send failure keeps the rows not sent for
        the next try and raises after recording the progress."""
        async with self._busy, self._engine.begin() as conn:
            got = await conn.scalar(text("SELECT pg_try_advisory_xact_lock(:k)"),
                                    {"k": lock_key(self.source)})
            if not got:
                return 0
            rows = (await conn.execute(
                text("SELECT seq, event_id, topic, key, payload FROM outbox"
                     " WHERE source = :s AND published_at IS NULL AND dead_reason IS NULL"
                     " ORDER BY seq LIMIT :n"), {"s": self.source, "n": self._batch})).all()
            if not rows:
                return 0
            sent, dead, failure = await self._send(rows)
            if sent:
                await conn.execute(
                    text("UPDATE outbox SET published_at = now() WHERE seq = ANY(:s)"),
                    {"s": sent})
            for row, reason in dead:
                await self._set_aside(conn, row, reason)
        if failure is not None:
            raise failure
        return len(sent) + len(dead)

    async def _send(self, rows: Sequence[Any]) -> tuple[list[int], list[tuple[Any, str]],
                                                         Exception | None]:
        limit = self._producer.max_event_bytes
        futures: list[tuple[Any, asyncio.Future[Any]]] = []
        dead: list[tuple[Any, str]] = []
        failure: Exception | None = None
        for r in rows:
            payload = bytes(r.payload)
            if len(payload) > limit:
                dead.append((r, f"{len(payload)} bytes, over the {limit}-byte event limit"))
                continue
            try:
                futures.append((r, await self._producer.send_future(r.topic, r.key, payload)))
            except (KafkaError, OSError, EventTooLarge) as exc:
                if is_transient(exc):
                    failure = exc
                    break  # the rest wait for the next try, in order
                dead.append((r, repr(exc)[:500]))
        results = await asyncio.gather(*(f for _, f in futures), return_exceptions=True)
        sent: list[int] = []
        for (r, _), res in zip(futures, results, strict=True):
            if not isinstance(res, BaseException):
                sent.append(r.seq)
                metrics.PUBLISHED.labels(self.source, r.topic).inc()
            elif isinstance(res, Exception) and is_transient(res):
                failure = failure or res
            else:
                dead.append((r, repr(res)[:500]))
        return sent, dead, failure

    async def _set_aside(self, conn: AsyncConnection, row: Any, reason: str) -> None:
        log.error("outbox row set aside: it can never be published", source=self.source,
                  event_id=row.event_id, topic=row.topic, reason=reason)
        metrics.OUTBOX_DEADLETTERED.labels(self.source).inc()
        await conn.execute(text("UPDATE outbox SET dead_reason = :r WHERE seq = :s"),
                           {"r": reason, "s": row.seq})
        letter = _letter(row.event_id, row.key, self.source, row.topic, reason,
                         bytes(row.payload))
        await conn.execute(_INSERT, {"i": letter.id, "t": DEAD_LETTER.name, "k": letter.key,
                                     "p": letter.encode(), "s": self.source, "d": None})

    async def pending(self) -> int:
        async with self._engine.connect() as conn:
            return int(await conn.scalar(
                text("SELECT count(*) FROM outbox WHERE source = :s AND published_at IS NULL"
                     " AND dead_reason IS NULL"), {"s": self.source}) or 0)

    async def purge(self) -> int:
        async with self._engine.begin() as conn:
            res = await conn.execute(
                text("DELETE FROM outbox WHERE source = :s AND published_at < :t"),
                {"s": self.source, "t": utcnow() - self._window})
            return res.rowcount or 0


async def replay(engine: AsyncEngine | AsyncConnection, since: datetime,
                 skip_topics: Sequence[str] = NOT_REPLAYED) -> int:
    """Mark rows published since ``since`` for publishing again (refill an empty broker),
    every source's, less ``skip_topics`` and rows set aside; wakes each source's relay."""
    async def run(conn: AsyncConnection) -> int:
        res = await conn.execute(
            text("UPDATE outbox SET published_at = NULL WHERE created_at >= :t"
                 " AND published_at IS NOT NULL AND dead_reason IS NULL"
                 " AND topic <> ALL(:skip) RETURNING source"),
            {"t": since, "skip": list(skip_topics)})
        sources = [r.source for r in res]
        for source in set(sources):
            await conn.execute(text(f"NOTIFY {channel(source)}"))
        return len(sources)

    if isinstance(engine, AsyncConnection):
        return await run(engine)
    async with engine.begin() as conn:
        return await run(conn)
