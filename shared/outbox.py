"""Transactional outbox: the event row commits with the business row; a relay publishes.

Every service that decides something (admission, queueing, the scheduler) writes its
events here in the transaction that records the decision, tagged with its ``source``;
its own relay publishes them after the commit, in order, one relay per source at a time
(advisory lock), so per-key order holds across replicas and a crash between the commit
and the publish loses nothing: the next relay of that source publishes what is left.

Published rows are kept for a replay window so a broker that comes back empty can be
refilled (``replay``, run by ``shared.refill``); consumers' idempotency makes the
replay harmless. A refill also marks the rows in flight (sent, not yet marked: the old
broker may have acknowledged them just before it died) by counting its pass in
``replays``; a relay marks only rows whose count is still the one it read, so those are
sent again too. A row that can never be published (over the event limit) is set aside
with its reason (``dead_reason``) and a dead letter, never blocking the rows behind it.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import asyncpg
from aiokafka.errors import KafkaError, KafkaTimeoutError
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


_INSERT_MANY = text(
    "INSERT INTO outbox (event_id, topic, key, payload, source, dead_reason, published_at)"
    " SELECT i, t, k, p, :s, d, CASE WHEN d IS NULL THEN NULL ELSE now() END"
    " FROM unnest(CAST(:i AS text[]), CAST(:t AS text[]), CAST(:k AS text[]),"
    " CAST(:p AS bytea[]), CAST(:d AS text[])) WITH ORDINALITY AS u(i, t, k, p, d, n)"
    " ORDER BY n ON CONFLICT (event_id) DO NOTHING RETURNING event_id")
# the longest a relay waits for the broker to acknowledge a batch: aiokafka gives up on a
# request after 40 s, but a delivery can wait forever once its broker died
# (aio-libs/aiokafka#1101); the rows it holds up are sent again
DELIVERY_TIMEOUT_S = 60.0
_BEHIND = text("SELECT EXISTS (SELECT 1 FROM outbox WHERE source = :s"
               " AND published_at IS NULL AND dead_reason IS NULL)")


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


def outbox_row(event: Event, source: str, event_id: str | None = None,
               max_bytes: int = DEFAULT_MAX_EVENT_BYTES) -> dict[str, Any]:
    """One event's outbox row as statement parameters (``i`` id, ``t`` topic, ``k`` key,
    ``p`` payload, ``s`` source), for a caller that inserts it in a statement of its own
    together with its business row (one round trip: admission's submit). An event over
    ``max_bytes`` raises ``EventTooLarge`` before anything is written."""
    env = Envelope.wrap(event, source, event_id)
    return {"i": env.id, "t": topic_for(event).name, "k": env.key,
            "p": check_size(env, max_bytes), "s": source}


async def add_to_outbox(conn: AsyncConnection, event: Event, source: str,
                        event_id: str | None = None,
                        max_bytes: int = DEFAULT_MAX_EVENT_BYTES) -> None:
    """Insert the event in the caller's transaction; it is published after commit. An
    event over ``max_bytes`` raises ``EventTooLarge`` (the caller refuses the request)."""
    await conn.execute(_INSERT, {**outbox_row(event, source, event_id, max_bytes), "d": None})
    await conn.execute(text(f"NOTIFY {channel(source)}"))


@dataclass(frozen=True)
class Row:
    """An outbox row to publish (``seq`` None: known from the caller's memory)."""

    event_id: str
    topic: str
    key: str
    payload: bytes
    seq: int | None = None
    replays: int = 0  # refills that marked it, when it was read (0: just inserted)


@dataclass
class Stored:
    """What one transaction queued: the rows it inserted (less those set aside and ids
    already there), and whether older rows of its source were still unpublished then
    (publishing these first would reorder a key's events)."""

    rows: list[Row] = field(default_factory=list)
    behind: bool = False


async def add_many(conn: AsyncConnection, items: Sequence[tuple[Envelope, str]], source: str,
                   max_bytes: int = DEFAULT_MAX_EVENT_BYTES, notify: bool = True) -> Stored:
    """Queue a service's decided events in its transaction (one statement). One that is
    over the limit is stored set aside (with a dead letter saying why) rather than
    failing the decision: it could never be published, and the decision itself stands.
    ``notify=False``: the caller publishes what this returns itself, after its commit
    (``OutboxRelay.publish_stored``); no relay need wake."""
    if not items:
        return Stored()
    rows: list[tuple[Row, str | None]] = []
    for env, topic in items:
        payload = env.encode()
        if len(payload) <= max_bytes:
            rows.append((Row(env.id, topic, env.key, payload), None))
            continue
        reason = f"{len(payload)} bytes, over the {max_bytes}-byte event limit"
        log.error("event set aside: too large to publish", event_id=env.id, topic=topic,
                  reason=reason)
        metrics.OUTBOX_DEADLETTERED.labels(source).inc()
        letter = _letter(env.id, env.key, source, topic, reason, payload)
        rows += [(Row(env.id, topic, env.key, payload), reason),
                 (Row(letter.id, DEAD_LETTER.name, letter.key, letter.encode()), None)]
    behind = bool(await conn.scalar(_BEHIND, {"s": source}))
    inserted = set((await conn.execute(_INSERT_MANY, {
        "i": [r.event_id for r, _ in rows], "t": [r.topic for r, _ in rows],
        "k": [r.key for r, _ in rows], "p": [r.payload for r, _ in rows],
        "d": [d for _, d in rows], "s": source})).scalars())
    if notify:
        await conn.execute(text(f"NOTIFY {channel(source)}"))
    return Stored([r for r, d in rows if d is None and r.event_id in inserted], behind)


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
        self.delivery_timeout_s = DELIVERY_TIMEOUT_S

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
                    async with asyncio.timeout(0.5):
                        await self._wake.wait()
                self._wake.clear()
        finally:
            with contextlib.suppress(Exception):
                async with asyncio.timeout(2):
                    await listener.close()

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

    def exclusive(self) -> asyncio.Lock:
        """Held from before a commit to its ``publish_stored``, so that this process's
        loop cannot publish the committed rows in between (they would go twice)."""
        return self._busy

    async def publish_stored(self, stored: Stored) -> None:
        """Publish what the caller's transaction just committed, from memory, and mark
        it in one statement: no read of the table, no transaction held open while the
        broker answers. The caller holds ``exclusive()``. Where older rows were still
        unpublished, or a send fails, the table decides instead (in order), now or in
        the loop."""
        if not stored.rows:
            return
        try:
            if stored.behind:
                while await self._publish_pending() == self._batch:
                    pass
                return
            sent, dead, failure = await self._send(stored.rows)
            if sent or dead:
                async with self._engine.begin() as conn:
                    await conn.execute(text("SET LOCAL synchronous_commit = off"))  # a mark
                    await self._mark(conn, sent, dead)  # lost in a crash: sent once more
            if failure is not None:
                raise failure
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
        async with self._busy:
            return await self._publish_pending()

    async def _publish_pending(self) -> int:
        async with self._engine.begin() as conn:
            got = await conn.scalar(text("SELECT pg_try_advisory_xact_lock(:k)"),
                                    {"k": lock_key(self.source)})
            if not got:
                return 0
            rows = [Row(r.event_id, r.topic, r.key, bytes(r.payload), r.seq, r.replays)
                    for r in (await conn.execute(
                        text("SELECT seq, event_id, topic, key, payload, replays FROM outbox"
                             " WHERE source = :s AND published_at IS NULL"
                             " AND dead_reason IS NULL ORDER BY seq LIMIT :n"),
                        {"s": self.source, "n": self._batch})).all()]
            if not rows:
                return 0
            sent, dead, failure = await self._send(rows)
            await self._mark(conn, sent, dead)
        if failure is not None:
            raise failure
        return len(sent) + len(dead)

    async def _mark(self, conn: AsyncConnection, sent: list[Row],
                    dead: list[tuple[Row, str]]) -> None:
        # a row a refill marked since it was read stays unpublished: the send may have
        # gone to the broker that died (sent again, harmlessly, if it did not)
        by_replays: dict[int, list[str]] = {}
        for r in sent:
            by_replays.setdefault(r.replays, []).append(r.event_id)
        for replays, ids in by_replays.items():
            await conn.execute(
                text("UPDATE outbox SET published_at = now() WHERE event_id = ANY(:e)"
                     " AND replays = :r"), {"e": ids, "r": replays})
        for row, reason in dead:
            await self._set_aside(conn, row, reason)

    async def _send(self, rows: Sequence[Row]) -> tuple[list[Row], list[tuple[Row, str]],
                                                         Exception | None]:
        limit = self._producer.max_event_bytes
        futures: list[tuple[Row, asyncio.Future[Any]]] = []
        dead: list[tuple[Row, str]] = []
        failure: Exception | None = None
        for r in rows:
            payload = r.payload
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
        if futures:
            await asyncio.wait([f for _, f in futures], timeout=self.delivery_timeout_s)
        sent: list[Row] = []
        for r, f in futures:
            if not f.done():  # never acknowledged: not marked, so sent again
                failure = failure or KafkaTimeoutError(
                    f"no acknowledgement in {self.delivery_timeout_s:g} s")
                continue
            res = f.exception() or f.result()
            if not isinstance(res, BaseException):
                sent.append(r)
                metrics.PUBLISHED.labels(self.source, r.topic).inc()
            elif isinstance(res, Exception) and is_transient(res):
                failure = failure or res
            else:
                dead.append((r, repr(res)[:500]))
        return sent, dead, failure

    async def _set_aside(self, conn: AsyncConnection, row: Row, reason: str) -> None:
        log.error("outbox row set aside: it can never be published", source=self.source,
                  event_id=row.event_id, topic=row.topic, reason=reason)
        metrics.OUTBOX_DEADLETTERED.labels(self.source).inc()
        await conn.execute(text("UPDATE outbox SET dead_reason = :r WHERE event_id = :e"),
                           {"r": reason, "e": row.event_id})
        letter = _letter(row.event_id, row.key, self.source, row.topic, reason,
                         row.payload)
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
    """Mark rows stored since ``since`` for publishing again (refill an empty broker),
    every source's, less ``skip_topics`` and rows set aside; wakes each source's relay.
    Rows not yet marked published are counted too (``replays``): one in flight now is
    sent again rather than marked published by a relay that sent it to the old broker."""
    async def run(conn: AsyncConnection) -> int:
        res = await conn.execute(
            text("UPDATE outbox SET published_at = NULL, replays = replays + 1"
                 " WHERE created_at >= :t AND dead_reason IS NULL"
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
