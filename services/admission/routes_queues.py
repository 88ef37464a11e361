"""Queues in the gateway: list and get (usage against quota, pending and running counts,
borrowed capacity), and the admin's create / update / close / drain / open.

Queueing owns the queues. An admin change is checked here against the read model (clear
404 / 409 / 422 at once), sent to queueing as a ``queue.command`` through the outbox,
and answered when queueing has applied it (its ``queue.changed`` reached the read
model), or 202 if that takes longer than ``queue_apply_timeout_s``. A user token sees its
tenant's queues and the shared ones; another tenant's queue is 404, like no queue.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from datetime import datetime
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, HTTPException, Request, Response, status
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from sqlalchemy.ext.asyncio import AsyncEngine

from services.admission import queues_view
from services.admission.auth import Principal, authenticate, require_admin
from services.admission.ratelimit import REFUSED
from shared.events import QueueAction, QueueCommand
from shared.jobspec import JobSpec
from shared.outbox import add_to_outbox
from shared.queuespec import (
    DEFAULT_QUEUE,
    NAME_PATTERN,
    TENANT_PATTERN,
    Amount,
    QueueSpec,
    QueueState,
    tree_errors,
    validation_errors,
)
from shared.quota_tree import BIG, RESOURCE_KEYS, UNITS, QueueTree, fmt, spec_demand

Caller = Annotated[Principal, Depends(authenticate)]
Admin = Annotated[Principal, Depends(require_admin)]
APPLY_TIMEOUT_S = 10.0
PAST = {QueueAction.CLOSE: "closed", QueueAction.DRAIN: "drained", QueueAction.OPEN: "opened"}
router = APIRouter(tags=["queues"])


class Usage(BaseModel):
    gpus: float = 0.0
    cpu_milli: float = 0.0
    memory_mib: float = 0.0


class QueueOut(BaseModel):
    name: str
    kind: Literal["queue", "cohort"]
    parent: str | None
    tenant: str = Field(description="empty = shared by every tenant")
    state: QueueState
    strategy: str
    weight: float
    guaranteed: Amount | None
    borrowing_limit: Amount | None
    lending_limit: Amount | None
    description: str = ""
    used: Usage = Field(description="what its admitted jobs (and its children's) reserve")
    borrowed: Usage = Field(description="used above guaranteed, from its cohort")
    pending: int = Field(0, description="jobs waiting in it")
    admitted: int = Field(0, description="admitted jobs not running yet")
    running: int = 0
    version: int
    updated_at: datetime


class QueueIn(BaseModel):
    """A new queue (the fields of a queues file entry)."""

    model_config = ConfigDict(extra="forbid")
    name: str = Field(pattern=NAME_PATTERN, max_length=63)
    kind: Literal["queue", "cohort"] = "queue"
    parent: str | None = None
    tenant: str = Field("", pattern=TENANT_PATTERN, max_length=63)
    guaranteed: Amount | None = None
    borrowing_limit: Amount | None = None
    lending_limit: Amount | None = None
    weight: float = Field(1.0, gt=0)
    state: QueueState = QueueState.OPEN
    strategy: Literal["best_effort", "strict"] = "best_effort"
    description: str = Field("", max_length=500)


class QueuePatch(BaseModel):
    """The fields to change; the others stay. ``null`` clears a limit."""

    model_config = ConfigDict(extra="forbid")
    parent: str | None = None
    tenant: str | None = Field(None, pattern=TENANT_PATTERN, max_length=63)
    guaranteed: Amount | None = None
    borrowing_limit: Amount | None = None
    lending_limit: Amount | None = None
    weight: float | None = Field(None, gt=0)
    strategy: Literal["best_effort", "strict"] | None = None
    description: str | None = Field(None, max_length=500)


class QueueAccepted(BaseModel):
    request_id: str
    detail: str


def _engine(request: Request) -> AsyncEngine:
    engine: AsyncEngine = request.app.state.engine
    return engine


def _out(row: dict[str, Any]) -> QueueOut:
    s = row["settings"] if isinstance(row["settings"], dict) else json.loads(row["settings"])
    st = row["status"] if isinstance(row["status"], dict) else json.loads(row["status"] or "{}")

    def usage(d: dict[str, Any] | None) -> Usage:
        return Usage(**{k: v for k, v in (d or {}).items() if v is not None})

    return QueueOut(
        name=row["name"], kind=s.get("kind", "queue"), parent=s.get("parent"),
        tenant=row["tenant"], state=QueueState(row["state"]),
        strategy=s.get("strategy", "best_effort"), weight=s.get("weight", 1.0),
        guaranteed=s.get("guaranteed"), borrowing_limit=s.get("borrowing_limit"),
        lending_limit=s.get("lending_limit"), description=s.get("description", ""),
        used=usage(st.get("used")), borrowed=usage(st.get("borrowed")),
        pending=st.get("pending", 0), admitted=st.get("admitted", 0),
        running=st.get("running", 0), version=row["version"], updated_at=row["updated_at"])


def _visible(row: dict[str, Any] | None, caller: Principal) -> bool:
    return row is not None and (caller.admin or row["tenant"] in ("", caller.tenant))


async def _visible_queue(engine: AsyncEngine, name: str, caller: Principal) -> dict[str, Any]:
    row = await queues_view.get_queue(engine, name)
    if row is None or not _visible(row, caller):
        raise HTTPException(status.HTTP_404_NOT_FOUND, detail=f"no queue {name}")
    return row


def _specs(rows: list[dict[str, Any]]) -> dict[str, QueueSpec]:
    out = {}
    for r in rows:
        s = r["settings"] if isinstance(r["settings"], dict) else json.loads(r["settings"])
        s = {k: v for k, v in s.items() if k in QueueSpec.model_fields}
        out[r["name"]] = QueueSpec.model_validate(s)
    return out


def _unprocessable(errors: list[tuple[str, str]]) -> HTTPException:
    return HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT, detail=[
        {"field": f, "message": m, "type": "value_error"} for f, m in errors])


async def _check_tree(engine: AsyncEngine, spec: QueueSpec) -> None:
    specs = _specs(await queues_view.list_queues(engine, None))
    specs[spec.name] = spec
    errors = [(p.split(".", 1)[1] if "." in p else p, m)
              for p, m in tree_errors(specs, {}) if p.split(".")[0] == spec.name]
    if errors:
        raise _unprocessable(errors)


async def _send(engine: AsyncEngine, response: Response, name: str, action: QueueAction,
                settings: dict[str, Any], caller: Principal) -> QueueOut | QueueAccepted:
    """Ask queueing, then wait (bounded) for its answer to reach the read model."""
    request_id = uuid.uuid4().hex
    async with engine.begin() as conn:
        await add_to_outbox(conn, QueueCommand(request_id=request_id, queue=name, action=action,
                                               settings=settings, requested_by=caller.user),
                            "admission", event_id=f"queue-cmd-{request_id}")
    deadline = time.monotonic() + APPLY_TIMEOUT_S
    while time.monotonic() < deadline:
        outcome = await queues_view.request_outcome(engine, request_id)
        if outcome is not None:
            if outcome["outcome"] == "rejected":
                err = json.loads(outcome["error"])
                raise HTTPException(int(err.get("status", 409)), detail=err["error"])
            row = await queues_view.get_queue(engine, name)
            if row is not None:
                return _out(row)
        await asyncio.sleep(0.05)
    response.status_code = status.HTTP_202_ACCEPTED
    return QueueAccepted(request_id=request_id, detail=(
        f"sent to queueing, not applied yet: GET /v1/queues/{name} shows when it is"))


@router.get("/v1/queues", response_model=list[QueueOut])
async def list_queues(request: Request, caller: Caller) -> list[QueueOut]:
    """Queues with their quota, usage, borrowed capacity and job counts: every queue for
    an admin; the token's tenant's and the shared ones otherwise."""
    rows = await queues_view.list_queues(_engine(request), None if caller.admin else caller.tenant)
    return [_out(r) for r in rows]


@router.get("/v1/queues/{name}", response_model=QueueOut)
async def get_queue(name: str, request: Request, caller: Caller) -> QueueOut:
    return _out(await _visible_queue(_engine(request), name, caller))


@router.post("/v1/queues", status_code=201, response_model=QueueOut | QueueAccepted,
             responses={202: {"model": QueueAccepted}, 409: {"description": "it exists"}})
async def create_queue(body: QueueIn, request: Request, response: Response,
                       caller: Admin) -> QueueOut | QueueAccepted:
    """Create a queue or cohort (admin)."""
    engine = _engine(request)
    if await queues_view.get_queue(engine, body.name) is not None:
        raise HTTPException(status.HTTP_409_CONFLICT, detail=f"queue {body.name} already exists")
    try:
        spec = QueueSpec.model_validate(body.model_dump(exclude_none=True))
    except ValidationError as exc:
        raise _unprocessable(validation_errors(exc)) from exc
    await _check_tree(engine, spec)
    return await _send(engine, response, body.name, QueueAction.CREATE, spec.public(), caller)


@router.patch("/v1/queues/{name}", response_model=QueueOut | QueueAccepted,
              responses={202: {"model": QueueAccepted}})
async def update_queue(name: str, body: QueuePatch, request: Request, response: Response,
                       caller: Admin) -> QueueOut | QueueAccepted:
    """Change some of a queue's fields (admin): quota, limits, weight, parent."""
    engine = _engine(request)
    row = await _visible_queue(engine, name, caller)
    changes = body.model_dump(exclude_unset=True, mode="json")
    if not changes:
        raise _unprocessable([("(body)", "name at least one field to change")])
    current = _specs([row])[name].public()
    merged = {k: v for k, v in {**current, **changes}.items() if v is not None}
    try:
        spec = QueueSpec.model_validate(merged)
    except ValidationError as exc:
        raise _unprocessable(validation_errors(exc)) from exc
    await _check_tree(engine, spec)
    return await _send(engine, response, name, QueueAction.UPDATE, changes, caller)


