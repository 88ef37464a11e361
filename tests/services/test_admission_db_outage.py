"""PostgreSQL going away under a running gateway, for real: a PostgreSQL of this test's
own is stopped under the gateway (uvicorn) and started again on the same data
directory. Meanwhile every /v1 route answers 503 with Retry-After (at the token lookup,
and past it in the route itself), never a 500; once it is back the same app serves
again, without a restart. An exhausted pool is 503 too, and what counts as
"unavailable" is decided on the error, so a bug is still a 500."""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import asyncpg
import httpx
import pytest
import structlog
from sqlalchemy import exc as sa
from sqlalchemy.ext.asyncio import create_async_engine

from kairos.embedded import EmbeddedPostgres
from services.admission import db_errors
from services.admission.app import create_app
from services.admission.auth import Principal
from services.admission.db_errors import DETAIL, unavailable
from services.admission.deps import authenticate
from services.admission.routes import queues as routes_queues
from services.admission.settings import AdmissionSettings
from shared.db import prepare_database
from tests.services.gateway_helpers import JOB, auth, gateway
from tests.services.test_admission_isolation_matrix import CASES, no_secret_in

pytestmark = [pytest.mark.db, pytest.mark.both_pg]
ADMIN = Principal(tenant="ops", user="root", role="admin", token_id=None)


@dataclass
class OwnPostgres:
    datadir: Path
    server: EmbeddedPostgres

    def stop(self) -> None:
        self.server.stop()

    def start_again(self) -> str:
        self.server = EmbeddedPostgres(self.datadir, fresh=False)  # keep the data
        return self.server.start()


@pytest.fixture
def own_pg() -> Iterator[tuple[OwnPostgres, str]]:
    # outside pytest's 0700 tmp tree: the embedded PostgreSQL runs as its own user
    workdir = Path(tempfile.mkdtemp(prefix="kairos-pg-outage-"))
    pg = OwnPostgres(workdir / "data", EmbeddedPostgres(workdir / "data"))
    url = pg.server.start()
    try:
        yield pg, url
    finally:
        pg.stop()
        shutil.rmtree(workdir, ignore_errors=True)


def assert_unavailable(r: httpx.Response, where: object) -> None:
    assert r.status_code == 503, (where, r.text)
    assert r.json() == {"detail": DETAIL}, where
    assert r.headers["retry-after"] == "2", where


async def test_every_route_is_503_while_postgres_is_down_then_serves_again(
        own_pg: tuple[OwnPostgres, str], monkeypatch: pytest.MonkeyPatch) -> None:
    pg, url = own_pg
    await prepare_database(url)
    monkeypatch.setattr(routes_queues, "APPLY_TIMEOUT_S", 0.2)
    async with gateway(url) as gw:
        user = await gw.token("vision", name="alice")
        job = await gw.submit(user)
        ids = {"job": job, "elastic": job, "done": job, "env": job, "spare": "t-x",
               "array": "a-0000000000000000"}

        await asyncio.to_thread(pg.stop)
        with structlog.testing.capture_logs() as logged:
            # a logger made now: one used before (services cache theirs on first use,
            # shared.logging) would not reach the capture
            monkeypatch.setattr(db_errors, "log", structlog.get_logger(db_errors.__name__))
            # the token lookup of each route meets the outage first
            for r in (await gw.http.post("/v1/jobs", json=JOB, headers=auth(user)),
                      await gw.http.get(f"/v1/jobs/{job}", headers=auth(user)),
                      await gw.http.get("/v1/jobs", headers=auth(user))):
                assert_unavailable(r, r.request.url)
            for (method, path), case in CASES.items():
                r = await gw.http.request(method, case.url.format(**ids), json=case.body,
                                          headers=auth(gw.admin))
                assert_unavailable(r, (method, path))
            # past the token lookup, the route's own queries meet it too
            gw.app.dependency_overrides[authenticate] = lambda: ADMIN
            for (method, path), case in CASES.items():
                r = await gw.http.request(method, case.url.format(**ids), json=case.body)
                if path == "/v1/me":  # the one route that reads nothing
                    assert r.status_code == 200, r.text
                else:
                    assert_unavailable(r, (method, path, "past auth"))
            gw.app.dependency_overrides.clear()
            assert (await gw.http.get("/healthz")).status_code == 200  # alive, not ready

        assert sum(e["event"] == "database unavailable" for e in logged) >= 2 * len(CASES)
        no_secret_in(repr(logged), [user, gw.admin])

        assert await asyncio.to_thread(pg.start_again) == url  # same socket, same data
        r = await gw.http.post("/v1/jobs", json=JOB, headers=auth(user))
        assert r.status_code == 201, r.text
        assert (await gw.http.get(f"/v1/jobs/{job}", headers=auth(user))).status_code == 200
        page = (await gw.http.get("/v1/jobs", headers=auth(user))).json()
        assert [j["id"] for j in page["items"]] == [job, r.json()["id"]]


