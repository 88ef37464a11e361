"""The HTTP gateway: submit, get, list, cancel and resize jobs; list nodes; manage API
tokens (admin). All under /v1.

Tenants: a job's tenant is its submitter's token's tenant (a spec cannot name one). A
`user` token sees, cancels and resizes only its tenant's jobs; another tenant's job is
answered 404 exactly like a job that does not exist. An `admin` token sees every tenant
and alone manages tokens.
"""


import json
from datetime import datetime, timedelta
from typing import Annotated, Any, Literal

from fastapi import Depends, FastAPI, Header, HTTPException, Query, Request, Response, status
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import HTMLResponse, JSONResponse
from fastapi.staticfiles import StaticFiles
from pydantic import BaseModel, Field, ValidationError
from sqlalchemy.ext.asyncio import AsyncEngine
from swagger_ui_bundle import swagger_ui_path

from services.admission import cursor as page_cursor
from services.admission import (
    openapi_errors,
    queues_view,
    ratelimit,
    spec_body,
    store,
    tokens,
)
from services.admission.accept import accept, accept_array
from services.admission.auth import Principal, authenticate, require_admin
from services.admission.db_errors import DatabaseErrors
from services.admission.limits import BodyLimit
from services.admission.node_health import GpuHealthOut
from services.admission.overload import OverloadGuard, SubmitGate
from services.admission.request_metrics import RequestMetrics
from services.admission.routes_arrays import ArrayOut, array_out
from services.admission.routes_arrays import router as arrays_router
from services.admission.routes_environments import router as environments_router
from services.admission.routes_jobs_stream import router as jobs_stream_router
from services.admission.routes_logs import router as logs_router
from services.admission.routes_nodes_ops import router as nodes_ops_router
from services.admission.routes_queues import (
    PlacementWaitOut,
    WaitingOut,
    placement_wait_of,
    waiting_of,
)
from services.admission.routes_queues import router as queues_router
from services.admission.routes_usage import router as usage_router
from services.admission.settings import AdmissionSettings
from shared.elastic_resize import ResizeRefused, elastic_task
from shared.events import CommandAction, JobCommand, JobState
from shared.http import ReadyCheck, add_ops_routes
from shared.jobspec import JobSpec, parse_job_spec
from shared.outbox import add_to_outbox

Caller = Annotated[Principal, Depends(authenticate)]
Admin = Annotated[Principal, Depends(require_admin)]
DOCS_ASSETS = "/docs-assets"  # Swagger UI's files, from the swagger-ui-bundle-v2 package


class HistoryEntry(BaseModel):
    state: str
    reason: str
    attempt: int
    exit_code: int | None = None
    task: str | None = None
    node_id: str | None = None
    message: str | None = None
    occurred_at: datetime


class PlacementEntry(BaseModel):
    task_id: str
    node_id: str
    attempt: int
    gpus: list[dict[str, Any]]
    cpu_milli: int
    memory_mib: int


class JobOut(BaseModel):
    id: str
    name: str
    queue: str
    tenant: str
    user: str
    state: str
    reason: str
    attempt: int
    exit_code: int | None = None
    submitted_at: datetime
    updated_at: datetime
    spec: dict[str, Any]
    array_id: str | None = Field(default=None, description="an array's element: its array")
    array_index: int | None = Field(default=None, description="an array's element: its index")
    history: list[HistoryEntry] | None = None
    placement: list[PlacementEntry] | None = None
    replicas: dict[str, int] | None = Field(
        default=None, description="replicas placed now, per task (elastic jobs resize)")
    waiting: WaitingOut | None = Field(
        default=None, description="while it waits in its queue: position, reason, estimate")
    placement_wait: PlacementWaitOut | None = Field(
        default=None, description="admitted, while it waits for GPUs: the scheduler's "
        "reason and, when backfill has one, an estimated start")


class ResizeIn(BaseModel):
    replicas: int = Field(ge=1, le=1024, description="replicas wanted")
    task: str | None = Field(default=None, description="the elastic task; empty = the only one")


class JobList(BaseModel):
    items: list[JobOut]
    limit: int
    offset: int
    next_offset: int | None = Field(description="offset of the next page; empty = last page")
    next_cursor: str | None = Field(
        default=None, description="pass as ?cursor= for the next page (stable while jobs "
        "come and go); empty = last page")


