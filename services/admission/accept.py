"""Accepting a submit: the checks every kind of work passes before it is stored, in one
place, so a batch job and an interactive environment are held to the same rules."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fastapi import HTTPException, status
from sqlalchemy.ext.asyncio import AsyncEngine

from services.admission import arrays, policy, store
from services.admission.auth import Principal
from services.admission.queue_check import check_queue
from services.admission.queues_view import QueueCache
from services.admission.settings import AdmissionSettings
from shared.jobspec import JobSpec


@dataclass(frozen=True)
class Intake:
    """What a submit is checked against and stored in (``deps.IntakeDep`` builds it from
    the app's state)."""

    engine: AsyncEngine
    settings: AdmissionSettings
    queues: QueueCache
    shapes: policy.ClusterShapes

    async def accept(self, caller: Principal, spec: JobSpec,
                     idempotency_key: str | None) -> tuple[dict[str, Any], bool]:
        """Size and fit policy, then an open queue the caller may use with the job within
        its quota ceiling; then the row and its outbox event in one transaction. Returns
        the job row and whether it was created (False: the same Idempotency-Key came
        before)."""
        await self.check(caller, spec)
        return await store.insert_job(self.engine, spec, caller.tenant, caller.user,
                                      idempotency_key,
                                      max_event_bytes=self.settings.max_event_bytes)

    async def accept_array(self, caller: Principal, spec: JobSpec,
                           idempotency_key: str | None) -> tuple[dict[str, Any], bool]:
        """The same checks for each element (they share one shape), the array no larger
        than the gateway's ``max_array_size``; then every element in one transaction.
        Returns the array row and whether it was created."""
        assert spec.array is not None
        await self.check(caller, spec)
        return await arrays.insert_array(self.engine, spec, caller.tenant, caller.user,
                                         idempotency_key,
                                         max_event_bytes=self.settings.max_event_bytes)

    async def check(self, caller: Principal, spec: JobSpec) -> None:
        """Every refusal a submit of ``spec`` would get before it is stored (a dry run's
        too): an array's size, size and fit policy, the queue and its quota ceiling."""
        arr = spec.array_indices
        if arr is not None and arr.size > self.settings.max_array_size:
            raise HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT, detail=[{
                "field": "array", "type": "value_error", "message": (
                    f"{arr.size} elements; this gateway accepts arrays of at most "
                    f"{self.settings.max_array_size}")}])
        await policy.check(spec, self.settings.max_job_gpus, self.shapes)
        await check_queue(self.engine, spec.queue, caller, spec, self.queues)
