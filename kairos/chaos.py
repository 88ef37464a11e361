"""The chaos suite's harness: a supervised embedded stack, a steady workload, one fault at
a time, and the invariant checker after each (``bench/chaos.py``, ``make chaos``; a
slice of it runs in ``make test``).

Each fault is a phase: jobs are submitted at a steady rate (1-GPU, shares, multi-GPU,
gangs, some urgent ones that preempt, some cancels), the fault is injected a few seconds
in, and the phase ends when every job it accepted has ended (or a deadline passed).
A recorder reads every topic all along (a broker restarted empty loses what it held,
so the history is kept here), and ``kairos.check`` judges the phase's jobs.

Measured per fault: ``recovery_s`` (from the fault until every service answers /readyz
and a job submitted after the fault has started running: the platform is ready and jobs
flow again), ``lost`` (accepted jobs
not ended), ``double_runs`` (jobs that ran in two places), ``errors_5xx`` (answers of
500 and up other than a 503 with ``Retry-After``, which is the designed answer while a
dependency is away; those are counted as ``unavailable_503``), ``overloaded_429`` (a
gateway refusing submits while the platform is behind: the client waits and retries),
``violations``; ``after_fault_ended_s`` (recovery counted from the end of a fault that
lasts: a pause resumed, a partition healed, a full restart's start done) and
``first_job_running_s`` (until a job submitted after the fault runs, on any node: for a
pause, whose process answers no /readyz until it resumes, this is the recovery; a fault
with a standby counts from the kill or pause, not from the standby's start); from
the agents' own journals (``kairos/node_records.py``) ``wrongly_failed`` and
``limit_overruns``.
"""

from __future__ import annotations

import asyncio
import functools
import os
import random
import signal
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from aiokafka import TopicPartition

from kairos.check import TOPICS, History, Violation, check
from kairos.netns import unavailable as netns_unavailable
from kairos.node_records import check_records, journal_entries
from kairos.stack import Proc, Stack
from shared.bus import Consumer, ConsumerOptions, Producer
from shared.config import CommonSettings
from shared.events import EndCause, Envelope, Event, JobState, JobStatus, NodeLost

TERMINAL = {"succeeded", "failed", "cancelled"}
JOB_KINDS = {"not_terminal", "double_run", "stale_epoch"}  # violations about one job
CHAOS_ENV = {
    "KAIROS_HEARTBEAT_S": "1", "KAIROS_TELEMETRY_S": "2", "KAIROS_LOST_AFTER_S": "12",
    "KAIROS_FENCE_AFTER_S": "7",  # group timeouts: the embedded stack's own (stack.py)
}


def job_spec(rnd: random.Random, i: int, limits: bool = False) -> tuple[dict[str, Any], bool]:
    """A job of the mix, and whether to cancel it soon after. ``limits``: the mix also
    holds batch jobs that run past their timeLimit and interactive environments on GPU
    shares (held until their timeLimit), so that a fault can be judged on both."""
    if limits and rnd.random() < 0.4:
        return limited_spec(rnd, i), False
    kind = rnd.choices(["one", "share", "multi", "gang", "urgent"], [40, 20, 15, 20, 5])[0]
    res: dict[str, Any] = {"gpu": 1}
    replicas = 1
    if kind == "share":
        res = {"gpuMemory": rnd.choice([10240, 20480]), "gpuCompute": rnd.choice([25, 50])}
    elif kind == "multi":
        res = {"gpu": rnd.choice([2, 4, 8])}
    elif kind == "gang":
        res, replicas = {"gpu": rnd.choice([4, 8])}, rnd.choice([2, 3])
    elif kind == "urgent":
        res = {"gpu": 8}
    spec = {"name": f"chaos-{kind}-{i}", "duration": round(rnd.uniform(2, 8), 1),
            "minAvailable": replicas, "maxRetry": 1,
            "priorityClass": "urgent" if kind == "urgent" else rnd.choice(["low", "normal"]),
            "tasks": [{"name": "worker", "replicas": replicas, "resources": res}]}
    return spec, rnd.random() < 0.08


