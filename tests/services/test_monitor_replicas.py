"""Two monitor replicas split the work without double counting, against the real broker
(its own Tansu, so no other test's events are mixed in) and real PostgreSQL: every
series summed over the two equals what one replica alone exports, each GPU comes from
exactly one of them, and when the elected one stops the other takes the cluster view over."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition
from prometheus_client import CollectorRegistry

from kairos.embedded import EmbeddedBroker
from services.monitor.main import MonitorReplica
from services.monitor.metrics import MonitorMetrics
from services.monitor.settings import LOCK_KEY, MonitorSettings
from shared.bus import Consumer, ConsumerOptions, Producer, ensure_topics
from shared.config import CommonSettings
from shared.events import (
    Binding,
    BindingAction,
    DeadLetter,
    Envelope,
    Event,
    GpuAssignment,
    GpuHealth,
    GpuTelemetry,
    JobState,
    JobStatus,
    JobSubmitted,
    NodeHeartbeat,
    NodeTelemetry,
    QueueChanged,
    TaskBinding,
)
from shared.jobspec import parse_job_spec
from shared.topics import DEAD_LETTER, JOBS_COMMANDS, JOBS_STATUS
from tests.services.builders import node

pytestmark = [pytest.mark.broker, pytest.mark.db]

NODES = [f"m{i}" for i in range(6)]
DEGRADED = {"m0", "m1"}  # GPU 1 of these
# series whose value is the time of the export or of the consumption, not a count
TIME_DEPENDENT = {"kairos_queue_oldest_pending_seconds",
                  "kairos_node_last_heartbeat_timestamp_seconds"}
Key = tuple[str, frozenset[tuple[str, str]]]


@pytest.fixture
def own_broker(tmp_path: Path) -> Iterator[str]:
    b = EmbeddedBroker(log_path=tmp_path / "tansu.log")
    bootstrap = b.start()
    asyncio.run(ensure_topics(bootstrap, max_partitions=4))
    yield bootstrap
    b.stop()


@dataclass
class Replica:
    monitor: MonitorReplica
    registry: CollectorRegistry
    consumer: Consumer
    producer: Producer
    tasks: list[asyncio.Task[None]] = field(default_factory=list)

    def samples(self) -> dict[Key, float]:
        return {(s.name, frozenset(s.labels.items())): s.value
                for metric in self.registry.collect() for s in metric.samples
                if not s.name.endswith("_created") and s.name not in TIME_DEPENDENT}

    def gpus(self) -> set[tuple[str, str]]:
        return {(dict(labels)["node"], dict(labels)["gpu"]) for (name, labels) in self.samples()
                if name == "kairos_gpu_utilization_ratio"}

    async def stop(self) -> None:
        for t in self.tasks:
            t.cancel()
        for t in self.tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await t
        await self.consumer.stop()
        await self.producer.stop()


async def start(bootstrap: str, db_url: str, group: str, key: int) -> Replica:
    settings = MonitorSettings(
        kafka_bootstrap=bootstrap, database_url=db_url, shard_group=group, election_key=key,
        lost_after_s=3600, check_every_s=0.3, election_poll_s=0.3, export_every_s=0,
        session_timeout_ms=6000, heartbeat_interval_ms=500, rebalance_timeout_ms=6000)
    producer = Producer(bootstrap, "monitor")
    await producer.start()
    registry = CollectorRegistry()
    monitor = MonitorReplica(settings, producer, MonitorMetrics(registry))
    consumer = await monitor.setup()
    await consumer.start()
    r = Replica(monitor, registry, consumer, producer)
    r.tasks = [asyncio.create_task(consumer.run()), asyncio.create_task(monitor.campaign()),
               asyncio.create_task(monitor.watch_nodes())]
    return r


def total(*replicas: Replica) -> dict[Key, float]:
    out: dict[Key, float] = {}
    for r in replicas:
        for k, v in r.samples().items():
            out[k] = out.get(k, 0.0) + v
    return out


async def until(check: object, what: str, timeout_s: float = 60) -> None:
    """Poll ``check()`` (a message, "" when satisfied) until it holds or time runs out."""
    message = "never checked"
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(timeout_s):
            while message := check():  # type: ignore[operator]
                await asyncio.sleep(0.3)
    assert not message, f"{what}: {message}"


def differences(pair: dict[Key, float], one: dict[Key, float]) -> str:
    """Series that differ; one exported by one side only differs too, even at 0 (on a
    loaded machine a replica may not have read its GPUs' telemetry yet, and a missing
    series read as 0 let the wait end before the GPUs were exported)."""
    keys = {k for k in pair.keys() | one.keys()
            if k not in pair or k not in one or pair[k] != one[k]}
    return "; ".join(f"{n}{dict(lb)}: pair {pair.get((n, lb))} vs one {one.get((n, lb))}"
                     for n, lb in sorted(keys, key=str)[:8])


def telemetry(round_: int) -> list[Event]:
    return [NodeTelemetry(node_id=n, gpus=[
        GpuTelemetry(index=i, utilization_pct=10 * round_ + i, memory_used_mib=1024,
                     temperature_c=55, power_w=250,
                     health=GpuHealth.DEGRADED if n in DEGRADED and i == 1
                     else GpuHealth.HEALTHY) for i in range(2)]) for n in NODES]


def cluster_events() -> list[Event]:
    spec = parse_job_spec({"name": "j", "queue": "research", "tasks": [{"name": "w"}]})
    now = datetime.now(UTC)
    evs: list[Event] = [node(n, gpus=2) for n in NODES]
    evs += [NodeHeartbeat(node_id=n) for n in NODES]
    evs.append(QueueChanged(queue="research", change="created",
                            settings={"tenant": "vision", "nominal": {"gpu": 2}}))
    for j in ("J1", "J2", "J3", "J4", "J5"):
        evs.append(JobSubmitted(job_id=j, queue="research", tenant="vision", user="u",
                                spec=spec, submitted_at=now))

    def bind(job: str, action: BindingAction, node_id: str, *gpus: GpuAssignment) -> Binding:
        return Binding(binding_id=f"{job}-{action}", action=action, node_id=node_id, epoch=1,
                       job_id=job, tasks=[TaskBinding(task_id=f"w-{g.index}.{action}",
                                                      task_name="w", role="w", replica=0,
                                                      rank=0, gpus=[g]) for g in gpus])

    evs += [bind("J1", BindingAction.ALLOCATE, "m0", GpuAssignment(index=0)),
            bind("J4", BindingAction.ALLOCATE, "m1", GpuAssignment(index=0)),
            bind("J4", BindingAction.RESIZE, "m2", GpuAssignment(index=0)),  # grown
            bind("J5", BindingAction.ALLOCATE, "m3",
                 GpuAssignment(index=1, memory_mib=20480, compute_pct=25))]
    for j, states in {"J1": ["admitted", "bound", "running"], "J2": ["admitted"],
                      "J3": ["admitted", "bound", "running", "succeeded"],
                      "J4": ["admitted", "bound", "running"], "J5": ["admitted", "bound"]}.items():
        evs += [JobStatus(job_id=j, state=JobState(s), reason=f"test {s}") for s in states]
    evs += [DeadLetter(topic="jobs.commands", partition=0, offset=i, msg_key=None, value="{",
                       reason="undecodable", error="test", consumer_group="g")
            for i in range(3)]
    return evs


@pytest.fixture
async def publisher(own_broker: str) -> AsyncIterator[Producer]:
    p = Producer(own_broker, "test")
    await p.start()
    yield p
    await p.stop()


async def test_two_replicas_sum_to_what_one_exports(own_broker: str, db_url: str,
                                                    publisher: Producer) -> None:
    tag = uuid.uuid4().hex[:6]
    one = await start(own_broker, db_url, f"monitor-one-{tag}", LOCK_KEY + 1)
    pair = [await start(own_broker, db_url, f"monitor-pair-{tag}", LOCK_KEY) for _ in range(2)]
    try:
        # the group has split the shard topics between the two before anything is sent
        def split() -> str:
            owned = [r.monitor._owned_telemetry() for r in pair]
            if not all(owned) or owned[0] & owned[1] or len(owned[0] | owned[1]) != 4:
                return f"telemetry partitions {owned}"
            return "" if len(one.monitor._owned_telemetry()) == 4 else "single not assigned"
        await until(split, "the consumer group never split the partitions")
        leaders = [r for r in pair if r.monitor.election.leading]
        assert len(leaders) == 1, "exactly one replica of the pair is elected"
        assert one.monitor.election.leading, "the lone replica leads its own election"

        for e in [*cluster_events(), *telemetry(1)]:
            await publisher.publish(e)

        def expected(samples: dict[Key, float]) -> str:
            def v(name: str, **labels: str) -> float | None:
                return samples.get((name, frozenset(labels.items())))
            want = {("kairos_cluster_gpus", "total"): 12, ("kairos_cluster_gpus", "allocated"): 4,
                    ("kairos_cluster_gpus", "shared"): 1, ("kairos_cluster_gpus", "degraded"): 2}
            for (name, state), n in want.items():
                if v(name, state=state) != n:
                    return f"{name}{{state={state}}} = {v(name, state=state)}, want {n}"
            for labels, n in (({"state": "running", "reason": "other"}, 3),
                              ({"state": "succeeded", "reason": "other"}, 1)):
                if v("kairos_job_transitions_total", **labels) != n:
                    return f"transitions {labels} = {v('kairos_job_transitions_total', **labels)}"
            if v("kairos_cluster_deadletters_total", topic="jobs.commands",
                 reason="undecodable") != 3:
                return "dead letters not counted"
            if v("kairos_queue_quota_gpus", queue="research", tenant="vision",
                 kind="borrowed") != 1.25:  # 3 whole GPUs and a quarter, 2 guaranteed
                return "quota"
            return ""

        every_gpu = {(n, str(i)) for n in NODES for i in range(2)}

        def all_gpus(*replicas: Replica) -> str:
            """On a loaded machine a node's telemetry may reach a replica after the
            cluster-wide series settled: wait for every GPU's series too."""
            got = set().union(*(r.gpus() for r in replicas))
            return "" if got == every_gpu else f"GPUs not exported yet: {every_gpu - got}"

        await until(lambda: expected(one.samples()) or all_gpus(one), "one replica alone")
        await until(lambda: expected(total(*pair)) or all_gpus(*pair)
                    or differences(total(*pair), one.samples()), "the pair's sums")
        exported = [r.gpus() for r in pair]
        assert all(exported), "each replica exports its share of the GPUs"
        assert not exported[0] & exported[1], "no GPU is exported twice"
        assert exported[0] | exported[1] == one.gpus() == {(n, str(i)) for n in NODES
                                                           for i in range(2)}
        standby = next(r for r in pair if r not in leaders)
        assert not any(name == "kairos_jobs" for name, _ in standby.samples()), \
            "a standby exports no cluster-wide series"

        # the elected replica stops: the other takes the cluster view and every partition
        await leaders[0].stop()
        pair.remove(leaders[0])
        await until(lambda: "" if standby.monitor.election.leading else "not elected",
                    "the standby never took over")
        await until(lambda: "" if len(standby.monitor._owned_telemetry()) == 4 else "rebalance",
                    "the survivor never got every partition")
        for e in telemetry(2):  # agents keep reporting: the moved nodes come back
            await publisher.publish(e)

        def same_view() -> str:
            a, b = standby.samples(), one.samples()
            keys = [k for k in b if not k[0].startswith(("kairos_job_transitions",
                                                          "kairos_cluster_deadletters"))]
            bad = [k for k in keys if a.get(k) != b[k] and k[0] != "kairos_gpu_utilization_ratio"]
            if bad:
                return differences(a, b)
            return "" if standby.gpus() == one.gpus() else "GPUs not all exported yet"
        await until(same_view, "after the failover")
        assert standby.gpus() == one.gpus()
    finally:
        for r in [one, *pair]:
            await r.stop()



