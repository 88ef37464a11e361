"""Queueing's admission decision as a pure function (``services/queueing/admit.py``) and
what it tells about the waiting jobs (``explain.py``): held jobs and a tree in, the
decision out, no database, no broker, no clock."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from services.queueing.admit import Admission, HeldJob, decide
from services.queueing.config import OrderingSpec, parse_queues
from services.queueing.explain import queue_statuses, waiting_lists
from services.queueing.ordering import Held, Ordering, demand, job_request
from services.queueing.quota import QueueTree, WaitReason
from services.queueing.store import JobRow
from shared.events import JobSubmitted
from shared.jobspec import parse_job_spec

NOW = 1_000_000.0
COHORT = {
    "cohorts": [{"name": "cluster"}],
    "queues": [
        {"name": "vision", "cohort": "cluster", "guaranteed": {"gpus": 4},
         "borrowing_limit": {"gpus": 2}},
        {"name": "nlp", "cohort": "cluster", "guaranteed": {"gpus": 4},
         "lending_limit": {"gpus": 2}},
    ],
}


def tree_of(data: dict[str, Any]) -> QueueTree:
    return QueueTree(parse_queues(data)[1])


def at(ts: float) -> datetime:
    return datetime.fromtimestamp(ts, UTC)


@dataclass
class Jobs:
    """Held jobs, built in arrival order: ``jobs.queued("nlp", gpus=2)``."""

    held: list[HeldJob] = field(default_factory=list)

    def add(self, queue: str, state: str, gpus: int = 1, *, admitted_at: float | None = None,
            started_at: float | None = None, estimate: float | None = None,
            reason: str = "", gpu_model: str | list[str] | None = None,
            holds_model: str = "", preemptible: bool = True) -> str:
        seq = len(self.held) + 1
        job_id = f"{queue}-{seq}"
        spec: dict[str, Any] = {"name": job_id, "queue": queue,
                                "tasks": [{"name": "w", "resources": {"gpu": gpus}}]}
        if estimate is not None:
            spec["runtimeEstimate"] = estimate
        if gpu_model is not None:
            spec["gpuModel"] = gpu_model
        if not preemptible:
            spec["preemptible"] = False
        sub = JobSubmitted(job_id=job_id, queue=queue, tenant="t", user="u",
                           spec=parse_job_spec(spec), submitted_at=at(NOW - 1000 + seq))
        req = job_request(sub, 1)
        row = JobRow(job_id, seq, queue, state, 1, "running" if started_at else state, False,
                     reason, 0, {}, at(admitted_at) if admitted_at else None,
                     at(started_at) if started_at else None, holds_model)
        self.held.append(HeldJob(row, Held(seq, sub, 1, req, demand(req))))
        return job_id

    def queued(self, queue: str, gpus: int = 1, **kw: Any) -> str:
        return self.add(queue, "queued", gpus, **kw)

    def admitted(self, queue: str, gpus: int = 1, **kw: Any) -> str:
        kw.setdefault("admitted_at", NOW - 500 + len(self.held))
        return self.add(queue, "admitted", gpus, **kw)


def run(tree: QueueTree, jobs: Jobs, policy: str = "priority") -> Admission:
    ordering = Ordering(OrderingSpec.model_validate({"policy": policy}))
    return decide(tree, tree.tops[0], jobs.held, ordering, NOW)


def admitted(d: Admission) -> list[tuple[str, bool]]:
    return [(j.job_id, borrowing) for j, borrowing in d.admitted]


def reasons(d: Admission) -> dict[str, WaitReason]:
    return {job_id: w.reason for job_id, w in d.waits.items()}


def test_a_queue_admits_within_its_quota_and_the_rest_wait_in_order() -> None:
    tree = tree_of({"queues": [{"name": "solo", "guaranteed": {"gpus": 4}}]})
    jobs = Jobs()
    ids = [jobs.queued("solo", gpus=1) for _ in range(6)]
    d = run(tree, jobs)
    assert admitted(d) == [(i, False) for i in ids[:4]]
    assert reasons(d) == {ids[4]: WaitReason.QUOTA, ids[5]: WaitReason.QUOTA}
    assert [j.job_id for j in d.queued["solo"]] == ids[4:]
    assert d.quota.used["solo"][0] == 4


def test_a_queue_borrows_from_its_cohort_up_to_its_borrowing_limit() -> None:
    jobs = Jobs()
    ids = [jobs.queued("vision") for _ in range(7)]
    d = run(tree_of(COHORT), jobs)
    assert admitted(d) == [(i, False) for i in ids[:4]] + [(i, True) for i in ids[4:6]]
    assert reasons(d) == {ids[6]: WaitReason.QUOTA}


def test_owners_within_their_guarantee_go_before_borrowers() -> None:
    jobs = Jobs()
    for _ in range(4):
        jobs.admitted("vision")
    jobs.admitted("nlp", gpus=2)
    borrower = jobs.queued("vision")  # first in line (FIFO), but it would borrow
    owner = jobs.queued("nlp", gpus=2)  # within nlp's guarantee
    d = run(tree_of(COHORT), jobs, policy="fifo")
    assert admitted(d) == [(owner, False)]
    assert reasons(d) == {borrower: WaitReason.QUOTA}


def test_an_owner_whose_share_was_lent_out_reclaims_the_latest_borrowers() -> None:
    jobs = Jobs()
    vision = [jobs.admitted("vision") for _ in range(6)]  # 2 borrowed from nlp
    owner = jobs.queued("nlp", gpus=4)
    d = run(tree_of(COHORT), jobs)
    assert admitted(d) == []
    assert reasons(d) == {owner: WaitReason.RECLAIM}
    assert [j.job_id for j, _ in d.reclaims] == [vision[5], vision[4]]  # latest first
    assert {(rc.cohort, rc.member) for _, rc in d.reclaims} == {("cluster", "nlp")}


def test_jobs_being_reclaimed_count_as_gone_so_no_more_are_asked_to_stop() -> None:
    jobs = Jobs()
    for _ in range(4):
        jobs.admitted("vision")
    for _ in range(2):
        jobs.add("vision", "reclaiming", admitted_at=NOW - 10)
    owner = jobs.queued("nlp", gpus=4)
    d = run(tree_of(COHORT), jobs)
    assert reasons(d) == {owner: WaitReason.RECLAIM}
    assert d.reclaims == []


def test_a_strict_queue_holds_back_what_is_behind_its_blocked_head() -> None:
    tree = tree_of({"queues": [{"name": "s", "guaranteed": {"gpus": 4},
                                "strategy": "strict"}]})
    jobs = Jobs()
    jobs.admitted("s", gpus=2)
    head = jobs.queued("s", gpus=4)
    small = jobs.queued("s", gpus=1)
    d = run(tree, jobs, policy="fifo")
    assert admitted(d) == []
    assert reasons(d) == {head: WaitReason.QUOTA, small: WaitReason.PRIORITY}
    assert d.waits[small].detail == f"behind {head} in strict queue s"
    assert (d.waits[small].blocked_by, d.waits[head].blocked_by) == (head, None)
    # the queue's waiting list says so too, as the shared vocabulary's codes
    listed, _ = waiting_lists(d, jobs.held, NOW)
    assert [(w.job_id, w.reason, w.blocked_by) for w in listed["s"]] == [
        (head, WaitReason.QUOTA, None), (small, WaitReason.PRIORITY, head)]


def test_a_closed_queue_admits_nothing_and_its_jobs_are_listed_last() -> None:
    tree = tree_of({"cohorts": [{"name": "c"}],
                    "queues": [{"name": "open", "cohort": "c", "guaranteed": {"gpus": 1}},
                               {"name": "shut", "cohort": "c", "state": "closed"}]})
    jobs = Jobs()
    shut = jobs.queued("shut")
    first = jobs.queued("open")
    second = jobs.queued("open")
    d = run(tree, jobs)
    assert admitted(d) == [(first, False)]
    assert reasons(d) == {second: WaitReason.QUOTA, shut: WaitReason.QUEUE_CLOSED}
    assert list(d.queued) == ["open", "shut"]


def test_a_quota_wait_is_estimated_from_the_runtimes_of_the_jobs_holding_it() -> None:
    tree = tree_of({"queues": [{"name": "solo", "guaranteed": {"gpus": 2}}]})
    jobs = Jobs()
    jobs.admitted("solo", started_at=NOW - 50, estimate=100)  # ends at NOW + 50
    jobs.admitted("solo", started_at=NOW - 10, estimate=100)  # ends at NOW + 90
    first = jobs.queued("solo")
    second = jobs.queued("solo", reason="quota")
    d = run(tree, jobs)
    listed, notices = waiting_lists(d, jobs.held, NOW)
    assert [(w.job_id, w.position, w.estimated_start) for w in listed["solo"]] == [
        (first, 1, at(NOW + 50)), (second, 2, at(NOW + 90))]
    assert [n.job.job_id for n in notices] == [first]  # the other's reason is unchanged
    [status] = queue_statuses(["solo"], jobs.held, d, listed)
    assert (status.pending, status.admitted, status.running) == (2, 0, 2)
    assert status.used["gpus"] == 2


def test_the_decision_is_the_same_for_the_same_input() -> None:
    jobs = Jobs()
    for _ in range(5):
        jobs.admitted("vision")
    for q in ("nlp", "vision", "nlp", "vision"):
        jobs.queued(q, gpus=2)
    tree = tree_of(COHORT)
    one, two = run(tree, jobs), run(tree, jobs)
    assert admitted(one) == admitted(two)
    assert one.waits == two.waits
    assert [j.job_id for j, _ in one.reclaims] == [j.job_id for j, _ in two.reclaims]
