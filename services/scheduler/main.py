"""The scheduler service: leader lease, cluster state from events, cycles, bindings."""

from __future__ import annotations

import asyncio
import json
import socket
import time
import uuid
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

from prometheus_client import Counter, Gauge, Histogram
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from scheduling import PendingReason, Plan, PreemptReason, ResizeReason, Scheduler, SchedulerConfig
from scheduling.decay import DecayedUsage
from services.scheduler.history import JobHistory
from services.scheduler.model import Output
from services.scheduler.rows import JobRow, NodeRow, node_from_row, node_row
from services.scheduler.settings import SchedulerSettings
from services.scheduler.state import SchedulerState
from shared.bus import Consumer, ConsumerOptions, all_partitions
from shared.errors import NonRetryable
from shared.events import Envelope, Event, NodeSchedulability
from shared.http import HttpServer, ops_app
from shared.leader import LeaderLease
from shared.logging import get_logger
from shared.outbox import OutboxRelay, Stored, add_many
from shared.refill import BrokerWatch
from shared.retry import retry_transient
from shared.service import ServiceRuntime, run_main
from shared.topics import JOBS_COMMANDS, JOBS_READY, JOBS_STATUS, NODES_LIFECYCLE, NODES_TELEMETRY

log = get_logger(__name__)

USAGE_SAVE_S = 30.0  # fair share's decayed past is stored at most this often
CYCLE_SECONDS = Histogram("kairos_scheduler_cycle_seconds", "Scheduling cycle time by phase",
                          ["phase"], buckets=(.0005, .001, .0025, .005, .01, .025, .05, .1, .25,
                                              .5, 1, 2.5))
PLACEMENTS = Counter("kairos_scheduler_placements_total",
                     "Tasks bound to GPUs (placed, or grown into an elastic job)")
PREEMPTIONS = Counter("kairos_scheduler_preemptions_total", "Tasks asked to stop, by reason",
                      ["reason"])
PENDING = Gauge("kairos_scheduler_pending_jobs", "Jobs left pending, by reason", ["reason"])
for _r in PreemptReason:  # every reason is a series from the start (0 until it happens)
    PREEMPTIONS.labels(_r.value)
IS_LEADER = Gauge("kairos_scheduler_is_leader", "1 while this process leads")
EPOCH = Gauge("kairos_scheduler_epoch", "The fencing epoch of this leader")
NODES = Gauge("kairos_scheduler_nodes", "Live nodes by scheduling state (cordon / drain; lost ones not counted)",
              ["scheduling"])


def placed_tasks(events: list[tuple[Envelope, str]]) -> int:
    """Tasks the bindings among ``events`` start: a placement's, and the replicas a
    resize grows (a shrink's resize starts none)."""
    return sum(len(env.data.get("tasks") or []) for env, _ in events
               if env.type == "binding" and env.data.get("action") in ("allocate", "resize"))


def count_preemptions(plan: Plan) -> None:
    for pre in plan.preemptions:
        PREEMPTIONS.labels(pre.reason.value).inc(len(pre.task_ids) or 1)
    for rz in plan.resizes:
        if rz.reason is ResizeReason.SHRINK:
            PREEMPTIONS.labels(PreemptReason.SHRINK.value).inc(len(rz.stop_task_ids))


def load_placer(settings: SchedulerSettings) -> Scheduler:
    """The scheduling core with the configured policy; a bad file fails the start with
    every error and its field path."""
    if settings.policy_file:
        config = SchedulerConfig.from_yaml(Path(settings.policy_file).read_text())
    else:
        config = SchedulerConfig.preset(settings.policy)
    return Scheduler(config)


class LeadershipLost(NonRetryable):
    """Another scheduler took the lease: this one must not write another decision."""


