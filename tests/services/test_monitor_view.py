"""The monitor's cluster view: job counts, queue gauges, JCT histograms, allocation (grown
elastic replicas included), quota and DRF shares, fragmentation, stuck jobs."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import ClassVar

import pytest
from prometheus_client import CollectorRegistry

from services.monitor.metrics import MonitorMetrics
from services.monitor.view import ClusterView, queue_conf
from shared.events import (
    Binding,
    BindingAction,
    Event,
    GpuAssignment,
    JobState,
    JobStatus,
    JobSubmitted,
    NodeLost,
    QueueChanged,
    TaskBinding,
)
from shared.jobspec import parse_job_spec
from tests.services.builders import node

SPEC = parse_job_spec({"name": "j", "queue": "research", "tasks": [{"name": "w"}]})
WAITING_SPEC = parse_job_spec({"name": "big", "queue": "research",
                               "tasks": [{"name": "w", "resources": {"gpu": 4}}]})


class Sampler:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.metrics = MonitorMetrics(self.registry)

    def __call__(self, name: str, **labels: str) -> float:
        value = self.registry.get_sample_value(name, labels)
        assert value is not None, f"{name}{labels} not exported"
        return value

    def absent(self, name: str, **labels: str) -> bool:
        return self.registry.get_sample_value(name, labels) is None


@pytest.fixture
def m() -> Sampler:
    return Sampler()


def submitted(job: str, at: float, spec: object = SPEC, tenant: str = "vision") -> JobSubmitted:
    return JobSubmitted(job_id=job, queue="research", tenant=tenant, user="u", spec=spec,
                        submitted_at=datetime.fromtimestamp(at, UTC))


def status(job: str, state: JobState, attempt: int = 1, task: str | None = None,
           reason: str = "test") -> JobStatus:
    return JobStatus(job_id=job, state=state, reason=reason, attempt=attempt, task=task,
                     node_id="m1" if task else None)


def task(task_id: str, *gpus: GpuAssignment, cpu: int = 8000, mem: int = 65536) -> TaskBinding:
    return TaskBinding(task_id=task_id, task_name="w", role="w", replica=0, rank=0,
                       gpus=list(gpus), cpu_milli=cpu, memory_mib=mem)


def binding(job: str, action: BindingAction, *tasks: TaskBinding, node_id: str = "m1",
            attempt: int = 1) -> Binding:
    return Binding(binding_id=f"{job}-{action}-{len(tasks)}", action=action, node_id=node_id,
                   epoch=1, job_id=job, attempt=attempt, tasks=list(tasks))


def view(m: Sampler, **kw: float) -> ClusterView:
    return ClusterView(metrics=m.metrics, **kw)  # type: ignore[arg-type]


def test_jobs_queues_and_histograms_follow_the_events(m: Sampler) -> None:
    v = view(m, stuck_after_s=60)
    v.apply(node("m1", gpus=4), 0, 0)
    for j in "ABC":
        v.apply(submitted(j, 1000), 1000, 1000)
    v.apply(status("A", JobState.ADMITTED), 1001, 1001)
    v.apply(status("A", JobState.BOUND), 1002, 1002)
    v.apply(binding("A", BindingAction.ALLOCATE,
                    task("w-0", GpuAssignment(index=0), GpuAssignment(index=1, memory_mib=1000,
                                                                      compute_pct=50))),
            1002, 1002)
    v.apply(status("A", JobState.RUNNING), 1010, 1010)
    v.apply(status("B", JobState.BOUND), 1003, 1003)
    v.export(now=1100)
    assert m("kairos_jobs", state="running") == 1
    assert m("kairos_jobs", state="bound") == 1
    assert m("kairos_jobs", state="pending") == 1
    assert m("kairos_queue_pending_jobs", queue="research", tenant="vision") == 1
    assert m("kairos_queue_running_jobs", queue="research", tenant="vision") == 2
    assert m("kairos_queue_oldest_pending_seconds", queue="research", tenant="vision") == 100
    assert m("kairos_jobs_stuck", reason="bound_not_running") == 1  # B, 97 s bound
    assert m("kairos_cluster_gpus", state="allocated") == 2
    assert m("kairos_cluster_gpus", state="shared") == 1
    assert m("kairos_cluster_gpus", state="total") == 4
    assert m("kairos_gpu_memory_total_bytes", node="m1", gpu="0") == 81559 * 1024 * 1024
    assert m("kairos_job_queueing_seconds_count", queue="research", tenant="vision") == 1
    assert m("kairos_queue_starvation_bound_seconds", queue="research",
             tenant="vision") == 14 * 86400

    v.apply(status("A", JobState.SUCCEEDED), 1030, 1030)
    v.apply(status("C", JobState.CANCELLED), 1031, 1031)
    v.apply(status("A", JobState.RUNNING), 1032, 1032)  # a late replay changes nothing
    v.apply(submitted("A", 1000), 1033, 1033)  # nor does a replayed submission
    v.export(now=1040)
    assert m("kairos_jobs", state="succeeded") == 1
    assert m("kairos_jobs", state="cancelled") == 1
    assert m("kairos_jobs", state="running") == 0
    assert m("kairos_jobs", state="pending") == 0
    assert m("kairos_cluster_gpus", state="allocated") == 0
    assert m("kairos_queue_pending_jobs", queue="research", tenant="vision") == 0
    # A only: a cancel is no completion; A took 30 s from submission
    assert m("kairos_job_completion_seconds_count", queue="research", tenant="vision") == 1
    assert m("kairos_job_completion_seconds_bucket", queue="research", tenant="vision",
             le="30.0") == 1


def test_grown_elastic_replicas_count_as_allocated_until_they_end(m: Sampler) -> None:
    """A resize binding's tasks hold GPUs like an allocate's; a task that ends frees only
    its own GPUs, even when the job has other tasks on the same node."""
    v = view(m)
    v.apply(node("m1", gpus=8), 0, 0)
    v.apply(submitted("E", 10), 10, 10)
    v.apply(status("E", JobState.BOUND), 11, 11)
    v.apply(binding("E", BindingAction.ALLOCATE, task("w-0", GpuAssignment(index=0))), 11, 11)
    v.apply(binding("E", BindingAction.RESIZE, task("w-1.1", GpuAssignment(index=1)),
                    task("w-2.1", GpuAssignment(index=2))), 12, 12)
    v.export(now=13)
    assert m("kairos_cluster_gpus", state="allocated") == 3
    assert m("kairos_queue_quota_gpus", queue="research", tenant="vision", kind="used") == 3
    # a shrink stops w-2.1: its GPU is held until the agent reports it ended
    shrink = binding("E", BindingAction.RESIZE)
    v.apply(shrink.model_copy(update={"stop_task_ids": ["w-2.1"]}), 14, 14)
    v.export(now=14)
    assert m("kairos_cluster_gpus", state="allocated") == 3
    v.apply(status("E", JobState.CANCELLED, task="w-2.1"), 15, 15)
    v.export(now=15)
    assert m("kairos_cluster_gpus", state="allocated") == 2
    v.apply(status("E", JobState.SUCCEEDED), 20, 20)
    v.export(now=20)
    assert m("kairos_cluster_gpus", state="allocated") == 0


def test_a_retry_releases_the_earlier_attempt(m: Sampler) -> None:
    v = view(m)
    v.apply(node("m1", gpus=8), 0, 0)
    v.apply(node("m2", gpus=8), 0, 0)
    v.apply(submitted("R", 10), 10, 10)
    v.apply(binding("R", BindingAction.ALLOCATE, task("w-0", GpuAssignment(index=0))), 11, 11)
    v.apply(NodeLost(node_id="m1", last_seen=datetime.fromtimestamp(11, UTC)), 20, 20)
    v.apply(status("R", JobState.ADMITTED, attempt=2, reason="retry after node lost"), 21, 21)
    v.export(now=21)
    assert m("kairos_cluster_gpus", state="allocated") == 0
    assert m("kairos_cluster_gpus", state="total") == 8  # m1 is lost
    assert m("kairos_nodes", state="lost") == 1
    assert m("kairos_nodes", state="ready") == 1


def test_statuses_read_before_their_submission_are_applied_to_it(m: Sampler) -> None:
    """The view reads jobs.submitted and jobs.status in parallel: order across topics is
    not guaranteed when it replays history."""
    v = view(m)
    v.apply(status("L", JobState.RUNNING), 20, 100)
    v.apply(status("L", JobState.SUCCEEDED), 50, 100)
    v.apply(submitted("L", 10), 10, 100)
    v.export(now=100)
    assert m("kairos_jobs", state="succeeded") == 1
    assert m("kairos_jobs", state="pending") == 0
    assert m("kairos_job_queueing_seconds_sum", queue="research", tenant="vision") == 10
    assert m("kairos_job_completion_seconds_sum", queue="research", tenant="vision") == 40


def test_quota_borrowing_and_dominant_share(m: Sampler) -> None:
    v = view(m)
    v.apply(node("m1", gpus=8), 0, 0)
    v.apply(QueueChanged(queue="research", change="created",
                         settings={"tenant": "vision", "nominal": {"gpu": 2},
                                   "starvation_bound_s": 600}), 0, 0)
    v.apply(submitted("Q", 10), 10, 10)
    v.apply(binding("Q", BindingAction.ALLOCATE,
                    task("w-0", GpuAssignment(index=0), GpuAssignment(index=1),
                         GpuAssignment(index=2), cpu=64_000)), 11, 11)
    v.apply(submitted("S", 10), 10, 10)
    v.apply(binding("S", BindingAction.ALLOCATE,
                    task("w-0", GpuAssignment(index=3, memory_mib=20480, compute_pct=25),
                         cpu=0, mem=0)), 11, 11)
    v.export(now=12)
    labels = {"queue": "research", "tenant": "vision"}
    assert m("kairos_queue_quota_gpus", **labels, kind="guaranteed") == 2
    assert m("kairos_queue_quota_gpus", **labels, kind="used") == 3.25
    assert m("kairos_queue_quota_gpus", **labels, kind="borrowed") == 1.25
    assert m("kairos_queue_dominant_share_ratio", **labels) == 0.5  # 64 of 128 cores
    assert m("kairos_queue_starvation_bound_seconds", **labels) == 600


@pytest.mark.parametrize(("settings", "guaranteed", "bound"), [
    ({"nominal": {"gpu": 4}}, 4.0, None),
    ({"guaranteed": 3, "starvationBound": 60}, 3.0, 60.0),
    ({"quota": {"gpus": 16}, "tenant": "nlp"}, 16.0, None),
    ({"weight": 2}, None, None),
    ({"nominal": {"gpu": True}}, None, None),  # not a number
])
def test_queue_settings_are_read_tolerantly(settings: dict[str, object],
                                            guaranteed: float | None,
                                            bound: float | None) -> None:
    conf = queue_conf(settings)
    assert (conf.guaranteed_gpus, conf.starvation_bound_s) == (guaranteed, bound)


def test_fragmentation_counts_free_gpus_no_waiting_shape_can_use(m: Sampler) -> None:
    v = view(m)
    v.apply(node("m1", gpus=4), 0, 0)
    v.apply(node("m2", gpus=4), 0, 0)
    v.apply(submitted("X", 1), 1, 1)
    v.apply(binding("X", BindingAction.ALLOCATE, task("w-0", *(GpuAssignment(index=i)
                                                              for i in range(3)))), 2, 2)
    v.export(now=3)
    assert m("kairos_cluster_fragmentation_ratio") == 0  # nothing waits
    v.apply(submitted("W", 4, spec=WAITING_SPEC), 4, 4)  # a 4-GPU task waits
    v.export(now=5)
    # free: 1 on m1 (stranded), 4 on m2 (usable) -> 1/5
    assert m("kairos_cluster_fragmentation_ratio") == pytest.approx(0.2)


class _Scheduling(Event):
    """Stands in for the scheduler's node.scheduling answer to a cordon (the monitor reads
    it by its type name and fields)."""

    TYPE: ClassVar[str] = "node.scheduling"
    node_id: str
    scheduling: str


def test_cordoned_nodes_and_clearing_on_standing_down(m: Sampler) -> None:
    v = view(m)
    v.apply(node("m1"), 0, 0)
    v.apply(node("m2"), 0, 0)
    v.apply(_Scheduling(node_id="m2", scheduling="cordoned"), 1, 1)
    v.apply(submitted("A", 1), 1, 1)
    v.export(now=2)
    assert m("kairos_nodes", state="cordoned") == 1
    assert m("kairos_nodes", state="ready") == 1
    v.apply(_Scheduling(node_id="m2", scheduling="schedulable"), 3, 3)
    v.export(now=3)
    assert m("kairos_nodes", state="cordoned") == 0
    m.metrics.clear_cluster()
    assert m.absent("kairos_nodes", state="ready")
    assert m.absent("kairos_jobs", state="pending")
    assert m.absent("kairos_cluster_gpus", state="total")
    assert m.absent("kairos_queue_pending_jobs", queue="research", tenant="vision")


def test_gpus_per_model_and_billed_gpus_at_the_queues_inherited_weights(m: Sampler) -> None:
    """The cohort prices an H100 at 4; its queue research inherits it: 3 H100s held and a
    quarter of one count 13 billed GPUs, by model H100-80GB."""
    v = view(m)
    v.apply(node("m1", gpus=8), 0, 0)
    v.apply(QueueChanged(queue="lab", change="created",
                         settings={"name": "lab", "kind": "cohort",
                                   "billing_weights": {"H100": 4}}), 0, 0)
    v.apply(QueueChanged(queue="research", change="created",
                         settings={"name": "research", "parent": "lab", "tenant": "vision"}),
            0, 0)
    v.apply(submitted("Q", 10), 10, 10)
    v.apply(binding("Q", BindingAction.ALLOCATE,
                    task("w-0", GpuAssignment(index=0), GpuAssignment(index=1),
                         GpuAssignment(index=2))), 11, 11)
    v.apply(submitted("S", 10), 10, 10)
    v.apply(binding("S", BindingAction.ALLOCATE,
                    task("w-0", GpuAssignment(index=3, memory_mib=20480, compute_pct=25),
                         cpu=0, mem=0)), 11, 11)
    v.export(now=12)
    labels = {"queue": "research", "tenant": "vision"}
    assert m("kairos_queue_gpus_by_model", **labels, model="H100-80GB") == 3.25
    assert m("kairos_queue_billed_gpus", **labels) == 13.0
    v.apply(status("Q", JobState.SUCCEEDED, task="w-0"), 20, 20)
    v.export(now=21)
    assert m("kairos_queue_billed_gpus", **labels) == 1.0
