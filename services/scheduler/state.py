"""The scheduler's view of the cluster and the jobs it holds, updated from events.

Pure bookkeeping: events in, ``Output`` (events to publish, rows to persist) out. The
placement decision itself comes from the scheduling core (``scheduling``), called in
``cycle()`` with a snapshot built here.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

from scheduling import (
    Allocation,
    GpuSlot,
    GpuUse,
    JobRequest,
    Node,
    Plan,
    RunningJob,
    Snapshot,
    TaskRequest,
)
from shared.events import (
    Binding,
    BindingAction,
    ClusterMember,
    CommandAction,
    Envelope,
    Event,
    GpuAssignment,
    JobCommand,
    JobReady,
    JobState,
    JobStatus,
    NodeHeartbeat,
    NodeInventory,
    NodeLost,
    NodeRegistered,
    NodeTelemetry,
    TaskBinding,
)
from shared.topics import topic_for

TERMINAL = {JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED, JobState.PREEMPTED}


@dataclass
class Placed:
    """One task of one attempt on a node; holds its resources until it is terminal."""

    task_id: str
    task_name: str
    replica: int
    rank: int
    node_id: str
    gpus: tuple[GpuUse, ...]
    cpu_milli: int
    memory_mib: int
    attempt: int
    state: JobState = JobState.BOUND

    def to_json(self) -> dict[str, Any]:
        return {**{k: getattr(self, k) for k in (
            "task_id", "task_name", "replica", "rank", "node_id", "cpu_milli", "memory_mib",
            "attempt")}, "state": self.state.value,
            "gpus": [[g.index, g.memory_mib, g.compute_pct] for g in self.gpus]}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Placed:
        return cls(**{**d, "state": JobState(d["state"]),
                      "gpus": tuple(GpuUse(*g) for g in d["gpus"])})


@dataclass
class SchedJob:
    job_id: str
    ready: JobReady | None  # None for a tombstone (cancel seen before the job)
    state: JobState
    attempt: int
    seq: int  # arrival order, for FIFO among pending jobs
    placed: list[Placed] = field(default_factory=list)  # includes tasks of older attempts
    cancel_requested: bool = False
    bound_at: float | None = None  # when the current attempt was placed (scheduler clock)
    preempted_by: str = ""  # set while its tasks are asked to stop for another job

    def live(self) -> Iterator[Placed]:
        return (p for p in self.placed if p.state not in TERMINAL)

    def current(self) -> list[Placed]:
        return [p for p in self.placed if p.attempt == self.attempt]


@dataclass
class NodeView:
    inventory: NodeInventory
    lost: bool = False
    degraded_gpus: frozenset[int] = frozenset()


@dataclass
class Output:
    """What handling produced: events to publish and the jobs whose rows changed."""

    events: list[tuple[Envelope, str]] = field(default_factory=list)
    dirty_jobs: set[str] = field(default_factory=set)
    dirty_nodes: set[str] = field(default_factory=set)

    def emit(self, event: Event, source: str, event_id: str | None = None) -> None:
        self.events.append((Envelope.wrap(event, source, event_id), topic_for(event).name))


def job_request(job: SchedJob) -> JobRequest:
    assert job.ready is not None
    spec = job.ready.spec
    return JobRequest(
        job_id=job.job_id,
        tasks=tuple(
            TaskRequest(name=t.name, role=t.effective_role, replicas=t.replicas,
                        gpu=t.resources.gpu, gpu_memory_mib=t.resources.gpu_memory,
                        gpu_compute_pct=t.resources.gpu_compute, cpu_milli=t.resources.cpu,
                        memory_mib=t.resources.memory)
            for t in spec.tasks),
        queue=job.ready.queue,
        tenant=job.ready.tenant,
        user=job.ready.user,
        priority=spec.priority,
        priority_class=spec.priority_class.value,
        submit_time=job.ready.submitted_at.timestamp(),
        min_available=spec.min_available,
        runtime_estimate_s=spec.runtime_estimate,
        preemptible=spec.preemptible,
        attempt=job.attempt,
    )


Placer = Callable[[Snapshot], Plan]


class SchedulerState:
    SOURCE = "scheduler"

    def __init__(self, epoch: int, placer: Placer) -> None:
        self.epoch = epoch
        self.placer = placer
        self.nodes: dict[str, NodeView] = {}
        self.jobs: dict[str, SchedJob] = {}
        self.telemetry: dict[str, NodeTelemetry] = {}
        self.pending_reasons: dict[str, str] = {}
        self.finished: set[str] = set()  # ended jobs, evicted from ``jobs`` once persisted
        self._node_cache: tuple[Node, ...] | None = None
        self._allocs: dict[tuple[str, str, int], Allocation] = {}
        self._requests: dict[tuple[str, int], JobRequest] = {}
        self._seq = 0
        self.needs_cycle = True

    # --- events in ---------------------------------------------------------------------

    def handle(self, event: Event, out: Output) -> None:
        if isinstance(event, JobReady):
            self._on_ready(event, out)
        elif isinstance(event, JobStatus):
            if event.task is not None:
                self._on_task_status(event, out)
        elif isinstance(event, JobCommand):
            if event.action is CommandAction.CANCEL:
                self._on_cancel(event, out)
        elif isinstance(event, NodeRegistered):
            self.nodes[event.inventory.node_id] = NodeView(event.inventory)
            self._node_cache = None
            out.dirty_nodes.add(event.inventory.node_id)
            self.needs_cycle = True
        elif isinstance(event, NodeHeartbeat):
            view = self.nodes.get(event.node_id)
            if view is not None and view.lost:
                view.lost = False
                self._node_cache = None
                out.dirty_nodes.add(event.node_id)
                self.needs_cycle = True
        elif isinstance(event, NodeLost):
            self._on_node_lost(event, out)
        elif isinstance(event, NodeTelemetry):
            self.telemetry[event.node_id] = event
            view = self.nodes.get(event.node_id)
            if view is not None:
                degraded = frozenset(g.index for g in event.gpus if g.health != "healthy")
                if degraded != view.degraded_gpus:
                    view.degraded_gpus = degraded
                    self._node_cache = None
                    self.needs_cycle = True

    def _next_seq(self) -> int:
        self._seq += 1
        return self._seq

    def _on_ready(self, ev: JobReady, out: Output) -> None:
        job = self.jobs.get(ev.job_id)
        if ev.job_id in self.finished:
            return  # a replay of a job that already ended (e.g. an outbox refill)
        if job is not None and job.ready is None:  # cancelled before it reached us
            job.ready = ev
            job.attempt = ev.attempt
            job.state = JobState.CANCELLED
            out.dirty_jobs.add(job.job_id)
            self._status(out, job, JobState.CANCELLED, "cancelled before placement")
            return
        if job is not None and ev.attempt <= job.attempt:
            return  # a replay
        self.jobs[ev.job_id] = SchedJob(ev.job_id, ev, JobState.ADMITTED, ev.attempt,
                                        self._next_seq())
        out.dirty_jobs.add(ev.job_id)
        self.needs_cycle = True

    def _on_cancel(self, cmd: JobCommand, out: Output) -> None:
        job = self.jobs.get(cmd.job_id)
        if job is None:
            self.jobs[cmd.job_id] = SchedJob(cmd.job_id, None, JobState.CANCELLED, 0,
                                             self._next_seq(), cancel_requested=True)
            out.dirty_jobs.add(cmd.job_id)
            return
        if job.state in TERMINAL - {JobState.PREEMPTED} or job.cancel_requested:
            return
        job.cancel_requested = True
        out.dirty_jobs.add(job.job_id)
        if job.state is JobState.ADMITTED:
            job.state = JobState.CANCELLED
            self._status(out, job, JobState.CANCELLED, cmd.reason or "cancelled")
        else:
            self._stop_tasks(job, out, "cancelled")

    def _on_task_status(self, st: JobStatus, out: Output) -> None:
        job = self.jobs.get(st.job_id)
        if job is None:
            return
        placed = next((p for p in job.placed
                       if p.task_id == st.task and p.attempt == st.attempt), None)
        if placed is None or placed.state in TERMINAL:
            return
        if st.state is JobState.RUNNING:
            if placed.state is not JobState.BOUND:
                return
            placed.state = JobState.RUNNING
        elif st.state in TERMINAL:
            placed.state = st.state
            self.needs_cycle = True  # resources freed
        else:
            return
        out.dirty_jobs.add(job.job_id)
        if st.attempt != job.attempt:
            return  # a straggler of an older attempt: only its resources mattered
        self._advance(job, st, out)

    def _advance(self, job: SchedJob, st: JobStatus, out: Output) -> None:
        tasks = job.current()
        states = {p.state for p in tasks}
        if job.cancel_requested:
            if all(s in TERMINAL for s in states):
                job.state = JobState.CANCELLED
                self._status(out, job, JobState.CANCELLED, "cancelled")
            return
        if st.state is JobState.RUNNING and job.state is JobState.BOUND and states == {
                JobState.RUNNING}:
            job.state = JobState.RUNNING
            self._status(out, job, JobState.RUNNING, "all tasks running")
        elif states == {JobState.SUCCEEDED}:
            job.state = JobState.SUCCEEDED
            self._status(out, job, JobState.SUCCEEDED, "all tasks succeeded", exit_code=0)
        elif st.state in (JobState.FAILED, JobState.CANCELLED, JobState.PREEMPTED) and \
                job.state in (JobState.BOUND, JobState.RUNNING):
            self._retry_or_fail(job, out, f"task {st.task} {st.state.value}: {st.reason}",
                                st.exit_code)

    def _retry_or_fail(self, job: SchedJob, out: Output, why: str, exit_code: int | None) -> None:
        assert job.ready is not None
        if job.preempted_by:  # its tasks were already asked to stop
            self._status(out, job, JobState.PREEMPTED, f"preempted for {job.preempted_by}")
            job.preempted_by = ""
        else:
            self._stop_tasks(job, out, why)
        if job.attempt <= job.ready.spec.max_retry:
            job.attempt += 1
            job.state = JobState.ADMITTED
            job.seq = self._next_seq()
            self._status(out, job, JobState.ADMITTED, f"retry after {why}")
            self.needs_cycle = True
        else:
            job.state = JobState.FAILED
            self._status(out, job, JobState.FAILED, f"out of retries: {why}", exit_code=exit_code)

    def _on_node_lost(self, ev: NodeLost, out: Output) -> None:
        view = self.nodes.get(ev.node_id)
        if view is None or view.lost:
            return
        view.lost = True
        self._node_cache = None
        out.dirty_nodes.add(ev.node_id)
        for job in list(self.jobs.values()):
            hit = [p for p in job.live() if p.node_id == ev.node_id]
            if not hit:
                continue
            for p in hit:  # the node is gone: its tasks hold nothing any more
                p.state = JobState.FAILED
            out.dirty_jobs.add(job.job_id)
            if job.state in (JobState.BOUND, JobState.RUNNING) and any(
                    p.attempt == job.attempt for p in hit):
                if job.cancel_requested:
                    self._advance(job, JobStatus(job_id=job.job_id, state=JobState.FAILED,
                                                 reason="node lost", attempt=job.attempt), out)
                else:
                    self._retry_or_fail(job, out, f"node {ev.node_id} lost", None)
        self.needs_cycle = True

    # --- the cycle ---------------------------------------------------------------------

    def _nodes(self) -> tuple[Node, ...]:
        """The same tuple while the inventory is unchanged: the core keeps its node table
        (numpy arrays) by this identity and rebuilds it only on a change."""
        if self._node_cache is None:
            self._node_cache = tuple(
                Node(
                    node_id=n.inventory.node_id,
                    cpu_milli=n.inventory.cpu_milli,
                    memory_mib=n.inventory.memory_mib,
                    gpus=[GpuSlot(g.index, g.uuid, g.model, g.memory_mib, g.nvlink_domain,
                                  healthy=g.index not in n.degraded_gpus)
                          for g in n.inventory.gpus],
                    labels=dict(n.inventory.labels),
                    rack=n.inventory.rack,
                    schedulable=not n.lost,
                )
                for n in self.nodes.values()
            )
        return self._node_cache

    def _request(self, job: SchedJob, owner: str | None = None) -> JobRequest:
        key = (owner or job.job_id, job.attempt)
        req = self._requests.get(key)
        if req is None:
            req = job_request(job)
            if owner is not None:
                req = replace(req, job_id=owner)
            self._requests[key] = req
        return req

    def snapshot(self, now: float) -> Snapshot:
        """The core's view. Tasks of an older attempt still stopping hold their resources
        under a job id of their own (``<job>~<attempt>``), marked terminating, so the core
        neither confuses them with the pending retry nor preempts them again. Objects are
        reused across cycles where nothing changed: the core diffs allocations by identity."""
        allocations: list[Allocation] = []
        running: list[RunningJob] = []
        live_keys: set[tuple[str, str, int]] = set()
        for job in self.jobs.values():
            live = list(job.live())
            if not live or job.ready is None:
                continue
            for attempt in sorted({p.attempt for p in live}):
                current = attempt == job.attempt and job.state in (JobState.BOUND,
                                                                  JobState.RUNNING)
                owner = job.job_id if current else f"{job.job_id}~{attempt}"
                for p in live:
                    if p.attempt != attempt:
                        continue
                    key = (owner, p.task_id, attempt)
                    live_keys.add(key)
                    alloc = self._allocs.get(key)
                    if alloc is None:
                        alloc = self._allocs[key] = Allocation(
                            owner, p.task_id, p.node_id, p.gpus, p.cpu_milli, p.memory_mib,
                            p.task_name)
                    allocations.append(alloc)
                request = self._request(job, None if current else owner)
                running.append(RunningJob(
                    request, start_time=job.bound_at if job.bound_at is not None else now,
                    terminating=not current or bool(job.preempted_by) or job.cancel_requested))
        for key in self._allocs.keys() - live_keys:
            del self._allocs[key]
        pending = tuple(
            self._request(j) for j in sorted(
                (j for j in self.jobs.values() if j.state is JobState.ADMITTED),
                key=lambda j: j.seq)
        )
        if len(self._requests) > 4 * (len(self.jobs) + 64):  # forget ended jobs' requests
            keep = {(j.job_id, j.attempt) for j in self.jobs.values()}
            self._requests = {k: v for k, v in self._requests.items()
                              if (k[0].split("~")[0], k[1]) in keep}
        return Snapshot(now=now, nodes=self._nodes(), allocations=tuple(allocations),
                        pending=pending, running=tuple(running))

    def cycle(self, now: float, out: Output) -> Plan:
        self.needs_cycle = False
        plan = self.placer(self.snapshot(now))
        self.pending_reasons = {k: v.value for k, v in plan.pending.items()}
        for pre in plan.preemptions:
            victim = self.jobs.get(pre.job_id)
            if victim is None or victim.preempted_by or victim.state not in (
                    JobState.BOUND, JobState.RUNNING):
                continue
            victim.preempted_by = pre.preemptor
            out.dirty_jobs.add(victim.job_id)
            self._stop_tasks(victim, out, f"preempted ({pre.reason.value}) for {pre.preemptor}",
                             grace_s=pre.grace_period_s)
        for job_id, binds in plan.binds_by_job().items():
            job = self.jobs[job_id]
            assert job.ready is not None
            order = {t.name: i for i, t in enumerate(job.ready.spec.tasks)}
            binds.sort(key=lambda b: (order[b.task_name], b.replica))
            new = [Placed(b.task_id, b.task_name, b.replica, rank, b.node_id, b.gpus,
                          b.cpu_milli, b.memory_mib, job.attempt)
                   for rank, b in enumerate(binds)]
            job.placed = [p for p in job.placed if p.state not in TERMINAL] + new
            job.state = JobState.BOUND
            job.bound_at = now
            out.dirty_jobs.add(job_id)
            self._publish_bindings(job, new, out)
            self._status(out, job, JobState.BOUND, f"placed on {len({p.node_id for p in new})}"
                         " node(s)")
        return plan

    def _publish_bindings(self, job: SchedJob, tasks: list[Placed], out: Output) -> None:
        assert job.ready is not None
        spec = job.ready.spec
        by_name = {t.name: t for t in spec.tasks}
        master = min(tasks, key=lambda p: p.rank)
        master_addr = self._address(master.node_id)
        by_node: dict[str, list[Placed]] = {}
        for p in tasks:
            by_node.setdefault(p.node_id, []).append(p)
        cluster = [ClusterMember(role=by_name[p.task_name].effective_role, rank=p.rank,
                                 host=self._address(p.node_id)) for p in tasks]
        for node_id, placed in by_node.items():
            inv = self.nodes[node_id].inventory if node_id in self.nodes else None
            uuids = {g.index: g.uuid for g in inv.gpus} if inv else {}
            binding = Binding(
                binding_id=f"{job.job_id}-{job.attempt}-{node_id}",
                action=BindingAction.ALLOCATE, node_id=node_id, epoch=self.epoch,
                job_id=job.job_id, attempt=job.attempt, world_size=len(tasks),
                master_addr=master_addr, duration_s=spec.duration, cluster=cluster,
                tasks=[TaskBinding(
                    task_id=p.task_id, task_name=p.task_name,
                    role=by_name[p.task_name].effective_role, replica=p.replica, rank=p.rank,
                    local_rank=local,
                    gpus=[GpuAssignment(index=g.index, uuid=uuids.get(g.index, ""),
                                        memory_mib=g.memory_mib, compute_pct=g.compute_pct)
                          for g in p.gpus],
                    cpu_milli=p.cpu_milli, memory_mib=p.memory_mib,
                    image=by_name[p.task_name].image, command=by_name[p.task_name].command,
                    env=by_name[p.task_name].env) for local, p in enumerate(placed)])
            out.emit(binding, self.SOURCE, event_id=f"bind-{binding.binding_id}-e{self.epoch}")

    def _address(self, node_id: str) -> str:
        view = self.nodes.get(node_id)
        return (view.inventory.address or node_id) if view else node_id

    def _stop_tasks(self, job: SchedJob, out: Output, reason: str,
                    grace_s: float = 30.0) -> None:
        by_node: dict[tuple[str, int], list[Placed]] = {}
        for p in job.live():
            by_node.setdefault((p.node_id, p.attempt), []).append(p)
        for (node_id, attempt), placed in by_node.items():
            out.emit(Binding(
                binding_id=f"{job.job_id}-{attempt}-{node_id}-stop",
                action=BindingAction.STOP, node_id=node_id, epoch=self.epoch,
                job_id=job.job_id, attempt=attempt, reason=reason, grace_period_s=grace_s,
                tasks=[TaskBinding(task_id=p.task_id, task_name=p.task_name, role="",
                                   replica=p.replica, rank=p.rank) for p in placed],
            ), self.SOURCE, event_id=f"stop-{job.job_id}-{attempt}-{node_id}-e{self.epoch}")

    def republish(self, out: Output) -> None:
        """After taking leadership: fence every node with the new epoch, so a late
        decision of the old leader is refused, then resend what agents may have missed."""
        for node_id in self.nodes:
            out.emit(Binding(binding_id=f"fence-{node_id}-e{self.epoch}",
                             action=BindingAction.FENCE, node_id=node_id, epoch=self.epoch,
                             job_id="", reason="new leader"), self.SOURCE,
                     event_id=f"fence-{node_id}-e{self.epoch}")
        for job in self.jobs.values():
            if job.state is JobState.BOUND and not job.cancel_requested:
                self._publish_bindings(job, job.current(), out)
            if job.cancel_requested and any(True for _ in job.live()):
                self._stop_tasks(job, out, "cancelled")

    def _status(self, out: Output, job: SchedJob, state: JobState, reason: str,
                exit_code: int | None = None) -> None:
        out.emit(JobStatus(job_id=job.job_id, state=state, reason=reason, attempt=job.attempt,
                           exit_code=exit_code, epoch=self.epoch), self.SOURCE,
                 event_id=f"{state.value}-{job.job_id}-{job.attempt}")

    # --- persistence -------------------------------------------------------------------

    def job_row(self, job_id: str) -> dict[str, Any]:
        job = self.jobs[job_id]
        return {
            "job_id": job.job_id,
            "state": job.state.value,
            "attempt": job.attempt,
            "ready": job.ready.model_dump_json() if job.ready else "{}",
            "placement": [p.to_json() for p in job.placed],
            "tasks": {"seq": job.seq, "cancel_requested": job.cancel_requested,
                      "bound_at": job.bound_at, "preempted_by": job.preempted_by},
        }

    def evict_finished(self) -> None:
        """Drop ended jobs that hold nothing any more (call after persisting them)."""
        for job_id in [j.job_id for j in self.jobs.values()
                       if j.state in TERMINAL and j.ready is not None
                       and not any(True for _ in j.live())]:
            del self.jobs[job_id]
            self.finished.add(job_id)

    def load_job(self, row: dict[str, Any]) -> None:
        meta = row["tasks"]
        ready = JobReady.model_validate(row["ready"]) if row["ready"] else None
        job = SchedJob(row["job_id"], ready, JobState(row["state"]), row["attempt"],
                       meta.get("seq", 0), [Placed.from_json(p) for p in row["placement"]],
                       meta.get("cancel_requested", False), meta.get("bound_at"),
                       meta.get("preempted_by", ""))
        self.jobs[job.job_id] = job
        self._seq = max(self._seq, job.seq)
