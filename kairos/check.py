"""`kairos check`: the platform's invariants, read back after a run.

It reads the topics (``jobs.status``, ``bindings``, ``nodes.lifecycle``,
``queues.events``) and the gateway's jobs in PostgreSQL, and reports each broken
invariant with what proves it:

- ``not_terminal``: an accepted job that never reached succeeded, failed or cancelled;
- ``double_run``: a job whose work went on in two places: a task of an attempt that
  reported ``running`` or ``succeeded`` after the job had moved on to a later attempt,
  or on a node after that node was declared lost (and before it registered again);
- ``over_capacity``: a GPU whose memory or compute was allocated beyond its capacity at
  some moment (allocations from bindings, freed by the task's end or its node's loss; a
  binding resent for an ended task, or sent to a node already declared lost, holds the
  GPU only once its task runs);
- ``stale_epoch``: a task started from a binding of a lower epoch than a fence its node
  had already received;
- ``quota_exceeded``: a queue that borrowed beyond its borrowing limit (in all, or of a
  GPU model its quota names).

The checking is a pure function over a ``History`` (``check``); a chaos run records the
history live with ``History.add`` (a broker restarted empty loses what it held) and the
CLI reads it from the topics.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition
from pydantic import ValidationError
from sqlalchemy import text

from shared.db import make_engine
from shared.events import (
    Binding,
    BindingAction,
    Envelope,
    JobState,
    JobStatus,
    NodeLost,
    NodeRegistered,
    QueueChanged,
    QueueStatus,
)
from shared.topics import BINDINGS, JOBS_STATUS, NODES_LIFECYCLE, QUEUES_EVENTS

TOPICS = (JOBS_STATUS.name, BINDINGS.name, NODES_LIFECYCLE.name, QUEUES_EVENTS.name)
TERMINAL_JOB = {"succeeded", "failed", "cancelled"}
TASK_END = {JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED, JobState.PREEMPTED}
EPS = 1e-6


@dataclass(frozen=True)
class Violation:
    kind: str
    subject: str  # the job, node/GPU or queue it is about
    detail: str


@dataclass
class History:
    """Events in the order they were seen, each once (by envelope id)."""

    events: list[tuple[datetime, Any]] = field(default_factory=list)
    _ids: set[str] = field(default_factory=set)

    def add(self, env: Envelope) -> None:
        if env.id in self._ids or env.type not in (
                "job.status", "binding", "node.registered", "node.lost",
                "queue.changed", "queue.status"):
            return
        try:
            event = env.payload()
        except (KeyError, ValidationError):
            return
        self._ids.add(env.id)
        self.events.append((env.occurred_at, event))


@dataclass
class Report:
    jobs: int = 0
    terminal: int = 0
    violations: list[Violation] = field(default_factory=list)
    reruns: dict[str, list[str]] = field(default_factory=dict)  # job -> why each rerun

    def count(self, kind: str) -> int:
        return sum(1 for v in self.violations if v.kind == kind)

    def as_dict(self) -> dict[str, Any]:
        kinds = ("not_terminal", "double_run", "over_capacity", "stale_epoch",
                 "quota_exceeded")
        return {"jobs": self.jobs, "terminal": self.terminal,
                "violations": len(self.violations),
                **{k: self.count(k) for k in kinds},
                "double_run_jobs": len({v.subject for v in self.violations
                                        if v.kind == "double_run"}),
                "reruns": sum(len(v) for v in self.reruns.values()),
                "details": [v.__dict__ for v in self.violations[:200]]}


def check(history: History, job_states: dict[str, str]) -> Report:
    """Every invariant over one history; ``job_states`` is the gateway's state of each
    accepted job (what its users see)."""
    report = Report(jobs=len(job_states),
                    terminal=sum(1 for s in job_states.values() if s in TERMINAL_JOB))
    for job, state in sorted(job_states.items()):
        if state not in TERMINAL_JOB:
            report.violations.append(Violation("not_terminal", job, f"left {state}"))
    events = sorted(history.events, key=lambda e: e[0])
    _runs(events, report)
    _capacity(events, report)
    _quota(events, report)
    return report


def _runs(events: list[tuple[datetime, Any]], report: Report) -> None:
    latest: dict[str, int] = defaultdict(lambda: 1)  # job -> its newest attempt announced
    lost: dict[str, datetime] = {}  # node -> when declared lost (until it registers again)
    fenced: dict[str, int] = defaultdict(int)  # node -> highest epoch fenced there
    # job -> attempt -> tasks running now (task id -> node)
    running: dict[str, dict[int, dict[str, str]]] = defaultdict(lambda: defaultdict(dict))
    for at, ev in events:
        if isinstance(ev, NodeLost):
            lost[ev.node_id] = at
            for attempts in running.values():  # the scheduler counts them stopped
                for tasks in attempts.values():
                    for task in [t for t, n in tasks.items() if n == ev.node_id]:
                        del tasks[task]
        elif isinstance(ev, NodeRegistered):
            lost.pop(ev.inventory.node_id, None)
        elif isinstance(ev, Binding) and ev.action is BindingAction.FENCE:
            fenced[ev.node_id] = max(fenced[ev.node_id], ev.epoch)
        elif isinstance(ev, JobStatus) and ev.task is None:
            if ev.attempt > latest[ev.job_id]:
                report.reruns.setdefault(ev.job_id, []).append(ev.reason)
                latest[ev.job_id] = ev.attempt
        elif isinstance(ev, JobStatus) and ev.state in TASK_END:
            running[ev.job_id][ev.attempt].pop(ev.task or "", None)
        elif isinstance(ev, JobStatus) and ev.state is JobState.RUNNING:
            where = f"{ev.job_id}/{ev.task} attempt {ev.attempt} on {ev.node_id}"
            others = {a: t for a, t in running[ev.job_id].items() if a != ev.attempt and t}
            if others:
                a, tasks = next(iter(others.items()))
                report.violations.append(Violation(
                    "double_run", ev.job_id, f"{where} started while attempt {a} still runs "
                    f"({', '.join(f'{t} on {n}' for t, n in sorted(tasks.items()))})"))
            if ev.node_id in lost:
                report.violations.append(Violation(
                    "double_run", ev.job_id, f"{where} running after its node was declared "
                    f"lost at {lost[ev.node_id].isoformat()}"))
            else:
                running[ev.job_id][ev.attempt][ev.task or ""] = ev.node_id or ""
            if ev.epoch is not None and ev.node_id and ev.epoch < fenced[ev.node_id]:
                report.violations.append(Violation(
                    "stale_epoch", ev.job_id, f"{where} started from epoch {ev.epoch} after "
                    f"the node was fenced at epoch {fenced[ev.node_id]}"))
        if isinstance(ev, JobStatus) and ev.task is not None and ev.state is \
                JobState.SUCCEEDED and ev.node_id in lost:
            report.violations.append(Violation(
                "double_run", ev.job_id, f"{ev.job_id}/{ev.task} attempt {ev.attempt} "
                f"succeeded on {ev.node_id} after the node was declared lost"))


def _capacity(events: list[tuple[datetime, Any]], report: Report) -> None:
    gpus: dict[tuple[str, int], int] = {}  # (node, index) -> memory MiB
    held: dict[tuple[str, str, int], tuple[str, list[tuple[int, int, int]]]] = {}
    use: dict[tuple[str, int], list[int]] = defaultdict(lambda: [0, 0])  # MiB, compute %
    reported: set[tuple[str, int]] = set()

    def take(key: tuple[str, str, int], node: str, grants: list[tuple[int, int, int]]) -> None:
        if key in held:
            return  # a resent binding: the same task, held once
        held[key] = (node, grants)
        for index, mib, pct in grants:
            u = use[(node, index)]
            cap = gpus.get((node, index))
            u[0] += mib or (cap or 0)
            u[1] += pct
            if cap is not None and (u[0] > cap or u[1] > 100) and (node, index) not in reported:
                reported.add((node, index))
                report.violations.append(Violation(
                    "over_capacity", f"{node}/gpu{index}", f"{u[0]} of {cap} MiB and "
                    f"{u[1]}% compute allocated when {key[0]}/{key[1]} was bound"))

    def free(key: tuple[str, str, int]) -> None:
        node, grants = held.pop(key, ("", []))
        for index, mib, pct in grants:
            u = use[(node, index)]
            u[0] -= mib or gpus.get((node, index), 0)
            u[1] -= pct

    # A new leader resends the bindings of jobs it loaded as running, and one whose task
    # had ended unbeknown to it is resent too; the agent reports the end again and runs
    # nothing. Such a binding holds the GPU only if the task then runs again.
    # Likewise a binding to a node already declared lost (the monitor declares it; the
    # scheduler may bind in the moment before it hears): the scheduler gives the job
    # back when it hears, and the binding holds the GPU only if its task runs.
    ended: set[tuple[str, str, int]] = set()
    resent: dict[tuple[str, str, int], tuple[str, list[tuple[int, int, int]]]] = {}
    gone: set[str] = set()  # nodes declared lost and not registered since
    for _, ev in events:
        if isinstance(ev, NodeRegistered):
            gone.discard(ev.inventory.node_id)
            for g in ev.inventory.gpus:
                gpus[(ev.inventory.node_id, g.index)] = g.memory_mib
        elif isinstance(ev, Binding) and ev.action in (BindingAction.ALLOCATE,
                                                       BindingAction.RESIZE):
            for t in ev.tasks:
                key = (ev.job_id, t.task_id, ev.attempt)
                grants = [(g.index, g.memory_mib, g.compute_pct) for g in t.gpus]
                if key in ended or ev.node_id in gone:
                    resent[key] = (ev.node_id, grants)
                else:
                    take(key, ev.node_id, grants)
        elif isinstance(ev, JobStatus) and ev.task is not None and ev.state in TASK_END:
            key = (ev.job_id, ev.task, ev.attempt)
            ended.add(key)
            resent.pop(key, None)
            free(key)
        elif isinstance(ev, JobStatus) and ev.task is not None and \
                ev.state is JobState.RUNNING and (ev.job_id, ev.task, ev.attempt) in resent:
            key = (ev.job_id, ev.task, ev.attempt)
            ended.discard(key)
            take(key, *resent.pop(key))
        elif isinstance(ev, NodeLost):
            gone.add(ev.node_id)
            for key in [k for k, (n, _) in held.items() if n == ev.node_id]:
                free(key)


def _quota(events: list[tuple[datetime, Any]], report: Report) -> None:
    limits: dict[str, dict[str, float]] = {}
    model_caps: dict[str, dict[str, float]] = {}  # queue -> model -> guaranteed + borrowing
    reported: set[str] = set()
    for _, ev in events:
        if isinstance(ev, QueueChanged) and ev.settings:
            limits[ev.queue] = {k: float(v) for k, v in (
                ev.settings.get("borrowing_limit") or {}).items() if v is not None}
            model_caps[ev.queue] = {
                m["model"]: float(m["guaranteed"]) + float(m["borrowing_limit"])
                for m in ev.settings.get("gpu_models") or ()
                if m.get("guaranteed") is not None and m.get("borrowing_limit") is not None}
        elif isinstance(ev, QueueStatus) and ev.queue not in reported:
            over = [f"borrowed {ev.borrowed.get(r)} {r}, limit {limit}"
                    for r, limit in limits.get(ev.queue, {}).items()
                    if float(ev.borrowed.get(r) or 0.0) > limit + EPS]
            over += [f"holds {ev.used_by_model.get(m)} {m} GPUs, at most {cap}"
                     for m, cap in model_caps.get(ev.queue, {}).items()
                     if float(ev.used_by_model.get(m) or 0.0) > cap + EPS]
            if over:
                reported.add(ev.queue)
                report.violations.append(Violation("quota_exceeded", ev.queue, over[0]))


async def read_topics(bootstrap: str, history: History | None = None,
                      idle_s: float = 2.0) -> History:
    """Everything the topics hold now, from their start."""
    history = history or History()
    c = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False,
                         auto_offset_reset="earliest", fetch_max_wait_ms=100)
    await c.start()
    try:
        tps = [TopicPartition(t, p) for t in TOPICS for p in (c.partitions_for_topic(t)
                                                              or await _partitions(c, t))]
        c.assign(tps)
        await c.seek_to_beginning(*tps)
        ends = await c.end_offsets(tps)
        while any([await c.position(tp) < ends[tp] for tp in tps]):
            got = await c.getmany(timeout_ms=int(idle_s * 1000))
            if not got:
                break
            for records in got.values():
                for r in records:
                    with contextlib.suppress(ValidationError, ValueError):
                        history.add(Envelope.decode(r.value or b""))
    finally:
        await c.stop()
    return history


async def _partitions(c: AIOKafkaConsumer, topic: str) -> set[int]:
    await c.topics()
    return c.partitions_for_topic(topic) or set()


async def job_states(database_url: str) -> dict[str, str]:
    engine = make_engine(database_url, pool_size=1)
    try:
        async with engine.connect() as conn:
            rows = (await conn.execute(text("SELECT id, state FROM jobs"))).all()
        return {r.id: r.state for r in rows}
    finally:
        await engine.dispose()


async def run_check(bootstrap: str, database_url: str) -> Report:
    history, states = await asyncio.gather(read_topics(bootstrap), job_states(database_url))
    return check(history, states)
