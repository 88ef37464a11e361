"""The queue tree's quota arithmetic, shared by queueing (which admits jobs against it,
``services/queueing/quota.py``) and admission (which refuses a job no quota could ever
admit). Pure: specs in, numbers out.

A tree is cluster -> tenant -> team, as deep as needed (Kueue's cohort model): each node
has an effective ``nominal`` (its guarantee, or the sum of its children's) and ``lend``
(how much of that its cohort may use). A resource that no node of a tree limits is not
limited at all.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from scheduling import JobRequest, Quota, Resources
from shared.job_request import task_requests
from shared.jobspec import JobSpec
from shared.queuespec import QueueSpec, effective_tenant

BIG = 1e15  # "no limit" as a number: sums and comparisons stay finite
EPS = 1e-9
Vec = tuple[float, float, float]
ZERO: Vec = (0.0, 0.0, 0.0)
UNITS = ("GPUs", "CPU millicores", "MiB memory")
RESOURCE_KEYS = ("gpus", "cpu_milli", "memory_mib")


def add(a: Vec, b: Vec, sign: float = 1.0) -> Vec:
    return (a[0] + sign * b[0], a[1] + sign * b[1], a[2] + sign * b[2])


def fmt(v: float) -> str:
    return f"{v:g}" if v < BIG / 2 else "unlimited"


def request_demand(req: JobRequest) -> Vec:
    """What a job reserves of its queue's quota: its replicas as submitted (GPU shares
    count their compute fraction)."""
    return (float(req.total_gpus), float(sum(t.replicas * t.cpu_milli for t in req.tasks)),
            float(sum(t.replicas * t.memory_mib for t in req.tasks)))


def spec_demand(spec: JobSpec) -> Vec:
    """``request_demand`` of a spec not yet submitted (admission's check)."""
    return request_demand(JobRequest(job_id="", tasks=task_requests(spec)))


@dataclass(frozen=True, slots=True)
class Ceiling:
    """The most a queue could ever hold at once, per resource (``BIG`` = unlimited), and
    for each the node of its path whose limit binds (the queue itself or a cohort above)."""

    amount: Vec
    at: tuple[str, str, str]

    def exceeded(self, demand: Vec) -> list[int]:
        """The resources (0 GPUs, 1 CPU, 2 memory) of which ``demand`` asks too much."""
        return [r for r in range(3) if demand[r] > self.amount[r] + EPS]


class QueueTree:
    """The queue specs as a tree, with each node's effective nominal and lending."""

    def __init__(self, specs: Iterable[QueueSpec]) -> None:
        self.specs: dict[str, QueueSpec] = {q.name: q for q in specs}
        self.children: dict[str, list[str]] = {n: [] for n in self.specs}
        self.tops: list[str] = []
        for q in self.specs.values():
            if q.parent in self.specs:
                self.children[q.parent].append(q.name)
            else:
                self.tops.append(q.name)
        self.top_of: dict[str, str] = {}
        for top in self.tops:
            for n in self.subtree(top):
                self.top_of[n] = top
        self.limited: dict[str, tuple[bool, bool, bool]] = {}
        for top in self.tops:
            flags = [False, False, False]
            for n in self.subtree(top):
                q = self.specs[n]
                for amount in (q.guaranteed, q.borrowing_limit):
                    if amount is not None:
                        for r, v in enumerate(amount.values()):
                            flags[r] = flags[r] or v is not None
            self.limited[top] = (flags[0], flags[1], flags[2])
        self.nominal: dict[str, Vec] = {}
        self.lend: dict[str, Vec] = {}
        for top in self.tops:
            self._effective(top)

    def _effective(self, name: str) -> None:
        kids = self.children[name]
        for k in kids:
            self._effective(k)
        q = self.specs[name]
        g = q.guaranteed.values() if q.guaranteed else (None, None, None)
        lim = q.lending_limit.values() if q.lending_limit else (None, None, None)
        nom: list[float] = []
        lend: list[float] = []
        for r in range(3):
            gr = g[r]
            n = float(gr) if gr is not None else sum(self.nominal[k][r] for k in kids)
            lr = lim[r]
            if lr is not None:
                lend.append(min(float(lr), n))
            elif gr is None and kids:
                lend.append(sum(self.lend[k][r] for k in kids))
            else:
                lend.append(n)
            nom.append(n)
        self.nominal[name] = (nom[0], nom[1], nom[2])
        self.lend[name] = (lend[0], lend[1], lend[2])

    def subtree(self, name: str) -> list[str]:
        out, stack = [], [name]
        while stack:
            n = stack.pop()
            out.append(n)
            stack.extend(self.children.get(n, []))
        return out

    def path(self, name: str) -> list[str]:
        """The queue, its parent, ... up to its top-level ancestor."""
        out = [name]
        while (p := self.specs[out[-1]].parent) is not None and p in self.specs:
            out.append(p)
        return out

    def tenant(self, name: str) -> str:
        return effective_tenant(self.specs, name)

    def _lender(self, cohort: str) -> Vec:
        """What a cohort offers its children beyond their own lending: its guarantee that
        no child claims, and (having a parent) what it may borrow from above."""
        q = self.specs[cohort]
        g = q.guaranteed.values() if q.guaranteed else (None, None, None)
        bl = q.borrowing_limit.values() if q.borrowing_limit else (None, None, None)
        kids = self.children[cohort]
        out: list[float] = []
        for r in range(3):
            gr = g[r]
            spare = max(0.0, float(gr) - sum(self.nominal[k][r] for k in kids)) if gr is not None else 0.0
            above = 0.0
            if q.parent is not None:
                b = bl[r]
                above = float(b) if b is not None else BIG
            out.append(spare + above)
        return (out[0], out[1], out[2])

    def quotas(self, cohort: str) -> list[Quota]:
        """The members of one level for ``QuotaBook``: the cohort's children and its lender."""
        out = []
        for k in self.children[cohort]:
            q = self.specs[k]
            bl = None
            if q.borrowing_limit is not None:
                bl = Resources(*(BIG if v is None else v for v in q.borrowing_limit.values()))
            out.append(Quota(k, Resources(*self.nominal[k]), cohort=cohort, borrowing_limit=bl,
                             lending_limit=Resources(*self.lend[k]), weight=q.weight))
        lender = self._lender(cohort)
        out.append(Quota(f"~{cohort}", Resources(*lender), cohort=cohort,
                         lending_limit=Resources(*lender)))
        return out

    def ceiling(self, name: str) -> Ceiling:
        """What quota admits of one job of queue ``name`` when nothing else is admitted:
        a job asking more waits forever. At each level of its path, within nominal is
        always admitted; above, the node is bounded by its borrowing limit and by what
        its cohort can lend (its siblings' lending, the cohort's unclaimed guarantee and,
        having a parent, what the cohort may borrow, bounded one level up); at the top a
        node holds at most its nominal. Queueing's ``QuotaState.check`` agrees with it."""
        lim = self.limited[self.top_of[name]]
        amount = [BIG, BIG, BIG]
        at = ["", "", ""]
        for node in self.path(name):
            nom = self.nominal[node]
            cohort = self.specs[node].parent
            caps: list[float]
            if cohort is None or cohort not in self.specs:
                caps = list(nom)
            else:
                q = self.specs[node]
                bl = q.borrowing_limit.values() if q.borrowing_limit else (None, None, None)
                pool = self._lender(cohort)
                for k in self.children[cohort]:
                    pool = add(pool, self.lend[k])
                caps = []
                for r in range(3):
                    b = bl[r]
                    cap = nom[r] - self.lend[node][r] + pool[r]
                    if b is not None:
                        cap = min(cap, nom[r] + float(b))
                    caps.append(max(cap, nom[r]))
            for r in range(3):  # on a tie the level above binds: it bounds the one below
                if lim[r] and caps[r] < BIG / 2 and caps[r] <= amount[r]:
                    amount[r], at[r] = caps[r], node
        return Ceiling((amount[0], amount[1], amount[2]), (at[0], at[1], at[2]))