class SchedulerService:
    """Decisions are stored with their events in one transaction (the rows, and the
    events in the outbox), then published: a leader killed in between loses nothing,
    since the next one's relay publishes what it left."""

    SOURCE = "scheduler"

    def __init__(self, rt: ServiceRuntime, engine: AsyncEngine, state: SchedulerState,
                 history_first_read: int = 2000,
                 lease_valid: Callable[[], bool] = lambda: True) -> None:
        self.rt = rt
        # checked before a batch's offsets are committed: a leader that resumes past its
        # lease may find nothing of its own to store (the events are of jobs the new
        # leader placed, unknown to it), so the write fence alone would let it commit
        # them, and the new leader would never read them
        self.lease_valid = lease_valid
        self.history_first_read = history_first_read  # succeeded jobs the history starts from
        self.engine = engine
        self.state = state
        self._usage_saved = -1e18  # when fair share's past was last stored (its clock)
        self.out = Output()
        self.relay = OutboxRelay(engine, rt.producer, rt.settings.database_url,
                                 timedelta(seconds=rt.settings.outbox_replay_window_s),
                                 source=self.SOURCE)
        self._flushing = asyncio.Lock()  # the consumer's batches and the refill hook
        self._resends = 0

    async def load(self) -> None:
        async with self.engine.connect() as conn:
            rows = (await conn.execute(text(
                "SELECT job_id, state, attempt, ready, placement, tasks FROM sched_jobs"
                " WHERE state NOT IN ('succeeded', 'failed', 'cancelled')"
                # a cancel that came before its job: kept, so the job is cancelled on arrival
                " OR ready = '{}'::jsonb"
                " OR jsonb_path_exists(placement,"
                " '$[*] ? (@.state == \"bound\" || @.state == \"running\")')"
            ))).mappings().all()
            for r in rows:
                self.state.load_job(JobRow(**r))
            self.state.finished.update(x for (x,) in (await conn.execute(text(
                "SELECT job_id FROM sched_jobs WHERE state IN ('succeeded', 'failed', 'cancelled')"
            ))).all() if x not in self.state.jobs)
            for r in (await conn.execute(text(
                    "SELECT node_id, inventory, state, cordon, cordon_generation, cordon_reason,"
                    " admin_labels, admin_taints, labels_generation FROM sched_nodes"))).mappings():
                self.state.nodes[r["node_id"]] = node_from_row(NodeRow(**r))
            if self.state.history is not None:  # a new leader learns what its rows say
                await self.state.history.load(conn, self.history_first_read)
            if self.state.decay is not None:  # fair share's past goes on from the last leader's
                rows = (await conn.execute(text("SELECT tenant, gpu_s, at FROM sched_usage"))).all()
                self.state.decay.gpu_s = {r.tenant: float(r.gpu_s) for r in rows}
                self.state.decay.at = max((float(r.at) for r in rows), default=None)
        log.info("state loaded", jobs=len(self.state.jobs), nodes=len(self.state.nodes),
                 durations=len(self.state.history.every) if self.state.history else 0)

    async def handle(self, env: Envelope, event: Event) -> None:
        self.state.handle(event, self.out)

    async def resend(self) -> None:
        """The broker came back empty (``BrokerWatch``): send again what agents need."""
        async with self._flushing:
            self._resends += 1
            self.out.id_suffix = f"-r{self._resends}"
            self.state.resend(self.out)
            self.out.id_suffix = ""
            await self._flush()

    async def flush(self) -> None:
        """After each batch: run a cycle if anything changed, store, then publish; the
        batch is committed after, so a leader whose lease ran out raises instead."""
        async with self._flushing:
            await self._flush()
        if not self.lease_valid():
            raise LeadershipLost("the lease ran out by this process's clock (paused past "
                                 "it?): this batch is left for the next leader")

    async def _flush(self) -> None:
        t0 = time.perf_counter()
        cycled = self.state.needs_cycle
        if cycled:
            first = len(self.out.events)
            plan = self.state.cycle(time.time(), self.out)
            CYCLE_SECONDS.labels("place").observe(time.perf_counter() - t0)
            PLACEMENTS.inc(placed_tasks(self.out.events[first:]))
            count_preemptions(plan)
            reasons = list(self.state.pending_reasons.values())
            for reason in {*PendingReason, *reasons}:  # 0 for reasons no job has now
                PENDING.labels(str(reason)).set(reasons.count(reason))
        out, self.out = self.out, Output()
        if out.dirty_nodes or cycled:
            states = [v.scheduling for v in self.state.nodes.values() if not v.lost]
            for s in NodeSchedulability:
                NODES.labels(s.value).set(states.count(s))
        async with self.relay.exclusive():  # nothing else publishes between the two
            t1 = time.perf_counter()
            # the same rows and events again if PostgreSQL is away (the transaction
            # rolled back)
            stored = await retry_transient(lambda: self.persist(out), "scheduler.persist")
            CYCLE_SECONDS.labels("persist").observe(time.perf_counter() - t1)
            if stored.rows:
                t2 = time.perf_counter()
                await self.relay.publish_stored(stored)
                CYCLE_SECONDS.labels("publish").observe(time.perf_counter() - t2)
        if cycled:
            CYCLE_SECONDS.labels("total").observe(time.perf_counter() - t0)
        self.state.evict_finished()

    async def _save_usage(self, conn: AsyncConnection) -> None:
        """Fair share's decayed past per tenant, at most every ``USAGE_SAVE_S`` (a new
        leader goes on from it; what it misses is at most that much of the past)."""
        decay = self.state.decay
        if decay is None or decay.at is None or decay.at - self._usage_saved < USAGE_SAVE_S:
            return
        self._usage_saved = decay.at
        await conn.execute(text("DELETE FROM sched_usage"))
        if decay.gpu_s:
            await conn.execute(text(
                "INSERT INTO sched_usage (tenant, gpu_s, at) VALUES (:t, :g, :a)"),
                [{"t": t, "g": g, "a": decay.at} for t, g in decay.gpu_s.items()])

    async def persist(self, out: Output) -> Stored:
        """Rows and events in one transaction, fenced by the lease: a leader that lost it
        (paused past it, cut off) finds a higher epoch and writes nothing. Returns the
        events stored, for the caller to publish after the commit."""
        if not out.dirty_jobs and not out.dirty_nodes and not out.events:
            return Stored()
        jobs = [self.state.job_row(j) for j in out.dirty_jobs if j in self.state.jobs]
        async with self.engine.begin() as conn:
            epoch = await conn.scalar(text(
                "SELECT epoch FROM scheduler_leases WHERE name = 'scheduler' FOR SHARE"))
            if epoch is not None and epoch != self.state.epoch:
                raise LeadershipLost(f"the lease is at epoch {epoch}, this leader holds "
                                     f"{self.state.epoch}: stopping")
            stored = await add_many(conn, out.events, self.SOURCE,
                                    self.rt.settings.max_event_bytes, notify=False)
            if jobs:
                await conn.execute(text(
                    """INSERT INTO sched_jobs (job_id, state, attempt, ready, placement, tasks,
                           updated_at)
                       VALUES (:job_id, :state, :attempt, CAST(:ready AS jsonb),
                           CAST(:placement AS jsonb), CAST(:tasks AS jsonb), now())
                       ON CONFLICT (job_id) DO UPDATE SET state = EXCLUDED.state,
                           attempt = EXCLUDED.attempt, ready = EXCLUDED.ready,
                           placement = EXCLUDED.placement, tasks = EXCLUDED.tasks,
                           updated_at = now()"""),
                    [{**j, "placement": json.dumps(j["placement"]), "tasks": json.dumps(j["tasks"])}
                     for j in jobs])
            await self._save_usage(conn)
            nodes = [self.state.nodes[n] for n in out.dirty_nodes if n in self.state.nodes]
            if nodes:
                await conn.execute(text(
                    """INSERT INTO sched_nodes (node_id, inventory, state, cordon,
                           cordon_generation, cordon_reason, admin_labels, admin_taints,
                           labels_generation)
                       VALUES (:node_id, CAST(:inventory AS jsonb), :state, :cordon,
                           :cordon_generation, :cordon_reason, CAST(:admin_labels AS jsonb),
                           CAST(:admin_taints AS jsonb), :labels_generation)
                       ON CONFLICT (node_id) DO UPDATE SET inventory = EXCLUDED.inventory,
                           state = EXCLUDED.state, cordon = EXCLUDED.cordon,
                           cordon_generation = EXCLUDED.cordon_generation,
                           cordon_reason = EXCLUDED.cordon_reason,
                           admin_labels = EXCLUDED.admin_labels,
                           admin_taints = EXCLUDED.admin_taints,
                           labels_generation = EXCLUDED.labels_generation, updated_at = now()"""),
                    [node_row(v) for v in nodes])
        return stored