def limited_spec(rnd: random.Random, i: int) -> dict[str, Any]:
    """A batch job stopped by its timeLimit (it would run longer), or an interactive
    environment on a GPU share, held until its timeLimit."""
    if rnd.random() < 0.5:
        return {"name": f"chaos-limited-{i}", "duration": round(rnd.uniform(15, 25), 1),
                "timeLimit": rnd.choice([4, 6, 8]), "maxRetry": 1,
                "tasks": [{"name": "worker", "resources": {"gpu": 1}}]}
    return {"kind": "Interactive", "name": f"chaos-env-{i}", "timeLimit": rnd.choice([5, 8]),
            "tasks": [{"name": "session", "resources": {"gpuMemory": 10240,
                                                        "gpuCompute": 25}}]}


def first_running_after(history: History, jobs: set[str]) -> float | None:
    """The wall-clock time the first of ``jobs`` started running (job-level status)."""
    times = [at.timestamp() for at, ev in history.events
             if isinstance(ev, JobStatus) and ev.task is None and ev.job_id in jobs
             and ev.state is JobState.RUNNING]
    return min(times) if times else None


class Recorder:
    """Every event of the checked topics, read as it is published, in a thread of its own
    (the shared consumer: it reads a log that started over and waits out the broker)."""

    def __init__(self, bootstrap: str) -> None:
        self.history = History()
        self._bootstrap = bootstrap
        self._lock = threading.Lock()
        self._loop = asyncio.new_event_loop()
        self._consumer: Consumer | None = None
        self._thread = threading.Thread(target=self._run, name="recorder", daemon=True)
        self._started = threading.Event()

    def start(self) -> None:
        self._thread.start()
        if not self._started.wait(60):
            raise TimeoutError("the recorder did not start")

    def _run(self) -> None:
        self._loop.run_until_complete(self._main())

    async def _main(self) -> None:
        settings = CommonSettings(service_name="chaos-recorder", kafka_bootstrap=self._bootstrap)
        producer = Producer(self._bootstrap, "chaos-recorder")
        await producer.start()
        tps = [TopicPartition(t, p) for t in TOPICS
               for p in range(await producer.partition_count(t))]

        async def handle(env: Envelope, event: Event) -> None:
            with self._lock:
                self.history.add(env)

        self._consumer = Consumer(settings, ConsumerOptions(
            "chaos-recorder", list(TOPICS), assign=tps, commit=False, dead_letter=False),
            handle, producer)
        await self._consumer.start()
        self._started.set()
        try:
            await self._consumer.run()
        finally:
            await self._consumer.stop()
            await producer.stop()

    def snapshot(self) -> History:
        with self._lock:
            return History(list(self.history.events), set(self.history._ids))

    def stop(self) -> None:
        if self._consumer is not None:
            self._loop.call_soon_threadsafe(self._consumer._stopping.set)
        self._thread.join(15)


@dataclass
class Client:
    """The workload's HTTP side: submits retry with one Idempotency-Key until accepted."""

    stack: Stack
    errors_5xx: int = 0
    unavailable_503: int = 0
    overloaded_429: int = 0
    _http: httpx.Client = field(init=False)

    def __post_init__(self) -> None:
        self._http = httpx.Client(base_url=self.stack.url, timeout=30, headers={
            "Authorization": f"Bearer {self.stack.token}"})

    def _call(self, method: str, path: str, deadline_s: float = 120,
              **kw: Any) -> httpx.Response | None:
        end = time.monotonic() + deadline_s
        while time.monotonic() < end:
            try:
                r = self._http.request(method, path, **kw)
            except httpx.HTTPError:
                time.sleep(0.5)  # admission itself is down: a client retries
                continue
            if r.status_code in (429, 503) and "retry-after" in r.headers:
                if r.status_code == 503:
                    self.unavailable_503 += 1
                else:  # overloaded (or a rate limit): a real client waits as told
                    self.overloaded_429 += 1
                time.sleep(min(5.0, float(r.headers["retry-after"])))
                continue
            if r.status_code >= 500:
                self.errors_5xx += 1
                time.sleep(0.5)
                continue
            return r
        return None

    def submit(self, spec: dict[str, Any]) -> str | None:
        r = self._call("POST", "/v1/jobs", json=spec,
                       headers={"Idempotency-Key": uuid.uuid4().hex})
        return str(r.json()["id"]) if r is not None and r.status_code == 201 else None

    def cancel(self, job_id: str) -> None:
        self._call("DELETE", f"/v1/jobs/{job_id}")

    def states(self, ids: list[str]) -> dict[str, str]:
        out: dict[str, str] = {}
        for job_id in ids:
            r = self._call("GET", f"/v1/jobs/{job_id}", deadline_s=30)
            out[job_id] = r.json()["state"] if r is not None and r.status_code == 200 \
                else "unknown"
        return out

    def close(self) -> None:
        self._http.close()


