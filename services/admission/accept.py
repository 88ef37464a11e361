"""Accepting a submit: the checks every kind of work passes before it is stored, in one
place, so a batch job and an interactive environment are held to the same rules."""

from __future__ import annotations

from typing import Any

from fastapi import HTTPException, Request, status

from services.admission import arrays, policy, store
from services.admission.auth import Principal
from services.admission.routes_queues import check_submit as check_queue
from shared.jobspec import JobSpec


async def accept(request: Request, caller: Principal, spec: JobSpec,
                 idempotency_key: str | None) -> tuple[dict[str, Any], bool]:
    """Size and fit policy, then an open queue the caller may use with the job within
    its quota ceiling; then the row and its outbox event in one transaction. Returns the
    job row and whether it was created (False: the same Idempotency-Key came before)."""
    await policy.check_submit(request.app, spec)
    await check_queue(request.app.state.engine, spec.queue, caller, spec,
                      getattr(request.app.state, "queue_cache", None))
    return await store.insert_job(request.app.state.engine, spec, caller.tenant, caller.user,
                                  idempotency_key,
                                  max_event_bytes=request.app.state.settings.max_event_bytes)


async def accept_array(request: Request, caller: Principal, spec: JobSpec,
                       idempotency_key: str | None) -> tuple[dict[str, Any], bool]:
    """The same checks for each element (they share one shape), the array no larger than
    the gateway's ``max_array_size``; then every element in one transaction. Returns the
    array row and whether it was created."""
    settings = request.app.state.settings
    arr = spec.array_indices
    assert arr is not None
    if arr.size > settings.max_array_size:
        raise HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT, detail=[{
            "field": "array", "type": "value_error", "message": (
                f"{arr.size} elements; this gateway accepts arrays of at most "
                f"{settings.max_array_size}")}])
    await policy.check_submit(request.app, spec)
    await check_queue(request.app.state.engine, spec.queue, caller, spec,
                      getattr(request.app.state, "queue_cache", None))
    return await arrays.insert_array(request.app.state.engine, spec, caller.tenant,
                                     caller.user, idempotency_key,
                                     max_event_bytes=settings.max_event_bytes)
