"""Job arrays at the gateway (in process) against real PostgreSQL: one submit stores every
element and its jobs.submitted event in one transaction, a retry gets the same array,
bad arrays are refused saying why with nothing stored, and a cancel reaches every
element not ended yet."""

# ruff: noqa: F811 (the fixture imported from its home module is the tests' argument)
from __future__ import annotations

import json
from typing import Any

import pytest
from sqlalchemy import text

from services.admission.app import create_app
from services.admission.settings import AdmissionSettings
from shared.db import make_engine
from shared.events import Envelope, JobCommand, JobSubmitted
from tests.services.test_admission_api import Gateway, auth, gw  # noqa: F401 (fixture)

pytestmark = pytest.mark.db


def array(indices: str, **extra: Any) -> dict[str, Any]:
    return {"name": "sweep", "array": indices, **extra,
            "tasks": [{"name": "w", "resources": {"gpu": 1}, "env": {"LR": "0.1"}}]}


async def _outbox(gw: Gateway, array_id: str) -> list[Envelope]:
    async with gw.engine.connect() as conn:
        rows = (await conn.execute(text(
            "SELECT payload FROM outbox WHERE event_id LIKE :p OR convert_from(payload, 'UTF8') LIKE :q"
            " ORDER BY seq"), {"p": f"submitted-{array_id}-%", "q": f"%{array_id}%"})).scalars()
        return [Envelope.decode(bytes(p)) for p in rows]


async def _count(gw: Gateway, sql: str, **params: Any) -> int:
    async with gw.engine.connect() as conn:
        return int(await conn.scalar(text(sql), params) or 0)


async def test_one_submit_stores_each_element_with_its_index(gw: Gateway) -> None:
    tok = await gw.token("vision")
    r = await gw.http.post("/v1/jobs", json=array("0-8:2,11%3"), headers=auth(tok))
    assert r.status_code == 201, r.text
    arr = r.json()
    assert (arr["size"], arr["max_running"], arr["indices"]) == (6, 3, "0-8:2,11%3")
    assert r.headers["location"] == f"/v1/arrays/{arr['id']}"
    listed = (await gw.http.get("/v1/jobs", params={"array": arr["id"]},
                                headers=auth(tok))).json()["items"]
    assert sorted(j["array_index"] for j in listed) == [0, 2, 4, 6, 8, 11]
    assert {j["array_id"] for j in listed} == {arr["id"]}
    one = (await gw.http.get(f"/v1/jobs/{arr['id']}-6", headers=auth(tok))).json()
    env = one["spec"]["tasks"][0]["env"]
    assert env == {"LR": "0.1", "KAIROS_ARRAY_ID": arr["id"], "KAIROS_ARRAY_INDEX": "6",
                   "SLURM_ARRAY_JOB_ID": arr["id"], "SLURM_ARRAY_TASK_ID": "6",
                   "SLURM_ARRAY_TASK_COUNT": "6", "SLURM_ARRAY_TASK_MIN": "0",
                   "SLURM_ARRAY_TASK_MAX": "11"}
    assert one["spec"]["array"] is None and one["state"] == "pending"
    assert [h["reason"] for h in one["history"]] == ["accepted"]
    events = [e.payload() for e in await _outbox(gw, arr["id"])]
    assert all(isinstance(e, JobSubmitted) for e in events)
    assert sorted((e.array_index, e.array_id, e.array_max_running)  # type: ignore[union-attr]
                  for e in events) == [(i, arr["id"], 3) for i in (0, 2, 4, 6, 8, 11)]
    summary = (await gw.http.get(f"/v1/arrays/{arr['id']}", headers=auth(tok))).json()
    assert summary["states"] == {"pending": 6} and summary["spec"]["array"] == "0-8:2,11%3"
    other = await gw.token("nlp")  # another tenant's array is as good as none
    assert (await gw.http.get(f"/v1/arrays/{arr['id']}", headers=auth(other))).status_code == 404
    assert (await gw.http.delete(f"/v1/arrays/{arr['id']}",
                                 headers=auth(other))).status_code == 404