Inject = Callable[["Chaos"], None]


@dataclass
class Chaos:
    stack: Stack
    recorder: Recorder
    client: Client
    seed: int = 7
    stop_took_s: float | None = None  # a full restart's graceful stop, the last one
    _fault_at: list[float] = field(default_factory=list)  # the phase's, while it runs
    _reported: set[Violation] = field(default_factory=set)

    # --- the faults ------------------------------------------------------------------------

    def fault_begins(self) -> None:
        """For a fault that prepares first (a standby started and given time to stand
        by): the fault's moment is now, not when its preparation began."""
        self._fault_at[:] = [time.time()]

    def kill(self, name: str) -> None:
        os.kill(self.stack.proc(name).popen.pid, signal.SIGKILL)  # the supervisor restarts it

    def leader(self) -> Proc:
        for p in self.stack.procs:
            if p.name.startswith("scheduler") and p.popen.poll() is None:
                try:
                    m = httpx.get(f"{p.url}/metrics", timeout=2).text
                except httpx.HTTPError:
                    continue
                if "kairos_scheduler_is_leader 1.0" in m:
                    return p
        raise RuntimeError("no scheduler leads")

    def standby(self) -> Proc:
        name = "scheduler#standby"
        if not any(p.name == name for p in self.stack.procs):
            self.stack.start_service(name, module="services.scheduler")
        return self.stack.proc(name)

    def pause(self, proc: Proc, seconds: float) -> None:
        os.kill(proc.popen.pid, signal.SIGSTOP)
        time.sleep(seconds)
        os.kill(proc.popen.pid, signal.SIGCONT)

    def restart_postgres(self) -> None:
        assert self.stack._pg is not None and self.stack._pg._server is not None
        pid = self.stack._pg._server.get_postmaster_info().pid
        os.kill(pid, signal.SIGINT)  # a fast shutdown, as `pg_ctl restart -m fast`; the
        # supervisor starts it again on the same data

    def kill_postgres(self) -> None:
        """kill -9 of the postmaster: no shutdown at all, as a crash of its machine looks
        to the services (its backends die with it); the supervisor starts it again."""
        assert self.stack._pg is not None and self.stack._pg._server is not None
        os.kill(self.stack._pg._server.get_postmaster_info().pid, signal.SIGKILL)

    def full_restart(self) -> None:
        """Ctrl-C of `kairos up`, then `kairos up` again on the same state: the graceful
        stop (Stack.stop), then a start that keeps PostgreSQL's data, the agents' state
        and the broker's address (it comes back empty, as the embedded one does)."""
        self.stack.fresh = False
        began = time.monotonic()
        self.stack.stop()
        self.stop_took_s = time.monotonic() - began  # recovery counts from the Ctrl-C
        self.stack.start()

    def restart_broker(self) -> None:
        assert self.stack._broker is not None and self.stack._broker._proc is not None
        self.stack._broker._proc.kill()  # the supervisor starts an empty one

    def agent(self) -> Proc:
        return next(p for p in self.stack.procs if p.name.startswith("node-agent"))

    # --- one phase -------------------------------------------------------------------------

    def phase(self, name: str, inject: Inject, jobs: int = 60, rate_per_s: float = 4.0,
              fault_after_s: float = 4.0, drain_s: float = 240.0) -> dict[str, Any]:
        rnd = random.Random(f"{self.seed}-{name}")
        errors_before = self.client.errors_5xx
        unavailable_before = self.client.unavailable_503
        overloaded_before = self.client.overloaded_429
        accepted: list[tuple[float, str]] = []  # (wall clock when accepted, job)
        cancels: list[str] = []
        fault_at: list[float] = []  # wall clock (fault_begins() may move it on)
        self._fault_at = fault_at
        injected_at: list[float] = []  # when the fault ended (a pause resumed, a restart ...)
        ready_at: list[float] = []

        def fault() -> None:
            time.sleep(fault_after_s)
            fault_at.append(time.time())
            inject(self)
            injected_at.append(time.time())
            time.sleep(1.0)  # a supervisor notices an exit within a second
            ready_at.append(self._wait_ready(drain_s))

        pids = {p.name: p.popen.pid for p in self.stack.procs}
        thread = threading.Thread(target=fault)
        thread.start()
        started = time.monotonic()
        for i in range(jobs):
            time.sleep(max(0.0, started + i / rate_per_s - time.monotonic()))
            spec, cancel = job_spec(rnd, i, limits=name in LIMITS_MIX)
            job = self.client.submit(spec)
            if job:
                accepted.append((time.time(), job))
                if cancel:
                    cancels.append(job)
            if cancels and rnd.random() < 0.3:
                self.client.cancel(cancels.pop(0))
        for job in cancels:
            self.client.cancel(job)
        thread.join()
        ids = [j for _, j in accepted]
        states = self._drain(ids, drain_s)
        time.sleep(2)  # the last reports reach the recorder
        history = self.recorder.snapshot()
        report = check(history, states)
        # the history holds every phase so far: judge this phase's jobs, and what is new
        report.violations = [v for v in report.violations
                             if (v.subject in states if v.kind in JOB_KINDS
                                 else v not in self._reported)]
        self._reported.update(report.violations)
        report.reruns = {j: r for j, r in report.reruns.items() if j in states}
        # what the nodes' own journals say: work they finished that was not recorded as
        # such, platform causes that spent retries, tasks that ran past their limit
        records = check_records(journal_entries(self.stack.workdir / "agents"), history,
                                states)
        report.violations += records.violations
        flowing = first_running_after(history, {j for at, j in accepted if at > fault_at[0]})
        recovery = None if flowing is None else max(ready_at[0], flowing) - fault_at[0]
        stop_s, self.stop_took_s = self.stop_took_s, None
        return {
            "recovery_s": None if recovery is None else round(recovery, 1),
            # from the fault's end (a pause resumed, a partition healed; a kill ends at
            # once) until every service is ready and a job submitted after it runs
            "after_fault_ended_s": None if recovery is None else round(
                max(ready_at[0], flowing or 0.0) - injected_at[0], 1),
            # from the fault until the first job submitted after it runs (on any node)
            "first_job_running_s": None if flowing is None else round(flowing - fault_at[0], 1),
            # a full restart: how long the graceful stop took, and recovery from the start
            **({} if stop_s is None else {
                "stop_s": round(stop_s, 1),
                "recovery_from_start_s": None if recovery is None
                else round(recovery - stop_s, 1)}),
            "lost": report.count("not_terminal"),
            "double_runs": len({v.subject for v in report.violations if v.kind == "double_run"}),
            "errors_5xx": self.client.errors_5xx - errors_before,
            "unavailable_503": self.client.unavailable_503 - unavailable_before,
            "overloaded_429": self.client.overloaded_429 - overloaded_before,
            "violations": len(report.violations),
            "wrongly_failed": len(records.wrongly_failed),
            "limit_overruns": len(records.limit_overruns),
            "rerun_after_node_lost": len(records.rerun_after_node_lost),
            "jobs": len(ids), "reruns_with_reason": sum(len(v) for v in report.reruns.values()),
            "states": {s: list(states.values()).count(s) for s in sorted(set(states.values()))},
            "details": [f"{v.kind} {v.subject}: {v.detail}" for v in report.violations[:20]],
            # what the fault did: nodes declared lost, tasks their agents stopped themselves
            "nodes_lost": sorted({ev.node_id for at, ev in history.events
                                  if isinstance(ev, NodeLost) and at.timestamp() >= fault_at[0]}),
            # services that exited and were restarted (the killed one; none for an outage
            # of PostgreSQL or the broker, which every service waits out)
            "service_restarts": sorted(p.name for p in self.stack.procs
                                       if p.name in pids and p.popen.pid != pids[p.name]),
            "fenced_tasks": sum(1 for at, ev in history.events
                                if isinstance(ev, JobStatus) and ev.task is not None
                                and ev.job_id in states
                                and ev.end_cause() is EndCause.FENCED),
        }

    def _wait_ready(self, deadline_s: float) -> float:
        """When every service meant to run answers /readyz 200 (wall clock)."""
        end = time.monotonic() + deadline_s
        while time.monotonic() < end:
            procs = [p for p in self.stack.procs if p.wanted]
            try:
                if all(httpx.get(f"{p.url}/readyz", timeout=2).status_code
                       == 200 for p in procs):
                    return time.time()
            except httpx.HTTPError:
                pass
            time.sleep(0.25)
        return time.time()

    def _drain(self, ids: list[str], deadline_s: float) -> dict[str, str]:
        end = time.monotonic() + deadline_s
        states = self.client.states(ids)
        while time.monotonic() < end:
            left = [j for j, s in states.items() if s not in TERMINAL]
            if not left:
                break
            time.sleep(1)
            states.update(self.client.states(left))
        return states


