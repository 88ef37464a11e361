"""Interactive GPU environments: request, list, look at, return.

An environment IS a job, of kind ``Interactive``: one task with one replica, under the
same admission policy, queues and quotas as batch work. It is held until its user
returns it (a cancel with reason ``returned``) or until its ``timeLimit``, when the
agent stops it (reason ``time limit reached``). Once it runs, the agent's report gives
where to connect: the host and port it allocated (``KAIROS_PORT`` in the task's
environment) or, on Kubernetes, the Pod.
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Header, HTTPException, Query, Request, Response, status
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from pydantic.alias_generators import to_camel
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from services.admission import ratelimit, store
from services.admission.accept import accept
from services.admission.auth import Principal, authenticate
from services.admission.openapi_errors import field_errors
from shared.events import RETURNED, CommandAction, Connection, JobCommand, JobState
from shared.jobspec import JobSpec, PriorityClass, parse_job_spec
from shared.outbox import add_to_outbox

router = APIRouter(tags=["environments"])
Caller = Annotated[Principal, Depends(authenticate)]
MAX_TIME_LIMIT_S = 7 * 86400
SESSION_TASK = "session"


class EnvironmentIn(BaseModel):
    """What a user asks for; camelCase like a job spec. A whole-GPU count or a share."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True,
                              extra="forbid")
    name: str = Field(default="env", max_length=63)
    queue: str = Field(default="default", max_length=63)
    gpu: int | None = Field(default=None, ge=0, le=64,
                            description="whole GPUs; default 1 unless a share is asked")
    gpu_memory: int = Field(default=0, ge=0, description="MiB of one shared GPU")
    gpu_compute: int = Field(default=0, ge=0, le=100, description="percent of one GPU")
    cpu: int = Field(default=4000, ge=0, description="millicores")
    memory: int = Field(default=16384, ge=0, description="MiB")
    image: str | None = Field(default=None, max_length=500)
    command: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)
    time_limit: int = Field(default=3600, ge=1, le=MAX_TIME_LIMIT_S,
                            description="seconds it is held at most")
    priority: int = Field(default=0, ge=-1000, le=1000)
    priority_class: PriorityClass = PriorityClass.NORMAL
    preemptible: bool = True
    duration: float | None = Field(default=None, ge=0, description=(
        "simulated nodes only: seconds the session 'runs' (default: until returned)"))

    def to_spec(self) -> JobSpec:
        shared = bool(self.gpu_memory or self.gpu_compute)
        resources = {"gpuMemory": self.gpu_memory, "gpuCompute": self.gpu_compute} if shared \
            else {"gpu": 1 if self.gpu is None else self.gpu}
        if shared and self.gpu:
            resources["gpu"] = self.gpu  # let the spec refuse "both" with its own message
        task: dict[str, Any] = {"name": SESSION_TASK, "replicas": 1, "command": self.command,
                                "env": self.env, "resources": {**resources, "cpu": self.cpu,
                                                               "memory": self.memory}}
        if self.image:
            task["image"] = self.image
        doc: dict[str, Any] = {
            "kind": "Interactive", "name": self.name, "queue": self.queue,
            "timeLimit": self.time_limit, "priority": self.priority,
            "priorityClass": self.priority_class.value, "preemptible": self.preemptible,
            "maxRetry": 0, "tasks": [task]}
        if self.duration is not None:
            doc["duration"] = self.duration
        return parse_job_spec(doc)


class EnvironmentOut(BaseModel):
    id: str
    name: str
    queue: str
    tenant: str
    user: str
    state: str
    reason: str
    attempt: int
    time_limit_s: int
    resources: dict[str, Any]
    image: str
    submitted_at: datetime
    updated_at: datetime
    connection: Connection | None = Field(
        default=None, description="where to connect, while it runs")
    running_since: datetime | None = None
    expires_at: datetime | None = Field(
        default=None, description="when its time limit stops it, while it runs")


class EnvironmentList(BaseModel):
    items: list[EnvironmentOut]
    limit: int
    offset: int
    next_offset: int | None


def _spec(row: dict[str, Any]) -> dict[str, Any]:
    spec = row["spec"]
    return spec if isinstance(spec, dict) else dict(json.loads(spec))


