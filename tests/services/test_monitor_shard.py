"""The monitor's partitioned share (telemetry, transitions, dead letters) and the
fragmentation measure."""

from __future__ import annotations

import json

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.utils import floatToGoString

from services.monitor.fragmentation import NodeRoom, Shape, fragmentation
from services.monitor.metrics import MonitorMetrics
from services.monitor.shard import ShardView, transition_reason
from shared.bus import partition_for
from shared.events import (
    DeadLetter,
    Envelope,
    GpuHealth,
    GpuTelemetry,
    JobForecast,
    JobState,
    JobStatus,
    NodeTelemetry,
    TransitionReason,
)


def telemetry(node: str, degraded: tuple[int, ...] = ()) -> NodeTelemetry:
    return NodeTelemetry(node_id=node, gpus=[
        GpuTelemetry(index=i, utilization_pct=50, memory_used_mib=1024, temperature_c=60,
                     power_w=300, health=GpuHealth.DEGRADED if i in degraded
                     else GpuHealth.HEALTHY) for i in range(2)])


def test_shard_exports_only_the_nodes_of_its_partitions() -> None:
    reg = CollectorRegistry()
    shard = ShardView(MonitorMetrics(reg), telemetry_partitions=4)
    nodes = [f"n{i}" for i in range(12)]
    for n in nodes:
        shard.apply(telemetry(n, degraded=(1,)))
    shard.export(owned={0, 1, 2, 3})
    assert reg.get_sample_value("kairos_cluster_gpus", {"state": "degraded"}) == 12
    assert reg.get_sample_value("kairos_gpu_utilization_ratio", {"node": "n0", "gpu": "0"}) == 0.5
    assert reg.get_sample_value("kairos_gpu_memory_used_bytes",
                                {"node": "n0", "gpu": "0"}) == 1024 ** 3
    kept = {n for n in nodes if partition_for(n, 4) in {0, 1}}
    assert 0 < len(kept) < len(nodes)
    shard.export(owned={0, 1})  # a rebalance took partitions 2 and 3 away
    assert reg.get_sample_value("kairos_cluster_gpus", {"state": "degraded"}) == len(kept)
    for n in nodes:
        value = reg.get_sample_value("kairos_gpu_temperature_celsius", {"node": n, "gpu": "1"})
        assert (value == 60) if n in kept else (value is None), n


def test_transitions_and_dead_letters_are_counted_with_bounded_labels() -> None:
    reg = CollectorRegistry()
    shard = ShardView(MonitorMetrics(reg), telemetry_partitions=4)
    shard.apply(JobStatus(job_id="j", state=JobState.BOUND, reason="placed on 2 node(s)"))
    shard.apply(JobStatus(job_id="j", state=JobState.BOUND, reason="placed on 1 node(s)"))
    shard.apply(JobStatus(job_id="j", state=JobState.RUNNING, reason="x", task="w-0"))  # task
    shard.apply(DeadLetter(topic="jobs.commands", partition=0, offset=3, msg_key=None,
                           value="{", reason="undecodable", error="e", consumer_group="g"))
    assert reg.get_sample_value("kairos_job_transitions_total",
                                {"state": "bound", "reason": "placed"}) == 2
    assert reg.get_sample_value("kairos_job_transitions_total",
                                {"state": "running", "reason": "other"}) is None
    assert reg.get_sample_value("kairos_cluster_deadletters_total",
                                {"topic": "jobs.commands", "reason": "undecodable"}) == 1


def test_the_monitor_labels_a_transition_by_its_code_not_its_text() -> None:
    reg = CollectorRegistry()
    shard = ShardView(MonitorMetrics(reg), telemetry_partitions=4)
    # the words say nothing a prefix table knows; the code says what happened
    shard.apply(JobStatus(job_id="j", state=JobState.PREEMPTED, reason="quota of q taken "
                          "back", reason_code=TransitionReason.RECLAIMED))
    assert reg.get_sample_value("kairos_job_transitions_total",
                                {"state": "preempted", "reason": "reclaimed"}) == 1


