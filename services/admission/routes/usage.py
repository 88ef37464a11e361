"""GET /v1/usage: GPU-hours per tenant and per queue over a time range.

Counted from the task replicas' running intervals (``services.admission.usage``) clipped
to the range: whole GPUs by their count, a GPU share by its fraction; per GPU model, and
billed at each queue's weights per model as they are now (``shared/billing.py``). A `user` token
sees its own tenant; an admin every tenant, or one with ``?tenant=``.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Annotated

from fastapi import APIRouter, HTTPException, Query, status

from services.admission import queues_view, usage
from services.admission.deps import Caller, EngineDep
from services.admission.models.usage import QueueUsage, TenantUsage, UsageReport
from services.admission.queue_check import queue_specs
from shared.billing import effective_weights, weight_of

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
    specs = queue_specs(await queues_view.list_queues(engine, None))
    tenants: dict[str, TenantUsage] = {}
    queues: dict[tuple[str, str], QueueUsage] = {}
    for r in rows:  # one row per (tenant, queue, GPU model)
        t = tenants.setdefault(r["tenant"], TenantUsage(
            tenant=r["tenant"], gpu_hours=0.0, shared_gpu_hours=0.0, runs=0, queues=[]))
        q = queues.get((r["tenant"], r["queue"]))
        if q is None:
            q = queues[r["tenant"], r["queue"]] = QueueUsage(
                queue=r["queue"], gpu_hours=0.0, shared_gpu_hours=0.0, runs=0)
            t.queues.append(q)
        hours, model = float(r["gpu_hours"]), r["gpu_model"] or ""
        billed = hours * weight_of(effective_weights(specs, r["queue"]), model)
        q.gpu_hours_by_model[model] = round(q.gpu_hours_by_model.get(model, 0.0) + hours, 6)
        for acc in (q, t):
            acc.gpu_hours = round(acc.gpu_hours + hours, 6)
            acc.shared_gpu_hours = round(acc.shared_gpu_hours + float(r["shared_gpu_hours"]), 6)
            acc.billed_gpu_hours = round(acc.billed_gpu_hours + billed, 6)
            acc.runs += int(r["runs"])
    return UsageReport(from_=start, to=end, tenants=list(tenants.values()),
                       gpu_hours=round(sum(t.gpu_hours for t in tenants.values()), 6),
                       billed_gpu_hours=round(sum(t.billed_gpu_hours
                                                  for t in tenants.values()), 6))
