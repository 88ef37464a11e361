"""Which held jobs a tree of queues admits now, in which order, and why the others wait.

Pure: the tree's held jobs, the tree and the time in, the decision out; no I/O and no
clock (``now`` is given), so a test or a replay decides exactly as the service did. The
service stores and announces what is decided (``service.py``).

1. usage: what the admitted jobs reserve, per queue; jobs being reclaimed still hold
   theirs until they have stopped, but count as gone when asking for more reclaim;
2. order the waiting jobs of open and draining queues with the core's ordering plugins;
3. admit in that order what quota allows. A job that must wait holds back no smaller
   one, unless its queue is ``strict``. Kueue's rule: jobs that fit within their
   guarantee go before borrowers (pass 1 defers borrowers), so a borrower never takes
   what an owner waits for. A job within its guarantee whose share was lent out waits
   for *reclaim*: borrowers' jobs are picked to be preempted. In a tree that gives GPU
   models quotas of their own, a GPU job is admitted against the first model that has
   room (``shared/model_quota.py``) and reclaim works within that model;
4. every job left waiting has a reason (closed queues' jobs included).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from services.queueing.array_caps import ArrayCaps
from services.queueing.ordering import Held, Ordering
from services.queueing.quota import EPS, QueueTree, QuotaState, Reclaim, WaitReason
from shared.model_quota import NO_MODEL, Choice, ModelTrees, Quotas
from shared.queuespec import QueueState

if TYPE_CHECKING:
    from services.queueing.store import JobRow

HOLDING = ("admitted", "reclaiming")  # the row states that hold quota
CLASS_RANK = {"low": 0, "normal": 1, "high": 2, "urgent": 3}


@dataclass(frozen=True, slots=True)
class HeldJob:
    """A job in a queue: its stored row and its parsed request."""

    row: JobRow
    held: Held

    @property
    def job_id(self) -> str:
        return self.row.job_id

    @property
    def queue(self) -> str:
        return self.row.queue


@dataclass(frozen=True, slots=True)
class Wait:
    """Why a job is not admitted now."""

    reason: WaitReason
    detail: str
    blocked_by: str | None = None  # priority: the job ahead of it


@dataclass(slots=True)
class Admission:
    """One tree's decision in one cycle."""

    quotas: Quotas  # usage with the admitted jobs added, in all and per GPU model
    admitted: list[tuple[HeldJob, bool]]  # in the order admitted; True: it borrows
    reclaims: list[tuple[HeldJob, Reclaim]]  # admitted jobs to preempt, and for whom
    waits: dict[str, Wait]  # job id -> why it waits
    queued: dict[str, list[HeldJob]]  # each queue's waiting jobs, in the order tried
    choices: dict[str, Choice] = field(default_factory=dict)  # admitted job -> its model

    @property
    def quota(self) -> QuotaState:
        return self.quotas.total


def decide(tree: QueueTree, top: str, jobs: Sequence[HeldJob], ordering: Ordering,
           now: float, models: ModelTrees | None = None,
           past_usage: Mapping[str, float] | None = None) -> Admission:
    """The decision for the tree under ``top``, from its held jobs (``seq`` order);
    ``models``: the tree's GPU models (``ModelTrees(tree)`` when not given);
    ``past_usage``: each queue's decayed GPU-seconds, for fair share over past use."""
    holding = [j for j in jobs if j.row.state in HOLDING]
    waiting = [j for j in jobs if j.row.state == "queued"]
    closed = [j for j in waiting if tree.specs[j.queue].state is QueueState.CLOSED]
    open_ = {j.held.request.job_id: j for j in waiting
             if tree.specs[j.queue].state is not QueueState.CLOSED}
    weights = {q: tree.specs[q].weight for q in tree.subtree(top)}
    capacity = tree.nominal[top][0] if tree.limited[top][0] else 0.0
    ordered = [open_[h.request.job_id] for h in
               ordering.order([j.held for j in open_.values()], now, weights, capacity,
                              past_usage)]
    models = models if models is not None and models.tree is tree else ModelTrees(tree)
    decision = Admission(Quotas.of(models, (
        (j.queue, j.row.gpu_model, j.held.demand, j.row.state == "reclaiming")
        for j in holding)), [], [], {}, {})
    _admit(tree, ordered, holding, decision)
    for j in closed:
        decision.waits[j.job_id] = Wait(WaitReason.QUEUE_CLOSED, f"queue {j.queue} is "
                                        "closed: it admits nothing until it is opened")
    for j in ordered:
        if j.held.request.job_id in decision.waits:
            decision.queued.setdefault(j.held.event.queue, []).append(j)
    for j in closed:
        decision.queued.setdefault(j.queue, []).append(j)
    return decision


