"""Job arrays: look at one, cancel it whole. An array is submitted like any job (``POST
/v1/jobs`` with ``array`` in the spec); its elements are jobs (``GET /v1/jobs?array=ID``
lists them, ``DELETE /v1/jobs/{element}`` cancels one)."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Annotated, Any

from fastapi import APIRouter, Depends, HTTPException, Request, status
from pydantic import BaseModel, Field

from services.admission import arrays
from services.admission.auth import Principal, authenticate

router = APIRouter(tags=["arrays"])
Caller = Annotated[Principal, Depends(authenticate)]


class ArrayOut(BaseModel):
    id: str = Field(description="the array; its elements are <id>-<index>")
    name: str
    queue: str
    tenant: str
    user: str
    indices: str = Field(description="as submitted: 0-999, 1,3,5-7, 0-15:4, with %N")
    size: int = Field(description="elements")
    max_running: int | None = Field(description="elements holding quota at once at most "
                                    "(%N); empty = as many as quota allows")
    submitted_at: datetime
    spec: dict[str, Any]
    states: dict[str, int] = Field(default_factory=dict,
                                   description="elements by state (empty in a submit's answer)")
    jobs: str = Field(description="where its elements are listed")
    cancelled: int | None = Field(default=None, description="a cancel: elements it stopped")


def array_out(row: dict[str, Any], cancelled: int | None = None) -> ArrayOut:
    spec = row["spec"] if isinstance(row["spec"], dict) else json.loads(row["spec"])
    return ArrayOut(**{k: row[k] for k in ("id", "name", "queue", "tenant", "user", "indices",
                                           "size", "submitted_at")},
                    max_running=row["max_running"], spec=spec, states=row.get("states", {}),
                    jobs=f"/v1/jobs?array={row['id']}", cancelled=cancelled)


async def _visible(request: Request, array_id: str, caller: Principal) -> dict[str, Any]:
    row = await arrays.get_array(request.app.state.engine, array_id)
    if row is None or (not caller.admin and row["tenant"] != caller.tenant):
        raise HTTPException(status.HTTP_404_NOT_FOUND, detail=f"no array {array_id}")
    return row


@router.get("/v1/arrays/{array_id}", response_model=ArrayOut)
async def get_array(array_id: str, request: Request, caller: Caller) -> ArrayOut:
    """The array as submitted, with its elements counted by state."""
    return array_out(await _visible(request, array_id, caller))


@router.delete("/v1/arrays/{array_id}", status_code=202, response_model=ArrayOut)
async def cancel_array(array_id: str, request: Request, caller: Caller) -> ArrayOut:
    """Cancel every element that has not ended (as ``scancel`` of an array job)."""
    row = await _visible(request, array_id, caller)
    n = await arrays.cancel_array(request.app.state.engine, array_id, caller.user)
    return array_out(row, cancelled=n)
