"""The monitor's cluster view: job counts, queue gauges, JCT histograms, GPUs, stuck jobs."""

from __future__ import annotations

from datetime import UTC, datetime

from prometheus_client import REGISTRY

from services.monitor.view import ClusterView
from shared.events import (
    Binding,
    BindingAction,
    GpuAssignment,
    JobState,
    JobStatus,
    JobSubmitted,
    TaskBinding,
)
from shared.jobspec import parse_job_spec
from tests.services.builders import node

SPEC = parse_job_spec({"name": "j", "queue": "research", "tasks": [{"name": "w"}]})


def sample(name: str, **labels: str) -> float:
    value = REGISTRY.get_sample_value(name, labels)
    assert value is not None, f"{name}{labels} not exported"
    return value


def submitted(job: str, at: float) -> JobSubmitted:
    return JobSubmitted(job_id=job, queue="research", tenant="vision", user="u", spec=SPEC,
                        submitted_at=datetime.fromtimestamp(at, UTC))


def status(job: str, state: JobState) -> JobStatus:
    return JobStatus(job_id=job, state=state, reason="test")


def test_jobs_queues_and_histograms_follow_the_events() -> None:
    before_count = REGISTRY.get_sample_value(
        "kairos_job_completion_seconds_count", {"queue": "research", "tenant": "vision"}) or 0
    v = ClusterView(stuck_after_s=60)
    v.apply(node("m1", gpus=4), 0, 0)
    v.apply(submitted("A", 1000), 1000, 1000)
    v.apply(submitted("B", 1000), 1000, 1000)
    v.apply(submitted("C", 1000), 1000, 1000)
    v.apply(status("A", JobState.ADMITTED), 1001, 1001)
    v.apply(status("A", JobState.BOUND), 1002, 1002)
    v.apply(Binding(binding_id="x", action=BindingAction.ALLOCATE, node_id="m1", epoch=1,
                    job_id="A", tasks=[TaskBinding(task_id="w-0", task_name="w", role="w",
                                                   replica=0, rank=0,
                                                   gpus=[GpuAssignment(index=0),
                                                         GpuAssignment(index=1,
                                                                       memory_mib=1000)])]),
            1002, 1002)
    v.apply(status("A", JobState.RUNNING), 1010, 1010)
    v.apply(status("B", JobState.BOUND), 1003, 1003)
    v.export(now=1100)
    assert sample("kairos_jobs", state="running") == 1
    assert sample("kairos_jobs", state="bound") == 1
    assert sample("kairos_jobs", state="pending") == 1
    assert sample("kairos_queue_pending_jobs", queue="research", tenant="vision") == 1
    assert sample("kairos_queue_running_jobs", queue="research", tenant="vision") == 2
    assert sample("kairos_queue_oldest_pending_seconds", queue="research", tenant="vision") == 100
    assert sample("kairos_jobs_stuck", reason="bound_not_running") == 1  # B, 97 s bound
    assert sample("kairos_cluster_gpus", state="allocated") == 2
    assert sample("kairos_cluster_gpus", state="shared") == 1
    assert sample("kairos_cluster_gpus", state="total") == 4
    assert sample("kairos_gpu_memory_total_bytes", node="m1", gpu="0") == 81559 * 1024 * 1024

    v.apply(status("A", JobState.SUCCEEDED), 1030, 1030)
    v.apply(status("C", JobState.CANCELLED), 1031, 1031)
    v.apply(status("A", JobState.RUNNING), 1032, 1032)  # a late replay changes nothing
    v.export(now=1040)
    assert sample("kairos_jobs", state="succeeded") == 1
    assert sample("kairos_jobs", state="cancelled") == 1
    assert sample("kairos_jobs", state="running") == 0
    assert sample("kairos_cluster_gpus", state="allocated") == 0
    assert sample("kairos_queue_pending_jobs", queue="research", tenant="vision") == 0
    assert sample("kairos_job_completion_seconds_count", queue="research",
                  tenant="vision") == before_count + 1  # A only: a cancel is no completion
    assert sample("kairos_job_completion_seconds_bucket", queue="research", tenant="vision",
                  le="30.0") >= 1  # A took 30 s from submission