async def main(settings: SchedulerSettings | None = None) -> None:
    settings = settings or SchedulerSettings()
    rt = ServiceRuntime(settings)
    await rt.start_dependencies()
    assert rt.engine is not None
    lease = LeaderLease(settings.database_url, f"{socket.gethostname()}-{uuid.uuid4().hex[:6]}",
                        ttl_s=settings.lease_ttl_s, renew_s=settings.lease_renew_s)
    http = HttpServer(ops_app(rt.ready), settings.http_host, settings.http_port)
    await http.start()  # probes answer while standing by
    epoch = await lease.acquire()
    IS_LEADER.set(1)
    EPOCH.set(epoch)
    history = JobHistory() if settings.history_estimates else None
    placer = load_placer(settings)
    half_life = placer.config.decay_half_life_s()
    decay = DecayedUsage(half_life) if half_life > 0 else None  # fair share over past use
    svc = SchedulerService(rt, rt.engine, SchedulerState(epoch, placer.schedule, history, decay),
                           settings.history_first_read, lease.valid)
    await svc.load()
    await svc.relay.flush()  # what the last leader stored but had not published yet
    svc.state.republish(svc.out)
    await svc.flush()
    watch = BrokerWatch(settings, rt.engine, rt.producer)
    watch.on_new_incarnation(svc.resend)
    # Only the lease's holder reads, so it takes every partition itself (committing as
    # the group "scheduler") instead of joining a group: a restarted leader reads at
    # once, where a new group member waits out the dead one's session first (18 s with
    # the default session on the embedded broker: bench/group_rejoin.py).
    topics = [JOBS_READY.name, JOBS_STATUS.name, JOBS_COMMANDS.name, NODES_LIFECYCLE.name,
              NODES_TELEMETRY.name]
    rt.add_consumer(Consumer(
        settings, ConsumerOptions("scheduler", topics,
                                  assign=await all_partitions(rt.producer, topics)),
        svc.handle, rt.producer, on_batch_end=svc.flush))
    rt.add_loop(lease.watch)  # returns, ending the service, once the lease is lost
    rt.add_loop(svc.relay.run)
    rt.add_loop(watch.run)
    try:
        await rt.run(http)
    finally:
        IS_LEADER.set(0)
        if not lease.leading:  # its supervisor starts it again, as a standby
            log.error("leadership lost; stopping so a fresh process can stand by", epoch=epoch)
        await lease.release()


def run() -> None:
    run_main(main)


