"""The monitor's view of the cluster, built from events, and the metrics it exports.

Names and labels follow monitoring/METRICS.md (the catalogue dashboards and alerts read).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from prometheus_client import Counter, Gauge, Histogram

from shared.events import (
    Binding,
    BindingAction,
    DeadLetter,
    Event,
    GpuHealth,
    JobState,
    JobStatus,
    JobSubmitted,
    NodeHeartbeat,
    NodeLost,
    NodeRegistered,
    NodeTelemetry,
)

MIB = 1024 * 1024
JOB_BUCKETS = (1, 5, 15, 30, 60, 120, 300, 600, 1800, 3600, 7200, 21600, 86400)

JOBS = Gauge("kairos_jobs", "Jobs by state", ["state"])
GPUS = Gauge("kairos_cluster_gpus", "GPUs by state (total, allocated, shared, degraded)",
             ["state"])
NODES = Gauge("kairos_nodes", "Nodes by state", ["state"])
NODES_LOST = Counter("kairos_nodes_lost_total", "Nodes declared lost")
HEARTBEAT_TIMEOUT = Gauge("kairos_node_heartbeat_timeout_seconds",
                          "Silence after which a node is declared lost")
DEADLETTERED = Counter("kairos_cluster_deadletters_total", "Dead letters seen on the bus",
                       ["topic", "reason"])
QUEUEING = Histogram("kairos_job_queueing_seconds", "Submission to first running",
                     ["queue", "tenant"], buckets=JOB_BUCKETS)
COMPLETION = Histogram("kairos_job_completion_seconds", "Submission to succeeded or failed (JCT)",
                       ["queue", "tenant"], buckets=JOB_BUCKETS)
QUEUE_PENDING = Gauge("kairos_queue_pending_jobs", "Jobs pending or admitted, not running",
                      ["queue", "tenant"])
QUEUE_RUNNING = Gauge("kairos_queue_running_jobs", "Jobs bound or running", ["queue", "tenant"])
QUEUE_OLDEST = Gauge("kairos_queue_oldest_pending_seconds", "Age of the oldest waiting job",
                     ["queue", "tenant"])
STUCK = Gauge("kairos_jobs_stuck", "Jobs that stopped progressing, by reason", ["reason"])
GPU_UTIL = Gauge("kairos_gpu_utilization_ratio", "GPU utilisation (0-1)", ["node", "gpu"])
GPU_MEM = Gauge("kairos_gpu_memory_used_bytes", "GPU memory used", ["node", "gpu"])
GPU_MEM_TOTAL = Gauge("kairos_gpu_memory_total_bytes", "GPU memory installed", ["node", "gpu"])
GPU_TEMP = Gauge("kairos_gpu_temperature_celsius", "GPU temperature", ["node", "gpu"])
GPU_POWER = Gauge("kairos_gpu_power_watts", "GPU power draw", ["node", "gpu"])
GPU_DEGRADED = Gauge("kairos_gpu_degraded", "1 if the GPU is degraded", ["node", "gpu"])
LAST_HEARTBEAT = Gauge("kairos_node_last_heartbeat_timestamp_seconds",
                       "Unix time of a node's last heartbeat", ["node"])

WAITING = {JobState.PENDING, JobState.ADMITTED, JobState.PREEMPTED}
ACTIVE = {JobState.BOUND, JobState.RUNNING}


@dataclass
class JobTrack:
    queue: str
    tenant: str
    submitted_at: float
    state: JobState = JobState.PENDING
    since: float = 0.0  # when it entered ``state``
    ran: bool = False


@dataclass
class ClusterView:
    stuck_after_s: float = 120.0
    jobs: dict[str, JobTrack] = field(default_factory=dict)  # jobs not yet ended
    ended: dict[str, int] = field(default_factory=dict)  # terminal state -> count
    node_gpus: dict[str, int] = field(default_factory=dict)
    last_seen: dict[str, float] = field(default_factory=dict)
    lost: set[str] = field(default_factory=set)
    # (job, attempt, node) -> [(gpu index, shared)] of live bindings
    bound: dict[tuple[str, int, str], list[tuple[int, bool]]] = field(default_factory=dict)
    degraded: dict[str, set[int]] = field(default_factory=dict)
    queues: set[tuple[str, str]] = field(default_factory=set)  # (queue, tenant) ever seen

    def apply(self, event: Event, occurred_at: float, seen_at: float) -> None:
        if isinstance(event, JobSubmitted):
            if event.job_id not in self.jobs:
                t = event.submitted_at.timestamp()
                self.jobs[event.job_id] = JobTrack(event.queue, event.tenant, t, since=t)
                self.queues.add((event.queue, event.tenant))
        elif isinstance(event, JobStatus) and event.task is None:
            self._job_status(event, occurred_at)
        elif isinstance(event, JobStatus) and event.state.terminal and event.node_id:
            self.bound.pop((event.job_id, event.attempt, event.node_id), None)
        elif isinstance(event, Binding) and event.action is BindingAction.ALLOCATE:
            self.bound[(event.job_id, event.attempt, event.node_id)] = [
                (g.index, bool(g.memory_mib)) for t in event.tasks for g in t.gpus]
        elif isinstance(event, NodeRegistered):
            inv = event.inventory
            self.node_gpus[inv.node_id] = len(inv.gpus)
            for g in inv.gpus:
                GPU_MEM_TOTAL.labels(inv.node_id, str(g.index)).set(g.memory_mib * MIB)
            self._seen(inv.node_id, seen_at)
        elif isinstance(event, NodeHeartbeat):
            self._seen(event.node_id, seen_at)
        elif isinstance(event, NodeLost):
            self.lost.add(event.node_id)
        elif isinstance(event, NodeTelemetry):
            self._telemetry(event)
        elif isinstance(event, DeadLetter):
            DEADLETTERED.labels(event.topic, event.reason).inc()

    def _seen(self, node: str, at: float) -> None:
        self.last_seen[node] = at
        self.lost.discard(node)

    def _job_status(self, st: JobStatus, at: float) -> None:
        job = self.jobs.get(st.job_id)
        if job is None:
            return  # ended already, or submitted before this monitor's history
        job.state, job.since = st.state, at
        if st.state is JobState.RUNNING and not job.ran:
            job.ran = True
            QUEUEING.labels(job.queue, job.tenant).observe(max(0.0, at - job.submitted_at))
        if st.state.terminal or st.state is JobState.PREEMPTED:
            for k in [k for k in self.bound if k[0] == st.job_id]:
                del self.bound[k]
        if st.state.terminal:
            if st.state is not JobState.CANCELLED:
                COMPLETION.labels(job.queue, job.tenant).observe(
                    max(0.0, at - job.submitted_at))
            self.ended[st.state.value] = self.ended.get(st.state.value, 0) + 1
            del self.jobs[st.job_id]

    def _telemetry(self, event: NodeTelemetry) -> None:
        self.degraded[event.node_id] = {
            g.index for g in event.gpus if g.health is GpuHealth.DEGRADED}
        for g in event.gpus:
            labels = (event.node_id, str(g.index))
            GPU_UTIL.labels(*labels).set(g.utilization_pct / 100)
            GPU_MEM.labels(*labels).set(g.memory_used_mib * MIB)
            GPU_TEMP.labels(*labels).set(g.temperature_c)
            GPU_POWER.labels(*labels).set(g.power_w)
            GPU_DEGRADED.labels(*labels).set(1 if g.health is GpuHealth.DEGRADED else 0)

    def export(self, now: float) -> None:
        counts = dict.fromkeys((s.value for s in JobState), 0)
        counts.update(self.ended)
        pending = dict.fromkeys(self.queues, 0)
        running = dict.fromkeys(self.queues, 0)
        oldest = dict.fromkeys(self.queues, 0.0)
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
            JOBS.labels(s).set(n)
        for gauge, values in ((QUEUE_PENDING, pending), (QUEUE_RUNNING, running),
                              (QUEUE_OLDEST, oldest)):
            for (queue, tenant), v in values.items():
                gauge.labels(queue, tenant).set(v)
        STUCK.labels("bound_not_running").set(stuck)
        whole: set[tuple[str, int]] = set()
        shared: set[tuple[str, int]] = set()
        for (_, _, node), gpus in self.bound.items():
            for idx, is_shared in gpus:
                (shared if is_shared else whole).add((node, idx))
        GPUS.labels("total").set(sum(self.node_gpus.values()))
        GPUS.labels("allocated").set(len(whole | shared))
        GPUS.labels("shared").set(len(shared - whole))
        GPUS.labels("degraded").set(sum(len(v) for v in self.degraded.values()))
        NODES.labels("ready").set(len(set(self.node_gpus) - self.lost))
        NODES.labels("lost").set(len(self.lost))
        NODES.labels("cordoned").set(0)  # cordon arrives with the gateway's node operations
        for node, t in self.last_seen.items():
            LAST_HEARTBEAT.labels(node).set(t)
