"""Queues in the gateway: list and get (usage against quota, pending and running counts,
borrowed capacity), and the admin's create / update / close / drain / open.

Queueing owns the queues. An admin change is checked here against the read model (clear
404 / 409 / 422 at once), sent to queueing as a ``queue.command`` through the outbox,
and answered when queueing has applied it (its ``queue.changed`` reached the read
model), or 202 if that takes longer than ``APPLY_TIMEOUT_S``. A user token sees its
tenant's queues and the shared ones; another tenant's queue is 404, like no queue.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from typing import Any

from fastapi import APIRouter, HTTPException, Response, status
from pydantic import ValidationError
from sqlalchemy.ext.asyncio import AsyncEngine

from services.admission import queues_view
from services.admission.auth import Principal
from services.admission.deps import Admin, Caller, EngineDep
from services.admission.models.queues import (
    QueueAccepted,
    QueueIn,
    QueueOut,
    QueuePatch,
    queue_out,
)
from services.admission.queue_check import queue_specs, unprocessable, visible
from shared.events import QueueAction, QueueCommand
from shared.outbox import add_to_outbox
from shared.queuespec import QueueSpec, tree_errors, validation_errors

APPLY_TIMEOUT_S = 10.0
PAST = {QueueAction.CLOSE: "closed", QueueAction.DRAIN: "drained", QueueAction.OPEN: "opened"}
router = APIRouter(tags=["queues"])


async def _visible_queue(engine: AsyncEngine, name: str, caller: Principal) -> dict[str, Any]:
    row = await queues_view.get_queue(engine, name)
    if row is None or not visible(row, caller):
        raise HTTPException(status.HTTP_404_NOT_FOUND, detail=f"no queue {name}")
    return row


async def _check_tree(engine: AsyncEngine, spec: QueueSpec) -> None:
    specs = queue_specs(await queues_view.list_queues(engine, None))
    specs[spec.name] = spec
    errors = [(p.split(".", 1)[1] if "." in p else p, m)
              for p, m in tree_errors(specs, {}) if p.split(".")[0] == spec.name]
    if errors:
        raise unprocessable(errors)


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
                return queue_out(row)
        await asyncio.sleep(0.05)
    response.status_code = status.HTTP_202_ACCEPTED
    return QueueAccepted(request_id=request_id, detail=(
        f"sent to queueing, not applied yet: GET /v1/queues/{name} shows when it is"))


@router.get("/v1/queues", response_model=list[QueueOut])
async def list_queues(caller: Caller, engine: EngineDep) -> list[QueueOut]:
    """Queues with their quota, usage, borrowed capacity and job counts: every queue for
    an admin; the token's tenant's and the shared ones otherwise."""
    rows = await queues_view.list_queues(engine, None if caller.admin else caller.tenant)
    return [queue_out(r) for r in rows]


@router.get("/v1/queues/{name}", response_model=QueueOut)
async def get_queue(name: str, caller: Caller, engine: EngineDep) -> QueueOut:
    return queue_out(await _visible_queue(engine, name, caller))


@router.post("/v1/queues", status_code=201, response_model=QueueOut | QueueAccepted,
             responses={202: {"model": QueueAccepted}, 409: {"description": "it exists"}})
async def create_queue(body: QueueIn, response: Response, caller: Admin,
                       engine: EngineDep) -> QueueOut | QueueAccepted:
    """Create a queue or cohort (admin)."""
    if await queues_view.get_queue(engine, body.name) is not None:
        raise HTTPException(status.HTTP_409_CONFLICT, detail=f"queue {body.name} already exists")
    try:
        spec = QueueSpec.model_validate(body.model_dump(exclude_none=True))
    except ValidationError as exc:
        raise unprocessable(validation_errors(exc)) from exc
    await _check_tree(engine, spec)
    return await _send(engine, response, body.name, QueueAction.CREATE, spec.public(), caller)


@router.patch("/v1/queues/{name}", response_model=QueueOut | QueueAccepted,
              responses={202: {"model": QueueAccepted}})
async def update_queue(name: str, body: QueuePatch, response: Response, caller: Admin,
                       engine: EngineDep) -> QueueOut | QueueAccepted:
    """Change some of a queue's fields (admin): quota, limits, weight, parent."""
    row = await _visible_queue(engine, name, caller)
    changes = body.model_dump(exclude_unset=True, mode="json")
    if not changes:
        raise unprocessable([("(body)", "name at least one field to change")])
    current = queue_specs([row])[name].public()
    merged = {k: v for k, v in {**current, **changes}.items() if v is not None}
    try:
        spec = QueueSpec.model_validate(merged)
    except ValidationError as exc:
        raise unprocessable(validation_errors(exc)) from exc
    await _check_tree(engine, spec)
    return await _send(engine, response, name, QueueAction.UPDATE, changes, caller)


async def _set_state(engine: AsyncEngine, response: Response, name: str, action: QueueAction,
                     caller: Principal) -> QueueOut | QueueAccepted:
    row = await _visible_queue(engine, name, caller)
    kind = queue_specs([row])[name].kind
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
async def close_queue(name: str, response: Response, caller: Admin,
                      engine: EngineDep) -> QueueOut | QueueAccepted:
    """Close a queue (admin): it refuses new jobs and admits none of those it holds;
    running jobs go on."""
    return await _set_state(engine, response, name, QueueAction.CLOSE, caller)


@router.post("/v1/queues/{name}/drain", response_model=QueueOut | QueueAccepted,
             responses={202: {"model": QueueAccepted}})
async def drain_queue(name: str, response: Response, caller: Admin,
                      engine: EngineDep) -> QueueOut | QueueAccepted:
    """Drain a queue (admin): it refuses new jobs but admits and runs those it holds."""
    return await _set_state(engine, response, name, QueueAction.DRAIN, caller)


@router.post("/v1/queues/{name}/open", response_model=QueueOut | QueueAccepted,
             responses={202: {"model": QueueAccepted}})
async def open_queue(name: str, response: Response, caller: Admin,
                     engine: EngineDep) -> QueueOut | QueueAccepted:
    """Open a closed or draining queue again (admin)."""
    return await _set_state(engine, response, name, QueueAction.OPEN, caller)