FAULTS: dict[str, Inject] = {
    "kill_admission": lambda c: c.kill("admission"),
    "kill_queueing": lambda c: c.kill("queueing"),
    "kill_scheduler_leader": lambda c: os.kill(c.leader().popen.pid, signal.SIGKILL),
    "kill_agent": lambda c: os.kill(c.agent().popen.pid, signal.SIGKILL),
    "kill_monitor": lambda c: c.kill("monitor"),
    "restart_postgres": lambda c: c.restart_postgres(),
    "restart_broker": lambda c: c.restart_broker(),
    "pause_agent_past_lost_timeout": lambda c: c.pause(c.agent(), 20.0),
}


def with_standby(inject: Inject) -> Inject:
    def run(c: Chaos) -> None:
        c.standby()
        time.sleep(3)  # it connects and stands by
        c.fault_begins()
        inject(c)
    return run


FAULTS["kill_scheduler_leader_with_standby"] = with_standby(FAULTS["kill_scheduler_leader"])
FAULTS["pause_scheduler_leader_past_lease"] = with_standby(
    lambda c: c.pause(c.leader(), 20.0))


def node_lost_for_good(c: Chaos) -> None:
    proc = c.agent()
    c.stack.stop_proc(proc, signal.SIGKILL)  # stopped on purpose: never comes back