async def dead_letter_count(bootstrap: str) -> int:
    c = AIOKafkaConsumer(bootstrap_servers=bootstrap)
    await c.start()
    try:
        tps = [TopicPartition(DEAD_LETTER.name, p)
               for p in c.partitions_for_topic(DEAD_LETTER.name) or ()]
        return sum((await c.end_offsets(tps)).values())
    finally:
        await c.stop()


async def test_the_view_consumer_replays_everything_and_dead_letters_nothing(
        own_broker: str, publisher: Producer) -> None:
    """The elected replica's reader: no commits (each start reads the whole history again)
    and no dead letters (the topics' own consumer groups send those)."""
    await publisher.send_raw(JOBS_COMMANDS.name, b"k", b"{not json")
    await publisher.publish(JobStatus(job_id="v1", state=JobState.RUNNING, reason="x"))
    topics = [JOBS_COMMANDS.name, JOBS_STATUS.name]
    tps = [TopicPartition(t, p) for t in topics for p in range(await publisher.partition_count(t))]
    letters = await dead_letter_count(own_broker)
    for _ in range(2):  # the second start reads it all again
        seen: list[str] = []

        async def handle(env: Envelope, event: Event, seen: list[str] = seen) -> None:
            seen.append(event.TYPE)

        c = Consumer(CommonSettings(kafka_bootstrap=own_broker, service_name="t"),
                     ConsumerOptions("view", topics, assign=tps, commit=False,
                                     dead_letter=False), handle, publisher)
        await c.start()
        task = asyncio.create_task(c.run())
        await until(lambda seen=seen: "" if seen == ["job.status"] else f"read {seen}",
                    "the view consumer")
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await c.stop()
    assert await dead_letter_count(own_broker) == letters


