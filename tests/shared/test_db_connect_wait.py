"""A new database connection waits out a PostgreSQL restart (``KAIROS_DB_CONNECT_WAIT_S``)
instead of failing at once: a request that arrives while PostgreSQL restarts for a
second or two is answered late, not with a 503. Past the wait, it fails as before.
Against a PostgreSQL of this test's own, stopped and started again for real."""

from __future__ import annotations

import asyncio

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from services.admission.db_errors import unavailable
from shared.db import make_engine, prepare_database
from tests.services.test_admission_db_outage import OwnPostgres, own_pg  # noqa: F401

pytestmark = pytest.mark.db


async def _select(engine: AsyncEngine) -> int:
    async with engine.connect() as conn:
        return int(await conn.scalar(text("SELECT 1")) or 0)


async def test_a_new_connection_waits_out_a_restart_and_fails_past_its_wait(
        own_pg: tuple[OwnPostgres, str]) -> None:  # noqa: F811
    pg, url = own_pg
    await prepare_database(url)
    waiting = make_engine(url, pool_size=1, connect_wait_s=60)
    impatient = make_engine(url, pool_size=1, connect_wait_s=0.3)
    try:
        await asyncio.to_thread(pg.stop)
        with pytest.raises(Exception) as refused:  # the driver's own error
            await _select(impatient)
        assert unavailable(refused.value)  # past its wait: the gateway's 503
        query = asyncio.create_task(_select(waiting))
        await asyncio.sleep(1.5)
        assert not query.done()  # waiting, not failed
        assert await asyncio.to_thread(pg.start_again) == url  # the same socket
        assert await asyncio.wait_for(query, 60) == 1
        assert await _select(impatient) == 1
    finally:
        await waiting.dispose()
        await impatient.dispose()
