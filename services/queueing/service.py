"""Queueing: holds submitted jobs in hierarchical queues and admits them against quota.

A cycle, per top-level tree of queues (one replica at a time, under an advisory lock):

1. read the tree's held jobs; usage = what admitted jobs reserve, per queue;
2. order the waiting ones with the scheduling core's ordering plugins;
3. admit in that order what quota allows (best effort: a job that must wait does not
   hold back smaller ones, unless its queue is ``strict``); a job within its guarantee
   whose share was lent out waits for *reclaim*: borrowers' jobs are preempted
   (``job.command`` preempt) and come back to their queue when they have stopped;
4. explain every job still waiting (position, reason, estimated start) and publish
   ``jobs.ready`` for the admitted, ``queue.status`` for each queue that changed.

Events go to the outbox in the transaction that records their decision (ids fixed by
job and attempt) and are published after the commit: a crash in between loses nothing,
since the relay publishes what was stored.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any

from prometheus_client import Counter, Gauge, Histogram
from pydantic import ValidationError
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from services.queueing import store
from services.queueing.array_caps import ArrayCaps
from services.queueing.config import OrderingSpec, QueueConfigError
from services.queueing.ordering import Held, Ordering, demand, job_request
from services.queueing.quota import EPS, QueueTree, QuotaState, Reclaim, WaitReason
from services.queueing.store import JobRow
from shared.bus import Producer
from shared.events import (
    CommandAction,
    Envelope,
    Event,
    JobCommand,
    JobReady,
    JobState,
    JobStatus,
    JobSubmitted,
    QueueAction,
    QueueChanged,
    QueueCommand,
    QueueStatus,
    WaitingJob,
)
from shared.logging import get_logger
from shared.outbox import OutboxRelay, add_many
from shared.queuespec import (
    DEFAULT_QUEUE,
    RESOURCES,
    QueueSpec,
    QueueState,
    tree_errors,
    validation_errors,
)
from shared.topics import topic_for

log = get_logger(__name__)

CYCLE_SECONDS = Histogram("kairos_queueing_cycle_seconds", "Queueing cycle time",
                          buckets=(.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5))
ADMITTED = Counter("kairos_queueing_admitted_total", "Jobs admitted against quota",
                   ["queue", "borrowing"])
RECLAIMS = Counter("kairos_queueing_reclaims_total", "Jobs preempted to give a queue "
                   "its guaranteed quota back", ["queue"])
WAITING = Gauge("kairos_queueing_waiting_jobs", "Jobs waiting in their queue, by reason",
                ["queue", "reason"])
QUOTA_GPUS = Gauge("kairos_queueing_quota_gpus", "A queue's GPUs: guaranteed, used, borrowed",
                   ["queue", "kind"])
MAX_WAITING_LISTED = 500
CLASS_RANK = {"low": 0, "normal": 1, "high": 2, "urgent": 3}
# the job-level reports queueing acts on (a pending one is its own notice coming back)
_STATUS_MATTERS = frozenset(JobState) - {JobState.PENDING}
QUEUES_TOPIC = topic_for(QueueChanged(queue="-", change="updated")).name


class Refused(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def _dt(ts: float) -> datetime:
    return datetime.fromtimestamp(ts, UTC)


class Queueing:
    SOURCE = "queueing"

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
        self.versions: dict[str, int] = {}
        self._lock = asyncio.Lock()
        self._dirty = True
        self._held: dict[tuple[str, int], Held] = {}
        self._last_status: dict[str, dict[str, Any]] = {}

    # --- configuration -----------------------------------------------------------------

    async def start(self, file_specs: Sequence[QueueSpec] = ()) -> None:
        """Apply the queues file: a queue it names is created, or updated when its entry
        in the file changed since it was last applied; otherwise what is stored (maybe
        changed through the admin API) stands. ``default`` exists unless configured."""
        async with self.engine.begin() as conn:
            await conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": store.CONFIG_LOCK})
            current = await store.load_queues(conn)
            merged = {n: r.spec for n, r in current.items()}
            changed = []
            for spec in file_specs:
                row = current.get(spec.name)
                if row is None or row.file_hash != spec.fingerprint():
                    merged[spec.name] = spec
                    changed.append(spec)
            if DEFAULT_QUEUE not in merged:
                merged[DEFAULT_QUEUE] = QueueSpec(name=DEFAULT_QUEUE,
                                                  description="the queue of jobs that name none")
                changed.append(merged[DEFAULT_QUEUE])
            errors = tree_errors(merged, {})
            if errors:
                raise QueueConfigError(errors, "queues (the file with what is stored)")
            for spec in changed:
                from_file = spec in file_specs
                await store.upsert_queue(conn, spec, "file" if from_file else "default",
                                         spec.fingerprint() if from_file else None)
            rows = await store.load_queues(conn)
            self._set_tree(rows)
            tree = self.tree
            self._queued = True
            await add_many(conn, [
                (Envelope.wrap(QueueChanged(queue=n, change="updated",
                                            settings=self._settings(r.spec, tree),
                                            version=r.version),
                               self.SOURCE, f"queue-{n}-v{r.version}"), QUEUES_TOPIC)
                for n, r in rows.items()], self.SOURCE, notify=False)
        await self._publish()
        log.info("queues loaded", queues=sorted(rows), changed_by_file=[s.name for s in changed])

    def _set_tree(self, rows: dict[str, store.QueueRow]) -> None:
        self.tree = QueueTree(r.spec for r in rows.values())
        self.versions = {n: r.version for n, r in rows.items()}

    async def _refresh_tree(self) -> None:
        async with self.engine.connect() as conn:
            if await store.queue_versions(conn) == self.versions:
                return
            rows = await store.load_queues(conn)
        self._set_tree(rows)

    @staticmethod
    def _settings(spec: QueueSpec, tree: QueueTree) -> dict[str, Any]:
        return {**spec.public(), "effective_tenant": tree.tenant(spec.name)
                if spec.name in tree.specs else spec.tenant}

    async def _on_queue_command(self, cmd: QueueCommand) -> None:
        async with self.engine.begin() as conn:
            await conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": store.CONFIG_LOCK})
            if await store.request_seen(conn, cmd.request_id):
                return  # a replay
            rows = await store.load_queues(conn)
            specs = {n: r.spec for n, r in rows.items()}
            try:
                spec, change = self._apply(cmd, specs)
            except Refused as exc:
                await store.record_request(conn, cmd.request_id, cmd.queue, "rejected", exc.message)
                event = QueueChanged(queue=cmd.queue, change="rejected", request_id=cmd.request_id,
                                     error=exc.message, settings={"status": exc.status})
                await self._queue(conn, event, f"queue-rejected-{cmd.request_id}")
                log.info("queue command rejected", queue=cmd.queue, action=cmd.action,
                         error=exc.message)
                return
            version = await store.upsert_queue(conn, spec, "api", None)
            await store.record_request(conn, cmd.request_id, cmd.queue, "applied")
            tree = QueueTree({**specs, spec.name: spec}.values())
            await self._queue(conn, QueueChanged(
                queue=spec.name, change=change, settings=self._settings(spec, tree),
                request_id=cmd.request_id, version=version), f"queue-{spec.name}-v{version}")
        log.info("queue changed", queue=cmd.queue, change=change, by=cmd.requested_by)
        self._dirty = True

    @staticmethod
    def _apply(cmd: QueueCommand, specs: dict[str, QueueSpec]) -> tuple[QueueSpec, Any]:
        name = cmd.queue
        current = specs.get(name)
        if cmd.action is QueueAction.CREATE and current is not None:
            raise Refused(409, f"queue {name} already exists")
        if cmd.action is not QueueAction.CREATE and current is None:
            raise Refused(404, f"no queue {name}")
        if cmd.action in (QueueAction.CREATE, QueueAction.UPDATE):
            base = current.public() if current is not None else {}
            data = {**base, **cmd.settings, "name": name}
            try:
                spec = QueueSpec.model_validate(data)
            except ValidationError as exc:
                raise Refused(422, "; ".join(f"{p}: {m}" for p, m in validation_errors(exc))) from exc
            errors = tree_errors({**specs, name: spec}, {})
            mine = [f"{p}: {m}" for p, m in errors if p.split(".")[0] == name]
            if errors:
                raise Refused(422, "; ".join(mine or [f"{p}: {m}" for p, m in errors]))
            return spec, "created" if current is None else "updated"
        assert current is not None
        if current.kind == "cohort":
            raise Refused(409, f"{name} is a cohort: it holds no jobs, so it cannot be "
                          + {QueueAction.CLOSE: "closed", QueueAction.DRAIN: "drained",
                             QueueAction.OPEN: "opened"}[cmd.action])
        state = {QueueAction.CLOSE: QueueState.CLOSED, QueueAction.DRAIN: QueueState.DRAINING,
                 QueueAction.OPEN: QueueState.OPEN}[cmd.action]
        if current.state is state:
            raise Refused(409, f"queue {name} is already {state.value}")
        change = {QueueState.CLOSED: "closed", QueueState.DRAINING: "draining",
                  QueueState.OPEN: "opened"}[state]
        return current.model_copy(update={"state": state}), change

    # --- events in ---------------------------------------------------------------------

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

    async def _queue(self, conn: Any, event: Event, event_id: str | None) -> None:
        """``event`` goes out once ``conn``'s transaction commits."""
        self._queued = True
        await add_many(conn, [(Envelope.wrap(event, self.SOURCE, event_id),
                               topic_for(event).name)], self.SOURCE, notify=False)

    async def _handle_batch(self, items: list[tuple[Envelope, Event]]) -> None:
        submitted = [e for _, e in items if isinstance(e, JobSubmitted)]
        if submitted:
            await self._refresh_tree()
            unknown = [e for e in submitted if self.tree.specs.get(e.queue) is None
                       or self.tree.specs[e.queue].kind == "cohort"]
            async with self.engine.begin() as conn:
                await store.insert_jobs(conn, [
                    {"j": e.job_id, "q": e.queue, "t": e.tenant,
                     "s": "done" if e in unknown else "queued", "e": e.model_dump_json()}
                    for e in submitted])
                for e in unknown:  # admission refuses these; one may slip through a race
                    await self._queue(conn, JobStatus(
                        job_id=e.job_id, state=JobState.FAILED, reason=f"no queue {e.queue} "
                        "to hold it (unknown or a cohort)"), f"failed-q-{e.job_id}")
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
                await store.insert_jobs(conn, [{"j": cmd.job_id, "q": "", "t": "",
                                                "s": "cancelled", "e": "{}"}])
            else:
                await store.update_job(conn, cmd.job_id, state="cancelled")
            await self._queue(conn, JobStatus(
                job_id=cmd.job_id, state=JobState.CANCELLED,
                reason=cmd.reason or "cancelled while queued"), f"cancelled-q-{cmd.job_id}")
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

    async def _on_status(self, conn: Any, row: JobRow, st: JobStatus) -> None:
        """Apply one report to the locked ``row`` (kept up to date for the next)."""
        if row.state in ("done", "cancelled", "queued"):
            return  # ended, or a report of an attempt before its requeue
        if st.attempt < row.attempt:
            return
        if st.state.terminal:
            await store.update_job(conn, st.job_id, state="done", phase=st.state.value)
            row.state, row.phase = "done", st.state.value
            self._dirty = True
        elif st.state is JobState.PREEMPTED:
            if row.state == "reclaiming":  # back to its queue, without its quota
                await store.update_job(conn, st.job_id, state="queued",
                                       attempt=row.attempt + 1, phase="", borrowing=False,
                                       reason="", admitted_at=None, started_at=None)
                await self._queue(conn, JobStatus(
                    job_id=st.job_id, state=JobState.PENDING, attempt=row.attempt + 1,
                    reason=f"requeued in queue {row.queue}: its quota was reclaimed"),
                    f"requeued-{st.job_id}-{row.attempt + 1}")
                row.state, row.attempt = "queued", row.attempt + 1
                self._dirty = True
            # else the scheduler's own preemption: it retries the job, quota still held
        elif st.state in (JobState.ADMITTED, JobState.BOUND, JobState.RUNNING):
            values: dict[str, Any] = {"phase": st.state.value, "attempt": st.attempt}
            if st.state is JobState.RUNNING:
                values["started_at"] = _dt(self.clock())
            await store.update_job(conn, st.job_id, **values)
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
            CYCLE_SECONDS.observe(time.perf_counter() - started)
        await self._publish()

    def _held_of(self, row: JobRow) -> Held:
        key = (row.job_id, row.attempt)
        h = self._held.get(key)
        if h is None:
            sub = JobSubmitted.model_validate(row.event)
            req = job_request(sub, row.attempt)
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
        queues = tree.subtree(top)
        now = self.clock()
        out: list[tuple[Envelope, str]] = []
        async with self.engine.begin() as conn:
            await conn.execute(text("SELECT pg_advisory_xact_lock(:k)"),
                               {"k": store.tree_lock_key(top)})
            self._forget_oldest()
            rows = await store.active_jobs(conn, queues,
                                           lambda job_id, attempt: (job_id, attempt) in self._held)
            holding = [r for r in rows if r.state in ("admitted", "reclaiming")]
            arrays = ArrayCaps(self._held_of(r).event for r in holding)
            usage: dict[str, tuple[float, float, float]] = {}
            freeing: dict[str, tuple[float, float, float]] = {}
            for r in holding:
                d = self._held_of(r).demand
                for acc in ((usage, freeing) if r.state == "reclaiming" else (usage,)):
                    u = acc.get(r.queue, (0.0, 0.0, 0.0))
                    acc[r.queue] = (u[0] + d[0], u[1] + d[1], u[2] + d[2])
            quota = QuotaState(tree, usage, freeing)
            waiting = [r for r in rows if r.state == "queued"]
            closed = [r for r in waiting if tree.specs[r.queue].state is QueueState.CLOSED]
            open_ = [self._held_of(r) for r in waiting
                     if tree.specs[r.queue].state is not QueueState.CLOSED]
            weights = {q: tree.specs[q].weight for q in queues}
            capacity = tree.nominal[top][0] if tree.limited[top][0] else 0.0
            ordered = self.ordering.order(open_, now, weights, capacity)
            reasons: dict[str, tuple[WaitReason, str]] = {}
            blocked: dict[str, str] = {}  # strict queue -> the job that holds it back
            admits: list[tuple[Held, bool]] = []
            victims: list[tuple[JobRow, Reclaim]] = []
            # Kueue's rule: jobs that fit within their guarantee go before borrowers, so a
            # borrower never takes what an owner waits for (pass 1 defers borrowers).
            deferred: list[Held] = []
            held_back: set[str] = set()  # strict queues with a deferred job
            for first in (True, False):
                for h in ordered if first else deferred:
                    q = h.event.queue
                    if q in blocked:
                        reasons[h.request.job_id] = (WaitReason.PRIORITY, (
                            f"behind {blocked[q]} in strict queue {q}"))
                        continue
                    if first and q in held_back:
                        deferred.append(h)
                        continue
                    capped = arrays.full(h.event)
                    if capped is not None:  # not a quota matter: it blocks no queue
                        reasons[h.request.job_id] = (WaitReason.ARRAY_LIMIT, capped)
                        continue
                    dec = quota.check(q, h.demand)
                    if dec.admitted and dec.borrowing and first:
                        deferred.append(h)
                        if tree.specs[q].strategy == "strict":
                            held_back.add(q)
                        continue
                    if dec.admitted:
                        quota.add(q, h.demand)
                        arrays.add(h.event)
                        admits.append((h, dec.borrowing))
                        continue
                    assert dec.reason is not None
                    reasons[h.request.job_id] = (dec.reason, dec.detail)
                    if dec.reclaim is not None:
                        victims += self._pick_victims(quota, dec.reclaim, holding, victims)
                        quota.claim(q, h.demand)
                    if tree.specs[q].strategy == "strict":
                        blocked[q] = h.request.job_id
            for r in closed:
                reasons[r.job_id] = (WaitReason.QUEUE_CLOSED, f"queue {r.queue} is closed: it "
                                     "admits nothing until it is opened")
            now_dt = _dt(now)
            for h, borrowing in admits:
                out += self._admit_events(h, borrowing, now_dt)
                await conn.execute(text(
                    """UPDATE queue_jobs SET state = 'admitted', phase = 'admitted',
                           borrowing = :b, reason = '', admitted_at = :t
                       WHERE job_id = :j AND state = 'queued'"""),
                    {"b": borrowing, "t": now_dt, "j": h.request.job_id})
                ADMITTED.labels(h.event.queue, str(borrowing).lower()).inc()
            for row, rc in victims:
                out.append(self._reclaim_event(row, rc))
                await store.update_job(conn, row.job_id, state="reclaiming")
                RECLAIMS.labels(rc.member).inc()
            by_queue = self._positions(ordered, closed, reasons)
            listed = await self._explain(conn, by_queue, rows, reasons, quota, now, out)
            out += self._statuses(queues, rows, admits, victims, quota, listed)
            self._queued = self._queued or bool(out)
            await add_many(conn, out, self.SOURCE, notify=False)
        if admits or victims:
            log.info("queue cycle", tree=top, admitted=len(admits), reclaiming=len(victims),
                     waiting=len(reasons))

    def _pick_victims(self, quota: QuotaState, rc: Reclaim, holding: list[JobRow],
                      already: list[tuple[JobRow, Reclaim]]) -> list[tuple[JobRow, Reclaim]]:
        """Borrowers' jobs to preempt, least valuable first (lowest priority class, then
        the most recently admitted: the least work lost), until the cohort's pool covers
        what its members draw. Jobs already being reclaimed count as gone."""
        tree = self.tree
        borrowers = set(quota.borrowers(rc.cohort, rc.member))
        if not borrowers:
            return []
        taken = {r.job_id for r, _ in already}
        cands = []
        for r in holding:
            if r.state != "admitted" or r.job_id in taken:
                continue
            branch = next((n for n in tree.path(r.queue) if tree.specs[n].parent == rc.cohort), None)
            h = self._held_of(r)
            if branch in borrowers and h.request.preemptible:
                cands.append((CLASS_RANK.get(h.request.priority_class, 1), h.request.priority,
                              -(r.admitted_at.timestamp() if r.admitted_at else 0.0), -r.seq,
                              r, h))
        cands.sort(key=lambda c: c[:4])
        need = list(rc.need)
        out = []
        for *_, r, h in cands:
            if all(n <= EPS for n in need):
                break
            d = quota.mask(r.queue, h.demand)
            if not any(d[i] > 0 and need[i] > EPS for i in range(3)):
                continue
            quota.mark_freeing(r.queue, d)
            need = [max(0.0, need[i] - d[i]) for i in range(3)]
            out.append((r, rc))
        return out

    def _admit_events(self, h: Held, borrowing: bool, now: datetime) -> list[tuple[Envelope, str]]:
        sub, attempt = h.event, h.attempt
        ready = JobReady(job_id=sub.job_id, queue=sub.queue, tenant=sub.tenant, user=sub.user,
                         spec=sub.spec, submitted_at=sub.submitted_at, admitted_at=now,
                         attempt=attempt)
        why = f"admitted by queue {sub.queue}" + (" (borrowing its cohort's quota)"
                                                   if borrowing else "")
        status = JobStatus(job_id=sub.job_id, state=JobState.ADMITTED, reason=why,
                           attempt=attempt)
        return [(Envelope.wrap(ready, self.SOURCE, f"ready-{sub.job_id}-{attempt}"),
                 topic_for(ready).name),
                (Envelope.wrap(status, self.SOURCE, f"admitted-{sub.job_id}-{attempt}"),
                 topic_for(status).name)]

    def _reclaim_event(self, row: JobRow, rc: Reclaim) -> tuple[Envelope, str]:
        cmd = JobCommand(job_id=row.job_id, action=CommandAction.PREEMPT,
                         reason=f"quota reclaimed: queue {row.queue} borrowed what {rc.member} "
                         f"is guaranteed in cohort {rc.cohort}", requested_by=self.SOURCE)
        return (Envelope.wrap(cmd, self.SOURCE, f"reclaim-{row.job_id}-{row.attempt}"),
                topic_for(cmd).name)

    @staticmethod
    def _positions(ordered: list[Held], closed: list[JobRow],
                   reasons: dict[str, tuple[WaitReason, str]]) -> dict[str, list[str]]:
        """Each queue's waiting jobs in the order they will be tried."""
        out: dict[str, list[str]] = {}
        for h in ordered:
            if h.request.job_id in reasons:
                out.setdefault(h.event.queue, []).append(h.request.job_id)
        for r in closed:
            out.setdefault(r.queue, []).append(r.job_id)
        return out

    async def _explain(self, conn: Any, by_queue: dict[str, list[str]], rows: list[JobRow],
                       reasons: dict[str, tuple[WaitReason, str]], quota: QuotaState,
                       now: float, out: list[tuple[Envelope, str]]) -> dict[str, list[WaitingJob]]:
        """Position, reason and estimated start of every waiting job; a job whose reason
        changed also gets a ``pending`` status (its history shows why it waits)."""
        by_id = {r.job_id: r for r in rows}
        listed: dict[str, list[WaitingJob]] = {}
        for q, ids in by_queue.items():
            items = []
            ahead = 0.0
            for pos, job_id in enumerate(ids, 1):
                reason, detail = reasons[job_id]
                row = by_id[job_id]
                h = self._held_of(row)
                est = None
                if reason is WaitReason.QUOTA:
                    est = self._estimate(q, ahead + h.demand[0], rows, quota, now)
                    ahead += h.demand[0]
                items.append(WaitingJob(job_id=job_id, position=pos, reason=reason.value,
                                        detail=detail, estimated_start=_dt(est) if est else None))
                if row.reason != reason.value:
                    notice = row.notices + 1
                    await store.update_job(conn, job_id, reason=reason.value, notices=notice)
                    st = JobStatus(job_id=job_id, state=JobState.PENDING, attempt=row.attempt,
                                   reason=f"waiting: {reason.value}", message=detail)
                    out.append((Envelope.wrap(st, self.SOURCE,
                                              f"waiting-{job_id}-{row.attempt}-{notice}"),
                                topic_for(st).name))
            listed[q] = items
        return listed

    def _estimate(self, queue: str, need_gpus: float, rows: list[JobRow], quota: QuotaState,
                  now: float) -> float | None:
        """When enough of the queue's own GPUs come back for ``need_gpus`` (this job and
        those ahead of it), from the runtime estimates of the jobs holding them; None when
        one of those has no estimate (or the queue has no GPU quota)."""
        tree = quota.tree
        if not tree.limited[tree.top_of[queue]][0]:
            return None
        excess = quota.used[queue][0] + need_gpus - tree.nominal[queue][0]
        if excess <= EPS:
            return None  # not its own quota that is short: a cohort's
        ends = []
        for r in rows:
            if r.queue != queue or r.state != "admitted":
                continue
            h = self._held_of(r)
            est = h.request.runtime_estimate_s
            if est is None or r.started_at is None:
                ends.append((float("inf"), h.demand[0]))
            else:
                ends.append((max(now, r.started_at.timestamp() + est), h.demand[0]))
        freed = 0.0
        for end, gpus in sorted(ends):
            if end == float("inf"):
                return None
            freed += gpus
            if freed + EPS >= excess:
                return end
        return None

    def _statuses(self, queues: list[str], rows: list[JobRow], admits: list[tuple[Held, bool]],
                  victims: list[tuple[JobRow, Reclaim]], quota: QuotaState,
                  listed: dict[str, list[WaitingJob]]) -> list[tuple[Envelope, str]]:
        admitted_now = {h.request.job_id for h, _ in admits}
        counts: dict[str, list[int]] = {q: [0, 0, 0] for q in queues}  # pending, admitted, running
        for r in rows:
            c = counts[r.queue]
            if r.state == "queued" and r.job_id not in admitted_now:
                c[0] += 1
            elif r.phase == "running":
                c[2] += 1
            else:
                c[1] += 1
        out = []
        tree = quota.tree
        for q in queues:
            spec = tree.specs[q]
            g = spec.guaranteed.values() if spec.guaranteed else (None, None, None)
            used, borrowed = quota.used[q], quota.borrowed(q)
            waiting = listed.get(q, [])
            status = QueueStatus(
                queue=q, tenant=tree.tenant(q), state=spec.state.value,
                guaranteed=dict(zip(RESOURCES, g, strict=True)),
                used=dict(zip(RESOURCES, used, strict=True)),
                borrowed=dict(zip(RESOURCES, borrowed, strict=True)),
                pending=counts[q][0], admitted=counts[q][1], running=counts[q][2],
                waiting=waiting[:MAX_WAITING_LISTED])
            for reason in WaitReason:
                WAITING.labels(q, reason.value).set(sum(1 for w in waiting if w.reason == reason))
            QUOTA_GPUS.labels(q, "guaranteed").set(tree.nominal[q][0])
            QUOTA_GPUS.labels(q, "used").set(used[0])
            QUOTA_GPUS.labels(q, "borrowed").set(borrowed[0])
            body = status.model_dump(mode="json")
            if self._last_status.get(q) == body:
                continue
            self._last_status[q] = body
            out.append((Envelope.wrap(status, self.SOURCE), topic_for(status).name))
        return out