def _admit(tree: QueueTree, ordered: list[HeldJob], holding: list[HeldJob],
           decision: Admission) -> None:
    """Steps 3 and 4 for the open queues' jobs, in ``ordered``'s order."""
    quotas, waits = decision.quotas, decision.waits
    arrays = ArrayCaps(j.held.event for j in holding)
    blocked: dict[str, str] = {}  # strict queue -> the job that holds it back
    deferred: list[HeldJob] = []  # borrowers, tried in pass 2
    held_back: set[str] = set()  # strict queues with a deferred job
    for first in (True, False):
        for j in ordered if first else deferred:
            h = j.held
            q = h.event.queue
            if q in blocked:
                waits[h.request.job_id] = Wait(WaitReason.PRIORITY,
                                               f"behind {blocked[q]} in strict queue {q}",
                                               blocked[q])
                continue
            if first and q in held_back:
                deferred.append(j)
                continue
            capped = arrays.full(h.event)
            if capped is not None:  # not a quota matter: it blocks no queue
                waits[h.request.job_id] = Wait(WaitReason.ARRAY_LIMIT, capped)
                continue
            verdict = quotas.check(q, h.demand, quotas.trees.choices(
                q, h.demand[0], h.event.spec.gpu_model_names))
            dec = verdict.decision
            if dec.admitted and dec.borrowing and first:
                deferred.append(j)
                if tree.specs[q].strategy == "strict":
                    held_back.add(q)
                continue
            if dec.admitted:
                quotas.add(q, h.demand, verdict.choice.key)
                arrays.add(h.event)
                decision.admitted.append((j, dec.borrowing))
                if verdict.choice != NO_MODEL:
                    decision.choices[h.request.job_id] = verdict.choice
                continue
            assert dec.reason is not None
            waits[h.request.job_id] = Wait(dec.reason, dec.detail)
            if dec.reclaim is not None:
                key = verdict.choice.key  # "" : the totals are short
                decision.reclaims += _pick_victims(quotas, key, replace(dec.reclaim, model=key),
                                                   holding, decision.reclaims)
                quotas.state(key).claim(q, (h.demand[0], 0.0, 0.0) if key else h.demand)
            if tree.specs[q].strategy == "strict":
                blocked[q] = h.request.job_id


def _pick_victims(quotas: Quotas, key: str, rc: Reclaim, holding: list[HeldJob],
                  already: list[tuple[HeldJob, Reclaim]]) -> list[tuple[HeldJob, Reclaim]]:
    """Borrowers' jobs to preempt, least valuable first (lowest priority class, then
    the most recently admitted: the least work lost), until the cohort's pool covers
    what its members draw. Jobs already being reclaimed count as gone. ``key``: the
    GPU model whose quota is short (only jobs admitted against it are picked), or ""
    for the totals."""
    quota = quotas.state(key)
    tree = quota.tree
    borrowers = set(quota.borrowers(rc.cohort, rc.member))
    if not borrowers:
        return []
    taken = {j.job_id for j, _ in already}
    cands = []
    for j in holding:
        r, req = j.row, j.held.request
        if r.state != "admitted" or r.job_id in taken or (key and r.gpu_model != key):
            continue
        branch = next((n for n in tree.path(r.queue) if tree.specs[n].parent == rc.cohort), None)
        if branch in borrowers and req.preemptible:
            cands.append((CLASS_RANK.get(req.priority_class, 1), req.priority,
                          -(r.admitted_at.timestamp() if r.admitted_at else 0.0), -r.seq, j))
    cands.sort(key=lambda c: c[:4])
    need = list(rc.need)
    out = []
    for *_, j in cands:
        if all(n <= EPS for n in need):
            break
        held = j.held.demand
        d = quota.mask(j.queue, (held[0], 0.0, 0.0) if key else held)
        if not any(d[i] > 0 and need[i] > EPS for i in range(3)):
            continue
        quotas.mark_freeing(j.queue, held, j.row.gpu_model)
        need = [max(0.0, need[i] - d[i]) for i in range(3)]
        out.append((j, rc))
    return out
