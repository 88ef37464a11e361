"""The scheduling core's view of what the scheduler holds (``Snapshot``), built each cycle.

Objects are reused across cycles where nothing changed: the core keeps its node table
(numpy arrays) by the identity of the nodes tuple and diffs allocations by identity, so
this builder keeps the nodes tuple, each allocation and each ``JobRequest`` until what
they describe changes. A request takes the history's estimate and samples of its tenant
and size when its attempt queues and again when it starts (``_request``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from scheduling import Allocation, GpuSlot, JobRequest, Node, RunningJob, Snapshot
from scheduling.mig import Instance
from services.scheduler.history import gpu_key
from services.scheduler.model import Cluster, NodeView, SchedJob
from shared.events import JobState
from shared.gpu_models import model_id
from shared.job_request import job_request as shared_job_request
from shared.node_constraints import hard_taints


def job_request(job: SchedJob, caps: Mapping[str, int] | None = None) -> JobRequest:
    assert job.ready is not None
    r = job.ready
    return shared_job_request(r.spec, job_id=job.job_id, queue=r.queue, tenant=r.tenant,
                              user=r.user, submitted_at=r.submitted_at, attempt=job.attempt,
                              targets=job.targets, caps=caps, admitted_models=r.gpu_models,
                              billing_weights=r.billing_weights)


def core_node(n: NodeView) -> Node:
    return Node(
        node_id=n.inventory.node_id,
        cpu_milli=n.inventory.cpu_milli,
        memory_mib=n.inventory.memory_mib,
        gpus=[GpuSlot(g.index, g.uuid, model_id(g.model, g.memory_mib), g.memory_mib,
                      g.nvlink_domain, healthy=g.index not in n.degraded_gpus, mig_mode=g.mig_mode,
                      mig=tuple(Instance(m.profile, m.start, m.size) for m in g.mig_instances))
              for g in n.inventory.gpus],
        labels={**n.inventory.labels, **n.admin_labels},
        taints=hard_taints([*n.inventory.taints, *n.admin_taints]),
        rack=n.inventory.rack,
        schedulable=not n.lost and not n.cordon,
        cordoned=bool(n.cordon),
        datasets=n.current_datasets(),
    )


def caps(job: SchedJob) -> dict[str, int] | None:
    """A group with a replica that completed is finishing: it does not grow again."""
    done = {p.task_name for p in job.current() if p.state is JobState.SUCCEEDED}
    return {n: len(job.active(n)) for n in done} or None


class SnapshotBuilder:
    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self._nodes: tuple[Node, ...] = ()
        self._nodes_version = -1  # of ``cluster.nodes_version`` that ``_nodes`` shows
        self._allocs: dict[tuple[str, str, int], Allocation] = {}
        # the request as the spec makes it, its GPU key, whether it was filled from the
        # history while running (None: not filled yet), and the request filled
        self._requests: dict[tuple[Any, ...], tuple[JobRequest, int, Any, JobRequest]] = {}

    def nodes(self) -> tuple[Node, ...]:
        """The same tuple while the inventory is unchanged."""
        if self._nodes_version != self.cluster.nodes_version:
            self._nodes = tuple(core_node(n) for n in self.cluster.nodes.values())
            self._nodes_version = self.cluster.nodes_version
        return self._nodes

    def _request(self, job: SchedJob, owner: str | None = None,
                 caps: dict[str, int] | None = None, running: bool = False) -> JobRequest:
        """The attempt's request with the history's estimate and samples as they were when
        it queued, and again when it started: not renewed while it waits or runs, so that
        a job's rank moves with its own progress only. Renewed with every success of its
        size, ranks shifted under running jobs and they were stopped for noise
        (docs/design/simulator.md: "What a job knows of its similar jobs, and when")."""
        key = (owner or job.job_id, job.attempt, tuple(sorted(job.targets.items())),
               tuple(sorted((caps or {}).items())))
        hit = self._requests.get(key)
        if hit is None:
            req = job_request(job, caps)
            if owner is not None:
                req = replace(req, job_id=owner)
            hit = self._requests[key] = (req, gpu_key(req), None, req)
        history = self.cluster.history
        if history is not None and hit[2] != running:  # first seen, or first seen running
            name = job.ready.spec.name if job.ready is not None else None
            hit = self._requests[key] = (hit[0], hit[1], running, history.fill(hit[0], hit[1], name))
        return hit[3]

    def snapshot(self, now: float) -> Snapshot:
        """Tasks of an older attempt still stopping hold their resources under a job id
        of their own (``<job>~<attempt>``), marked terminating, so the core neither
        confuses them with the pending retry nor preempts them again."""
        jobs = self.cluster.jobs
        allocations: list[Allocation] = []
        running: list[RunningJob] = []
        live_keys: set[tuple[str, str, int]] = set()
        for job in jobs.values():
            live = list(job.live())
            if not live or job.ready is None:
                continue
            # replicas a shrink is stopping hold their resources apart from the job
            # (``<job>~<attempt>~rz``, terminating), so the core neither counts them as
            # the job's replicas nor shrinks them again
            for attempt, removed in sorted({(p.attempt, p.removed) for p in live}):
                current = attempt == job.attempt and not removed and job.state in (
                    JobState.BOUND, JobState.RUNNING)
                owner = job.job_id if current else (
                    f"{job.job_id}~{attempt}" + ("~rz" if removed else ""))
                for p in live:
                    if p.attempt != attempt or p.removed is not removed:
                        continue
                    key = (owner, p.task_id, attempt)
                    live_keys.add(key)
                    alloc = self._allocs.get(key)
                    if alloc is None:
                        alloc = self._allocs[key] = Allocation(
                            owner, p.core_id, p.node_id, p.gpus, p.cpu_milli, p.memory_mib,
                            p.task_name)
                    allocations.append(alloc)
                request = self._request(job, None if current else owner,
                                        caps(job) if current else None, running=True)
                running.append(RunningJob(
                    request, start_time=job.bound_at if job.bound_at is not None else now,
                    terminating=not current or job.preempted or job.ending))
        for key in self._allocs.keys() - live_keys:
            del self._allocs[key]
        # a retry waits until its last attempt's tasks have stopped: a job never runs in
        # two places (a stopping task may run on through its checkpoint grace)
        pending = tuple(
            self._request(j) for j in sorted(
                (j for j in jobs.values() if j.state is JobState.ADMITTED
                 and not any(p.attempt < j.attempt for p in j.live())),
                key=lambda j: j.seq)
        )
        if len(self._requests) > 4 * (len(jobs) + 64):  # forget ended jobs' requests
            keep = {(j.job_id, j.attempt) for j in jobs.values()}
            self._requests = {k: v for k, v in self._requests.items()
                              if (k[0].split("~")[0], k[1]) in keep}
        return Snapshot(now=now, nodes=self.nodes(), allocations=tuple(allocations),
                        pending=pending, running=tuple(running))