class NodeOut(BaseModel):
    node_id: str
    state: str
    inventory: dict[str, Any]
    last_heartbeat: datetime | None
    gpus_total: int
    gpus_allocated: int
    gpus_shared: int
    allocations: list[dict[str, Any]]
    scheduling: str = Field(default="schedulable", description="schedulable, cordoned, "
                            "draining or drained (POST /v1/nodes/{id}/cordon|drain|uncordon)")
    scheduling_reason: str = ""
    gpu_health: list[GpuHealthOut] = Field(
        default_factory=list, description="the GPUs the node's agent reports not healthy, "
        "with the telemetry that said so; empty when all are healthy")


class Me(BaseModel):
    tenant: str
    user: str
    role: str = Field(description="user or admin")
    token_id: str | None


class TokenIn(BaseModel):
    model_config = {"extra": "forbid"}
    tenant: str = Field(pattern=tokens.TENANT_RE.pattern, max_length=63,
                        description="the tenant whose jobs the token submits and sees")
    role: Literal["user", "admin"] = "user"
    name: str | None = Field(default=None, pattern=tokens.NAME_RE.pattern, max_length=63,
                             description="who or what uses it (jobs' user); default the tenant")
    expires_in_s: int | None = Field(default=None, ge=1, le=10 * 366 * 86400,
                                     description="seconds until it expires; empty = never")


class TokenOut(BaseModel):
    id: str
    tenant: str
    name: str
    role: Literal["user", "admin"]
    state: Literal["active", "expired", "revoked"]
    created_at: datetime
    created_by: str | None
    expires_at: datetime | None
    revoked_at: datetime | None
    last_used_at: datetime | None


class TokenCreated(TokenOut):
    token: str = Field(description="the secret: shown this once, stored only as a hash")


def _token_out(row: dict[str, Any]) -> TokenOut:
    return TokenOut(**{k: v for k, v in row.items() if k in TokenOut.model_fields},
                    state=tokens.token_state(row))


def _validation_detail(exc: ValidationError) -> list[dict[str, Any]]:
    return openapi_errors.field_errors(
        exc.errors(include_url=False, include_context=False, include_input=False))


def _job_out(row: dict[str, Any], detail: bool = False) -> JobOut:
    spec = row["spec"] if isinstance(row["spec"], dict) else json.loads(row["spec"])
    out = JobOut(**{k: row[k] for k in JobOut.model_fields if k in row and k not in (
        "spec", "history", "placement")}, spec=spec)
    if detail:
        out.history = [HistoryEntry(**h) for h in row.get("history", [])]
        out.placement = [PlacementEntry(**p) for p in row.get("placement", [])]
        if out.placement:  # task ids are <task>-<replica>[.<incarnation>]
            names = [p.task_id.split(".")[0].rsplit("-", 1)[0] for p in out.placement]
            out.replicas = {n: names.count(n) for n in dict.fromkeys(names)}
    return out


async def _read_spec(request: Request) -> JobSpec:
    raw = await request.body()  # the body limit (limits.BodyLimit) holds it to its size
    ctype = request.headers.get("content-type", "application/json").split(";")[0].strip()
    data = await spec_body.decode(raw, ctype, request.app.state.settings.max_request_bytes)
    if not isinstance(data, dict):
        raise HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT, detail=[
            {"field": "(body)", "message": "a job spec must be a mapping", "type": "dict_type"}])
    try:
        return parse_job_spec(data)
    except ValidationError as exc:
        raise HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT,
                            detail=_validation_detail(exc)) from exc