async def test_a_view_consumer_stopped_while_it_starts_is_stopped(
        own_broker: str, db_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Leadership lost while the view's consumer connects: standing down stops it, and
    no fetcher polls on after the replica stopped (it did before: its errors filled the
    logs of later tests, against a broker long gone)."""
    settings = MonitorSettings(kafka_bootstrap=own_broker, database_url=db_url,
                               election_key=uuid.uuid4().int % 2**62)
    producer = Producer(own_broker, "monitor")
    await producer.start()
    replica = MonitorReplica(settings, producer, MonitorMetrics(CollectorRegistry()))
    connecting = asyncio.Event()
    real_start = Consumer.start
    started: list[Consumer] = []

    async def slow_start(self: Consumer) -> None:
        started.append(self)
        await real_start(self)
        connecting.set()
        await asyncio.sleep(3600)  # still fixing its positions when leadership goes

    monkeypatch.setattr(Consumer, "start", slow_start)
    try:
        lead = asyncio.create_task(replica.lead())
        async with asyncio.timeout(30):
            await connecting.wait()
        lead.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await lead
        await replica.stand_down()
        assert len(started) == 1
        view_consumer = started[0]
        assert view_consumer._stopping.is_set()
        assert view_consumer._consumer._closed, "the view's consumer was left running"
    finally:
        await producer.stop()
