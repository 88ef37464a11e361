"""Async SQLAlchemy 2 on asyncpg, and migrations (alembic) run at start under a lock."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from sqlalchemy import event, text
from sqlalchemy.engine import Connection, make_url
from sqlalchemy.ext.asyncio import AsyncEngine, async_sessionmaker, create_async_engine
from sqlalchemy.util import await_only

from shared.errors import database_unavailable
from shared.logging import get_logger

log = get_logger(__name__)
MIGRATIONS = Path(__file__).parent / "migrations"
_MIGRATION_LOCK = 0x4B41_4952  # "KAIR": one migrator at a time across services


def make_engine(url: str, pool_size: int = 10, connect_wait_s: float = 0.0) -> AsyncEngine:
    """``connect_wait_s``: how long a new connection waits for a PostgreSQL that is
    restarting (see ``_wait_to_connect``); 0 fails at once."""
    engine = create_async_engine(url, pool_size=pool_size, max_overflow=10,
                                 pool_pre_ping=True)
    if connect_wait_s > 0:
        _wait_to_connect(engine, connect_wait_s)
    return engine


def autocommit(engine: AsyncEngine) -> AsyncEngine:
    """The same pool, each statement its own transaction: a lone read or a one-statement
    write skips the BEGIN and ROLLBACK/COMMIT round trips SQLAlchemy would add around it
    (three round trips become one; on the submit path each costs CPU on both ends)."""
    return engine.execution_options(isolation_level="AUTOCOMMIT")


def _wait_to_connect(engine: AsyncEngine, wait_s: float) -> None:
    """A connection PostgreSQL refuses because it is away (refused, no socket, "the
    database system is starting up / shutting down") is tried again, with backoff, for
    up to ``wait_s``. Nothing was sent on it yet, so trying again is always safe, and a
    restart of a second or two makes a request slower instead of answering 503."""

    @event.listens_for(engine.sync_engine, "do_connect")
    def connect(dialect: Any, _record: Any, cargs: Any, cparams: Any) -> Any:
        deadline = time.monotonic() + wait_s
        delay = 0.05
        while True:
            try:
                return dialect.connect(*cargs, **cparams)
            except Exception as exc:
                # the driver's error, or SQLAlchemy's translation raised from it
                away = database_unavailable(exc) or (
                    exc.__cause__ is not None and database_unavailable(exc.__cause__))
                if not away or time.monotonic() + delay > deadline:
                    raise
                log.info("database away, waiting to connect", wait_s=delay,
                         error=repr(exc)[:200])
                await_only(asyncio.sleep(delay))  # in SQLAlchemy's greenlet: yields
                delay = min(delay * 2, 0.5)


def session_factory(engine: AsyncEngine) -> async_sessionmaker[Any]:
    return async_sessionmaker(engine, expire_on_commit=False)


def _alembic_config() -> Any:
    from alembic.config import Config  # only where migrations run: a service start, once

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    return cfg


def _upgrade(conn: Connection) -> None:
    from alembic import command

    cfg = _alembic_config()
    cfg.attributes["connection"] = conn
    command.upgrade(cfg, "head")


async def migrate(engine: AsyncEngine) -> None:
    """Bring the schema to head; concurrent callers wait on an advisory lock."""
    async with engine.begin() as conn:
        await conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": _MIGRATION_LOCK})
        await conn.run_sync(_upgrade)


async def wait_for_database(engine: AsyncEngine, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            async with engine.connect() as conn:
                await conn.execute(text("SELECT 1"))
            return
        except (OSError, Exception) as exc:  # asyncpg raises several kinds while starting
            if time.monotonic() > deadline:
                raise TimeoutError(f"PostgreSQL unreachable after {timeout_s}s: {exc}") from exc
            log.info("waiting for postgresql", error=str(exc)[:120])
            await asyncio.sleep(0.5)


async def create_database(url: str) -> None:
    """Create the URL's database if missing (connecting to the 'postgres' database)."""
    u = make_url(url)
    admin = create_async_engine(u.set(database="postgres"), isolation_level="AUTOCOMMIT")
    try:
        async with admin.connect() as conn:
            exists = await conn.scalar(
                text("SELECT 1 FROM pg_database WHERE datname = :d"), {"d": u.database}
            )
            if not exists:
                await conn.execute(text(f'CREATE DATABASE "{u.database}"'))
    finally:
        await admin.dispose()


async def prepare_database(url: str) -> None:
    """Create the database if needed, wait for it, and migrate it to head."""
    await create_database(url)
    engine = make_engine(url, pool_size=1)
    try:
        await wait_for_database(engine)
        await migrate(engine)
    finally:
        await engine.dispose()
