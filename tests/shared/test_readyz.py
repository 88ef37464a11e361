"""/readyz follows the database: a service's probe over real HTTP, with the real broker
and the real PostgreSQL reached through a TCP relay this test cuts (connections refused)
and blackholes (accepted, never answered: a network partition)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from sqlalchemy.engine import make_url

from kairos.embedded import free_port
from shared.config import CommonSettings
from shared.http import HttpServer, ops_app
from shared.service import ServiceRuntime

pytestmark = [pytest.mark.db, pytest.mark.broker]


class Relay:
    """127.0.0.1:<port> -> the database (TCP or its Unix socket). ``up``: forwards;
    ``down``: nothing listens (refused); ``blackhole``: accepts and never answers."""

    def __init__(self, db_url: str) -> None:
        url = make_url(db_url)
        socket_dir = url.query.get("host")
        self.unix = (str(next(Path(str(socket_dir)).glob(".s.PGSQL.*")))
                     if socket_dir else None)
        self.target = (url.host or "127.0.0.1", url.port or 5432)
        self.port = free_port()
        self.mode = "up"
        self.server: asyncio.Server | None = None
        self.open: set[asyncio.StreamWriter] = set()
        self.database = url.database

    async def start(self) -> None:
        self.server = await asyncio.start_server(self._client, "127.0.0.1", self.port,
                                                 reuse_address=True)

    async def set(self, mode: str) -> None:
        self.mode = mode
        for w in list(self.open):  # what was connected is cut as well
            w.close()
        self.open.clear()
        if mode == "down" and self.server is not None:
            self.server.close()
            await self.server.wait_closed()
            self.server = None
        elif mode != "down" and self.server is None:
            await self.start()

    async def stop(self) -> None:
        await self.set("down")

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.open.add(writer)
        if self.mode == "blackhole":
            with contextlib.suppress(Exception):
                await reader.read()  # hold it until the client gives up or we cut it
            return
        if self.unix:
            up_r, up_w = await asyncio.open_unix_connection(self.unix)
        else:
            up_r, up_w = await asyncio.open_connection(*self.target)
        self.open.add(up_w)

        async def pipe(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            with contextlib.suppress(Exception):
                while data := await r.read(65536):
                    w.write(data)
                    await w.drain()
            w.close()

        await asyncio.gather(pipe(reader, up_w), pipe(up_r, writer))

    def url(self) -> str:
        return f"postgresql+asyncpg://postgres@127.0.0.1:{self.port}/{self.database}"


@pytest.fixture
async def relay(db_url: str) -> AsyncIterator[Relay]:
    r = Relay(db_url)
    await r.start()
    yield r
    await r.stop()


async def test_readyz_answers_503_naming_the_database_while_it_is_unreachable(
        relay: Relay, broker: str) -> None:
    settings = CommonSettings(service_name="readyz-test", kafka_bootstrap=broker,
                              database_url=relay.url(), log_json=False)
    rt = ServiceRuntime(settings)
    await rt.producer.start()
    port = free_port()
    http = HttpServer(ops_app(rt.ready), "127.0.0.1", port)
    await http.start()
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}",
                                     timeout=30) as client:
            r = await client.get("/readyz")
            assert r.status_code == 200
            assert r.json() == {"ready": True, "checks": {"broker": True, "database": True}}

            await relay.set("down")  # refused
            r = await client.get("/readyz")
            assert r.status_code == 503
            assert r.json() == {"ready": False, "checks": {"broker": True, "database": False},
                                "detail": "not ready: database unreachable"}
            assert (await client.get("/healthz")).status_code == 200  # alive, not ready

            await relay.set("blackhole")  # accepted, never answered: still a bounded answer
            r = await client.get("/readyz")
            assert r.status_code == 503 and r.json()["checks"]["database"] is False

            await relay.set("up")
            r = await client.get("/readyz")
            assert r.status_code == 200 and r.json()["ready"] is True
    finally:
        await http.stop()
        await rt.producer.stop()
        assert rt.engine is not None
        await rt.engine.dispose()