async def _set_state(request: Request, response: Response, name: str, action: QueueAction,
                     caller: Principal) -> QueueOut | QueueAccepted:
    engine = _engine(request)
    row = await _visible_queue(engine, name, caller)
    kind = _specs([row])[name].kind
    if kind == "cohort":
        raise HTTPException(status.HTTP_409_CONFLICT, detail=(
            f"{name} is a cohort: it holds no jobs, so it cannot be {PAST[action]}"))
    target = {QueueAction.CLOSE: "closed", QueueAction.DRAIN: "draining",
              QueueAction.OPEN: "open"}[action]
    if row["state"] == target:
        raise HTTPException(status.HTTP_409_CONFLICT, detail=f"queue {name} is already {target}")
    return await _send(engine, response, name, action, {}, caller)


@router.post("/v1/queues/{name}/close", response_model=QueueOut | QueueAccepted,
             responses={202: {"model": QueueAccepted}})
async def close_queue(name: str, request: Request, response: Response,
                      caller: Admin) -> QueueOut | QueueAccepted:
    """Close a queue (admin): it refuses new jobs and admits none of those it holds;
    running jobs go on."""
    return await _set_state(request, response, name, QueueAction.CLOSE, caller)


@router.post("/v1/queues/{name}/drain", response_model=QueueOut | QueueAccepted,
             responses={202: {"model": QueueAccepted}})
