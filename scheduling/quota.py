"""Quota admission in Kueue's cohort model, and DRF shares; pure functions of usage.

Each tenant has a nominal quota. ``lending_limit`` caps how much of it the cohort may
borrow, so ``nominal - lending_limit`` is guaranteed to the tenant; ``borrowing_limit``
caps how far above nominal it may go. The cohort's pool is the sum of what members
lend; every member's usage above its guaranteed part draws from that pool. A tenant
within its nominal quota is always admitted: if others borrowed its share, reclaim
(preemption of borrowers) gives it back. Tenants without a ``Quota`` are not limited.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from scheduling.model import PendingReason, Quota, Resources

_EPS = 1e-9


def _pairs(r: Resources) -> tuple[float, float, float]:
    return r.as_tuple()


@dataclass(frozen=True, slots=True)
class Admission:
    admitted: bool
    borrowing: bool = False
    reason: PendingReason | None = None
    detail: str = ""


class QuotaBook:
    """Usage per tenant against quotas; ``add`` as jobs are admitted or placed."""

    def __init__(self, quotas: Iterable[Quota], usage: Mapping[str, Resources] | None = None) -> None:
        self.quotas = {q.tenant: q for q in quotas}
        self.usage: dict[str, Resources] = dict(usage or {})
        self.cohorts: dict[str, list[str]] = {}
        for q in self.quotas.values():
            if q.cohort:
                self.cohorts.setdefault(q.cohort, []).append(q.tenant)

    def used(self, tenant: str) -> Resources:
        return self.usage.get(tenant, Resources())

    def add(self, tenant: str, demand: Resources, sign: int = 1) -> None:
        u = self.used(tenant)
        self.usage[tenant] = u + demand if sign > 0 else u - demand

    @staticmethod
    def _lendable(q: Quota) -> tuple[float, float, float]:
        nom = _pairs(q.nominal)
        if q.lending_limit is None:
            return nom
        return tuple(min(n, ll) for n, ll in zip(nom, _pairs(q.lending_limit), strict=True))  # type: ignore[return-value]

    def within_nominal(self, tenant: str, demand: Resources) -> bool:
        q = self.quotas.get(tenant)
        if q is None:
            return True
        after = self.used(tenant) + demand
        return all(a <= n + _EPS for a, n in zip(_pairs(after), _pairs(q.nominal), strict=True))

    def borrowing(self, tenant: str) -> bool:
        """Uses more than its nominal quota of some resource."""
        q = self.quotas.get(tenant)
        if q is None:
            return False
        return any(u > n + _EPS for u, n in zip(_pairs(self.used(tenant)), _pairs(q.nominal), strict=True))

    def check(self, tenant: str, demand: Resources) -> Admission:
        q = self.quotas.get(tenant)
        if q is None or self.within_nominal(tenant, demand):
            return Admission(True)
        if not q.cohort:
            return Admission(False, reason=PendingReason.QUOTA, detail="over nominal quota, no cohort")
        after = _pairs(self.used(tenant) + demand)
        nom = _pairs(q.nominal)
        blim = None if q.borrowing_limit is None else _pairs(q.borrowing_limit)
        members = self.cohorts[q.cohort]
        for r in range(3):
            if after[r] <= nom[r] + _EPS:
                continue
            if blim is not None and after[r] - nom[r] > blim[r] + _EPS:
                return Admission(False, reason=PendingReason.QUOTA, detail="over borrowing limit")
            pool = 0.0
            drawn = 0.0
            for m in members:
                mq = self.quotas[m]
                lend = self._lendable(mq)[r]
                guaranteed = _pairs(mq.nominal)[r] - lend
                use = after[r] if m == tenant else _pairs(self.used(m))[r]
                pool += lend
                drawn += max(0.0, use - guaranteed)
            if drawn > pool + _EPS:
                return Admission(False, reason=PendingReason.QUOTA, detail="cohort has nothing left to lend")
        return Admission(True, borrowing=True)


def dominant_share(usage: Resources, capacity: Resources, weight: float = 1.0) -> float:
    """DRF: the largest fraction of any cluster resource the tenant holds, over its weight."""
    shares = [u / c for u, c in zip(_pairs(usage), _pairs(capacity), strict=True) if c > 0]
    return (max(shares) if shares else 0.0) / (weight or 1.0)
