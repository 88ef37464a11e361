"""Job arrays: look at one, cancel it whole. An array is submitted like any job (``POST
/v1/jobs`` with ``array`` in the spec); its elements are jobs (``GET /v1/jobs?array=ID``
lists them, ``DELETE /v1/jobs/{element}`` cancels one)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, HTTPException, status
from sqlalchemy.ext.asyncio import AsyncEngine

from services.admission import arrays
from services.admission.auth import Principal
from services.admission.deps import Caller, EngineDep
from services.admission.models.jobs import ArrayOut, array_out

router = APIRouter(tags=["arrays"])


async def _visible(engine: AsyncEngine, array_id: str, caller: Principal) -> dict[str, Any]:
    row = await arrays.get_array(engine, array_id)
    if row is None or (not caller.admin and row["tenant"] != caller.tenant):
        raise HTTPException(status.HTTP_404_NOT_FOUND, detail=f"no array {array_id}")
    return row


@router.get("/v1/arrays/{array_id}", response_model=ArrayOut)
async def get_array(array_id: str, caller: Caller, engine: EngineDep) -> ArrayOut:
    """The array as submitted, with its elements counted by state."""
    return array_out(await _visible(engine, array_id, caller))


@router.delete("/v1/arrays/{array_id}", status_code=202, response_model=ArrayOut)
async def cancel_array(array_id: str, caller: Caller, engine: EngineDep) -> ArrayOut:
    """Cancel every element that has not ended (as ``scancel`` of an array job)."""
    row = await _visible(engine, array_id, caller)
    n = await arrays.cancel_array(engine, array_id, caller.user)
    return array_out(row, cancelled=n)
