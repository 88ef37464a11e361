"""Queueing: holds submitted jobs in hierarchical queues and admits them against quota.

This is the glue: it consumes events, keeps the jobs it holds in ``queue_jobs``
(``store.py``), runs the cycle and publishes what was decided. The decisions are pure
functions beside it: which jobs a tree admits and which are reclaimed (``admit.py``),
why and until when the others wait (``explain.py``), how an admin command changes the
tree (``queue_commands.py``); the events that announce them are ``messages.py``.

A cycle, per top-level tree of queues (one replica at a time, under an advisory lock):
read the tree's held jobs, decide, record the decision and the reasons that changed,
and publish ``jobs.ready`` for the admitted, a ``job.command`` preempt for each job
reclaimed, a ``pending`` notice for each job whose reason changed and ``queue.status``
for each queue that changed.

Events go to the outbox in the transaction that records their decision (ids fixed by
job and attempt) and are published after the commit: a crash in between loses nothing,
since the relay publishes what was stored.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from typing import Any

from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from services.queueing import messages, metrics, store
from services.queueing.admit import Admission, HeldJob, decide
from services.queueing.config import OrderingSpec
from services.queueing.errors import CommandRefused
from services.queueing.explain import queue_statuses, utc, waiting_lists
from services.queueing.messages import Outgoing
from services.queueing.ordering import Held, Ordering, demand, job_request
from services.queueing.queue_commands import apply_command, merge_file
from services.queueing.quota import QueueTree
from services.queueing.store import JobRow, NewJob
from shared.billing import effective_weights
from shared.bus import Producer
from shared.events import (
    CommandAction,
    Envelope,
    Event,
    JobCommand,
    JobState,
    JobStatus,
    JobSubmitted,
    QueueCommand,
)
from shared.logging import get_logger
from shared.model_quota import NO_MODEL, ModelTrees
from shared.outbox import OutboxRelay, add_many
from shared.queuespec import QueueSpec

log = get_logger(__name__)

# the job-level reports queueing acts on (a pending one is its own notice coming back)
_STATUS_MATTERS = frozenset(JobState) - {JobState.PENDING}


class Queueing:
    SOURCE = messages.SOURCE

    def __init__(self, producer: Producer, engine: AsyncEngine,
                 ordering: OrderingSpec | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self.producer = producer
        self.engine = engine
        self.relay = OutboxRelay(engine, producer, source=self.SOURCE)
        self._queued = False  # events went to the outbox since the last publish
        self.ordering = Ordering(ordering or OrderingSpec())
        self.clock = clock
        self.tree = QueueTree([])
        self.models = ModelTrees(self.tree)
        self.versions: dict[str, int] = {}
        self._lock = asyncio.Lock()
        self._dirty = True
        self._held: dict[tuple[str, int], Held] = {}
        self._last_status: dict[str, dict[str, Any]] = {}

    # --- the queue tree ----------------------------------------------------------------

    async def start(self, file_specs: Sequence[QueueSpec] = ()) -> None:
        """Apply the queues file (``queue_commands.merge_file``) and announce every queue."""
        async with self.engine.begin() as conn:
            await store.lock_config(conn)
            changed = merge_file(await store.load_queues(conn), file_specs)
            for spec in changed:
                from_file = spec in file_specs
                await store.upsert_queue(conn, spec, "file" if from_file else "default",
                                         spec.fingerprint() if from_file else None)
            rows = await store.load_queues(conn)
            self._set_tree(rows)
            await self._send(conn, [messages.queue_changed(r.spec, self.tree, r.version)
                                    for r in rows.values()])
        await self._publish()
        log.info("queues loaded", queues=sorted(rows), changed_by_file=[s.name for s in changed])

    def _set_tree(self, rows: dict[str, store.QueueRow]) -> None:
        self.tree = QueueTree(r.spec for r in rows.values())
        self.models = ModelTrees(self.tree)
        self.versions = {n: r.version for n, r in rows.items()}

    async def _refresh_tree(self) -> None:
        async with self.engine.connect() as conn:
            if await store.queue_versions(conn) == self.versions:
                return
            rows = await store.load_queues(conn)
        self._set_tree(rows)

    async def _on_queue_command(self, cmd: QueueCommand) -> None:
        async with self.engine.begin() as conn:
            await store.lock_config(conn)
            if await store.request_seen(conn, cmd.request_id):
                return  # a replay
            specs = {n: r.spec for n, r in (await store.load_queues(conn)).items()}
            try:
                spec, change = apply_command(cmd, specs)
            except CommandRefused as exc:
                await store.record_request(conn, cmd.request_id, cmd.queue, "rejected", str(exc))
                await self._send(conn, [messages.rejected(cmd, exc)])
                log.info("queue command rejected", queue=cmd.queue, action=cmd.action,
                         error=str(exc))
                return
            version = await store.upsert_queue(conn, spec, "api", None)
            await store.record_request(conn, cmd.request_id, cmd.queue, "applied")
            tree = QueueTree({**specs, spec.name: spec}.values())
            await self._send(conn, [messages.queue_changed(spec, tree, version, change,
                                                           cmd.request_id)])
        log.info("queue changed", queue=cmd.queue, change=change, by=cmd.requested_by)
        self._dirty = True

    # --- events in and out -------------------------------------------------------------

    async def handle(self, env: Envelope, event: Event) -> None:
        await self.handle_batch([(env, event)])

    async def handle_batch(self, items: list[tuple[Envelope, Event]]) -> None:
        async with self._lock:
            await self._handle_batch(items)
        await self._publish()

    async def _publish(self) -> None:
        """Publish what was queued, after its commit; most batches queue nothing, and a
        flush is a transaction of its own. Queueing flushes itself, so its inserts wake
        no relay (``notify=False``; the relay loop's poll is the backstop)."""
        if self._queued:
            self._queued = False
            await self.relay.flush()

    async def _send(self, conn: AsyncConnection, out: list[Outgoing]) -> None:
        """``out`` goes out once ``conn``'s transaction commits."""
        self._queued = self._queued or bool(out)
        await add_many(conn, out, self.SOURCE, notify=False)

    async def _handle_batch(self, items: list[tuple[Envelope, Event]]) -> None:
        submitted = [e for _, e in items if isinstance(e, JobSubmitted)]
        if submitted:
            await self._refresh_tree()
            unknown = [e for e in submitted if self.tree.specs.get(e.queue) is None
                       or self.tree.specs[e.queue].kind == "cohort"]
            async with self.engine.begin() as conn:
                await store.insert_jobs(conn, [
                    NewJob(e.job_id, e.queue, e.tenant, "done" if e in unknown else "queued",
                           e.model_dump_json()) for e in submitted])
                # admission refuses these; one may slip through a race
                await self._send(conn, [messages.no_queue(e) for e in unknown])
            self._dirty = True
        statuses: list[JobStatus] = []  # a run of them: applied in one transaction
        for _, event in items:  # in order: a cancel may follow its submit in one batch
            if isinstance(event, JobStatus):
                if event.task is None and event.state in _STATUS_MATTERS:
                    statuses.append(event)
                continue
            if statuses:
                await self._on_statuses(statuses)
                statuses = []
            if isinstance(event, JobCommand) and event.action is CommandAction.CANCEL:
                await self._cancel(event)
            elif isinstance(event, QueueCommand):
                await self._on_queue_command(event)
        if statuses:
            await self._on_statuses(statuses)

    async def _cancel(self, cmd: JobCommand) -> None:
        async with self.engine.begin() as conn:
            row = await store.lock_job(conn, cmd.job_id)
            if row is not None and row.state != "queued":
                return  # admitted: the scheduler owns it; its end releases the quota
            if row is None:  # cancel overtook the submit: keep a tombstone
                await store.insert_jobs(conn, [NewJob(cmd.job_id, "", "", "cancelled", "{}")])
            else:
                await store.cancel(conn, cmd.job_id)
            await self._send(conn, [messages.cancelled(cmd)])
        self._dirty = True

    async def _on_statuses(self, statuses: list[JobStatus]) -> None:
        """Job-level reports, in order, in one transaction (a fetch brings many: one
        transaction each was most of this service's time under load)."""
        async with self.engine.begin() as conn:
            rows = await store.lock_jobs(conn, list({st.job_id for st in statuses}))
            for st in statuses:
                row = rows.get(st.job_id)
                if row is not None:
                    await self._on_status(conn, row, st)

    async def _on_status(self, conn: AsyncConnection, row: JobRow, st: JobStatus) -> None:
        """Apply one report to the locked ``row`` (kept up to date for the next)."""
        if row.state in ("done", "cancelled", "queued"):
            return  # ended, or a report of an attempt before its requeue
        if st.attempt < row.attempt:
            return
        if st.state.terminal:
            await store.end(conn, st.job_id, st.state.value)
            row.state, row.phase = "done", st.state.value
            self._dirty = True
        elif st.state is JobState.PREEMPTED:
            if row.state == "reclaiming":  # back to its queue, without its quota
                await store.requeue(conn, st.job_id, row.attempt + 1)
                await self._send(conn, [messages.requeued(row, row.attempt + 1)])
                row.state, row.attempt = "queued", row.attempt + 1
                self._dirty = True
            # else the scheduler's own preemption: it retries the job, quota still held
        elif st.state in (JobState.ADMITTED, JobState.BOUND, JobState.RUNNING):
            started = utc(self.clock()) if st.state is JobState.RUNNING else None
            await store.follow_phase(conn, st.job_id, st.state.value, st.attempt, started)
            row.phase, row.attempt = st.state.value, st.attempt

    # --- the cycle ---------------------------------------------------------------------

    async def cycle_if_dirty(self) -> None:
        if self._dirty:
            await self.cycle()

    async def tick(self, interval_s: float) -> None:
        """Other replicas' changes and aging reach this one at least this often."""
        while True:
            await asyncio.sleep(interval_s)
            await self.cycle()

    async def cycle(self) -> None:
        async with self._lock:
            self._dirty = False
            started = time.perf_counter()
            await self._refresh_tree()
            for top in list(self.tree.tops):
                await self._cycle_tree(top)
            metrics.CYCLE_SECONDS.observe(time.perf_counter() - started)
        await self._publish()

    def _held_of(self, row: JobRow) -> Held:
        key = (row.job_id, row.attempt)
        h = self._held.get(key)
        if h is None:
            sub = JobSubmitted.model_validate(row.event)
            req = job_request(sub, row.attempt, effective_weights(self.tree.specs, sub.queue))
            h = self._held[key] = Held(row.seq, sub, row.attempt, req, demand(req))
        return h

    def _forget_oldest(self) -> None:
        """Keep the parsed jobs bounded (the oldest are parsed again if still held).
        Only between cycles: a cycle reads no event of a job it holds parsed."""
        if len(self._held) > 200_000:
            for k in list(self._held)[:100_000]:
                del self._held[k]

    async def _cycle_tree(self, top: str) -> None:
        tree = self.tree
        now = self.clock()
        async with self.engine.begin() as conn:
            await store.lock_tree(conn, top)
            self._forget_oldest()
            queues = tree.subtree(top)
            rows = await store.active_jobs(conn, queues,
                                           lambda job_id, attempt: (job_id, attempt) in self._held)
            jobs = [HeldJob(r, self._held_of(r)) for r in rows]
            half_life = self.ordering.spec.half_life_s
            usage = await store.load_usage(conn, queues, half_life) if half_life > 0 else None
            decision = decide(tree, top, jobs, self.ordering, now, self.models,
                              usage.advance(now) if usage is not None else None)
            if usage is not None:  # fair share's past: what each queue holds from now
                usage.hold(_held_gpus(jobs, decision))
                await store.save_usage(conn, queues, usage)
            await self._send(conn, await self._record(conn, top, decision, jobs, now))
        if decision.admitted or decision.reclaims:
            log.info("queue cycle", tree=top, admitted=len(decision.admitted),
                     reclaiming=len(decision.reclaims), waiting=len(decision.waits))

    async def _record(self, conn: AsyncConnection, top: str, decision: Admission,
                      jobs: list[HeldJob], now: float) -> list[Outgoing]:
        """Store ``decision``; returns the events that announce it, in order: the
        admitted, the reclaimed, the changed reasons, the changed queues."""
        out: list[Outgoing] = []
        now_dt = utc(now)
        for j, borrowing in decision.admitted:
            choice = decision.choices.get(j.job_id, NO_MODEL)
            out += messages.admitted(j.held, borrowing, now_dt, choice,
                                     effective_weights(self.tree.specs, j.queue))
            await store.admit(conn, j.held.request.job_id, borrowing, now_dt, choice.key)
            metrics.admitted(j.held.event.queue, borrowing)
        for j, rc in decision.reclaims:
            out.append(messages.reclaim(j.row, rc))
            await store.reclaim(conn, j.job_id)
            metrics.reclaimed(rc.member)
        listed, notices = waiting_lists(decision, jobs, now)
        for n in notices:
            count = n.job.row.notices + 1
            await store.note_wait(conn, n.job.job_id, n.wait.reason.value, count)
            out.append(messages.waiting(n.job.row, n.wait.reason.value, n.wait.detail, count))
        quota = decision.quota
        for status in queue_statuses(quota.tree.subtree(top), jobs, decision, listed):
            q = status.queue
            metrics.queue_seen(q, listed.get(q, []), quota.tree.nominal[q][0],
                               quota.used[q][0], quota.borrowed(q)[0])
            body = status.model_dump(mode="json")
            if self._last_status.get(q) == body:
                continue  # unchanged: not announced again
            self._last_status[q] = body
            out.append(messages.outgoing(status))
        return out


def _held_gpus(jobs: list[HeldJob], decision: Admission) -> dict[str, float]:
    """GPUs each queue's jobs hold after the decision (admitted, being reclaimed, and
    admitted now)."""
    held: dict[str, float] = {}
    now_in = {j.job_id for j, _ in decision.admitted}
    for j in jobs:
        if j.row.state in ("admitted", "reclaiming") or j.job_id in now_in:
            held[j.queue] = held.get(j.queue, 0.0) + j.held.demand[0]
    return held
