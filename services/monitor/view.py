"""The cluster-wide view, built from events by the elected monitor replica.

It joins topics keyed differently (a job's queue and tenant come from jobs.submitted,
keyed by queue; its states from jobs.status, keyed by job; its GPUs from bindings, keyed
by node), so no partition subset could compute it: one replica reads every partition
from the beginning and exports the cluster set of ``MonitorMetrics``. Pure bookkeeping:
events in, metric values out; no I/O, the clock is passed in.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from services.monitor.fragmentation import NodeRoom, Shape, fragmentation
from services.monitor.metrics import MonitorMetrics
from shared.billing import inherited, weight_of
from shared.events import (
    Binding,
    BindingAction,
    Event,
    JobState,
    JobStatus,
    JobSubmitted,
    NodeHeartbeat,
    NodeInventory,
    NodeLost,
    NodeRegistered,
    QueueChanged,
)
from shared.gpu_models import model_id
from shared.jobspec import JobSpec

MIB = 1024 * 1024
WAITING = {JobState.PENDING, JobState.ADMITTED, JobState.PREEMPTED}
ACTIVE = {JobState.BOUND, JobState.RUNNING}
RELEASED = {JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED, JobState.PREEMPTED}
REMEMBER = 200_000  # ended job ids / early statuses kept, so replays change nothing


@dataclass
class JobTrack:
    queue: str
    tenant: str
    submitted_at: float
    shapes: tuple[Shape, ...] = ()
    state: JobState = JobState.PENDING
    since: float = 0.0  # when it entered ``state``
    ran: bool = False


@dataclass(frozen=True)
class TaskHold:
    """What one bound task holds on its node until it ends."""

    node: str
    gpus: tuple[tuple[int, int, int], ...]  # (index, MiB, compute %); MiB 0 = whole GPU
    cpu_milli: int
    memory_mib: int


@dataclass
class QueueConf:
    tenant: str = ""
    guaranteed_gpus: float | None = None
    starvation_bound_s: float | None = None
    parent: str | None = None
    billing_weights: dict[str, float] = field(default_factory=dict)


def _shapes(spec: JobSpec) -> tuple[Shape, ...]:
    return tuple(Shape(t.resources.gpu, t.resources.gpu_memory or 0,
                       t.resources.gpu_compute or 0) for t in spec.tasks)


def _number(value: Any) -> float | None:
    if isinstance(value, Mapping):
        value = value.get("gpu", value.get("gpus"))
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) \
        else None


def queue_conf(settings: Mapping[str, Any]) -> QueueConf:
    """Read a QueueChanged's settings. The guaranteed quota is the queue's nominal GPU
    quota (within it a tenant is always admitted, reclaiming what others borrowed)."""
    guaranteed = None
    for key in ("guaranteed", "nominal", "nominalQuota", "nominal_quota", "quota"):
        if key in settings and (guaranteed := _number(settings[key])) is not None:
            break
    bound = None
    for key in ("starvation_bound_s", "starvationBound", "starvation_bound"):
        if key in settings and (bound := _number(settings[key])) is not None:
            break
    weights = settings.get("billing_weights")
    weights = {str(k): float(v) for k, v in weights.items() if isinstance(v, int | float)} \
        if isinstance(weights, dict) else {}
    parent = settings.get("parent")
    return QueueConf(str(settings.get("tenant") or ""), guaranteed, bound,
                     parent if isinstance(parent, str) else None, weights)


@dataclass
class ClusterView:
    stuck_after_s: float = 120.0
    starvation_bound_s: float = 14 * 86400.0  # for queues that do not set their own
    jobs: dict[str, JobTrack] = field(default_factory=dict)  # jobs not yet ended
    ended: dict[str, int] = field(default_factory=dict)  # terminal state -> count
    ended_ids: OrderedDict[str, None] = field(default_factory=OrderedDict)
    early: OrderedDict[str, list[tuple[JobStatus, float]]] = field(default_factory=OrderedDict)
    nodes: dict[str, NodeInventory] = field(default_factory=dict)
    last_seen: dict[str, float] = field(default_factory=dict)
    lost: set[str] = field(default_factory=set)
    cordoned: set[str] = field(default_factory=set)
    holds: dict[tuple[str, int, str], TaskHold] = field(default_factory=dict)  # job, attempt, task
    queues: dict[str, QueueConf] = field(default_factory=dict)
    queue_tenant: dict[str, str] = field(default_factory=dict)  # first tenant seen on a queue
    pairs: set[tuple[str, str]] = field(default_factory=set)  # (queue, tenant) ever seen
    metrics: MonitorMetrics | None = None

    def apply(self, event: Event, occurred_at: float, seen_at: float) -> None:
        if isinstance(event, JobSubmitted):
            self._submitted(event)
        elif isinstance(event, JobStatus):
            if event.task is None:
                self._job_status(event, occurred_at)
            elif event.state in RELEASED:
                self.holds.pop((event.job_id, event.attempt, event.task), None)
        elif isinstance(event, Binding):
            self._binding(event)
        elif isinstance(event, NodeRegistered):
            self.nodes[event.inventory.node_id] = event.inventory
            self._seen(event.inventory.node_id, seen_at)
            if self.metrics is not None:
                for g in event.inventory.gpus:
                    self.metrics.gpu_mem_total.labels(event.inventory.node_id, str(g.index)).set(
                        g.memory_mib * MIB)
        elif isinstance(event, NodeHeartbeat):
            self._seen(event.node_id, seen_at)
        elif isinstance(event, NodeLost):
            self.lost.add(event.node_id)
        elif isinstance(event, QueueChanged):
            if event.change == "deleted":
                self.queues.pop(event.queue, None)
            else:
                self.queues[event.queue] = queue_conf(event.settings)
        elif event.TYPE == "node.scheduling":  # the scheduler applied a cordon/drain
            node, state = getattr(event, "node_id", ""), str(getattr(event, "scheduling", ""))
            (self.cordoned.discard if state == "schedulable" else self.cordoned.add)(node)

    # --- events ------------------------------------------------------------------------

    def _seen(self, node: str, at: float) -> None:
        self.last_seen[node] = at
        self.lost.discard(node)

    def _submitted(self, ev: JobSubmitted) -> None:
        if ev.job_id in self.jobs or ev.job_id in self.ended_ids:
            return  # a replay (e.g. an outbox refill)
        t = ev.submitted_at.timestamp()
        self.jobs[ev.job_id] = JobTrack(ev.queue, ev.tenant, t, _shapes(ev.spec), since=t)
        self.pairs.add((ev.queue, ev.tenant))
        self.queue_tenant.setdefault(ev.queue, ev.tenant)
        # statuses read before the submission (another topic, read in parallel)
        for st, at in self.early.pop(ev.job_id, []):
            self._job_status(st, at)

    def _job_status(self, st: JobStatus, at: float) -> None:
        job = self.jobs.get(st.job_id)
        if job is None:
            if st.job_id not in self.ended_ids:
                self.early.setdefault(st.job_id, []).append((st, at))
                while len(self.early) > REMEMBER:
                    self.early.popitem(last=False)
            return
        job.state, job.since = st.state, at
        m = self.metrics
        if st.state is JobState.RUNNING and not job.ran:
            job.ran = True
            if m is not None:
                m.queueing.labels(job.queue, job.tenant).observe(max(0.0, at - job.submitted_at))
        for key in [k for k in self.holds if k[0] == st.job_id
                    and (k[1] < st.attempt or st.state in RELEASED)]:
            del self.holds[key]  # an earlier attempt's tasks, or the job let them go
        if st.state.terminal:
            if st.state is not JobState.CANCELLED and m is not None:
                m.completion.labels(job.queue, job.tenant).observe(max(0.0, at - job.submitted_at))
            self.ended[st.state.value] = self.ended.get(st.state.value, 0) + 1
            del self.jobs[st.job_id]
            self.ended_ids[st.job_id] = None
            while len(self.ended_ids) > REMEMBER:
                self.ended_ids.popitem(last=False)

    def _binding(self, b: Binding) -> None:
        # allocate starts a placement, resize grows an elastic job (its stopped replicas
        # are released by their terminal reports, like any other task)
        if b.action not in (BindingAction.ALLOCATE, BindingAction.RESIZE) or \
                b.job_id in self.ended_ids:
            return
        for t in b.tasks:
            self.holds[(b.job_id, b.attempt, t.task_id)] = TaskHold(
                b.node_id, tuple((g.index, g.memory_mib, g.compute_pct) for g in t.gpus),
                t.cpu_milli, t.memory_mib)

    # --- export ------------------------------------------------------------------------

    def _gpu_use(self) -> tuple[dict[tuple[str, int], tuple[int, int]], set[tuple[str, int]]]:
        """Per physical GPU: (MiB, compute %) held by shares; and the GPUs held whole."""
        shares: dict[tuple[str, int], tuple[int, int]] = {}
        whole: set[tuple[str, int]] = set()
        for h in self.holds.values():
            for idx, mib, pct in h.gpus:
                if mib or pct < 100:
                    mem0, pct0 = shares.get((h.node, idx), (0, 0))
                    shares[(h.node, idx)] = (mem0 + mib, pct0 + pct)
                else:
                    whole.add((h.node, idx))
        return shares, whole

    def fragmentation(self) -> float:
        shares, whole = self._gpu_use()
        rooms = []
        for node, inv in self.nodes.items():
            if node in self.lost or node in self.cordoned:
                continue
            room = NodeRoom()
            for g in inv.gpus:
                key = (node, g.index)
                if key in whole:
                    continue
                if key in shares:
                    mib, pct = shares[key]
                    if pct < 100 and mib < g.memory_mib:
                        room.partial.append((g.memory_mib - mib, 100 - pct))
                else:
                    room.whole_free += 1
            rooms.append(room)
        waiting = [s for j in self.jobs.values() if j.state in WAITING for s in j.shapes]
        return fragmentation(rooms, waiting)

    def export(self, now: float) -> None:
        m = self.metrics
        if m is None:
            return
        counts = dict.fromkeys((s.value for s in JobState), 0)
        counts.update(self.ended)
        pending = dict.fromkeys(self.pairs, 0)
        running = dict.fromkeys(self.pairs, 0)
        oldest = dict.fromkeys(self.pairs, 0.0)
        stuck = 0
        for job in self.jobs.values():
            counts[job.state.value] += 1
            key = (job.queue, job.tenant)
            if job.state in WAITING:
                pending[key] += 1
                oldest[key] = max(oldest[key], now - job.submitted_at)
            elif job.state in ACTIVE:
                running[key] += 1
            if job.state is JobState.BOUND and now - job.since > self.stuck_after_s:
                stuck += 1
        for s, n in counts.items():
            m.jobs.labels(s).set(n)
        for gauge, values in ((m.queue_pending, pending), (m.queue_running, running),
                              (m.queue_oldest, oldest)):
            for (queue, tenant), v in values.items():
                gauge.labels(queue, tenant).set(v)
        for queue, tenant in self.pairs:
            conf = self.queues.get(queue)
            bound = conf.starvation_bound_s if conf and conf.starvation_bound_s else None
            m.starvation_bound.labels(queue, tenant).set(bound or self.starvation_bound_s)
        m.stuck.labels("bound_not_running").set(stuck)
        self._export_usage(m)
        shares, whole = self._gpu_use()
        live = [inv for n, inv in self.nodes.items() if n not in self.lost]
        m.gpus.labels("total").set(sum(len(inv.gpus) for inv in live))
        m.gpus.labels("allocated").set(len(whole | set(shares)))
        m.gpus.labels("shared").set(len(set(shares) - whole))
        m.fragmentation.set(self.fragmentation())
        m.nodes.labels("ready").set(len(set(self.nodes) - self.lost - self.cordoned))
        m.nodes.labels("lost").set(len(self.lost))
        m.nodes.labels("cordoned").set(len(self.cordoned - self.lost))
        for node, t in self.last_seen.items():
            m.last_heartbeat.labels(node).set(t)

    def _model_of(self, node: str) -> str:
        inv = self.nodes.get(node)
        return model_id(inv.gpus[0].model, inv.gpus[0].memory_mib) if inv and inv.gpus else ""

    def _export_usage(self, m: MonitorMetrics) -> None:
        """Quota use per queue and DRF dominant share per (queue, tenant)."""
        live = [inv for n, inv in self.nodes.items() if n not in self.lost]
        capacity = (sum(len(i.gpus) for i in live), sum(i.cpu_milli for i in live),
                    sum(i.memory_mib for i in live))
        use: dict[tuple[str, str], list[float]] = {p: [0.0, 0.0, 0.0] for p in self.pairs}
        by_model: dict[tuple[str, str, str], float] = {}  # (queue, tenant, GPU model) -> GPUs
        for (job_id, _, _), h in self.holds.items():
            job = self.jobs.get(job_id)
            if job is None:
                continue
            u = use.setdefault((job.queue, job.tenant), [0.0, 0.0, 0.0])
            gpus = sum(1.0 if not mib and pct >= 100 else pct / 100 for _, mib, pct in h.gpus)
            u[0] += gpus
            if gpus:
                key = (job.queue, job.tenant, self._model_of(h.node))
                by_model[key] = by_model.get(key, 0.0) + gpus
            u[1] += h.cpu_milli
            u[2] += h.memory_mib
        by_queue: dict[str, float] = {q: 0.0 for q in self.queues}
        m.gpus_by_model.clear()  # a model a queue no longer holds must not linger
        billed: dict[tuple[str, str], float] = {p: 0.0 for p in use}
        def node(name: str) -> tuple[str | None, dict[str, float]] | None:
            c = self.queues.get(name)
            return None if c is None else (c.parent, c.billing_weights)
        for (queue, tenant, model), gpus in by_model.items():
            m.gpus_by_model.labels(queue, tenant, model).set(gpus)
            billed[queue, tenant] = billed.get((queue, tenant), 0.0) + gpus * weight_of(
                inherited(node, queue), model)
        for (queue, tenant), u in use.items():
            shares = [x / c for x, c in zip(u, capacity, strict=True) if c > 0]
            m.dominant_share.labels(queue, tenant).set(max(shares, default=0.0))
            m.billed_gpus.labels(queue, tenant).set(billed.get((queue, tenant), 0.0))
            by_queue[queue] = by_queue.get(queue, 0.0) + u[0]
        for queue, used in by_queue.items():
            conf = self.queues.get(queue, QueueConf())
            tenant = conf.tenant or self.queue_tenant.get(queue, "")
            guaranteed = conf.guaranteed_gpus
            m.queue_quota.labels(queue, tenant, "used").set(used)
            m.queue_quota.labels(queue, tenant, "guaranteed").set(guaranteed or 0)
            m.queue_quota.labels(queue, tenant, "borrowed").set(
                max(0.0, used - guaranteed) if guaranteed is not None else 0.0)
