"""Interactive GPU environments: request, list, look at, return.

An environment IS a job, of kind ``Interactive``: one task with one replica, under the
same admission policy, queues and quotas as batch work. It is held until its user
returns it (a cancel with reason ``returned``) or until its ``timeLimit``, when the
agent stops it (reason ``time limit reached``). Once it runs, the agent's report gives
where to connect: the host and port it allocated (``KAIROS_PORT`` in the task's
environment) or, on Kubernetes, the Pod.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Header, HTTPException, Query, Response, status
from pydantic import ValidationError
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from services.admission import ratelimit, store
from services.admission.auth import Principal
from services.admission.deps import Caller, EngineDep, IntakeDep, SettingsDep
from services.admission.models.environments import (
    EnvironmentIn,
    EnvironmentList,
    EnvironmentOut,
    env_out,
)
from services.admission.models.jobs import row_spec
from services.admission.openapi_errors import validation_detail
from shared.events import RETURNED, CommandAction, JobCommand, JobState
from shared.outbox import add_to_outbox

router = APIRouter(tags=["environments"])


async def _visible(engine: AsyncEngine, env_id: str, caller: Principal) -> dict[str, Any]:
    row = await store.get_job(engine, env_id)
    if row is None or (not caller.admin and row["tenant"] != caller.tenant) or \
            row_spec(row).get("kind") != "Interactive":
        # the same answer for another tenant's environment, a batch job or nothing
        raise HTTPException(status.HTTP_404_NOT_FOUND, detail=f"no environment {env_id}")
    return row


@router.post("/v1/environments", status_code=201, response_model=EnvironmentOut)
async def request_environment(
    body: EnvironmentIn, response: Response, caller: Caller, engine: EngineDep,
    settings: SettingsDep, intake: IntakeDep,
    idempotency_key: Annotated[str | None, Header(max_length=200)] = None,
) -> EnvironmentOut:
    """Request an interactive GPU environment: queued like any job of the caller's
    tenant; ``GET /v1/environments/{id}`` gives its connection once it runs."""
    await ratelimit.check_submit(engine, settings, caller.tenant)
    try:
        spec = body.to_spec()
    except ValidationError as exc:
        raise HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT,
                            detail=validation_detail(exc)) from exc
    row, created = await intake.accept(caller, spec, idempotency_key)
    if not created:
        response.status_code = status.HTTP_200_OK
    response.headers["Location"] = f"/v1/environments/{row['id']}"
    return env_out(row)


@router.get("/v1/environments", response_model=EnvironmentList)
async def list_environments(
    caller: Caller, engine: EngineDep,
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
    async with engine.connect() as conn:
        rows = [dict(r) for r in (await conn.execute(text(
            f"SELECT * FROM jobs WHERE {' AND '.join(clauses)}"
            " ORDER BY submitted_at, id LIMIT :limit OFFSET :offset"), params)).mappings()]
    more = len(rows) > limit
    return EnvironmentList(items=[env_out(r) for r in rows[:limit]], limit=limit,
                           offset=offset, next_offset=offset + limit if more else None)


@router.get("/v1/environments/{env_id}", response_model=EnvironmentOut)
async def get_environment(env_id: str, caller: Caller, engine: EngineDep) -> EnvironmentOut:
    """State, and where to connect while it runs."""
    return env_out(await _visible(engine, env_id, caller))


@router.delete("/v1/environments/{env_id}", status_code=202, response_model=EnvironmentOut)
async def return_environment(env_id: str, caller: Caller, engine: EngineDep) -> EnvironmentOut:
    """Return the environment: its session is stopped and its GPUs freed; it ends
    ``cancelled`` with reason ``returned``."""
    row = await _visible(engine, env_id, caller)
    if JobState(row["state"]).terminal:
        raise HTTPException(status.HTTP_409_CONFLICT, detail=(
            f"environment {env_id} already ended ({row['state']}: {row['reason']})"))
    async with engine.begin() as conn:
        await add_to_outbox(conn, JobCommand(
            job_id=env_id, action=CommandAction.CANCEL, reason=RETURNED,
            requested_by=caller.user), "admission", event_id=f"returned-{env_id}")
    return env_out(row)
