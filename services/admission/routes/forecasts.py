"""Forecasts: every waiting job's expected start (``kairos jobs --start``)."""

from typing import Annotated

from fastapi import APIRouter, HTTPException, Query, status

from services.admission import forecasts_view
from services.admission.deps import Caller, EngineDep
from services.admission.models.forecasts import WaitingJobList, WaitingJobOut, forecast_out

router = APIRouter()


@router.get("/v1/forecasts", response_model=WaitingJobList)
async def list_forecasts(
    caller: Caller, engine: EngineDep,
    queue: Annotated[str | None, Query(max_length=63, description="only this queue's")] = None,
    tenant: Annotated[str | None, Query(max_length=63, description="admins: only this "
                                        "tenant's")] = None,
    limit: Annotated[int, Query(ge=1, le=5000)] = 1000,
) -> WaitingJobList:
    """Waiting jobs, oldest first, each with its latest forecast (empty until the
    forecaster has made one): every tenant's for an admin, the token's tenant's else."""
    if not caller.admin:
        if tenant is not None and tenant != caller.tenant:
            raise HTTPException(status.HTTP_403_FORBIDDEN,
                                detail=f"this token lists only tenant {caller.tenant}'s jobs")
        tenant = caller.tenant
    rows = await forecasts_view.waiting_forecasts(engine, tenant, queue, limit)
    return WaitingJobList(items=[WaitingJobOut(
        **{k: r[k] for k in ("job_id", "name", "queue", "tenant", "state", "submitted_at")},
        forecast=forecast_out(r)) for r in rows])