@pytest.fixture
async def one_connection(db_url: str) -> AsyncIterator[tuple[httpx.AsyncClient, object]]:
    engine = create_async_engine(db_url, pool_size=1, max_overflow=0, pool_timeout=0.2)

    async def ready() -> dict[str, bool]:
        return {"database": True}

    app = create_app(AdmissionSettings(database_url=db_url), engine, ready)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                 base_url="http://gw") as http:
        yield http, engine
    await engine.dispose()


async def test_an_exhausted_pool_is_503_not_a_hang(
        one_connection: tuple[httpx.AsyncClient, object]) -> None:
    http, engine = one_connection
    async with engine.connect():  # type: ignore[attr-defined]  # holds the pool's only one
        r = await http.get("/v1/jobs", headers=auth("kairos_whatever"))
        assert_unavailable(r, "pool")
    r = await http.get("/v1/jobs", headers=auth("kairos_whatever"))
    assert r.status_code == 401 and r.json() == {"detail": "invalid token"}


def _caused(outer: BaseException, inner: BaseException) -> BaseException:
    outer.__cause__ = inner
    return outer


def _context(outer: BaseException, inner: BaseException) -> BaseException:
    outer.__context__ = inner
    return outer


@pytest.mark.parametrize(("error", "expected"), [
    (ConnectionRefusedError(111, "Connection refused"), True),
    (FileNotFoundError(2, "No such file or directory"), True),  # the Unix socket is gone
    (TimeoutError(), True),
    (asyncpg.CannotConnectNowError("the database system is starting up"), True),
    (asyncpg.exceptions.AdminShutdownError("terminating connection"), True),
    (asyncpg.exceptions.TooManyConnectionsError("too many clients"), True),
    (asyncpg.exceptions.ConnectionDoesNotExistError("connection was closed"), True),
    (sa.OperationalError("SELECT 1", {}, Exception("server closed the connection")), True),
    (sa.InterfaceError("SELECT 1", {}, Exception("connection is closed")), True),
    (sa.DBAPIError("SELECT 1", {}, Exception("gone"), connection_invalidated=True), True),
    (sa.TimeoutError("QueuePool limit reached"), True),
    (_caused(sa.DBAPIError("SELECT 1", {}, Exception("x")),
             asyncpg.CannotConnectNowError("starting up")), True),
    (ExceptionGroup("both", [OSError("a"), sa.TimeoutError("b")]), True),
    # a bug stays a bug: a 500
    (sa.DBAPIError("SELECT 1", {}, Exception("syntax")), False),
    (sa.IntegrityError("INSERT", {}, Exception("duplicate key")), False),
    (sa.ProgrammingError("SELECT", {}, Exception("no such column")), False),
    (asyncpg.exceptions.UndefinedColumnError("no such column"), False),
    (_context(KeyError("x"), OSError("handled earlier")), False),
    (ExceptionGroup("mixed", [OSError("a"), KeyError("b")]), False),
    (ValueError("x"), False),
])
def test_what_counts_as_unavailable(error: BaseException, expected: bool) -> None:
    assert unavailable(error) is expected
