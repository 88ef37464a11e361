"""GET /v1/jobs/{id}/logs: a task's output, proxied from the agent of the node it ran on.

The gateway checks the caller (another tenant's job is 404, as everywhere), finds where
the task ran in its read model (the agents' task reports in ``job_events``, and
``allocations_view`` for a task bound but not yet reported), and forwards the request to
that node's agent (``agent_url`` of its inventory, ``GET /logs/{job}``). ``follow``
streams the output until the task ends. Without ``task`` the job's first task is shown
(``X-Kairos-Task`` says which); without ``attempt``, the latest attempt.

Refusals: 404 for a job (or task) not visible or not started yet, or an agent that has
no logs for it; 503 when the node is lost or its agent serves no logs; 502 when the
agent cannot be reached or answers wrongly; 504 when it does not answer in time.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from typing import Annotated, Any

import httpx
from fastapi import APIRouter, HTTPException, Query, status
from fastapi.responses import PlainTextResponse, Response, StreamingResponse
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from services.admission.deps import Caller, EngineDep, LogProxyDep
from shared.logging import get_logger

log = get_logger(__name__)
router = APIRouter()
PASSED_HEADERS = ("x-kairos-task", "x-kairos-node")
_ERR = {"content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}


async def _placements(engine: AsyncEngine, job_id: str) -> list[dict[str, Any]]:
    """(task, attempt, node) of every task the job placed, in the order they appeared."""
    async with engine.connect() as conn:
        rows = (await conn.execute(text(
            """SELECT task, attempt, node_id, min(seq) AS first FROM job_events
               WHERE job_id = :j AND task IS NOT NULL AND node_id IS NOT NULL
               GROUP BY task, attempt, node_id
               UNION ALL
               SELECT task_id, attempt, node_id, NULL FROM allocations_view WHERE job_id = :j
               ORDER BY first NULLS LAST"""), {"j": job_id})).mappings().all()
    seen: dict[tuple[str, int], dict[str, Any]] = {}
    for r in rows:
        seen.setdefault((r["task"], r["attempt"]), dict(r))
    return list(seen.values())


def _task_order(task_id: str) -> tuple[str, int, str]:
    """worker-2 before worker-10; a grown replica (worker-3.1) after its group."""
    m = re.fullmatch(r"(.*)-(\d+)(\..*)?", task_id)
    return (m[1], int(m[2]), m[3] or "") if m else (task_id, 0, "")


def _choose(places: list[dict[str, Any]], job_id: str, state: str, task: str | None,
            attempt: int | None) -> dict[str, Any]:
    if not places:
        raise HTTPException(status.HTTP_404_NOT_FOUND, detail=(
            f"no logs yet: job {job_id} has not started a task ({state})"))
    attempt = attempt or max(p["attempt"] for p in places)
    of_attempt = [p for p in places if p["attempt"] == attempt]
    if not of_attempt:
        raise HTTPException(status.HTTP_404_NOT_FOUND, detail=(
            f"no logs yet: job {job_id} has no attempt {attempt} on a node"))
    if task is None:
        return min(of_attempt, key=lambda p: _task_order(p["task"]))
    for p in of_attempt:
        if p["task"] == task:
            return p
    known = ", ".join(sorted({p["task"] for p in of_attempt}, key=_task_order))
    raise HTTPException(status.HTTP_404_NOT_FOUND, detail=(
        f"job {job_id} has no task {task} in attempt {attempt} (tasks: {known})"))


async def _node(engine: AsyncEngine, node_id: str) -> dict[str, Any]:
    async with engine.connect() as conn:
        row = (await conn.execute(text(
            "SELECT state, inventory->>'agent_url' AS agent_url FROM nodes_view"
            " WHERE node_id = :n"), {"n": node_id})).mappings().first()
    if row is None:
        raise HTTPException(status.HTTP_503_SERVICE_UNAVAILABLE,
                            detail=f"node {node_id} is unknown to the gateway: no agent to ask")
    if row["state"] == "lost":
        raise HTTPException(status.HTTP_503_SERVICE_UNAVAILABLE, detail=(
            f"node {node_id} is lost: its agent does not answer heartbeats"))
    if not row["agent_url"]:
        raise HTTPException(status.HTTP_503_SERVICE_UNAVAILABLE, detail=(
            f"the agent of node {node_id} serves no logs (no agent_url in its inventory)"))
    return dict(row)


async def _agent_error(r: httpx.Response, node_id: str) -> HTTPException:
    await r.aread()
    try:
        detail = r.json().get("detail", r.text)
    except ValueError:
        detail = r.text
    if r.status_code == 404:
        return HTTPException(status.HTTP_404_NOT_FOUND, detail=str(detail))
    return HTTPException(status.HTTP_502_BAD_GATEWAY, detail=(
        f"the agent of node {node_id} answered {r.status_code}: {detail}"))


@router.get(
    "/v1/jobs/{job_id}/logs", response_class=PlainTextResponse,
    responses={200: {"content": {"text/plain": {}}, "description": "the task's output"},
               404: {**_ERR, "description": "no such job (or another tenant's), or no "
                     "log yet"},
               502: {**_ERR, "description": "the node's agent cannot be reached"},
               503: {**_ERR, "description": "the node is lost or its agent serves no logs"},
               504: {**_ERR, "description": "the node's agent did not answer in time"}})
async def job_logs(
    job_id: str,
    caller: Caller, engine: EngineDep, cfg: LogProxyDep,
    task: Annotated[str | None, Query(max_length=200, description=(
        "the task (e.g. worker-1); default the job's first"))] = None,
    attempt: Annotated[int | None, Query(ge=1, description="default the latest")] = None,
    tail: Annotated[int | None, Query(ge=0, le=1_000_000, description="last N lines")] = None,
    follow: Annotated[bool, Query(description="stream new output until the task ends")] = False,
) -> Response:
    """A task's output (stdout and stderr), from the agent of the node it runs or ran on."""
    async with engine.connect() as conn:
        job = (await conn.execute(text("SELECT tenant, state FROM jobs WHERE id = :j"),
                                  {"j": job_id})).mappings().first()
    if job is None or (not caller.admin and job["tenant"] != caller.tenant):
        raise HTTPException(status.HTTP_404_NOT_FOUND, detail=f"no job {job_id}")
    place = _choose(await _placements(engine, job_id), job_id, job["state"], task, attempt)
    node_id = place["node_id"]
    node = await _node(engine, node_id)
    params: dict[str, Any] = {"node": node_id, "task": place["task"],
                              "attempt": place["attempt"], "follow": follow}
    if tail is not None:
        params["tail"] = tail
    headers = {"Authorization": f"Bearer {cfg.agent_token}"} if cfg.agent_token else {}
    client = httpx.AsyncClient(base_url=node["agent_url"], headers=headers, timeout=httpx.Timeout(
        cfg.agent_timeout_s, read=None if follow else cfg.agent_timeout_s))
    try:
        r = await client.send(client.build_request("GET", f"/logs/{job_id}", params=params),
                              stream=True)
    except httpx.TimeoutException as exc:
        await client.aclose()
        raise HTTPException(status.HTTP_504_GATEWAY_TIMEOUT, detail=(
            f"the agent of node {node_id} did not answer in {cfg.agent_timeout_s:g}s")) from exc
    except httpx.HTTPError as exc:
        await client.aclose()
        log.warning("agent unreachable", node=node_id, url=node["agent_url"], error=str(exc))
        raise HTTPException(status.HTTP_502_BAD_GATEWAY, detail=(
            f"the agent of node {node_id} at {node['agent_url']} is unreachable: "
            f"{type(exc).__name__}")) from exc
    if r.status_code != 200:
        error = await _agent_error(r, node_id)
        await r.aclose()
        await client.aclose()
        raise error
    out_headers = {k: r.headers[k] for k in PASSED_HEADERS if k in r.headers}
    out_headers["x-kairos-attempt"] = str(place["attempt"])

    async def relay() -> AsyncIterator[bytes]:
        try:
            async for chunk in r.aiter_raw():
                yield chunk
        except httpx.HTTPError as exc:  # the agent went away mid-stream: say so, in band
            yield f"\n[kairos] log stream from node {node_id} ended: {exc!r}\n".encode()
        finally:
            await r.aclose()
            await client.aclose()

    if follow:
        return StreamingResponse(relay(), media_type="text/plain; charset=utf-8",
                                 headers=out_headers)
    try:
        body = await r.aread()
    except httpx.HTTPError as exc:
        raise HTTPException(status.HTTP_502_BAD_GATEWAY, detail=(
            f"the agent of node {node_id} broke off: {type(exc).__name__}")) from exc
    finally:
        await r.aclose()
        await client.aclose()
    return PlainTextResponse(body.decode(errors="replace"), headers=out_headers)