async def test_a_retry_with_the_same_key_gets_the_same_array(gw: Gateway) -> None:
    tok = await gw.token("vision")
    headers = {**auth(tok), "Idempotency-Key": "sweep-7"}
    first = await gw.http.post("/v1/jobs", json=array("0-4"), headers=headers)
    again = await gw.http.post("/v1/jobs", json=array("0-4"), headers=headers)
    assert (first.status_code, again.status_code) == (201, 200)
    assert again.json()["id"] == first.json()["id"]
    assert await _count(gw, "SELECT count(*) FROM jobs WHERE array_id = :a",
                        a=first.json()["id"]) == 5
    assert await _count(gw, "SELECT count(*) FROM job_arrays WHERE idempotency_key = 'sweep-7'"
                        ) == 1


@pytest.mark.parametrize(("indices", "says"), [
    ("5-1", "a range goes up"), ("0-9%0", "at least 1"), ("x", "not an index or a range"),
    ("0-2000000", "indices go up to"), ("", "no indices"), ("1,,2", "not an index")])
async def test_a_bad_array_is_422_naming_the_field(gw: Gateway, indices: str, says: str) -> None:
    tok = await gw.token("vision")
    r = await gw.http.post("/v1/jobs", json=array(indices), headers=auth(tok))
    assert r.status_code == 422, r.text
    (err,) = r.json()["detail"]
    assert err["field"] == "array" and says in err["message"]


async def test_limits_refuse_the_whole_array_and_store_nothing(db_url: str) -> None:
    engine = make_engine(db_url, pool_size=2)

    async def ready() -> dict[str, bool]:
        return {"database": True}

    import httpx

    from services.admission import tokens
    app = create_app(AdmissionSettings(database_url=db_url, max_array_size=50,
                                       max_event_bytes=20_000), engine, ready)
    _, tok = await tokens.create_token(engine, "vision")
    try:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                     base_url="http://gw") as http:
            before = await _jobs(engine)
            r = await http.post("/v1/jobs", json=array("0-50"), headers=auth(tok))
            assert r.status_code == 422 and "at most 50" in r.json()["detail"][0]["message"]
            big = array("0-9")  # each element's event over the limit: refused whole (413)
            big["tasks"][0]["env"] = {f"V{i}": "x" * 100 for i in range(200)}
            r = await http.post("/v1/jobs", json=big, headers=auth(tok))
            assert r.status_code == 413, r.text
            interactive = array("0-1", kind="Interactive", timeLimit=60)
            r = await http.post("/v1/jobs", json=interactive, headers=auth(tok))
            assert r.status_code == 422 and "cannot be an array" in r.text
            assert await _jobs(engine) == before
    finally:
        await engine.dispose()


async def _jobs(engine: Any) -> tuple[int, int, int]:
    async with engine.connect() as conn:
        return tuple([int(await conn.scalar(text(f"SELECT count(*) FROM {t}")) or 0)  # type: ignore[return-value]
                      for t in ("jobs", "job_arrays", "outbox")])


async def test_cancel_reaches_every_element_not_ended(gw: Gateway) -> None:
    tok = await gw.token("vision")
    arr = (await gw.http.post("/v1/jobs", json=array("0-3"), headers=auth(tok))).json()
    async with gw.engine.begin() as conn:  # element 1 ended already
        await conn.execute(text("UPDATE jobs SET state = 'succeeded' WHERE id = :j"),
                           {"j": f"{arr['id']}-1"})
    r = await gw.http.delete(f"/v1/arrays/{arr['id']}", headers=auth(tok))
    assert r.status_code == 202 and r.json()["cancelled"] == 3
    cancels = [e.payload() for e in await _outbox(gw, arr["id"])
               if e.type == JobCommand.TYPE]
    assert sorted(c.job_id for c in cancels) == [  # type: ignore[union-attr]
        f"{arr['id']}-{i}" for i in (0, 2, 3)]
    assert json.dumps([c.model_dump(mode="json") for c in cancels]).count("whole array") == 3
    missing = await gw.http.delete("/v1/arrays/a-0000000000000000", headers=auth(tok))
    assert missing.status_code == 404