def test_an_event_without_a_code_or_with_an_unknown_one_reads_as_before() -> None:
    """An older producer's event has no ``reason_code``: its text is classified; a newer
    producer's code this reader lacks reads as ``other``."""
    old = Envelope.wrap(JobStatus(job_id="j", state=JobState.RUNNING,
                                  reason="all tasks running"), "scheduler").encode()
    data = json.loads(old)
    del data["data"]["reason_code"]  # as an older scheduler wrote it
    ev = Envelope.decode(json.dumps(data).encode()).payload()
    assert isinstance(ev, JobStatus) and ev.reason_code is None
    assert transition_reason(ev) is TransitionReason.STARTED
    data["data"]["reason_code"] = "teleported"  # a code from a newer producer
    ev = Envelope.decode(json.dumps(data).encode()).payload()
    assert isinstance(ev, JobStatus) and transition_reason(ev) is TransitionReason.OTHER


@pytest.mark.parametrize(("reason", "expected"), [
    ("admitted by queue (fifo)", TransitionReason.ADMITTED),
    ("all tasks running", TransitionReason.STARTED),
    ("all tasks succeeded", TransitionReason.SUCCEEDED),
    ("retry after node lost", TransitionReason.RETRY),
    ("out of retries: task w-0 failed: error", TransitionReason.OUT_OF_RETRIES),
    ("preempted for j-123", TransitionReason.PREEMPTED),
    ("quota reclaimed: queue a borrowed what b is guaranteed", TransitionReason.RECLAIMED),
    ("node lost", TransitionReason.NODE_LOST),
    ("3 nodes lost under it: node n1 lost", TransitionReason.NODE_LOST),
    ("cancelled by user", TransitionReason.CANCELLED),
    ("cancelled before placement", TransitionReason.CANCELLED),
    ("returned", TransitionReason.CANCELLED),
    ("time limit reached", TransitionReason.TIME_LIMIT),
    ("resized", TransitionReason.RESIZED),
    ("waiting: quota", TransitionReason.WAITING),
    ("requeued in queue q: its quota was reclaimed", TransitionReason.REQUEUED),
    ("something new", TransitionReason.OTHER),
])
def test_an_old_events_text_is_classified(reason: str, expected: TransitionReason) -> None:
    assert transition_reason(JobStatus(job_id="j", state=JobState.ADMITTED,
                                       reason=reason)) is expected


@pytest.mark.parametrize(("rooms", "shapes", "expected"), [
    ([NodeRoom(4)], [], 0.0),  # nothing waits: nothing stranded
    ([], [Shape(1)], 0.0),  # nothing free
    ([NodeRoom(4)], [Shape(4)], 0.0),
    ([NodeRoom(3)], [Shape(2)], 1 / 3),  # one of three left over
    ([NodeRoom(3), NodeRoom(1)], [Shape(2), Shape(4)], 2 / 4),
    ([NodeRoom(1)], [Shape(0, 1024, 10)], 0.0),  # a share fits a free GPU
    ([NodeRoom(0, [(10240, 50)])], [Shape(1)], 1.0),  # half a GPU, whole GPUs wanted
    ([NodeRoom(0, [(10240, 50)])], [Shape(0, 20480, 25)], 1.0),  # not enough memory
    ([NodeRoom(0, [(40960, 50)])], [Shape(0, 20480, 25)], 0.0),
    ([NodeRoom(1, [(40960, 50)])], [Shape(2)], 1.0),
])
def test_fragmentation(rooms: list[NodeRoom], shapes: list[Shape], expected: float) -> None:
    assert fragmentation(rooms, shapes) == pytest.approx(expected)


def test_forecasts_are_observed_as_waits_per_queue() -> None:
    reg = CollectorRegistry()
    shard = ShardView(MonitorMetrics(reg), telemetry_partitions=4)
    shard.apply(JobForecast(job_id="a", queue="research", tenant="t", as_of=100, start=400))
    shard.apply(JobForecast(job_id="b", queue="research", tenant="t", as_of=100, start=None))
    shard.apply(JobForecast(job_id="c", queue="research", tenant="t", as_of=100, reason="quota"))
    labels = {"queue": "research"}
    assert reg.get_sample_value("kairos_forecast_start_seconds_count", labels) == 2
    assert reg.get_sample_value("kairos_forecast_start_seconds_bucket", {**labels, "le": "300.0"}) == 1
    assert reg.get_sample_value("kairos_forecast_start_seconds_bucket",
                                {**labels, "le": floatToGoString(30 * 86400)}) == 1
    assert reg.get_sample_value("kairos_forecast_start_seconds_bucket",
                                {**labels, "le": "+Inf"}) == 2  # no start: +Inf only
