"""Fair share: DRF ordering across tenants, Kueue-style quota admission and reclaim.

Ordering uses each job's *projected* dominant share: its tenant's share after the
tenant's earlier jobs in the queue and this one were placed. Sorting on it interleaves
tenants as progressive filling would, without re-sorting after every bind. GPUs count
at their billing weights where jobs carry them (``scheduling/billing.py``); with a
``half_life_s``, each tenant's decayed past use counts beside its current share
(``scheduling/decay.py``).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from scheduling import jobcols as jc
from scheduling.arrays import BoolArray, FloatArray
from scheduling.billing import billed_usage, pending_prices
from scheduling.framework import Cycle, JobInfo, JobPriorities, Plugin, register
from scheduling.model import PendingReason, PreemptReason, Resources
from scheduling.quota import QuotaBook, dominant_share


class FairShareArgs(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    quota: bool = Field(True, description="admit against the snapshot's quotas")
    reclaim: bool = Field(True, description="a tenant within its nominal quota may preempt borrowers")
    drf_preempt: bool = Field(False, description="preempt jobs of tenants above the preemptor's share")
    weights: dict[str, float] = Field(default_factory=dict, description="tenant weights without a Quota")
    half_life_s: float = Field(0.0, ge=0, description=(
        "past usage decays by half in this time and counts beside current shares "
        "(Slurm's PriorityDecayHalfLife); 0: current shares only"))


@register
class FairShare(Plugin):
    name = "fairshare"
    Args = FairShareArgs
    args: FairShareArgs

    def open(self, cycle: Cycle) -> None:
        quotas = cycle.snapshot.quotas if self.args.quota else ()
        cycle.put(QuotaBook(quotas, cycle.usage))
        self.weight_of = {q.tenant: q.weight for q in cycle.snapshot.quotas}
        self.weight_of.update(self.args.weights)
        self.billed = billed_usage(cycle)  # GPUs at their billing weights

    def share(self, cycle: Cycle, tenant: str, usage: Resources) -> float:
        return dominant_share(usage, cycle.capacity, self.weight_of.get(tenant, 1.0))

    def order_keys(self, cycle: Cycle, jobs: Sequence[JobInfo]) -> list[FloatArray]:
        n = len(jobs)
        c = cycle.cols
        _, first, tenant = jc.groups(c[jc.TENANT].astype(np.int64))
        names = [jobs[k].job.tenant for k in first.tolist()]  # each tenant's name, from its first job
        prios = cycle.get(JobPriorities)
        prio = prios.priority if prios is not None else c[jc.STATIC]
        submit = c[jc.SUBMIT]
        demand = c[[jc.GPUS, jc.CPU, jc.MEM]].T
        prices = pending_prices(cycle, jobs)
        if prices is not None:
            demand = demand * np.stack([prices, np.ones(n), np.ones(n)], axis=1)
        # within a tenant: by priority, then FIFO; cumulative demand, reset per tenant
        order = np.lexsort((np.arange(n), submit, -prio, tenant))
        cum = np.cumsum(demand[order], axis=0)
        t_sorted = tenant[order]
        starts = np.flatnonzero(np.r_[True, t_sorted[1:] != t_sorted[:-1]])
        group_start = np.repeat(starts, np.diff(np.r_[starts, n]))
        offset = np.where(group_start[:, None] > 0, cum[group_start - 1], 0.0)
        used = np.asarray([self.billed.get(t, Resources()).as_tuple() for t in names], dtype=float)
        weight = np.asarray([self.weight_of.get(t, 1.0) or 1.0 for t in names])
        cap = np.asarray(cycle.capacity.as_tuple())
        after = used[t_sorted] + cum - offset
        share = np.max(np.where(cap > 0, after / np.where(cap > 0, cap, 1.0), 0.0), axis=1) / weight[t_sorted]
        if cycle.past_share:  # the decayed past, as a share of the GPUs (half_life_s)
            was = np.asarray([cycle.past_share.get(t, 0.0) for t in names])
            share = share + (was / weight)[t_sorted]
        out = np.empty(n)
        out[order] = share
        return [out]

    def admit(self, cycle: Cycle, info: JobInfo) -> PendingReason | None:
        book = cycle.get(QuotaBook)
        if book is None or not book.quotas:
            return None
        return book.check(info.job.tenant, info.demand).reason

    def victims(self, cycle: Cycle, info: JobInfo) -> list[tuple[BoolArray, PreemptReason]]:
        out: list[tuple[BoolArray, PreemptReason]] = []
        if not cycle.running:
            return out
        rt = cycle.runs()
        book = cycle.get(QuotaBook)
        me = info.job.tenant
        if self.args.reclaim and book is not None and me in book.quotas and book.within_nominal(me, info.demand):
            cohort = book.quotas[me].cohort
            flags = np.asarray([t != me and cohort != "" and t in book.quotas
                                and book.quotas[t].cohort == cohort and book.borrowing(t)
                                for t in rt.tenants], dtype=bool)
            out.append((flags[rt.tenant], PreemptReason.RECLAIM))
        if self.args.drf_preempt:
            mine = self.share(cycle, me, cycle.usage.get(me, Resources()) + info.demand)
            used = np.asarray([cycle.usage.get(t, Resources()).as_tuple() for t in rt.tenants], dtype=float)
            weight = np.asarray([self.weight_of.get(t, 1.0) or 1.0 for t in rt.tenants])
            cap = np.asarray(cycle.capacity.as_tuple())
            after = (used[rt.tenant] - rt.demand) / np.where(cap > 0, cap, np.inf)
            share = after.max(axis=1) / weight[rt.tenant]
            others = np.asarray([t != me for t in rt.tenants], dtype=bool)[rt.tenant]
            out.append((others & (share > mine), PreemptReason.FAIR_SHARE))
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
