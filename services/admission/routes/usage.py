"""GET /v1/usage: GPU-hours per tenant and per queue over a time range.

Counted from the task replicas' running intervals (``services.admission.usage``) clipped
to the range: whole GPUs by their count, a GPU share by its fraction. A `user` token
sees its own tenant; an admin every tenant, or one with ``?tenant=``.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Annotated

from fastapi import APIRouter, HTTPException, Query, status

from services.admission import usage
from services.admission.deps import Caller, EngineDep
from services.admission.models.usage import QueueUsage, TenantUsage, UsageReport

router = APIRouter()
DEFAULT_RANGE = timedelta(days=1)
EARLIEST, LATEST = datetime(1970, 1, 1, tzinfo=UTC), datetime(9000, 1, 1, tzinfo=UTC)


def _aware(t: datetime) -> datetime:
    return t if t.tzinfo else t.replace(tzinfo=UTC)


@router.get("/v1/usage", response_model=UsageReport, response_model_by_alias=True)
async def get_usage(
    caller: Caller, engine: EngineDep,
    from_: Annotated[datetime | None, Query(
        alias="from", description="ISO 8601 time; default: a day before `to`")] = None,
    to: Annotated[datetime | None, Query(description="ISO 8601 time; default: now")] = None,
    tenant: Annotated[str | None, Query(
        max_length=63, description="admins: only this tenant")] = None,
) -> UsageReport:
    """GPU-hours used per tenant and queue in [from, to)."""
    if not caller.admin:
        if tenant is not None and tenant != caller.tenant:
            raise HTTPException(status.HTTP_403_FORBIDDEN, detail=(
                f"this token sees only tenant {caller.tenant}'s usage"))
        tenant = caller.tenant
    end = _aware(to) if to else datetime.now(UTC)
    start = _aware(from_) if from_ else end - DEFAULT_RANGE if end > EARLIEST + DEFAULT_RANGE \
        else EARLIEST
    for name, bound in (("from", start), ("to", end)):
        if not EARLIEST <= bound <= LATEST:
            raise HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT, detail=[{
                "field": f"query.{name}", "type": "value_error",
                "message": f"{bound.isoformat()} is outside {EARLIEST.year}-{LATEST.year}"}])
    if start >= end:
        raise HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT, detail=[{
            "field": "query.from", "type": "value_error",
            "message": f"from ({start.isoformat()}) must be before to ({end.isoformat()})"}])
    _, rows = await usage.gpu_hours(engine, start, end, tenant)
    tenants: dict[str, TenantUsage] = {}
    for r in rows:
        t = tenants.setdefault(r["tenant"], TenantUsage(
            tenant=r["tenant"], gpu_hours=0.0, shared_gpu_hours=0.0, runs=0, queues=[]))
        q = QueueUsage(queue=r["queue"], gpu_hours=round(float(r["gpu_hours"]), 6),
                       shared_gpu_hours=round(float(r["shared_gpu_hours"]), 6),
                       runs=int(r["runs"]))
        t.queues.append(q)
        t.gpu_hours = round(t.gpu_hours + q.gpu_hours, 6)
        t.shared_gpu_hours = round(t.shared_gpu_hours + q.shared_gpu_hours, 6)
        t.runs += q.runs
    return UsageReport(from_=start, to=end, tenants=list(tenants.values()),
                       gpu_hours=round(sum(t.gpu_hours for t in tenants.values()), 6))
