"""The scheduler's view of the cluster and the jobs it holds, updated from events.

Pure bookkeeping: events in, ``Output`` (events to publish, rows to persist) out. The
placement decision itself comes from the scheduling core (``scheduling``), called in
``cycle()`` with a snapshot built here.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from scheduling import (
    Allocation,
    GpuSlot,
    GpuUse,
    JobRequest,
    Node,
    Plan,
    Resize,
    ResizeReason,
    RunningJob,
    Snapshot,
)
from services.scheduler.explain import PendingNotices
from shared.elastic_resize import ResizeRefused, elastic_task
from shared.events import (
    FENCED,
    RETURNED,
    TIME_LIMIT_REACHED,
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
    NodeAction,
    NodeCommand,
    NodeHeartbeat,
    NodeInventory,
    NodeLost,
    NodeRegistered,
    NodeSchedulability,
    NodeSchedulingChanged,
    NodeTelemetry,
    TaskBinding,
)
from shared.job_request import job_request as shared_job_request
from shared.jobspec import TaskSpec
from shared.logging import get_logger
from shared.topics import topic_for

log = get_logger(__name__)

TERMINAL = {JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED, JobState.PREEMPTED}
DEFAULT_GRACE_S = 30.0  # checkpoint grace when the core gives none (JobRequest's default)
HELD_S = 10 * 365 * 86400.0  # a simulated interactive session runs until returned / its limit
# Node losses are not the job's failures and do not spend its maxRetry; but a job whose
# nodes keep dying under it may be what kills them, so this many losses fail it.
MAX_NODE_LOSSES = 10


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
    removed: bool = False  # a shrink asked it to stop; the job goes on without it

    @property
    def core_id(self) -> str:
        """The id the scheduling core knows it by (``<task>-<replica>``). ``task_id`` is
        unique per incarnation: a replica grown again after a shrink gets a new one."""
        return f"{self.task_name}-{self.replica}"

    def to_json(self) -> dict[str, Any]:
        return {**{k: getattr(self, k) for k in (
            "task_id", "task_name", "replica", "rank", "node_id", "cpu_milli", "memory_mib",
            "attempt", "removed")}, "state": self.state.value,
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
    targets: dict[str, int] = field(default_factory=dict)  # user resize: replicas per group
    resizes: int = 0  # resizes so far (deterministic ids of their events and new tasks)
    cancel_reason: str = ""  # the job's final reason when a cancel ends it ("returned")
    drain_requeue: bool = False  # stopping for a node drain: requeue without spending a retry
    requeues: int = 0  # attempts that a drain started again (not counted against maxRetry)
    reclaimed: str = ""  # queueing took its quota back: when stopped it returns to its queue
    node_losses: int = 0  # attempts ended by a lost node (requeued, not counted as retries)

    def live(self) -> Iterator[Placed]:
        return (p for p in self.placed if p.state not in TERMINAL)

    def current(self) -> list[Placed]:
        """The tasks of the current attempt, less those a shrink removed."""
        return [p for p in self.placed if p.attempt == self.attempt and not p.removed]

    def active(self, task_name: str | None = None) -> list[Placed]:
        """Current tasks still holding resources (of one group, or all)."""
        return [p for p in self.current() if p.state not in TERMINAL
                and (task_name is None or p.task_name == task_name)]


@dataclass
class NodeView:
    inventory: NodeInventory
    lost: bool = False
    degraded_gpus: frozenset[int] = frozenset()
    cordon: str = ""  # "" | "cordoned" | "draining": an operator's command
    cordon_generation: int = 0  # of the last command applied (replays are ignored)
    cordon_reason: str = ""
    drained: bool = False  # draining and nothing of ours runs there any more (announced)
    datasets: frozenset[str] | None = None  # from heartbeats; None = the inventory's


@dataclass
class Output:
    """What handling produced: events to publish and the jobs whose rows changed."""

    events: list[tuple[Envelope, str]] = field(default_factory=list)
    dirty_jobs: set[str] = field(default_factory=set)
    dirty_nodes: set[str] = field(default_factory=set)
    # appended to fixed event ids: a resend within one epoch (the broker came back
    # empty) needs ids of its own, or the outbox takes it for the first send
    id_suffix: str = ""

    def emit(self, event: Event, source: str, event_id: str | None = None) -> None:
        if event_id is not None:
            event_id += self.id_suffix
        self.events.append((Envelope.wrap(event, source, event_id), topic_for(event).name))


def job_request(job: SchedJob, caps: Mapping[str, int] | None = None) -> JobRequest:
    assert job.ready is not None
    r = job.ready
    return shared_job_request(r.spec, job_id=job.job_id, queue=r.queue, tenant=r.tenant,
                              user=r.user, submitted_at=r.submitted_at, attempt=job.attempt,
                              targets=job.targets, caps=caps)


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
        self.notices = PendingNotices()  # job.waiting: why a job waits, when that changes
        self.finished: set[str] = set()  # ended jobs, evicted from ``jobs`` once persisted
        self._node_cache: tuple[Node, ...] | None = None
        self._allocs: dict[tuple[str, str, int], Allocation] = {}
        self._requests: dict[tuple[Any, ...], JobRequest] = {}
        self._seq = 0
        self._reconciles = 0  # ids of reconcile bindings (a new one each time)
        self.needs_cycle = True

    # --- events in ---------------------------------------------------------------------

    def handle(self, event: Event, out: Output) -> None:
        if isinstance(event, JobReady):
            self._on_ready(event, out)
        elif isinstance(event, JobStatus):
            if event.task is not None:
                self._on_task_status(event, out)
                if event.node_id is not None:
                    self._check_drained(event.node_id, out)
        elif isinstance(event, JobCommand):
            if event.action is CommandAction.CANCEL:
                self._on_cancel(event, out)
            elif event.action is CommandAction.RESIZE:
                self._on_resize(event, out)
            elif event.action is CommandAction.PREEMPT:
                self._on_reclaim(event, out)
        elif isinstance(event, NodeCommand):
            self._on_node_command(event, out)
        elif isinstance(event, NodeRegistered):
            old = self.nodes.get(event.inventory.node_id)
            self.nodes[event.inventory.node_id] = NodeView(event.inventory) if old is None \
                else replace(old, inventory=event.inventory, lost=False)  # keeps a cordon
            self._node_cache = None
            out.dirty_nodes.add(event.inventory.node_id)
            self.needs_cycle = True
            self._reconcile_node(event.inventory.node_id, out, "registered")
        elif isinstance(event, NodeHeartbeat):
            view = self.nodes.get(event.node_id)
            if view is not None and view.lost:
                view.lost = False
                self._node_cache = None
                out.dirty_nodes.add(event.node_id)
                self.needs_cycle = True
                self._reconcile_node(event.node_id, out, "back after it was declared lost")
            if view is not None and event.datasets is not None and \
                    frozenset(event.datasets) != self._datasets(view):
                view.datasets = frozenset(event.datasets)
                self._node_cache = None
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
                                        self._next_seq(),
                                        # a reclaimed attempt may still be stopping
                                        list(job.live()) if job is not None else [])
        out.dirty_jobs.add(ev.job_id)
        self.needs_cycle = True

    def _on_reclaim(self, cmd: JobCommand, out: Output) -> None:
        """Queueing takes back the quota the job holds: stop it (checkpoint grace) and,
        once stopped, hand it back to its queue (``preempted``), which admits it again
        later with a new attempt. It is not retried here."""
        job = self.jobs.get(cmd.job_id)
        if job is None or job.ready is None or job.state in TERMINAL or \
                job.cancel_requested or job.reclaimed:
            return
        job.reclaimed = cmd.reason or "quota reclaimed"
        out.dirty_jobs.add(job.job_id)
        if job.state is JobState.ADMITTED:  # not placed yet: nothing to stop
            job.state = JobState.PREEMPTED
            self._status(out, job, JobState.PREEMPTED, job.reclaimed)
            self.needs_cycle = True
        elif not job.preempted_by:
            self._stop_tasks(job, out, job.reclaimed, grace_s=DEFAULT_GRACE_S)

    def _on_cancel(self, cmd: JobCommand, out: Output) -> None:
        job = self.jobs.get(cmd.job_id)
        if job is None and cmd.job_id in self.finished:
            return  # it ended already: nothing to cancel (and its row stays as it ended)
        if job is None:
            self.jobs[cmd.job_id] = SchedJob(cmd.job_id, None, JobState.CANCELLED, 0,
                                             self._next_seq(), cancel_requested=True,
                                             cancel_reason=cmd.reason)
            out.dirty_jobs.add(cmd.job_id)
            return
        if job.state in TERMINAL - {JobState.PREEMPTED} or job.cancel_requested:
            return
        job.cancel_requested = True
        job.cancel_reason = cmd.reason if cmd.reason == RETURNED else ""
        out.dirty_jobs.add(job.job_id)
        # reclaimed: back with its queue (which cancels it there too, if it holds it)
        if job.state is JobState.ADMITTED or (job.state is JobState.PREEMPTED and job.reclaimed):
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
        if placed.removed:  # a replica a shrink stopped: the job goes on without it
            if st.state in TERMINAL:
                job.placed.remove(placed)
                self.needs_cycle = True  # resources freed (the job that asked may start)
            elif st.state is JobState.RUNNING and placed.state is JobState.BOUND:
                placed.state = JobState.RUNNING
            else:
                return
            out.dirty_jobs.add(job.job_id)
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
            if all(s in TERMINAL for s in states) and job.state not in TERMINAL:
                job.state = JobState.CANCELLED
                self._status(out, job, JobState.CANCELLED, job.cancel_reason or "cancelled")
            return
        if st.reason == TIME_LIMIT_REACHED and st.state is JobState.CANCELLED and \
                job.state in (JobState.BOUND, JobState.RUNNING) and not job.preempted_by:
            self._time_limit(job, out)
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
            # an agent that could not renew its lease stopped it: like a lost node
            self._retry_or_fail(job, out, f"task {st.task} {st.state.value}: {st.reason}",
                                st.exit_code, node_lost=st.reason.startswith(FENCED))

    def _time_limit(self, job: SchedJob, out: Output) -> None:
        """A task reached the spec's timeLimit: the job ends, no retry. An interactive
        environment was simply held until its limit (cancelled); a batch job failed."""
        assert job.ready is not None
        self._stop_tasks(job, out, TIME_LIMIT_REACHED)
        job.cancel_requested = True  # the other tasks' reports change nothing any more
        if job.ready.spec.interactive:
            job.state = JobState.CANCELLED
            self._status(out, job, JobState.CANCELLED, TIME_LIMIT_REACHED)
        else:
            job.state = JobState.FAILED
            self._status(out, job, JobState.FAILED, TIME_LIMIT_REACHED)

    def _retry_or_fail(self, job: SchedJob, out: Output, why: str, exit_code: int | None,
                       node_lost: bool = False) -> None:
        """Start the job again with a new attempt, or fail it. Only the job's own failures
        spend its maxRetry: an attempt ended by a preemption, a drain or a lost node is
        requeued apart (``requeues``)."""
        assert job.ready is not None
        if job.reclaimed:  # back to its queue, which admits it again when quota allows
            if job.preempted_by:
                job.preempted_by = ""
            else:
                self._stop_tasks(job, out, job.reclaimed)
            job.state = JobState.PREEMPTED
            self._status(out, job, JobState.PREEMPTED, job.reclaimed)
            self.needs_cycle = True
            return
        not_its_fault = node_lost or job.drain_requeue or bool(job.preempted_by)
        if job.preempted_by:  # its tasks were already asked to stop
            self._status(out, job, JobState.PREEMPTED, f"preempted for {job.preempted_by}")
            job.preempted_by = ""
        else:
            self._stop_tasks(job, out, why)
        job.drain_requeue = False
        if node_lost:
            job.node_losses += 1
        if not_its_fault:  # preempted, drained or its node lost: this attempt does not count
            job.requeues += 1
        if job.node_losses >= MAX_NODE_LOSSES:
            job.state = JobState.FAILED
            self._status(out, job, JobState.FAILED,
                         f"{job.node_losses} nodes lost under it: {why}", exit_code=exit_code)
        elif job.attempt - job.requeues <= job.ready.spec.max_retry:
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
                    p.attempt == job.attempt and not p.removed for p in hit):
                if job.cancel_requested:
                    self._advance(job, JobStatus(job_id=job.job_id, state=JobState.FAILED,
                                                 reason="node lost", attempt=job.attempt), out)
                else:
                    self._retry_or_fail(job, out, f"node {ev.node_id} lost", None,
                                        node_lost=True)
        self.needs_cycle = True

    # --- cordon / drain / uncordon ----------------------------------------------------

    def _on_node_command(self, cmd: NodeCommand, out: Output) -> None:
        view = self.nodes.get(cmd.node_id)
        if view is None:
            log.warning("node command for an unknown node ignored", node=cmd.node_id)
            return
        if cmd.generation and cmd.generation <= view.cordon_generation:
            return  # a replay (or an older command delivered late)
        view.cordon_generation = cmd.generation or view.cordon_generation
        view.cordon_reason = cmd.reason
        view.drained = False
        view.cordon = {NodeAction.CORDON: "cordoned", NodeAction.DRAIN: "draining",
                       NodeAction.UNCORDON: ""}[cmd.action]
        self._node_cache = None
        self.needs_cycle = True
        out.dirty_nodes.add(cmd.node_id)
        log.info("node command applied", node=cmd.node_id, action=cmd.action.value,
                 by=cmd.requested_by)
        if cmd.action is NodeAction.DRAIN:
            self._drain(cmd.node_id, cmd.grace_period_s, out)
        self._announce(view, out)
        self._check_drained(cmd.node_id, out)

    def _drain(self, node_id: str, grace_s: float, out: Output) -> None:
        """Stop every job with a task of its current attempt there, gracefully
        (checkpoint signal, grace period), as a preemption would, and requeue it: the
        attempt does not count against its maxRetry."""
        for job in self.jobs.values():
            if job.state not in (JobState.BOUND, JobState.RUNNING) or job.cancel_requested \
                    or job.preempted_by or not any(p.node_id == node_id for p in job.active()):
                continue
            job.preempted_by = f"drain of node {node_id}"
            job.drain_requeue = True
            out.dirty_jobs.add(job.job_id)
            self._stop_tasks(job, out, f"preempted (drain) for node {node_id}", grace_s=grace_s)

    def _check_drained(self, node_id: str, out: Output) -> None:
        view = self.nodes.get(node_id)
        if view is None or view.cordon != "draining" or view.drained:
            return
        if any(p.node_id == node_id for job in self.jobs.values() for p in job.live()):
            return
        view.drained = True
        self._announce(view, out)

    @staticmethod
    def scheduling_of(view: NodeView) -> NodeSchedulability:
        if view.cordon == "draining":
            return NodeSchedulability.DRAINED if view.drained else NodeSchedulability.DRAINING
        return NodeSchedulability.CORDONED if view.cordon else NodeSchedulability.SCHEDULABLE

    def _announce(self, view: NodeView, out: Output) -> None:
        state = self.scheduling_of(view)
        node_id = view.inventory.node_id
        out.emit(NodeSchedulingChanged(node_id=node_id, scheduling=state,
                                       generation=view.cordon_generation,
                                       reason=view.cordon_reason), self.SOURCE,
                 event_id=f"node-{state.value}-{node_id}-g{view.cordon_generation}")

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
                    schedulable=not n.lost and not n.cordon,
                    cordoned=bool(n.cordon),
                    datasets=self._datasets(n),
                )
                for n in self.nodes.values()
            )
        return self._node_cache

    def _request(self, job: SchedJob, owner: str | None = None,
                 caps: dict[str, int] | None = None) -> JobRequest:
        key = (owner or job.job_id, job.attempt, tuple(sorted(job.targets.items())),
               tuple(sorted((caps or {}).items())))
        req = self._requests.get(key)
        if req is None:
            req = job_request(job, caps)
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
                                        self._caps(job) if current else None)
                running.append(RunningJob(
                    request, start_time=job.bound_at if job.bound_at is not None else now,
                    terminating=not current or bool(job.preempted_by) or job.cancel_requested))
        for key in self._allocs.keys() - live_keys:
            del self._allocs[key]
        # a retry waits until its last attempt's tasks have stopped: a job never runs in
        # two places (a stopping task may run on through its checkpoint grace)
        pending = tuple(
            self._request(j) for j in sorted(
                (j for j in self.jobs.values() if j.state is JobState.ADMITTED
                 and not any(p.attempt < j.attempt for p in j.live())),
                key=lambda j: j.seq)
        )
        if len(self._requests) > 4 * (len(self.jobs) + 64):  # forget ended jobs' requests
            keep = {(j.job_id, j.attempt) for j in self.jobs.values()}
            self._requests = {k: v for k, v in self._requests.items()
                              if (k[0].split("~")[0], k[1]) in keep}
        return Snapshot(now=now, nodes=self._nodes(), allocations=tuple(allocations),
                        pending=pending, running=tuple(running))

    @staticmethod
    def _caps(job: SchedJob) -> dict[str, int] | None:
        """A group with a replica that completed is finishing: it does not grow again."""
        done = {p.task_name for p in job.current() if p.state is JobState.SUCCEEDED}
        return {n: len(job.active(n)) for n in done} or None

    def cycle(self, now: float, out: Output) -> Plan:
        self.needs_cycle = False
        plan = self.placer(self.snapshot(now))
        self.pending_reasons = {k: v.value for k, v in plan.pending.items()}
        admitted = {j: job.attempt for j in plan.pending
                    if (job := self.jobs.get(j)) is not None and job.state is JobState.ADMITTED}
        for notice, event_id in self.notices.update(plan, admitted, now, self.epoch):
            out.emit(notice, self.SOURCE, event_id=event_id)
        for pre in plan.preemptions:
            victim = self.jobs.get(pre.job_id)
            if victim is None or victim.preempted_by or victim.state not in (
                    JobState.BOUND, JobState.RUNNING):
                continue
            victim.preempted_by = pre.preemptor
            out.dirty_jobs.add(victim.job_id)
            self._stop_tasks(victim, out, f"preempted ({pre.reason.value}) for {pre.preemptor}",
                             grace_s=pre.grace_period_s)
        for rz in plan.resizes:
            self._apply_resize(rz, out)
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
            if any(t.elastic and len(job.active(t.name)) < t.most_replicas
                   for t in job.ready.spec.tasks):
                self.needs_cycle = True  # it may grow next cycle (placement never grows)
        return plan

    # --- elastic resizes ---------------------------------------------------------------

    def _apply_resize(self, rz: Resize, out: Output) -> None:
        job = self.jobs.get(rz.job_id)
        if job is None or job.ready is None or job.cancel_requested or job.preempted_by or \
                job.state not in (JobState.BOUND, JobState.RUNNING):
            return
        if rz.reason is ResizeReason.GROW:
            self._grow(job, rz, out)
            return
        by_core = {p.core_id: p for p in job.active(rz.task_name)}
        stop = [by_core[t] for t in rz.stop_task_ids if t in by_core]
        self._shrink(job, rz.task_name, stop,
                     f"shrink for {rz.for_job}" if rz.for_job else "shrink",
                     rz.grace_period_s, out)

    def _grow(self, job: SchedJob, rz: Resize, out: Output) -> None:
        before = len(job.active(rz.task_name))
        job.resizes += 1
        used = {p.rank for p in job.active()}
        free_ranks = (r for r in itertools.count() if r not in used)
        new = [Placed(f"{b.task_id}.{job.resizes}", b.task_name, b.replica, next(free_ranks),
                      b.node_id, b.gpus, b.cpu_milli, b.memory_mib, job.attempt)
               for b in sorted(rz.binds, key=lambda b: b.replica)]
        job.placed.extend(new)
        out.dirty_jobs.add(job.job_id)
        why = "grow into idle GPUs"
        self._publish_resize(job, new, [], why, 0.0, out)
        self._resized(job, rz.task_name, before, before + len(new), why, out)

    def _shrink(self, job: SchedJob, task_name: str, stop: list[Placed], why: str,
                grace_s: float, out: Output) -> None:
        if not stop:
            return
        before = len(job.active(task_name))
        for p in stop:
            p.removed = True
        job.resizes += 1
        out.dirty_jobs.add(job.job_id)
        self._publish_resize(job, [], stop, why, grace_s, out)
        self._resized(job, task_name, before, before - len(stop), why, out)

    def _on_resize(self, cmd: JobCommand, out: Output) -> None:
        """A user asks for ``replicas`` of an elastic group: fewer stop now (highest
        replicas first); more grow when GPUs are idle; either way it is the new cap."""
        job = self.jobs.get(cmd.job_id)
        if job is None or job.ready is None or job.state in TERMINAL or \
                job.cancel_requested or cmd.replicas is None:
            log.warning("resize ignored: no such live job", job=cmd.job_id)
            return
        try:
            task = elastic_task(job.ready.spec, cmd.task, cmd.replicas)
        except ResizeRefused as e:
            log.warning("resize ignored", job=cmd.job_id, task=cmd.task,
                        replicas=cmd.replicas, why=e.message)
            return
        job.targets[task.name] = cmd.replicas
        out.dirty_jobs.add(job.job_id)
        self.needs_cycle = True
        if job.state in (JobState.BOUND, JobState.RUNNING) and not job.preempted_by:
            active = sorted(job.active(task.name), key=lambda p: p.replica, reverse=True)
            self._shrink(job, task.name, active[:max(0, len(active) - cmd.replicas)],
                         f"resize to {cmd.replicas} requested"
                         + (f" by {cmd.requested_by}" if cmd.requested_by else ""),
                         DEFAULT_GRACE_S, out)

    def _publish_resize(self, job: SchedJob, start: list[Placed], stop: list[Placed],
                        reason: str, grace_s: float, out: Output) -> None:
        """One ``resize`` binding per node touched: the new replicas to start (with the
        job's membership after the change) and the replicas to stop."""
        assert job.ready is not None
        by_name = {t.name: t for t in job.ready.spec.tasks}
        members = sorted(job.active(), key=lambda p: p.rank)
        master_addr = self._address(members[0].node_id) if members else ""
        cluster = [ClusterMember(role=by_name[p.task_name].effective_role, rank=p.rank,
                                 host=self._address(p.node_id)) for p in members]
        for node_id in sorted({p.node_id for p in start + stop}):
            on_node = [p for p in members if p.node_id == node_id]
            binding = Binding(
                binding_id=f"{job.job_id}-{job.attempt}-{node_id}-rz{job.resizes}",
                action=BindingAction.RESIZE, node_id=node_id, epoch=self.epoch,
                job_id=job.job_id, attempt=job.attempt, world_size=len(members),
                master_addr=master_addr, duration_s=job.ready.spec.duration, cluster=cluster,
                grace_period_s=grace_s, reason=reason,
                tasks=[self._task_binding(p, by_name, node_id, on_node.index(p), len(on_node))
                       for p in start if p.node_id == node_id],
                stop_task_ids=[p.task_id for p in stop if p.node_id == node_id])
            out.emit(binding, self.SOURCE, event_id=f"resize-{binding.binding_id}-e{self.epoch}")

    def _resized(self, job: SchedJob, task_name: str, before: int, after: int, why: str,
                 out: Output) -> None:
        assert job.ready is not None
        out.emit(JobStatus(
            job_id=job.job_id, state=job.state, reason="resized", attempt=job.attempt,
            message=f"{task_name}: {before} -> {after} replicas ({why})", epoch=self.epoch,
            replicas={t.name: len(job.active(t.name)) for t in job.ready.spec.tasks}),
            self.SOURCE, event_id=f"resized-{job.job_id}-{job.attempt}-{job.resizes}")

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
            binding = Binding(
                binding_id=f"{job.job_id}-{job.attempt}-{node_id}",
                action=BindingAction.ALLOCATE, node_id=node_id, epoch=self.epoch,
                job_id=job.job_id, attempt=job.attempt, world_size=len(tasks),
                master_addr=master_addr, duration_s=self._duration(job), cluster=cluster,
                time_limit_s=spec.time_limit, interactive=spec.interactive,
                tasks=[self._task_binding(p, by_name, node_id, local, len(placed))
                       for local, p in enumerate(placed)])
            out.emit(binding, self.SOURCE, event_id=f"bind-{binding.binding_id}-e{self.epoch}")

    @staticmethod
    def _duration(job: SchedJob) -> float | None:
        """How long a simulated task runs: an interactive session is held (until it is
        returned or reaches its time limit) unless the spec says otherwise."""
        assert job.ready is not None
        spec = job.ready.spec
        return HELD_S if spec.interactive and spec.duration is None else spec.duration

    def _task_binding(self, p: Placed, by_name: Mapping[str, TaskSpec], node_id: str,
                      local_rank: int, local_world_size: int) -> TaskBinding:
        view = self.nodes.get(node_id)
        uuids = {g.index: g.uuid for g in view.inventory.gpus} if view else {}
        spec = by_name[p.task_name]
        return TaskBinding(
            task_id=p.task_id, task_name=p.task_name, role=spec.effective_role,
            replica=p.replica, rank=p.rank, local_rank=local_rank,
            local_world_size=local_world_size,
            gpus=[GpuAssignment(index=g.index, uuid=uuids.get(g.index, ""),
                                memory_mib=g.memory_mib, compute_pct=g.compute_pct)
                  for g in p.gpus],
            cpu_milli=p.cpu_milli, memory_mib=p.memory_mib, image=spec.image,
            command=spec.command, env=spec.env)

    @staticmethod
    def _datasets(view: NodeView) -> frozenset[str]:
        return (view.datasets if view.datasets is not None
                else frozenset(view.inventory.datasets))

    def _reconcile_node(self, node_id: str, out: Output, why: str) -> None:
        """Tell a node that (re)registers or comes back after it was declared lost which
        tasks it still owns: every task placed there and not yet ended. The agent stops
        any other it runs (a lost node's tasks were already requeued elsewhere). Bindings
        are ordered per node, so a task bound before this answer is listed and one bound
        after it arrives after it: neither is touched."""
        owned = sorted(f"{job.job_id}/{p.task_id}/{p.attempt}"
                       for job in self.jobs.values() for p in job.live()
                       if p.node_id == node_id)
        self._reconciles += 1
        binding = Binding(binding_id=f"reconcile-{node_id}-e{self.epoch}-{self._reconciles}",
                          action=BindingAction.RECONCILE, node_id=node_id, epoch=self.epoch,
                          job_id="", reason=f"node {why}", owned=owned)
        out.emit(binding, self.SOURCE, event_id=binding.binding_id)

    def _address(self, node_id: str) -> str:
        view = self.nodes.get(node_id)
        return (view.inventory.address or node_id) if view else node_id

    def _stop_tasks(self, job: SchedJob, out: Output, reason: str,
                    grace_s: float = 30.0, older_only: bool = False) -> None:
        by_node: dict[tuple[str, int], list[Placed]] = {}
        for p in job.live():
            if older_only and p.attempt >= job.attempt:
                continue
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
        for node_id in list(self.nodes):
            self._check_drained(node_id, out)  # a drain that ended while no one led
            out.emit(Binding(binding_id=f"fence-{node_id}-e{self.epoch}",
                             action=BindingAction.FENCE, node_id=node_id, epoch=self.epoch,
                             job_id="", reason="new leader"), self.SOURCE,
                     event_id=f"fence-{node_id}-e{self.epoch}")
        for job in self.jobs.values():
            if any(p.attempt < job.attempt for p in job.live()):
                # the stop of a retried attempt's tasks may never have reached its agent,
                # and the retry waits for them
                self._stop_tasks(job, out, "an older attempt of a retried job",
                                 grace_s=DEFAULT_GRACE_S, older_only=True)
            if job.state is JobState.BOUND and not job.cancel_requested:
                self._publish_bindings(job, job.current(), out)
            if job.cancel_requested and any(True for _ in job.live()):
                self._stop_tasks(job, out, "cancelled")
            elif job.preempted_by and any(True for _ in job.live()):
                # the stop a preemption or a drain sent may never have reached the agent
                self._stop_tasks(job, out, f"preempted for {job.preempted_by}")
            elif job.reclaimed and any(True for _ in job.live()):
                self._stop_tasks(job, out, job.reclaimed, grace_s=DEFAULT_GRACE_S)
            elif job.state in (JobState.BOUND, JobState.RUNNING) and not job.preempted_by:
                # resizes the agents may have missed: grown replicas not yet running,
                # removed ones not yet stopped (agents do each once)
                grown = ([p for p in job.active() if p.state is JobState.BOUND]
                         if job.state is JobState.RUNNING else [])
                stopping = [p for p in job.live() if p.removed and p.attempt == job.attempt]
                if grown or stopping:
                    self._publish_resize(job, grown, stopping, "resent by a new leader",
                                         DEFAULT_GRACE_S, out)

    def resend(self, out: Output) -> None:
        """The broker came back empty: bindings are not refilled from the outbox (an old
        one could start a finished task), so tell every node what it owns and send again
        what agents may not have carried out yet. Agents handle each task once."""
        self.republish(out)
        for node_id, view in self.nodes.items():
            if not view.lost:
                self._reconcile_node(node_id, out, "resent after the broker restarted")

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
                      "bound_at": job.bound_at, "preempted_by": job.preempted_by,
                      "targets": job.targets, "resizes": job.resizes,
                      "cancel_reason": job.cancel_reason, "drain_requeue": job.drain_requeue,
                      "requeues": job.requeues, "reclaimed": job.reclaimed,
                      "node_losses": job.node_losses},
        }

    def evict_finished(self) -> None:
        """Drop ended jobs that hold nothing any more (call after persisting them)."""
        for job_id in [j.job_id for j in self.jobs.values()
                       if j.state in TERMINAL and j.ready is not None
                       and not any(True for _ in j.live())
                       # reclaimed: kept until its queue sends it again (replays refused)
                       and (j.state is not JobState.PREEMPTED or j.cancel_requested)]:
            del self.jobs[job_id]
            self.finished.add(job_id)

    def load_job(self, row: dict[str, Any]) -> None:
        meta = row["tasks"]
        ready = JobReady.model_validate(row["ready"]) if row["ready"] else None
        job = SchedJob(row["job_id"], ready, JobState(row["state"]), row["attempt"],
                       meta.get("seq", 0), [Placed.from_json(p) for p in row["placement"]],
                       meta.get("cancel_requested", False), meta.get("bound_at"),
                       meta.get("preempted_by", ""), dict(meta.get("targets") or {}),
                       meta.get("resizes", 0), meta.get("cancel_reason", ""),
                       meta.get("drain_requeue", False), meta.get("requeues", 0))
        job.reclaimed = meta.get("reclaimed", "")
        job.node_losses = meta.get("node_losses", 0)
        self.jobs[job.job_id] = job
        self._seq = max(self._seq, job.seq)
