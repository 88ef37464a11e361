"""Async SQLAlchemy 2 on asyncpg, and migrations (alembic) run at start under a lock."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from sqlalchemy import text
from sqlalchemy.engine import Connection, make_url
from sqlalchemy.ext.asyncio import AsyncEngine, async_sessionmaker, create_async_engine

from shared.logging import get_logger

log = get_logger(__name__)
MIGRATIONS = Path(__file__).parent / "migrations"
_MIGRATION_LOCK = 0x4B41_4952  # "KAIR": one migrator at a time across services


def make_engine(url: str, pool_size: int = 10) -> AsyncEngine:
    return create_async_engine(url, pool_size=pool_size, max_overflow=10, pool_pre_ping=True)


def session_factory(engine: AsyncEngine) -> async_sessionmaker[Any]:
    return async_sessionmaker(engine, expire_on_commit=False)


def _alembic_config() -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    return cfg


def _upgrade(conn: Connection) -> None:
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
