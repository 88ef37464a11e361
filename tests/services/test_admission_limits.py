"""The request body limit over real HTTP (uvicorn) against real PostgreSQL: a declared
Content-Length over it and a chunked body that streams past it are both 413 naming the
limit in bytes, on every route, before anything is written; the limit is a setting."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import pytest
from sqlalchemy import text

from services.admission.settings import AdmissionSettings
from tests.services.gateway_helpers import JOB, Gateway, auth, gateway
from tests.services.test_admission_isolation_matrix import CASES, routes_of

pytestmark = pytest.mark.db
MIB = 1024 * 1024


def big_job(size: int) -> bytes:
    """A valid-looking job spec of about ``size`` bytes (one long argument)."""
    return json.dumps({**JOB, "tasks": [{"name": "w", "command": ["echo", "x" * size]}]}).encode()


async def chunks(body: bytes, size: int = 64 * 1024) -> AsyncIterator[bytes]:
    """The body streamed without a Content-Length (Transfer-Encoding: chunked)."""
    for i in range(0, len(body), size):
        yield body[i:i + size]


async def written(gw: Gateway) -> tuple[int, ...]:
    """Rows of jobs, outbox and job_events."""
    async with gw.engine.connect() as conn:
        return tuple([int(await conn.scalar(text(f"SELECT count(*) FROM {t}")) or 0)
                      for t in ("jobs", "outbox", "job_events")])


async def test_a_5_mb_job_spec_is_413_naming_the_limit_and_writes_nothing(db_url: str) -> None:
    async with gateway(db_url) as gw:
        user = await gw.token("vision")
        body = big_job(5 * MIB)
        declared = await gw.http.post("/v1/jobs", content=body, headers={
            **auth(user), "Content-Type": "application/json"})
        streamed = await gw.http.post("/v1/jobs", content=chunks(body), headers={
            **auth(user), "Content-Type": "application/json"})
        for r in (declared, streamed):
            assert r.status_code == 413, r.text
            assert r.json() == {"detail": "the request body is larger than this gateway "
                                "accepts: the limit is 1048576 bytes"}
        assert "content-length" not in streamed.request.headers  # really chunked
        assert await written(gw) == (0, 0, 0)
        await gw.submit(user)  # and the gateway goes on serving
        assert (await written(gw))[0] == 1


async def test_every_route_refuses_an_oversized_body(
        db_url: str) -> None:
    async with gateway(db_url) as gw:
        body = b"{" + b" " * (MIB + 1) + b"}"
        routes = routes_of(gw.app)
        assert len(routes) > 30  # the walk found the included routers' routes too
        for method, path in routes:
            url = path.replace("{", "x").replace("}", "")  # any id: refused before routing
            r = await gw.http.request(method, url, content=body)
            assert r.status_code == 413, (method, path, r.text)
            assert "the limit is 1048576 bytes" in r.json()["detail"]
        # streamed, to every route that reads a body: counted as it comes
        for (method, path), case in CASES.items():
            if case.body is not None:
                url = path.replace("{", "x").replace("}", "")
                r = await gw.http.request(method, url, content=chunks(body),
                                          headers=auth(gw.admin))
                assert r.status_code == 413, (method, path, r.text)
                assert "the limit is 1048576 bytes" in r.json()["detail"]
        assert await written(gw) == (0, 0, 0)


async def test_the_limit_is_a_setting_and_holds_to_the_byte(
        db_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KAIROS_MAX_REQUEST_BYTES", "4096")
    assert AdmissionSettings().max_request_bytes == 4096
    assert AdmissionSettings.model_fields["max_request_bytes"].default == MIB
    async with gateway(db_url, max_request_bytes=4096) as gw:
        user = await gw.token("vision")
        pad = 4096 - len(big_job(0))
        exact, over = big_job(pad), big_job(pad + 1)
        assert (len(exact), len(over)) == (4096, 4097)
        for body in (exact, chunks(exact, 1000)):
            r = await gw.http.post("/v1/jobs", content=body, headers=auth(user))
            assert r.status_code == 201, r.text
        for body in (over, chunks(over, 1000)):
            r = await gw.http.post("/v1/jobs", content=body, headers=auth(user))
            assert r.status_code == 413 and "the limit is 4096 bytes" in r.json()["detail"]
        assert (await written(gw))[0] == 2


async def test_a_spec_under_the_body_limit_but_over_the_event_limit_is_413(
        db_url: str) -> None:
    """The body fits, the event it makes would not (the bus refuses events over
    max_event_bytes before any send): 413, nothing written, never a 500."""
    async with gateway(db_url, max_event_bytes=200_000) as gw:
        user = await gw.token("vision")
        r = await gw.http.post("/v1/jobs", content=big_job(300_000), headers={
            **auth(user), "Content-Type": "application/json"})
        assert r.status_code == 413, r.text
        assert "200000-byte event limit" in r.json()["detail"]
        assert await written(gw) == (0, 0, 0)