async def drain_queue(name: str, request: Request, response: Response,
                      caller: Admin) -> QueueOut | QueueAccepted:
    """Drain a queue (admin): it refuses new jobs but admits and runs those it holds."""
    return await _set_state(request, response, name, QueueAction.DRAIN, caller)


@router.post("/v1/queues/{name}/open", response_model=QueueOut | QueueAccepted,
             responses={202: {"model": QueueAccepted}})
async def open_queue(name: str, request: Request, response: Response,
                     caller: Admin) -> QueueOut | QueueAccepted:
    """Open a closed or draining queue again (admin)."""
    return await _set_state(request, response, name, QueueAction.OPEN, caller)


async def check_submit(engine: AsyncEngine, queue: str, caller: Principal,
                       spec: JobSpec | None = None,
                       cache: queues_view.QueueCache | None = None) -> None:
    """A job may go to an open queue of the caller's tenant or a shared one, and ask no
    more than that queue's quota could ever admit. The default queue is open before
    queueing has announced any queue (a fresh stack). ``cache``: the gateway's copy of
    the queues (one read a second rather than two a submit)."""
    rows = await (cache or queues_view.QueueCache(0)).rows(engine)
    row = rows.get(queue)
    if row is None and queue == DEFAULT_QUEUE:
        return
    if not _visible(row, caller):
        names = [r["name"] for r in rows.values() if _visible(r, caller)
                 and _specs([r])[r["name"]].kind == "queue" and r["state"] == "open"]
        raise _unprocessable([("queue", f"no queue {queue!r}" + (
            f"; open queues: {', '.join(names)}" if names else ""))])
    assert row is not None
    if _specs([row])[queue].kind == "cohort":
        raise _unprocessable([("queue", f"{queue!r} is a cohort: submit to one of its queues")])
    if row["state"] != "open":
        raise HTTPException(status.HTTP_409_CONFLICT, detail=(
            f"queue {queue} is {row['state']}: it accepts no new jobs"))
    if spec is not None:
        tree = (cache.derived.get("tree") if cache is not None else None) \
            or QueueTree(_specs(list(rows.values())).values())
        if cache is not None:
            cache.derived["tree"] = tree
        check_ceiling(tree, queue, spec)