def _env_out(row: dict[str, Any]) -> EnvironmentOut:
    spec = _spec(row)
    task = spec["tasks"][0]
    running = row["state"] == JobState.RUNNING.value
    conn = row.get("connection")
    if isinstance(conn, str):
        conn = json.loads(conn)
    out = EnvironmentOut(
        **{k: row[k] for k in ("id", "name", "queue", "tenant", "user", "state", "reason",
                               "attempt", "submitted_at", "updated_at")},
        time_limit_s=spec["timeLimit"], resources=task["resources"], image=task["image"],
        connection=Connection.model_validate(conn) if running and conn
        and row.get("connection_attempt") == row["attempt"] else None)
    if running:
        started = [h["occurred_at"] for h in row.get("history", [])
                   if h["state"] == "running" and h["task"] is None
                   and h["attempt"] == row["attempt"]]
        if started:
            out.running_since = started[-1]
            out.expires_at = started[-1] + timedelta(seconds=spec["timeLimit"])
    return out


def _validation_detail(exc: ValidationError) -> list[dict[str, Any]]:
    return field_errors(exc.errors(include_url=False, include_context=False,
                                   include_input=False))


async def _visible(engine: AsyncEngine, env_id: str, caller: Principal) -> dict[str, Any]:
    row = await store.get_job(engine, env_id)
    if row is None or (not caller.admin and row["tenant"] != caller.tenant) or \
            _spec(row).get("kind") != "Interactive":
        # the same answer for another tenant's environment, a batch job or nothing
        raise HTTPException(status.HTTP_404_NOT_FOUND, detail=f"no environment {env_id}")
    return row


@router.post("/v1/environments", status_code=201, response_model=EnvironmentOut)
async def request_environment(
    body: EnvironmentIn, request: Request, response: Response, caller: Caller,
    idempotency_key: Annotated[str | None, Header(max_length=200)] = None,
) -> EnvironmentOut:
    """Request an interactive GPU environment: queued like any job of the caller's
    tenant; ``GET /v1/environments/{id}`` gives its connection once it runs."""
    engine: AsyncEngine = request.app.state.engine
    await ratelimit.check_submit(engine, request.app.state.settings, caller.tenant)
    try:
        spec = body.to_spec()
    except ValidationError as exc:
        raise HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT,
                            detail=_validation_detail(exc)) from exc
    row, created = await accept(request, caller, spec, idempotency_key)
    if not created:
        response.status_code = status.HTTP_200_OK
    response.headers["Location"] = f"/v1/environments/{row['id']}"
    return _env_out(row)


@router.get("/v1/environments", response_model=EnvironmentList)
async def list_environments(
    request: Request, caller: Caller,
    state: JobState | None = None,
    tenant: Annotated[str | None, Query(max_length=63,
                                        description="admins: only this tenant's")] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    offset: Annotated[int, Query(ge=0)] = 0,
) -> EnvironmentList:
    """The caller's tenant's environments, oldest first (an admin's: every tenant's)."""
    if not caller.admin:
        if tenant is not None and tenant != caller.tenant:
            raise HTTPException(status.HTTP_403_FORBIDDEN, detail=(
                f"this token lists only tenant {caller.tenant}'s environments"))
        tenant = caller.tenant
    clauses = ["spec->>'kind' = 'Interactive'"]
    params: dict[str, Any] = {"limit": limit + 1, "offset": offset}
    for col, val in (("tenant", tenant), ("state", state.value if state else None)):
        if val is not None:
            clauses.append(f"{col} = :{col}")
            params[col] = val
    async with request.app.state.engine.connect() as conn:
        rows = [dict(r) for r in (await conn.execute(text(
            f"SELECT * FROM jobs WHERE {' AND '.join(clauses)}"
            " ORDER BY submitted_at, id LIMIT :limit OFFSET :offset"), params)).mappings()]
    more = len(rows) > limit
    return EnvironmentList(items=[_env_out(r) for r in rows[:limit]], limit=limit,
                           offset=offset, next_offset=offset + limit if more else None)


@router.get("/v1/environments/{env_id}", response_model=EnvironmentOut)
async def get_environment(env_id: str, request: Request, caller: Caller) -> EnvironmentOut:
    """State, and where to connect while it runs."""
    return _env_out(await _visible(request.app.state.engine, env_id, caller))


@router.delete("/v1/environments/{env_id}", status_code=202, response_model=EnvironmentOut)
async def return_environment(env_id: str, request: Request, caller: Caller) -> EnvironmentOut:
    """Return the environment: its session is stopped and its GPUs freed; it ends
    ``cancelled`` with reason ``returned``."""
    engine: AsyncEngine = request.app.state.engine
    row = await _visible(engine, env_id, caller)
    if JobState(row["state"]).terminal:
        raise HTTPException(status.HTTP_409_CONFLICT, detail=(
            f"environment {env_id} already ended ({row['state']}: {row['reason']})"))
    async with engine.begin() as conn:
        await add_to_outbox(conn, JobCommand(
            job_id=env_id, action=CommandAction.CANCEL, reason=RETURNED,
            requested_by=caller.user), "admission", event_id=f"returned-{env_id}")
    return _env_out(row)
