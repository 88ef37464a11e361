"""GET /v1/jobs/{id}/events over real HTTP (uvicorn) against real PostgreSQL: the
history first, then each transition as the read model receives it, then `end`; resuming
with Last-Event-ID; tenant isolation; a client that goes away leaves nothing behind."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from kairos.cli import app
from services.admission.job_events import JobEventsFeed
from services.admission.routes.job_stream import WATCHERS
from shared.events import JobState
from tests.services.gateway_helpers import Gateway, auth, gateway

pytestmark = pytest.mark.db


@pytest.fixture
async def gw(db_url: str) -> AsyncIterator[Gateway]:
    async with gateway(db_url, stream_poll_s=0.05, stream_keepalive_s=0.5) as g:
        yield g


async def read_events(lines: AsyncIterator[str]) -> AsyncIterator[dict[str, Any]]:
    """Parse an SSE stream into {event, id, data} (comments as {event: 'comment'})."""
    event: dict[str, Any] = {}
    async for line in lines:
        if line.startswith(":"):
            yield {"event": "comment"}
        elif not line:
            if event:
                yield event
            event = {}
        else:
            name, _, value = line.partition(": ")
            event[name] = json.loads(value) if name == "data" else value


def sse(body: str) -> list[dict[str, Any]]:
    """A whole SSE body as a list of {event, id, data}."""
    out = []
    for block in body.split("\n\n"):
        fields = dict(line.split(": ", 1) for line in block.split("\n")
                      if line and not line.startswith(":"))
        if fields:
            out.append({**fields, "data": json.loads(fields["data"])})
    return out


async def test_history_then_live_changes_then_end(gw: Gateway) -> None:
    token = await gw.token("vision")
    job = await gw.submit(token)
    await gw.status(job, JobState.ADMITTED)
    got: list[dict[str, Any]] = []
    async with gw.http.stream("GET", f"/v1/jobs/{job}/events", headers=auth(token)) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        events = read_events(r.aiter_lines())
        # the history, in order, as soon as the stream opens
        for state in ("pending", "admitted"):
            e = await anext(events)
            assert (e["event"], e["data"]["state"]) == ("status", state)
            assert e["id"] == str(e["data"]["seq"]) and e["data"]["job_id"] == job
            got.append(e)
        # then every change as the read model gets it, task reports included
        for state, task in ((JobState.BOUND, None), (JobState.RUNNING, "w-0"),
                            (JobState.RUNNING, None), (JobState.SUCCEEDED, "w-0"),
                            (JobState.SUCCEEDED, None)):
            await gw.status(job, state, task=task)
            e = await anext(events)
            while e["event"] == "comment":  # a keep-alive while idle
                e = await anext(events)
            assert (e["data"]["state"], e["data"]["task"]) == (state.value, task), e
            got.append(e)
        end = await anext(events)
        assert end["event"] == "end"
        assert end["data"] == {"job_id": job, "state": "succeeded", "reason": "test succeeded",
                               "attempt": 1, "exit_code": None}
        with pytest.raises(StopAsyncIteration):
            await anext(events)  # the server closed the stream
    seqs = [int(e["id"]) for e in got]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)


async def test_a_finished_job_streams_its_history_and_ends(gw: Gateway) -> None:
    token = await gw.token("vision")
    job = await gw.submit(token)
    await gw.status(job, JobState.CANCELLED, reason="cancelled by user")
    r = await gw.http.get(f"/v1/jobs/{job}/events", headers=auth(token))
    assert r.status_code == 200
    events = sse(r.text)
    assert [(e["event"], e["data"]["state"]) for e in events] == [
        ("status", "pending"), ("status", "cancelled"), ("end", "cancelled")]

    # resuming after the first event sends only what came after it
    r = await gw.http.get(f"/v1/jobs/{job}/events",
                          headers={**auth(token), "Last-Event-ID": events[0]["id"]})
    assert [(e["event"], e["data"]["state"]) for e in sse(r.text)] == [
        ("status", "cancelled"), ("end", "cancelled")]


async def test_another_tenants_job_is_404_and_bad_requests_say_why(gw: Gateway) -> None:
    alice, bob = await gw.token("vision"), await gw.token("nlp")
    job = await gw.submit(bob)
    for token, job_id in ((alice, job), (alice, "j-nope"), (gw.admin, "j-nope")):
        r = await gw.http.get(f"/v1/jobs/{job_id}/events", headers=auth(token))
        assert r.status_code == 404 and r.json() == {"detail": f"no job {job_id}"}
    r = await gw.http.get(f"/v1/jobs/{job}/events")
    assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
    for bad in ("x", "-1", "1.5", "\u00b2".encode("latin-1"), "9" * 19):
        r = await gw.http.get(f"/v1/jobs/{job}/events",
                              headers={**auth(bob), "Last-Event-ID": bad})
        assert r.status_code == 422, (bad, r.text)
        assert r.json()["detail"][0]["field"] == "header.last-event-id"
    # an admin may follow any tenant's job
    await gw.status(job, JobState.FAILED)
    r = await gw.http.get(f"/v1/jobs/{job}/events", headers=auth(gw.admin))
    assert r.status_code == 200 and "event: end" in r.text


async def test_a_client_that_goes_away_leaves_no_watcher(gw: Gateway) -> None:
    token = await gw.token("vision")
    job = await gw.submit(token)
    open_before = WATCHERS._value.get()
    async with (httpx.AsyncClient(base_url=str(gw.http.base_url), timeout=10) as client,
                client.stream("GET", f"/v1/jobs/{job}/events", headers=auth(token)) as r):
        lines = r.aiter_lines()
        assert (await anext(lines)).startswith("id: ")
        feed: JobEventsFeed = gw.app.state.job_events_feed
        assert job in feed._watches
        assert WATCHERS._value.get() == open_before + 1
    # the client closed its connection mid-stream: the server notices and cleans up
    for _ in range(200):
        if job not in feed._watches and WATCHERS._value.get() == open_before:
            break
        await asyncio.sleep(0.05)
    assert job not in feed._watches
    assert WATCHERS._value.get() == open_before


async def test_many_watchers_of_many_jobs_share_one_feed(gw: Gateway) -> None:
    token = await gw.token("vision")
    jobs = [await gw.submit(token) for _ in range(3)]

    async def follow(job: str) -> list[str]:
        r = await gw.http.get(f"/v1/jobs/{job}/events", headers=auth(token), timeout=30)
        return [e["data"]["state"] for e in sse(r.text)]

    watchers = [asyncio.create_task(follow(j)) for j in jobs for _ in range(2)]
    feed = None
    for _ in range(200):
        feed = getattr(gw.app.state, "job_events_feed", None)
        if feed and sum(len(w) for w in feed._watches.values()) == 6:
            break
        await asyncio.sleep(0.05)
    assert feed is not None and set(feed._watches) == set(jobs)
    for job in jobs:
        await gw.status(job, JobState.RUNNING)
        await gw.status(job, JobState.SUCCEEDED)
    results = await asyncio.wait_for(asyncio.gather(*watchers), 30)
    assert results == [["pending", "running", "succeeded", "succeeded"]] * 6


def cli(gw: Gateway, token: str, *args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, [*args, "--url", str(gw.http.base_url), "--token", token])
    return result.exit_code, result.output


async def test_kairos_watch_follows_live_and_exits_with_the_outcome(gw: Gateway) -> None:
    token = await gw.token("vision")
    job = await gw.submit(token)
    watching = asyncio.create_task(asyncio.to_thread(cli, gw, token, "watch", job))
    feed = None
    for _ in range(200):  # the CLI's stream is open
        feed = getattr(gw.app.state, "job_events_feed", None)
        if feed and job in feed._watches:
            break
        await asyncio.sleep(0.05)
    assert feed is not None and job in feed._watches
    for state, task in ((JobState.RUNNING, "w-0"), (JobState.RUNNING, None),
                        (JobState.SUCCEEDED, "w-0"), (JobState.SUCCEEDED, None)):
        await gw.status(job, state, task=task)
    code, out = await asyncio.wait_for(watching, 30)
    assert code == 0, out
    lines = out.splitlines()
    assert [ln.split()[1:3] for ln in lines[:5]] == [
        ["job", "pending"], ["w-0", "running"], ["job", "running"], ["w-0", "succeeded"],
        ["job", "succeeded"]]
    assert "on n1" in lines[1] and lines[-1] == f"job {job} succeeded (test succeeded)"

    failed, cancelled = await gw.submit(token), await gw.submit(token)
    await gw.status(failed, JobState.FAILED, reason="retries exhausted")
    await gw.status(cancelled, JobState.CANCELLED, reason="cancelled by user")
    code, out = await asyncio.to_thread(cli, gw, token, "watch", failed, "--no-tasks")
    assert code == 4 and f"job {failed} failed (retries exhausted)" in out
    code, out = await asyncio.to_thread(cli, gw, token, "watch", cancelled)
    assert code == 5 and "cancelled" in out
    code, out = await asyncio.to_thread(cli, gw, await gw.token("nlp"), "watch", job)
    assert code == 1 and f"error 404: no job {job}" in out


async def test_a_stream_closed_by_the_server_is_resumed_by_kairos_watch(db_url: str) -> None:
    """Streams are closed after stream_max_s (so long watches spread over replicas);
    `kairos watch` reconnects with Last-Event-ID and shows each change once."""
    async with gateway(db_url, stream_poll_s=0.05, stream_max_s=0.3) as gw:
        token = await gw.token("vision")
        job = await gw.submit(token)
        r = await gw.http.get(f"/v1/jobs/{job}/events", headers=auth(token))
        assert r.status_code == 200 and [e["event"] for e in sse(r.text)] == ["status"]

        watching = asyncio.create_task(asyncio.to_thread(cli, gw, token, "watch", job))
        for state, task in ((JobState.ADMITTED, None), (JobState.RUNNING, "w-0"),
                            (JobState.RUNNING, None), (JobState.SUCCEEDED, "w-0")):
            await asyncio.sleep(0.5)  # longer than a stream lives: the CLI reconnects
            await gw.status(job, state, task=task)
        await asyncio.sleep(0.5)
        await gw.status(job, JobState.SUCCEEDED)
        code, out = await asyncio.wait_for(watching, 30)
    assert code == 0, out
    assert [ln.split()[1:3] for ln in out.splitlines()] == [
        ["job", "pending"], ["job", "admitted"], ["w-0", "running"], ["job", "running"],
        ["w-0", "succeeded"], ["job", "succeeded"], [job, "succeeded"]]