def _amounts(v: tuple[float, float, float]) -> dict[str, float | None]:
    return {k: (x if x < BIG / 2 else None) for k, x in zip(RESOURCE_KEYS, v, strict=True)}


def check_ceiling(tree: QueueTree, queue: str, spec: JobSpec) -> None:
    """422 for a job larger than its queue's quota ceiling (guarantee plus all it may
    borrow, up the tree: ``QueueTree.ceiling``): queueing would hold it forever with
    reason ``quota``. A tree without limits has no ceiling."""
    if queue not in tree.specs:
        return
    ceiling, ask = tree.ceiling(queue), spec_demand(spec)
    over = ceiling.exceeded(ask)
    if not over:
        return
    REFUSED.labels("over_quota").inc()
    r = over[0]
    at = ceiling.at[r]
    where = "its guarantee with all it may borrow" + (
        f", bounded by {at} above it" if at != queue else "")
    raise HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT, detail=[{
        "field": "tasks", "type": "over_quota", "message": (
            f"the job asks for {fmt(ask[r])} {UNITS[r]} at once; queue {queue} can never "
            f"hold more than {fmt(ceiling.amount[r])} ({where}): it would wait forever"),
        "queue": queue, "limited_at": at, "ceiling": _amounts(ceiling.amount),
        "ask": _amounts(ask)}])


class WaitingOut(BaseModel):
    """Why a job still waits in its queue."""

    queue: str
    position: int = Field(description="1 = next in its queue's order")
    reason: str = Field(description="quota | reclaim | queue_closed | priority | array_limit")
    detail: str
    estimated_start: datetime | None
    updated_at: datetime


async def waiting_of(engine: AsyncEngine, job_id: str, state: str) -> WaitingOut | None:
    if state not in ("pending", "preempted"):
        return None
    row = await queues_view.waiting(engine, job_id)
    return WaitingOut(**row) if row else None


class PlacementWaitOut(BaseModel):
    """Why the scheduler has not placed an admitted job yet."""

    reason: str = Field(description="no_fit | gang_incomplete | never_fits | preempting | "
                        "priority | backfill_blocked | gpu_model | affinity | "
                        "no_matching_node | cordoned | quota")
    detail: str
    estimated_start: datetime | None = Field(
        description="when backfill expects it to start; empty = no estimate")
    updated_at: datetime = Field(description="when the scheduler last said so")


async def placement_wait_of(engine: AsyncEngine, job_id: str,
                            state: str) -> PlacementWaitOut | None:
    if state != "admitted":
        return None
    row = await queues_view.job_waiting(engine, job_id)
    return PlacementWaitOut(**row) if row else None
