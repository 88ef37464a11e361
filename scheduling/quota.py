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
_Vec = tuple[float, float, float]


@dataclass(frozen=True, slots=True)
class Admission:
    admitted: bool
    borrowing: bool = False
    reason: PendingReason | None = None
    detail: str = ""


_ADMIT = Admission(True)


class QuotaBook:
    """Usage per tenant against quotas; ``add`` as jobs are admitted or placed.

    Kept as plain float lists: the scheduler asks it once per pending job per cycle.
    """

    def __init__(self, quotas: Iterable[Quota], usage: Mapping[str, Resources] | None = None) -> None:
        self.quotas = {q.tenant: q for q in quotas}
        self._use: dict[str, list[float]] = {t: list(r.as_tuple()) for t, r in (usage or {}).items()}
        self._nom: dict[str, _Vec] = {t: q.nominal.as_tuple() for t, q in self.quotas.items()}
        self._lend: dict[str, _Vec] = {}
        for t, q in self.quotas.items():
            nom = self._nom[t]
            if q.lending_limit is None:
                self._lend[t] = nom
            else:
                ll = q.lending_limit.as_tuple()
                self._lend[t] = (min(nom[0], ll[0]), min(nom[1], ll[1]), min(nom[2], ll[2]))
        self.cohorts: dict[str, list[str]] = {}
        for q in self.quotas.values():
            if q.cohort:
                self.cohorts.setdefault(q.cohort, []).append(q.tenant)

    def used(self, tenant: str) -> Resources:
        u = self._use.get(tenant)
        return Resources(*u) if u else Resources()

    def add(self, tenant: str, demand: Resources, sign: int = 1) -> None:
        u = self._use.setdefault(tenant, [0.0, 0.0, 0.0])
        u[0] += sign * demand.gpu
        u[1] += sign * demand.cpu_milli
        u[2] += sign * demand.memory_mib

    def within_nominal(self, tenant: str, demand: Resources) -> bool:
        nom = self._nom.get(tenant)
        if nom is None:
            return True
        u = self._use.get(tenant) or (0.0, 0.0, 0.0)
        return (u[0] + demand.gpu <= nom[0] + _EPS and u[1] + demand.cpu_milli <= nom[1] + _EPS
                and u[2] + demand.memory_mib <= nom[2] + _EPS)

    def borrowing(self, tenant: str) -> bool:
        """Uses more than its nominal quota of some resource."""
        nom = self._nom.get(tenant)
        u = self._use.get(tenant)
        if nom is None or u is None:
            return False
        return u[0] > nom[0] + _EPS or u[1] > nom[1] + _EPS or u[2] > nom[2] + _EPS

    def check(self, tenant: str, demand: Resources) -> Admission:
        q = self.quotas.get(tenant)
        if q is None or self.within_nominal(tenant, demand):
            return _ADMIT
        if not q.cohort:
            return Admission(False, reason=PendingReason.QUOTA, detail="over nominal quota, no cohort")
        u = self._use.get(tenant) or [0.0, 0.0, 0.0]
        d = demand.as_tuple()
        after = (u[0] + d[0], u[1] + d[1], u[2] + d[2])
        nom = self._nom[tenant]
        blim = None if q.borrowing_limit is None else q.borrowing_limit.as_tuple()
        members = self.cohorts[q.cohort]
        for r in range(3):
            if after[r] <= nom[r] + _EPS:
                continue
            if blim is not None and after[r] - nom[r] > blim[r] + _EPS:
                return Admission(False, reason=PendingReason.QUOTA, detail="over borrowing limit")
            pool = 0.0
            drawn = 0.0
            for m in members:
                lend = self._lend[m][r]
                guaranteed = self._nom[m][r] - lend
                mu = self._use.get(m)
                use = after[r] if m == tenant else (mu[r] if mu else 0.0)
                pool += lend
                drawn += max(0.0, use - guaranteed)
            if drawn > pool + _EPS:
                return Admission(False, reason=PendingReason.QUOTA, detail="cohort has nothing left to lend")
        return Admission(True, borrowing=True)


def dominant_share(usage: Resources, capacity: Resources, weight: float = 1.0) -> float:
    """DRF: the largest fraction of any cluster resource the tenant holds, over its weight."""
    shares = [u / c for u, c in zip(usage.as_tuple(), capacity.as_tuple(), strict=True) if c > 0]
    return (max(shares) if shares else 0.0) / (weight or 1.0)