def create_app(settings: AdmissionSettings, engine: AsyncEngine, ready: ReadyCheck,
               guard: OverloadGuard | None = None) -> FastAPI:
    """``guard``: the overload bounds, kept current by the service's sampling loop (a
    guard nobody samples bounds only the submits in flight)."""
    app = FastAPI(
        title="Kairos gateway",
        version="1",
        description="Submit GPU training jobs, follow them, and see the cluster.",
        docs_url=None,  # served below from the packaged Swagger UI: /docs works offline
    )
    app.mount(DOCS_ASSETS, StaticFiles(directory=str(swagger_ui_path)), name="swagger-ui")

    @app.get("/docs", include_in_schema=False)
    async def _docs() -> HTMLResponse:
        return get_swagger_ui_html(
            openapi_url=app.openapi_url or "/openapi.json", title=f"{app.title} - Swagger UI",
            swagger_js_url=f"{DOCS_ASSETS}/swagger-ui-bundle.js",
            swagger_css_url=f"{DOCS_ASSETS}/swagger-ui.css",
            swagger_favicon_url=f"{DOCS_ASSETS}/favicon-32x32.png")

    app.state.settings = settings
    app.state.engine = engine
    app.state.overload = guard = guard or OverloadGuard.from_settings(settings)
    app.state.token_cache = tokens.TokenCache(settings.token_cache_s)
    app.state.queue_cache = queues_view.QueueCache(settings.queue_cache_s)
    add_ops_routes(app, ready)
    # each added middleware wraps those before it: RequestMetrics > SubmitGate > BodyLimit >
    # DatabaseErrors > the routes. So RequestMetrics counts every answer, 429, 413 and 503
    # included, an overloaded gateway refuses a submit before it reads anything, and an
    # oversized body is refused before anything reads the database.
    app.add_middleware(DatabaseErrors, retry_after_s=settings.db_retry_after_s)
    app.add_middleware(BodyLimit, max_bytes=settings.max_request_bytes)
    app.add_middleware(SubmitGate, guard=guard)
    app.add_middleware(RequestMetrics)

    @app.exception_handler(RequestValidationError)
    async def _bad_request(_: Request, exc: RequestValidationError) -> JSONResponse:
        return JSONResponse(status_code=422,
                            content={"detail": openapi_errors.field_errors(exc.errors())})

    @app.post("/v1/jobs", status_code=201, response_model=JobOut | ArrayOut,
              openapi_extra={"requestBody": {"required": True, "content": {
                  "application/json": {"schema": JobSpec.model_json_schema(by_alias=True)},
                  "application/yaml": {"schema": {"type": "string"}}}}})
    async def submit_job(
        request: Request, response: Response, caller: Caller,
        idempotency_key: Annotated[str | None, Header(max_length=200)] = None,
    ) -> JobOut | ArrayOut:
        """Submit a job; with ``array`` in its spec, a job array: one element per index
        (``<array id>-<index>``), all stored at once, answered with the array."""
        await ratelimit.check_submit(engine, settings, caller.tenant)
        spec = await _read_spec(request)
        if spec.array is not None:
            arr, created = await accept_array(request, caller, spec, idempotency_key)
            if not created:
                response.status_code = status.HTTP_200_OK
            response.headers["Location"] = f"/v1/arrays/{arr['id']}"
            return array_out(arr)
        row, created = await accept(request, caller, spec, idempotency_key)
        if not created:
            response.status_code = status.HTTP_200_OK
        response.headers["Location"] = f"/v1/jobs/{row['id']}"
        return _job_out(row)

    @app.get("/v1/jobs", response_model=JobList)
    async def list_jobs(
        caller: Caller,
        state: Annotated[JobState | None, Query(description="only jobs in this state")] = None,
        queue: Annotated[str | None, Query(max_length=63,
                                           description="only this queue's jobs")] = None,
        tenant: Annotated[str | None, Query(
            max_length=63, description="admins: only this tenant's jobs")] = None,
        user: Annotated[str | None, Query(max_length=63,
                                          description="only jobs this user submitted")] = None,
        array: Annotated[str | None, Query(max_length=63,
                                           description="only this job array's elements")] = None,
        limit: Annotated[int, Query(ge=1, le=settings.max_page_size)] = 100,
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
        return JobList(items=[_job_out(r) for r in rows[:limit]], limit=limit, offset=offset,
                       next_offset=offset + limit if more else None,
                       next_cursor=page_cursor.encode(last["submitted_at"], last["id"])
                       if last else None)

    async def _visible_job(job_id: str, caller: Principal) -> dict[str, Any]:
        row = await store.get_job(engine, job_id)
        if row is None or (not caller.admin and row["tenant"] != caller.tenant):
            # the same answer as for a job that does not exist: no existence leaks
            raise HTTPException(status.HTTP_404_NOT_FOUND, detail=f"no job {job_id}")
        return row

    @app.get("/v1/jobs/{job_id}", response_model=JobOut)
    async def get_job(job_id: str, caller: Caller) -> JobOut:
        row = await _visible_job(job_id, caller)
        out = _job_out(row, detail=True)
        out.waiting = await waiting_of(engine, job_id, row["state"])  # why it still waits
        out.placement_wait = await placement_wait_of(engine, job_id, row["state"])
        return out

    @app.delete("/v1/jobs/{job_id}", status_code=202, response_model=JobOut)
    async def cancel_job(job_id: str, caller: Caller) -> JobOut:
        row = await _visible_job(job_id, caller)
        if JobState(row["state"]).terminal:
            raise HTTPException(status.HTTP_409_CONFLICT,
                                detail=f"job {job_id} already ended ({row['state']})")
        await store.request_cancel(engine, job_id, caller.user)
        return _job_out(row, detail=True)

    @app.post("/v1/jobs/{job_id}/resize", status_code=202, response_model=JobOut)
    async def resize_job(job_id: str, body: ResizeIn, caller: Caller) -> JobOut:
        """Ask for another replica count of an elastic task (between its minReplicas and
        maxReplicas): fewer stop at once, more start when GPUs are free."""
        row = await _visible_job(job_id, caller)
        if JobState(row["state"]).terminal:
            raise HTTPException(status.HTTP_409_CONFLICT,
                                detail=f"job {job_id} already ended ({row['state']})")
        spec = JobSpec.model_validate(row["spec"] if isinstance(row["spec"], dict)
                                      else json.loads(row["spec"]))
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
        return _job_out(row, detail=True)

    @app.get("/v1/nodes", response_model=list[NodeOut])
    async def list_nodes(caller: Caller) -> list[NodeOut]:
        """Nodes and their allocations; a user token sees which GPUs are taken, but not
        the jobs of other tenants that hold them."""
        out = []
        for n in await store.list_nodes(engine):
            inv = n["inventory"]
            used: set[int] = set()
            shared: set[int] = set()
            for a in n["allocations"]:
                for g in a["gpus"]:
                    (shared if g.get("memory_mib") else used).add(g["index"])
            out.append(NodeOut(
                node_id=n["node_id"], state=n["state"], inventory=inv,
                last_heartbeat=n["last_heartbeat"], gpus_total=len(inv.get("gpus", [])),
                gpus_allocated=len(used | shared), gpus_shared=len(shared - used),
                allocations=[a if caller.admin or a["tenant"] == caller.tenant
                             else {"gpus": a["gpus"]} for a in n["allocations"]],
                scheduling=n.get("scheduling", "schedulable"),
                scheduling_reason=n.get("scheduling_reason", ""),
                gpu_health=n.get("gpu_health") or []))
        return out

    @app.get("/v1/me", response_model=Me)
    async def whoami(caller: Caller) -> Me:
        """The tenant, user and role of the calling token."""
        return Me(tenant=caller.tenant, user=caller.user, role=caller.role,
                  token_id=caller.token_id)

    @app.post("/v1/tokens", status_code=201, response_model=TokenCreated)
    async def create_token(body: TokenIn, caller: Admin) -> TokenCreated:
        """Create an API token (admin). The secret is in this answer only."""
        row, plaintext = await tokens.create_token(
            engine, body.tenant, body.role, body.name,
            timedelta(seconds=body.expires_in_s) if body.expires_in_s else None,
            created_by=caller.user)
        return TokenCreated(**_token_out(row).model_dump(), token=plaintext)

    @app.get("/v1/tokens", response_model=list[TokenOut])
    async def list_tokens(
        caller: Admin,
        tenant: Annotated[str | None, Query(max_length=63)] = None,
    ) -> list[TokenOut]:
        """Every token, without its secret (admin)."""
        return [_token_out(r) for r in await tokens.list_tokens(engine, tenant)]

    @app.delete("/v1/tokens/{token_id}", response_model=TokenOut)
    async def revoke_token(token_id: str, caller: Admin) -> TokenOut:
        """Revoke a token at once (admin); its next request gets 401 'token revoked'."""
        row = await tokens.revoke_token(engine, token_id)
        app.state.token_cache.clear()  # refused from now on, on this replica at once
        if row is None:
            raise HTTPException(status.HTTP_404_NOT_FOUND, detail=f"no token {token_id}")
        return _token_out(row)

    app.include_router(nodes_ops_router)
    app.include_router(environments_router)
    app.include_router(jobs_stream_router)
    app.include_router(usage_router)
    app.include_router(logs_router)
    app.include_router(queues_router)
    app.include_router(arrays_router)
    openapi_errors.install(app)  # after every route: documents each one's refusals
    return app
