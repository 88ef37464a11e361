"""Jobs and job arrays as the API shows them, and why a job still waits."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from pydantic import BaseModel, Field

from services.admission.models.forecasts import ForecastOut
from shared.events.reasons import TransitionCode, WaitCode


class HistoryEntry(BaseModel):
    state: str
    reason: str
    reason_code: TransitionCode = Field(
        default=None, description="the transition's code (admitted, placed, started, "
        "succeeded, preempted, retry, ...); empty for history from before codes")
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


class WaitingOut(BaseModel):
    """Why a job still waits in its queue."""

    queue: str
    position: int = Field(description="1 = next in its queue's order")
    reason: WaitCode = Field(description="quota | reclaim | queue_closed | priority | "
                             "array_limit")
    detail: str
    estimated_start: datetime | None
    blocked_by: str | None = Field(default=None, description="priority: the job ahead of "
                                   "it in its strict queue")
    updated_at: datetime


class PlacementWaitOut(BaseModel):
    """Why the scheduler has not placed an admitted job yet."""

    reason: WaitCode = Field(description="no_fit | gang_incomplete | never_fits | "
                             "preempting | priority | backfill_blocked | gpu_model | "
                             "affinity | no_matching_node | cordoned | quota")
    detail: str
    blocked_by: str | None = Field(
        default=None, description="priority / backfill_blocked: the job it waits behind")
    estimated_start: datetime | None = Field(
        description="when backfill expects it to start; empty = no estimate")
    updated_at: datetime = Field(description="when the scheduler last said so")


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
    forecast: ForecastOut | None = Field(
        default=None, description="while it waits: the forecaster's expected start, "
        "finish, band and nodes")


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


class StreamedEvent(BaseModel):
    """The data of a `status` event."""

    seq: int
    job_id: str
    state: str
    reason: str
    reason_code: TransitionCode = Field(default=None, description="the transition's code")
    attempt: int
    exit_code: int | None = None
    task: str | None = None
    node_id: str | None = None
    message: str | None = None
    occurred_at: datetime


def row_spec(row: dict[str, Any]) -> dict[str, Any]:
    """A row's ``spec`` column as a mapping (the driver may hand it over as JSON text)."""
    spec = row["spec"]
    return spec if isinstance(spec, dict) else dict(json.loads(spec))


def job_out(row: dict[str, Any], detail: bool = False) -> JobOut:
    out = JobOut(**{k: row[k] for k in JobOut.model_fields if k in row and k not in (
        "spec", "history", "placement")}, spec=row_spec(row))
    if detail:
        out.history = [HistoryEntry(**h) for h in row.get("history", [])]
        out.placement = [PlacementEntry(**p) for p in row.get("placement", [])]
        if out.placement:  # task ids are <task>-<replica>[.<incarnation>]
            names = [p.task_id.split(".")[0].rsplit("-", 1)[0] for p in out.placement]
            out.replicas = {n: names.count(n) for n in dict.fromkeys(names)}
    return out


def array_out(row: dict[str, Any], cancelled: int | None = None) -> ArrayOut:
    return ArrayOut(**{k: row[k] for k in ("id", "name", "queue", "tenant", "user", "indices",
                                           "size", "submitted_at")},
                    max_running=row["max_running"], spec=row_spec(row),
                    states=row.get("states", {}), jobs=f"/v1/jobs?array={row['id']}",
                    cancelled=cancelled)
