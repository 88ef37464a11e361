"""Fair share: DRF ordering across tenants, Kueue-style quota admission and reclaim.

Ordering uses each job's *projected* dominant share: its tenant's share after the
tenant's earlier jobs in the queue and this one were placed. Sorting on it interleaves
tenants as progressive filling would, without re-sorting after every bind.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from scheduling.framework import Cycle, JobInfo, Plugin, RunningInfo, register
from scheduling.model import PendingReason, PreemptReason, Resources
from scheduling.quota import QuotaBook, dominant_share
from scheduling.state import FloatArray


class FairShareArgs(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    quota: bool = Field(True, description="admit against the snapshot's quotas")
    reclaim: bool = Field(True, description="a tenant within its nominal quota may preempt borrowers")
    drf_preempt: bool = Field(False, description="preempt jobs of tenants above the preemptor's share")
    weights: dict[str, float] = Field(default_factory=dict, description="tenant weights without a Quota")


@register
class FairShare(Plugin):
    name = "fairshare"
    Args = FairShareArgs
    args: FairShareArgs

    def open(self, cycle: Cycle) -> None:
        quotas = cycle.snapshot.quotas if self.args.quota else ()
        cycle.quota_book = QuotaBook(quotas, cycle.usage)
        self.weight_of = {q.tenant: q.weight for q in cycle.snapshot.quotas}
        self.weight_of.update(self.args.weights)

    def share(self, cycle: Cycle, tenant: str, usage: Resources) -> float:
        return dominant_share(usage, cycle.capacity, self.weight_of.get(tenant, 1.0))

    def order_keys(self, cycle: Cycle, jobs: Sequence[JobInfo]) -> list[FloatArray]:
        out = np.zeros(len(jobs))
        by_tenant: dict[str, list[int]] = {}
        for k, info in enumerate(jobs):
            by_tenant.setdefault(info.job.tenant, []).append(k)
        for tenant, ks in by_tenant.items():
            ks.sort(key=lambda k: (-jobs[k].priority, jobs[k].job.submit_time, k))
            u = cycle.usage.get(tenant, Resources())
            for k in ks:
                u = u + jobs[k].demand
                out[k] = self.share(cycle, tenant, u)
        return [out]

    def admit(self, cycle: Cycle, info: JobInfo) -> PendingReason | None:
        book = cycle.quota_book
        if book is None or not book.quotas:
            return None
        return book.check(info.job.tenant, info.demand).reason

    def victims(self, cycle: Cycle, info: JobInfo) -> list[tuple[RunningInfo, PreemptReason]]:
        out: list[tuple[RunningInfo, PreemptReason]] = []
        book = cycle.quota_book
        me = info.job.tenant
        if self.args.reclaim and book is not None and me in book.quotas and book.within_nominal(me, info.demand):
            cohort = book.quotas[me].cohort
            for r in cycle.running:
                t = r.job.tenant
                q = book.quotas.get(t)
                if t != me and q is not None and q.cohort == cohort and cohort and book.borrowing(t):
                    out.append((r, PreemptReason.RECLAIM))
        if self.args.drf_preempt:
            mine = self.share(cycle, me, cycle.usage.get(me, Resources()) + info.demand)
            for r in cycle.running:
                t = r.job.tenant
                if t != me and self.share(cycle, t, cycle.usage.get(t, Resources()) - r.demand) > mine:
                    out.append((r, PreemptReason.FAIR_SHARE))
        return out


class DrfArgs(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    preempt: bool = False
    weights: dict[str, float] = Field(default_factory=dict)


@register
class Drf(FairShare):
    """Plain DRF across tenants (the research baseline): no quotas, optional preemption."""

    name = "drf"
    Args = DrfArgs  # type: ignore[assignment]

    def __init__(self, args: BaseModel, weight: float = 1.0) -> None:
        assert isinstance(args, DrfArgs)
        super().__init__(FairShareArgs(quota=False, reclaim=False, drf_preempt=args.preempt,
                                       weights=args.weights), weight)
