"""The monitor's Prometheus metrics, on a registry of the caller's choosing.

Names, units and labels follow monitoring/METRICS.md. Every series is exported by exactly
one replica, so dashboards and alerts add replicas up with ``sum``:

- the *cluster* set comes from the elected replica only (``ClusterView``: jobs, queues,
  allocation, nodes); a replica that loses the election removes it (``clear_cluster``);
- the *shard* set comes from whichever replica owns the partition the event arrived on
  (``ShardView``: per-GPU telemetry, the degraded-GPU count, transitions, dead letters).

A registry per object (instead of module globals) lets a test run two replicas in one
process and read each one's share.
"""

from __future__ import annotations

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram

# queueing delay and JCT: seconds to a day
JOB_BUCKETS = (1, 5, 15, 30, 60, 120, 300, 600, 1800, 3600, 7200, 21600, 86400)
CLUSTER_GPU_STATES = ("total", "allocated", "shared")  # the leader's; "degraded" is sharded
QUOTA_KINDS = ("guaranteed", "used", "borrowed")
STUCK_REASONS = ("bound_not_running",)


class MonitorMetrics:
    def __init__(self, registry: CollectorRegistry = REGISTRY) -> None:
        r = registry
        # --- cluster set (elected replica) ---
        self.jobs = Gauge("kairos_jobs", "Jobs by state", ["state"], registry=r)
        self.gpus = Gauge("kairos_cluster_gpus",
                          "GPUs by state (total, allocated, shared, degraded)", ["state"],
                          registry=r)
        self.fragmentation = Gauge(
            "kairos_cluster_fragmentation_ratio",
            "Share of free GPU capacity the waiting jobs' task shapes cannot use", registry=r)
        self.nodes = Gauge("kairos_nodes", "Nodes by state", ["state"], registry=r)
        self.nodes_lost = Counter("kairos_nodes_lost_total", "node.lost events published",
                                  registry=r)
        self.heartbeat_timeout = Gauge(
            "kairos_node_heartbeat_timeout_seconds",
            "Silence after which a node is declared lost", registry=r)
        self.last_heartbeat = Gauge("kairos_node_last_heartbeat_timestamp_seconds",
                                    "Unix time of a node's last heartbeat", ["node"], registry=r)
        self.queueing = Histogram("kairos_job_queueing_seconds", "Submission to first running",
                                  ["queue", "tenant"], buckets=JOB_BUCKETS, registry=r)
        self.completion = Histogram(
            "kairos_job_completion_seconds", "Submission to succeeded or failed (JCT)",
            ["queue", "tenant"], buckets=JOB_BUCKETS, registry=r)
        self.queue_pending = Gauge("kairos_queue_pending_jobs",
                                   "Jobs pending or admitted, not running", ["queue", "tenant"],
                                   registry=r)
        self.queue_running = Gauge("kairos_queue_running_jobs", "Jobs bound or running",
                                   ["queue", "tenant"], registry=r)
        self.queue_oldest = Gauge("kairos_queue_oldest_pending_seconds",
                                  "Age of the oldest waiting job", ["queue", "tenant"],
                                  registry=r)
        self.queue_quota = Gauge("kairos_queue_quota_gpus",
                                 "GPUs by kind (guaranteed, used, borrowed)",
                                 ["queue", "tenant", "kind"], registry=r)
        self.dominant_share = Gauge("kairos_queue_dominant_share_ratio",
                                    "DRF dominant share of the cluster held", ["queue", "tenant"],
                                    registry=r)
        self.gpus_by_model = Gauge("kairos_queue_gpus_by_model",
                                   "GPUs held (shares by their fraction), by GPU model",
                                   ["queue", "tenant", "model"], registry=r)
        self.billed_gpus = Gauge("kairos_queue_billed_gpus", "GPUs held at the queue's "
                                 "billing weights per model (1 where none is set)",
                                 ["queue", "tenant"], registry=r)
        self.starvation_bound = Gauge("kairos_queue_starvation_bound_seconds",
                                      "The queue's starvation bound (wait-time aging limit)",
                                      ["queue", "tenant"], registry=r)
        self.stuck = Gauge("kairos_jobs_stuck", "Jobs that stopped progressing, by reason",
                           ["reason"], registry=r)
        self.gpu_mem_total = Gauge("kairos_gpu_memory_total_bytes", "GPU memory installed",
                                   ["node", "gpu"], registry=r)
        # --- shard set (owner of the partition) ---
        self.gpu_util = Gauge("kairos_gpu_utilization_ratio", "GPU utilisation (0-1)",
                              ["node", "gpu"], registry=r)
        self.gpu_mem = Gauge("kairos_gpu_memory_used_bytes", "GPU memory used", ["node", "gpu"],
                             registry=r)
        self.gpu_temp = Gauge("kairos_gpu_temperature_celsius", "GPU temperature",
                              ["node", "gpu"], registry=r)
        self.gpu_power = Gauge("kairos_gpu_power_watts", "GPU power draw", ["node", "gpu"],
                               registry=r)
        self.gpu_degraded = Gauge("kairos_gpu_degraded", "1 if the GPU is degraded",
                                  ["node", "gpu"], registry=r)
        self.transitions = Counter("kairos_job_transitions_total",
                                   "Job state transitions on jobs.status", ["state", "reason"],
                                   registry=r)
        self.deadletters = Counter("kairos_cluster_deadletters_total",
                                   "Messages on the dead-letter topic", ["topic", "reason"],
                                   registry=r)
        self.forecast_wait = Histogram(
            "kairos_forecast_start_seconds",
            "Forecast wait to start (start - as_of) of each job.forecast, by queue; a job "
            "with no start in the horizon lands in +Inf, one waiting for quota is not counted",
            ["queue"], buckets=(*JOB_BUCKETS, 7 * 86400, 30 * 86400), registry=r)
        # --- every replica ---
        self.is_leader = Gauge("kairos_monitor_is_leader",
                               "1 on the replica that exports the cluster-wide series",
                               registry=r)
        self.is_leader.set(0)

    def per_gpu(self) -> tuple[Gauge, ...]:
        return (self.gpu_util, self.gpu_mem, self.gpu_temp, self.gpu_power, self.gpu_degraded)

    def clear_cluster(self) -> None:
        """Remove every cluster-set series: another replica exports them now."""
        for m in (self.jobs, self.nodes, self.last_heartbeat, self.queueing, self.completion,
                  self.queue_pending, self.queue_running, self.queue_oldest, self.queue_quota,
                  self.dominant_share, self.starvation_bound, self.stuck, self.gpu_mem_total,
                  self.gpus_by_model, self.billed_gpus):
            m.clear()
        for state in CLUSTER_GPU_STATES:
            self.gpus.remove(state)  # a missing child is no error
        # unlabelled series cannot be removed: a standby reports them as 0, which sums away
        self.fragmentation.set(0)
        self.heartbeat_timeout.set(0)
