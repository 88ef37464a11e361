"""Billing weights in fair share: a tenant's GPUs counted at what each GPU-hour of their
model costs (Slurm's ``TRESBillingWeights``). A job carries its price list
(``JobRequest.gpu_prices``: model name -> weight; a model it lacks costs 1); without
one, every GPU counts 1 and nothing here changes a number.

A running job's GPUs cost the price of the model they are on; a waiting job's, the
cheapest model of this cluster it may run on (what it will cost at least).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from scheduling.arrays import FloatArray
from scheduling.framework import Cycle, JobInfo
from scheduling.model import Resources


def price(prices: Sequence[tuple[str, float]], model: str) -> float:
    return next((w for m, w in prices if m == model), 1.0)


def billed_usage(cycle: Cycle) -> dict[str, Resources]:
    """Each tenant's usage (``Cycle.usage``) with its GPUs at their billing weights."""
    runs = cycle.running
    if not any(r.run.job.gpu_prices for r in runs):
        return cycle.usage
    table = cycle.table
    extra: dict[str, float] = {}
    for a in np.flatnonzero(cycle.alloc_run >= 0).tolist():
        job = runs[int(cycle.alloc_run[a])].run.job
        code = int(table.gmodel[int(cycle.alloc_node[a]), 0])
        if job.gpu_prices and code >= 0:
            p = price(job.gpu_prices, table.models[code])
            extra[job.tenant] = extra.get(job.tenant, 0.0) + (p - 1.0) * float(cycle.alloc_gpu[a])
    return {t: u + Resources(extra.get(t, 0.0), 0.0, 0.0) for t, u in cycle.usage.items()}


def pending_prices(cycle: Cycle, jobs: Sequence[JobInfo]) -> FloatArray | None:
    """What one GPU of each waiting job costs at least; None when no job has prices."""
    if not any(info.job.gpu_prices for info in jobs):
        return None
    present = cycle.table.models
    out = np.ones(len(jobs))
    for k, info in enumerate(jobs):
        job = info.job
        if job.gpu_prices:
            models = [m for m in (job.gpu_models or present) if m in present] or present
            out[k] = min((price(job.gpu_prices, m) for m in models), default=1.0)
    return out