def partition_agent(c: Chaos, seconds: float = 20.0) -> None:
    """Cut one agent off from the broker (and so from everything: it has no database)
    by dropping its namespace's traffic, while it and its tasks keep running, for longer
    than the lost-node timeout; then let it through again."""
    if not c.stack.netns:
        raise RuntimeError(f"no agent runs in a namespace of its own: "
                           f"{unavailable('partition_agent_past_lost_timeout')}")
    ns = next(iter(c.stack.netns.values()))
    ns.cut()
    try:
        time.sleep(seconds)
    finally:
        ns.heal()


FAULTS["partition_agent_past_lost_timeout"] = partition_agent
FAULTS["agent_restart_with_limits"] = FAULTS["kill_agent"]  # with the limits mix
FAULTS["postgres_kill_during_job_ends"] = lambda c: c.kill_postgres()
FAULTS["full_restart_under_load"] = lambda c: c.full_restart()
# faults whose workload also holds time-limited jobs and interactive environments
LIMITS_MIX = {"agent_restart_with_limits", "full_restart_under_load"}
FAULTS["node_lost_for_good"] = node_lost_for_good  # last: it takes capacity away
PARTITIONED_AGENT = "node1"  # its own network namespace, where one can be made


@functools.cache
def _netns_unavailable() -> str | None:
    return netns_unavailable()


def unavailable(fault: str) -> str | None:
    """Why a fault cannot be injected on this machine (None: it can)."""
    return _netns_unavailable() if fault == "partition_agent_past_lost_timeout" else None


def print_crashes(workdir: Path) -> None:
    """The end of every service log that holds a traceback (a test's or bench's output
    then says what crashed)."""
    for log in sorted(workdir.glob("logs/*.log")):
        text = log.read_text(errors="replace")
        if "Traceback" in text:
            print(f"--- {log.name} (last lines)\n{text[-3000:]}")


def chaos_stack(workdir: Any, nodes: int = 16) -> Stack:
    can_cut = unavailable("partition_agent_past_lost_timeout") is None
    isolate = (PARTITIONED_AGENT,) if can_cut and nodes > 4 else ()
    return Stack(workdir=workdir, nodes=nodes, gpus_per_node=8, nodes_per_agent=4,
                 admission_port=0 or _port(), env=dict(CHAOS_ENV), supervise=True,
                 isolate_agents=isolate)


def _port() -> int:
    from kairos.embedded import free_port
    return free_port()
