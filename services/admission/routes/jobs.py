"""Jobs: submit (a job or a job array), list, get, cancel and resize.

Tenants: a job's tenant is its submitter's token's tenant (a spec cannot name one). A
`user` token sees, cancels and resizes only its tenant's jobs; another tenant's job is
answered 404 exactly like a job that does not exist.
"""

from typing import Annotated, Any

from fastapi import APIRouter, Header, HTTPException, Query, Request, Response, status
from fastapi.responses import JSONResponse
from sqlalchemy.ext.asyncio import AsyncEngine

from services.admission import cursor as page_cursor
from services.admission import dry_run as dry_runs
from services.admission import forecasts_view, queues_view, ratelimit, spec_body, store
from services.admission.auth import Principal
from services.admission.deps import Caller, EngineDep, IntakeDep, SettingsDep
from services.admission.models.dry_run import DryRunOut
from services.admission.models.forecasts import forecast_out
from services.admission.models.jobs import (
    ArrayOut,
    JobList,
    JobOut,
    PlacementWaitOut,
    ResizeIn,
    WaitingOut,
    array_out,
    job_out,
    row_spec,
)
from shared.elastic_resize import ResizeRefused, elastic_task
from shared.events import CommandAction, JobCommand, JobState
from shared.jobspec import JobSpec
from shared.outbox import add_to_outbox

router = APIRouter()
DRY_RUN_ALL = "All"  # the only dryRun value (Kubernetes: "All" is the only one too)


@router.post("/v1/jobs", status_code=201, response_model=JobOut | ArrayOut,
             responses={200: {"model": JobOut | ArrayOut | DryRunOut, "description": (
                 "a retry with the same Idempotency-Key: what the first request created; "
                 "or, with `?dryRun=All`, what a submit would do (nothing is stored)")}},
             openapi_extra={"requestBody": {"required": True, "content": {
                 "application/json": {"schema": JobSpec.model_json_schema(by_alias=True)},
                 "application/yaml": {"schema": {"type": "string"}}}},
                 # declared by hand (read from the query below) as a plain enum: FastAPI's
                 # optional-string schema is an anyOf whose negative cases crash the
                 # OpenAPI fuzzer on CPython 3.11.7 (an ast recursion-depth bug)
                 "parameters": [{"name": "dryRun", "in": "query", "required": False,
                                 "schema": {"type": "string", "enum": [DRY_RUN_ALL]},
                                 "description": (
                                     "`All`: check the spec, its queue and quota as a submit "
                                     "would, and answer when it would start, storing and "
                                     "publishing nothing (the Kubernetes API's convention); "
                                     "any other value is refused with 400")}]})
async def submit_job(
    request: Request, response: Response, caller: Caller, engine: EngineDep,
    settings: SettingsDep, intake: IntakeDep,
    idempotency_key: Annotated[str | None, Header(max_length=200)] = None,
) -> JobOut | ArrayOut | Response:
    """Submit a job; with ``array`` in its spec, a job array: one element per index
    (``<array id>-<index>``), all stored at once, answered with the array. With
    ``?dryRun=All``: the same checks and refusals, then the quota's verdict and the
    forecast start, and nothing stored (200, not rate limited as a submit)."""
    dry_run = request.query_params.get("dryRun")
    if dry_run is not None:
        if dry_run != DRY_RUN_ALL:
            raise HTTPException(status.HTTP_400_BAD_REQUEST, detail=(
                f"dryRun must be {DRY_RUN_ALL} (or absent), as in the Kubernetes API; "
                f"got {dry_run[:40]!r}"))
        spec = await spec_body.read_spec(request, settings.max_request_bytes)
        out = await dry_runs.dry_run(intake, caller, spec)
        return JSONResponse(out.model_dump(mode="json", by_alias=True))
    await ratelimit.check_submit(engine, settings, caller.tenant)
    spec = await spec_body.read_spec(request, settings.max_request_bytes)
    if spec.array is not None:
        arr, created = await intake.accept_array(caller, spec, idempotency_key)
        if not created:
            response.status_code = status.HTTP_200_OK
        response.headers["Location"] = f"/v1/arrays/{arr['id']}"
        return array_out(arr)
    row, created = await intake.accept(caller, spec, idempotency_key)
    if not created:
        response.status_code = status.HTTP_200_OK
    response.headers["Location"] = f"/v1/jobs/{row['id']}"
    return job_out(row)


