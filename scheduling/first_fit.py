"""Plain first fit with all-or-nothing gangs: the baseline every policy is compared to."""

from __future__ import annotations

from scheduling.capacity import NodeFree, build_capacity
from scheduling.model import Bind, JobRequest, PendingReason, Plan, Snapshot


def _place_job(job: JobRequest, free: dict[str, NodeFree]) -> list[Bind] | None:
    """Place every replica of the job's gang, or nothing (rolled back)."""
    binds: list[Bind] = []
    for t in job.tasks:
        for r in range(t.replicas):
            for nf in free.values():
                uses = nf.fit(t)
                if uses is not None:
                    nf.take(t.cpu_milli, t.memory_mib, uses)
                    binds.append(
                        Bind(job.job_id, f"{t.name}-{r}", t.name, r, nf.node.node_id, uses,
                             t.cpu_milli, t.memory_mib)
                    )
                    break
            else:
                for b in binds:
                    free[b.node_id].take(b.cpu_milli, b.memory_mib, b.gpus, sign=-1)
                return None
    return binds


def first_fit(snapshot: Snapshot) -> Plan:
    """Jobs in the given order; each placed whole on the first nodes that hold it."""
    free = build_capacity(snapshot.nodes, snapshot.allocations)
    plan = Plan()
    for job in snapshot.pending:
        binds = _place_job(job, free)
        if binds is None:
            plan.pending[job.job_id] = PendingReason.NO_FIT
        else:
            plan.binds.extend(binds)
    return plan
