"""Quota over the queue tree (cluster -> tenant -> team), level by level with the
scheduling core's ``QuotaBook`` (Kueue's cohort model).

A job of queue Q is checked at every level of Q's path: Q among its siblings (the
children of its parent M, M being their cohort), then M among its siblings, up to the
top. At each level the members are the siblings, with

- nominal: their ``guaranteed`` (or, when unset, the sum of their children's);
- lending limit: how much of that the cohort may use (default: all of it);
- borrowing limit: how far above nominal they may go;

and one more lender that stands for M itself: the part of M's own guarantee that its
children do not claim, plus what M may borrow from above (unbounded here when M has a
parent: the check one level up bounds it). A resource that no node of a tree limits is
not checked at all, so the default queue, alone and without quota, admits everything.

A member within its nominal quota is always admitted by ``QuotaBook``; if the cohort has
lent that share out, the job waits for *reclaim*: borrowers' jobs are preempted until
the cohort's pool covers what its members draw from it.

The tree itself (effective nominal and lending, each queue's ceiling) is
``shared/quota_tree.py``: admission refuses with it a job larger than any quota could
ever admit. Queueing admits with ``QuotaState``; the gateway's dry run asks it whether a
job would be admitted now, from the usage queueing last announced.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from scheduling import QuotaBook, Resources
from shared.events.reasons import WaitReason  # queueing sets QUEUEING_WAITS of it
from shared.quota_tree import EPS, UNITS, ZERO, QueueTree, Vec
from shared.quota_tree import add as _add
from shared.quota_tree import fmt as _fmt

__all__ = ["Decision", "QuotaState", "Reclaim"]


@dataclass(frozen=True, slots=True)
class Reclaim:
    cohort: str  # the level whose pool is overdrawn
    member: str  # the requester's branch at that level (never a victim)
    need: Vec  # how much borrowed capacity must come back
    model: str = ""  # the GPU model whose quota is short ("" = the totals)


@dataclass(frozen=True, slots=True)
class Decision:
    admitted: bool
    borrowing: bool = False
    reason: WaitReason | None = None
    detail: str = ""
    reclaim: Reclaim | None = None
    at: str = ""  # refused: the queue or cohort whose quota stops it (reclaim: the cohort)


class QuotaState:
    """Usage of every node (its own jobs plus its subtree's) against the tree's quotas."""

    def __init__(self, tree: QueueTree, usage: Mapping[str, Vec] | None = None,
                 freeing: Mapping[str, Vec] | None = None) -> None:
        self.tree = tree
        self.used: dict[str, Vec] = dict.fromkeys(tree.specs, ZERO)
        self.freeing: dict[str, Vec] = dict.fromkeys(tree.specs, ZERO)  # being reclaimed
        self.claimed: dict[str, Vec] = dict.fromkeys(tree.specs, ZERO)  # waiting for reclaim
        for q, v in (usage or {}).items():
            self.add(q, v)
        for q, v in (freeing or {}).items():
            if q in tree.specs:
                for n in tree.path(q):
                    self.freeing[n] = _add(self.freeing[n], v)

    def add(self, queue: str, demand: Vec, sign: float = 1.0) -> None:
        if queue not in self.tree.specs:
            return
        for n in self.tree.path(queue):
            self.used[n] = _add(self.used[n], demand, sign)

    def mask(self, queue: str, demand: Vec) -> Vec:
        """The demand on the resources this queue's tree limits (others are free)."""
        lim = self.tree.limited[self.tree.top_of[queue]]
        return (demand[0] if lim[0] else 0.0, demand[1] if lim[1] else 0.0,
                demand[2] if lim[2] else 0.0)

    def borrowed(self, name: str) -> Vec:
        lim = self.tree.limited[self.tree.top_of[name]]
        u, n = self.used[name], self.tree.nominal[name]
        return tuple(max(0.0, u[r] - n[r]) if lim[r] else 0.0 for r in range(3))  # type: ignore[return-value]

    def check(self, queue: str, demand: Vec) -> Decision:
        d = self.mask(queue, demand)
        if d == ZERO:
            return Decision(True)
        borrowing = False
        for node in self.tree.path(queue):
            cohort = self.tree.specs[node].parent
            if cohort is None or cohort not in self.tree.specs:
                after = _add(self.used[node], d)
                nom = self.tree.nominal[node]
                for r in range(3):
                    if d[r] > 0 and after[r] > nom[r] + EPS:
                        return Decision(False, reason=WaitReason.QUOTA, at=node, detail=(
                            f"{node} would hold {_fmt(after[r])} of its {_fmt(nom[r])} "
                            f"{UNITS[r]} and has no cohort to borrow from"))
                continue
            # unlimited resources count 0; a job waiting for reclaim counts as admitted,
            # so no borrower takes what it waits for
            book = QuotaBook(self.tree.quotas(cohort), {
                k: Resources(*self.mask(k, _add(self.used[k], self.claimed[k])))
                for k in self.tree.children[cohort]})
            adm = book.check(node, Resources(*d))
            if not adm.admitted:
                return Decision(False, reason=WaitReason.QUOTA, at=node, detail=(
                    f"{node}: {adm.detail} (cohort {cohort})"))
            if adm.borrowing:
                borrowing = True
                continue
            if any(x > EPS for x in self.overdraw(cohort, node, d, count_freeing=False)):
                # wait while borrowers stop; ask for more only beyond what is stopping
                need = self.overdraw(cohort, node, d)
                return Decision(False, reason=WaitReason.RECLAIM, at=cohort, detail=(
                    f"{node} is within its guaranteed quota, lent out in cohort {cohort}: "
                    "its borrowers are being preempted"), reclaim=Reclaim(cohort, node, need))
        return Decision(True, borrowing=borrowing)

    def overdraw(self, cohort: str, member: str, demand: Vec, count_freeing: bool = True) -> Vec:
        """How far the members of ``cohort`` would draw past its pool if ``member`` took
        ``demand``. Unless told otherwise, jobs being reclaimed count as gone and jobs
        waiting for reclaim as admitted: what is left is what more must be reclaimed."""
        pool = [0.0, 0.0, 0.0]
        drawn = [0.0, 0.0, 0.0]
        lender = self.tree._lender(cohort)
        for k in self.tree.children[cohort]:
            use = self.used[k]
            if count_freeing:
                use = _add(_add(use, self.freeing[k], -1.0), self.claimed[k])
            if k == member:
                use = _add(use, demand)
            nom, lend = self.tree.nominal[k], self.tree.lend[k]
            for r in range(3):
                pool[r] += lend[r]
                drawn[r] += max(0.0, use[r] - (nom[r] - lend[r]))
        lim = self.tree.limited[self.tree.top_of[cohort]]
        return tuple(max(0.0, drawn[r] - pool[r] - lender[r]) if lim[r] and demand[r] > 0
                     else 0.0 for r in range(3))  # type: ignore[return-value]

    def borrowers(self, cohort: str, member: str) -> list[str]:
        """Members of ``cohort`` other than ``member`` that use more than their nominal
        quota (counting what is already being reclaimed as gone)."""
        out = []
        for k in self.tree.children[cohort]:
            if k == member:
                continue
            use = self.mask(k, _add(self.used[k], self.freeing[k], -1.0))
            nom = self.tree.nominal[k]
            if any(use[r] > nom[r] + EPS for r in range(3)):
                out.append(k)
        return out

    def mark_freeing(self, queue: str, demand: Vec) -> None:
        for n in self.tree.path(queue):
            self.freeing[n] = _add(self.freeing[n], demand)

    def claim(self, queue: str, demand: Vec) -> None:
        """A job waits for reclaim: later reclaims must cover it too."""
        d = self.mask(queue, demand)
        for n in self.tree.path(queue):
            self.claimed[n] = _add(self.claimed[n], d)