def listing_router(max_page_size: int) -> APIRouter:
    """``GET /v1/jobs``, made per app: its largest page is a setting, and the OpenAPI
    document states it (the ``limit`` parameter's maximum). No ``from __future__ import
    annotations`` in this module: FastAPI must see ``max_page_size`` in the signature."""
    listing = APIRouter()

    @listing.get("/v1/jobs", response_model=JobList)
    async def list_jobs(
        caller: Caller, engine: EngineDep,
        state: Annotated[JobState | None, Query(description="only jobs in this state")] = None,
        queue: Annotated[str | None, Query(max_length=63,
                                           description="only this queue's jobs")] = None,
        tenant: Annotated[str | None, Query(
            max_length=63, description="admins: only this tenant's jobs")] = None,
        user: Annotated[str | None, Query(max_length=63,
                                          description="only jobs this user submitted")] = None,
        array: Annotated[str | None, Query(max_length=63,
                                           description="only this job array's elements")] = None,
        limit: Annotated[int, Query(ge=1, le=max_page_size)] = 100,
        offset: Annotated[int, Query(ge=0, le=2**31 - 1)] = 0,
        cursor: Annotated[str | None, Query(
            max_length=512, description="next_cursor of the previous page")] = None,
    ) -> JobList:
        """Jobs, oldest first: every tenant's for an admin, the token's tenant's otherwise.
        Page with ?cursor=<next_cursor> (stable) or ?offset=<next_offset>."""
        if not caller.admin:
            if tenant is not None and tenant != caller.tenant:
                raise HTTPException(status.HTTP_403_FORBIDDEN, detail=(
                    f"this token lists only tenant {caller.tenant}'s jobs"))
            tenant = caller.tenant
        try:
            after = page_cursor.decode(cursor) if cursor else None
        except page_cursor.BadCursor as exc:
            raise HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT, detail=[{
                "field": "query.cursor", "message": str(exc), "type": "value_error"}]) from exc
        rows = await store.list_jobs(engine, tenant, state.value if state else None, queue,
                                     limit + 1, offset, user=user, after=after, array=array)
        more = len(rows) > limit
        last = rows[limit - 1] if more else None
        return JobList(items=[job_out(r) for r in rows[:limit]], limit=limit, offset=offset,
                       next_offset=offset + limit if more else None,
                       next_cursor=page_cursor.encode(last["submitted_at"], last["id"])
                       if last else None)

    return listing


async def _visible_job(engine: AsyncEngine, job_id: str, caller: Principal) -> dict[str, Any]:
    row = await store.get_job(engine, job_id)
    if row is None or (not caller.admin and row["tenant"] != caller.tenant):
        # the same answer as for a job that does not exist: no existence leaks
        raise HTTPException(status.HTTP_404_NOT_FOUND, detail=f"no job {job_id}")
    return row


async def _waiting(engine: AsyncEngine, job_id: str, state: str) -> WaitingOut | None:
    if state not in ("pending", "preempted"):
        return None
    row = await queues_view.waiting(engine, job_id)
    return WaitingOut(**row) if row else None


async def _placement_wait(engine: AsyncEngine, job_id: str,
                          state: str) -> PlacementWaitOut | None:
    if state != "admitted":
        return None
    row = await queues_view.job_waiting(engine, job_id)
    return PlacementWaitOut(**row) if row else None


@router.get("/v1/jobs/{job_id}", response_model=JobOut)
async def get_job(job_id: str, caller: Caller, engine: EngineDep) -> JobOut:
    row = await _visible_job(engine, job_id, caller)
    out = job_out(row, detail=True)
    out.waiting = await _waiting(engine, job_id, row["state"])  # why it still waits
    out.placement_wait = await _placement_wait(engine, job_id, row["state"])
    if row["state"] in forecasts_view.WAITING_STATES:
        out.forecast = forecast_out(await forecasts_view.forecast(engine, job_id))
    return out


@router.delete("/v1/jobs/{job_id}", status_code=202, response_model=JobOut)
async def cancel_job(job_id: str, caller: Caller, engine: EngineDep) -> JobOut:
    row = await _visible_job(engine, job_id, caller)
    if JobState(row["state"]).terminal:
        raise HTTPException(status.HTTP_409_CONFLICT,
                            detail=f"job {job_id} already ended ({row['state']})")
    await store.request_cancel(engine, job_id, caller.user)
    return job_out(row, detail=True)


@router.post("/v1/jobs/{job_id}/resize", status_code=202, response_model=JobOut)
async def resize_job(job_id: str, body: ResizeIn, caller: Caller, engine: EngineDep) -> JobOut:
    """Ask for another replica count of an elastic task (between its minReplicas and
    maxReplicas): fewer stop at once, more start when GPUs are free."""
    row = await _visible_job(engine, job_id, caller)
    if JobState(row["state"]).terminal:
        raise HTTPException(status.HTTP_409_CONFLICT,
                            detail=f"job {job_id} already ended ({row['state']})")
    spec = JobSpec.model_validate(row_spec(row))
    try:
        task = elastic_task(spec, body.task, body.replicas)
    except ResizeRefused as e:
        if e.field is None:
            raise HTTPException(status.HTTP_409_CONFLICT,
                                detail=f"job {job_id} is not elastic: {e.message}") from e
        raise HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT, detail=[{
            "field": e.field, "type": "value_error", "message": e.message}]) from e
    async with engine.begin() as conn:
        await add_to_outbox(conn, JobCommand(
            job_id=job_id, action=CommandAction.RESIZE, replicas=body.replicas,
            task=task.name, reason=f"resize to {body.replicas} requested",
            requested_by=caller.user), "admission")
    return job_out(row, detail=True)
