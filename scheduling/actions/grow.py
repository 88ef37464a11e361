"""The grow action: running elastic jobs take idle GPUs up to their most replicas,
outside the nodes claimed for preemptors or reserved, within their quota.

Higher static priority first, then the longest running; each new replica is a bind of
a ``grow`` resize.
"""

from __future__ import annotations

from scheduling.actions.base import Action
from scheduling.framework import JobInfo, Placing
from scheduling.model import Bind, Resize, ResizeReason, Resources
from scheduling.quota import QuotaBook
from scheduling.session import Session
from scheduling.victims import replica_of, task_of


class Grow(Action):
    name = "grow"

    def execute(self, s: Session) -> None:
        cycle = s.cycle
        allocs = cycle.snapshot.allocations
        block = s.hard | s.soft
        book = cycle.get(QuotaBook)
        runs = sorted((r for r in cycle.running
                       if r.elastic and not r.run.terminating and r.job.job_id not in s.victims),
                      key=lambda r: (-r.static_priority, r.run.start_time, r.job.job_id))
        for r in runs:
            job = r.job
            if not any(t.elastic and t.most_replicas > 0 for t in job.tasks):
                continue
            nodes = [cycle.table.index[allocs[k].node_id] for k in r.allocs if allocs[k].node_id in cycle.table.index]
            roles = [allocs[k].role or task_of(allocs[k]) for k in r.allocs]
            info = JobInfo(job=job, tasks=job.tasks, demand=Resources(), gpus=r.gpus, min_members=1)
            for t in job.tasks:
                if not t.elastic:
                    continue
                have = sorted(replica_of(allocs[k]) for k in r.allocs
                              if task_of(allocs[k]) == t.name and not s.gone[k])
                want = t.most_replicas - len(have)
                if want <= 0:
                    continue
                free_idx = [x for x in range(t.most_replicas + len(have)) if x not in set(have)][:want]
                base = s.placer.static_mask(info, t) & ~block
                binds: list[Bind] = []
                for rep in free_idx:
                    d = Resources(t.gpu_amount, t.cpu_milli, t.memory_mib)
                    if book is not None and not book.check(job.tenant, d).admitted:
                        break
                    p = Placing(info, t, cycle.state, 1, nodes, roles)
                    res = s.placer.choose(p, base)
                    if res is None:
                        break
                    i, uses = res
                    cycle.state.take(i, t.cpu_milli, t.memory_mib, uses)
                    b = Bind(job.job_id, f"{t.name}-{rep}", t.name, rep, cycle.table.node_ids[i], uses,
                             t.cpu_milli, t.memory_mib, t.role)
                    binds.append(b)
                    nodes.append(i)
                    roles.append(t.role)
                    s.account(job.tenant, d)
                if binds:
                    s.plan.resizes.append(Resize(job.job_id, t.name, len(have), len(have) + len(binds),
                                                 ResizeReason.GROW, binds=tuple(binds)))
