"""A task's outcome outlives every restart, and an adopted task gets back all it had.

The node's journal (``services/node_agent/journal.py``) keeps each task's start (its
GPUs, time limit, first start, connection) and its final report. So a task that ended
and was reported just before the broker lost the report (the embedded broker keeps its
log in memory) is reported again, not ``lost``, when the scheduler's next reconcile
still lists it; and a task adopted after a kill -9 keeps its time limit, counted from
its first start, its GPUs and its connection. Each of these failed before the journal.
Every end carries its cause as a code (``EndCause``).
"""

from __future__ import annotations

import contextlib
import time
import uuid
from pathlib import Path

import psutil

from services.node_agent.agent import NodeAgent
from services.node_agent.journal import Journal
from services.node_agent.lease import Lease
from services.node_agent.runtimes.base import GpuGrant, TaskLaunch
from shared.events import (
    Binding,
    BindingAction,
    EndCause,
    GpuAssignment,
    JobState,
    JobStatus,
    TaskBinding,
)
from tests.node_agent.harness import until
from tests.services.test_agent_fencing import Broker, bind, process_agent, sim_agent


def agent(broker: Broker, tmp_path: Path) -> NodeAgent:
    return sim_agent(broker, Lease(30, tmp_path / "n1" / "lease"), str(tmp_path))


def reconcile(*owned: str, epoch: int = 1) -> Binding:
    return Binding(binding_id=f"rc-{uuid.uuid4().hex[:6]}", action=BindingAction.RECONCILE,
                   node_id="n1", epoch=epoch, job_id="", reason="node registered",
                   owned=list(owned))


def limited(job: str, limit_s: float, duration: float = 600, *, gpus: int = 0,
            share_mib: int = 0, interactive: bool = False) -> Binding:
    return Binding(binding_id=f"{job}-allocate", action=BindingAction.ALLOCATE, node_id="n1",
                   epoch=1, job_id=job, duration_s=duration, grace_period_s=0.2,
                   time_limit_s=limit_s, interactive=interactive,
                   tasks=[TaskBinding(task_id="w-0", task_name="w", role="worker", replica=0,
                                      rank=0, gpus=[GpuAssignment(
                                          index=i, memory_mib=share_mib,
                                          compute_pct=60 if share_mib else 100)
                                          for i in range(gpus)])])


async def test_an_end_the_broker_lost_is_reported_again_after_a_restart(
        tmp_path: Path) -> None:
    """Before the journal, the restarted agent answered this reconcile with ``failed:
    lost: not running on this node``, and the job was retried or failed."""
    broker = Broker()
    first = agent(broker, tmp_path)
    await first.handle(bind("D", duration=0.1))
    await until(lambda: broker.states("D") == ["running", "succeeded"])
    broker.events.clear()  # the broker acknowledged the report, then lost its log
    await first.runtime.close()  # and the agent was stopped too (Ctrl-C)

    again = agent(broker, tmp_path)
    assert await again.reconcile() == 0
    await again.handle(reconcile("D/w-0/1"))  # the scheduler never stored the end
    (resent,) = broker.statuses("D")
    assert (resent.state, resent.cause, resent.exit_code) == (
        JobState.SUCCEEDED, EndCause.COMPLETED, 0)
    await again.handle(bind("D", duration=0.1))  # redelivered: not run again
    assert broker.states("D") == ["succeeded"]
    await again.handle(reconcile())  # the scheduler stored it: no longer listed, no report
    await again.handle(reconcile("X/w-0/1"))  # a task this node never saw: lost, a code
    (lost,) = broker.statuses("X")
    assert (lost.state, lost.cause) == (JobState.FAILED, EndCause.LOST)
    assert broker.states("D") == ["succeeded"]
    await again.close()


async def test_an_adopted_task_keeps_its_time_limit_from_its_first_start(
        tmp_path: Path) -> None:
    """Before the journal an adopted task had no timer: it ran to its end, past its limit."""
    broker = Broker()
    first = agent(broker, tmp_path)
    await first.handle(limited("T", limit_s=1.5, duration=30))
    started = time.monotonic()
    await first.runtime.close()  # kill -9: the task lives on in its file
    await until(lambda: time.monotonic() - started > 0.7)

    again = agent(broker, tmp_path)
    assert await again.reconcile() == 1
    await until(lambda: len(broker.states("T")) == 2, timeout=10)
    stopped = broker.statuses("T")[1]
    assert (stopped.state, stopped.cause) == (JobState.CANCELLED, EndCause.TIME_LIMIT)
    assert time.monotonic() - started < 10  # its limit, not its 30 s of work
    assert stopped.ran_s is not None and 1.2 < stopped.ran_s < 5
    await again.close()


async def test_an_adopted_task_past_its_limit_is_stopped_at_once(tmp_path: Path) -> None:
    broker = Broker()
    first = agent(broker, tmp_path)
    await first.handle(limited("T", limit_s=0.3, duration=30))
    await first.runtime.close()
    entry = first.journal.get("T/w-0/1")
    assert entry is not None and entry.started_at is not None
    await until(lambda: time.time() > entry.started_at + 0.5)  # type: ignore[operator]

    again = agent(broker, tmp_path)
    await again.reconcile()
    await until(lambda: len(broker.states("T")) == 2)
    assert broker.statuses("T")[1].cause is EndCause.TIME_LIMIT
    await again.close()


async def test_an_adopted_task_gets_back_its_gpus_and_its_connection(tmp_path: Path) -> None:
    broker = Broker()
    first = agent(broker, tmp_path)
    await first.handle(limited("G", limit_s=600, gpus=2, share_mib=20_000,
                                    interactive=True))
    conn = broker.statuses("G")[0].connection
    assert conn is not None
    await first.runtime.close()

    again = agent(broker, tmp_path)
    assert await again.reconcile() == 1
    busy = [g.utilization_pct > 50 for g in again.telemetry().gpus]
    assert busy[:2] == [True, True] and not any(busy[2:])  # its GPUs' load is back
    assert again.shares.watchdog is not None and again.shares.watchdog.watching
    rec = again._tasks.live["G/w-0/1"]
    assert rec.connection == conn
    assert [(g.index, g.memory_mib) for g in rec.launch.gpus] == [(0, 20_000), (1, 20_000)]
    await again.handle(bind("G", action=BindingAction.STOP, reason="returned"))
    await until(lambda: len(broker.states("G")) == 2)
    assert not any(g.utilization_pct > 50 for g in again.telemetry().gpus)  # released
    assert not again.shares.watchdog.watching
    await again.close()


async def test_a_local_process_adopted_after_a_kill_stops_at_its_limit(tmp_path: Path) -> None:
    """The same for a real process: it outlives the agent in its own process group, and
    keeps its log and its checkpoint file."""
    broker = Broker()

    marker = f"600.{uuid.uuid4().int % 10**9:09d}"
    try:
        first = process_agent(broker, tmp_path, fence_after_s=30)
        b = limited("P", limit_s=1.5)
        b = b.model_copy(update={"tasks": [b.tasks[0].model_copy(update={"command": [
            "sh", "-c", f'echo hello-{marker}; echo step-5 > "$KAIROS_CHECKPOINT_FILE"; '
            f"exec sleep {marker}"]})]})
        await first.handle(b)
        first.renewed(time.monotonic())
        await until(lambda: any(p.info["cmdline"] == ["sleep", marker]
                                for p in psutil.process_iter(["cmdline"])))
        await first.runtime.close()  # the agent dies; its task keeps running

        again = process_agent(broker, tmp_path, fence_after_s=30)
        again.renewed(time.monotonic())
        assert await again.reconcile() == 1
        assert f"hello-{marker}" in again.runtime.logs("P/w-0/1")  # its log, as it was
        await until(lambda: len(broker.states("P")) == 2, timeout=15)
        ended = broker.statuses("P")[1]
        assert ended.cause is EndCause.TIME_LIMIT
        assert ended.checkpoint == "step-5"  # what it recorded before the agent died
        await until(lambda: not [p for p in psutil.process_iter(["cmdline"])
                                 if p.info["cmdline"] == ["sleep", marker]])
        await again.close()
    finally:
        for p in psutil.process_iter(["cmdline"]):
            if p.info["cmdline"] == ["sleep", marker]:
                with contextlib.suppress(psutil.Error):
                    p.kill()


async def test_every_end_carries_its_cause(tmp_path: Path) -> None:
    broker = Broker()
    a = agent(broker, tmp_path)
    await a.handle(bind("S", duration=0.05))
    await a.handle(bind("P"))
    await a.handle(bind("C"))
    await a.handle(bind("P", action=BindingAction.STOP, reason="preempted (priority) for X")
                   .model_copy(update={"cause": EndCause.PREEMPTED}))
    # a cause says it, whatever the words
    await a.handle(bind("C", action=BindingAction.STOP, reason="quota reclaimed")
                   .model_copy(update={"cause": EndCause.RECLAIMED}))
    await until(lambda: all(len(broker.states(j)) == 2 for j in "SPC"))
    ends = {j: (broker.statuses(j)[1].state, broker.statuses(j)[1].cause) for j in "SPC"}
    assert ends == {"S": (JobState.SUCCEEDED, EndCause.COMPLETED),
                    "P": (JobState.PREEMPTED, EndCause.PREEMPTED),
                    "C": (JobState.CANCELLED, EndCause.RECLAIMED)}
    await a.close()


def test_an_end_without_a_cause_is_read_from_its_words() -> None:
    """An older agent's report: the text it wrote before causes gives the code."""
    def old(state: str, reason: str) -> EndCause:
        return JobStatus(job_id="j", state=JobState(state), reason=reason).end_cause()

    assert old("failed", "fenced: lease not renewed") is EndCause.FENCED
    assert old("cancelled", "time limit reached") is EndCause.TIME_LIMIT
    assert old("failed", "lost: not running on this node") is EndCause.LOST
    assert old("failed", "error") is EndCause.FAILED
    assert old("succeeded", "completed") is EndCause.COMPLETED
    assert JobStatus(job_id="j", state=JobState.FAILED, reason="x",
                     cause="from-a-newer-agent").cause is EndCause.OTHER  # type: ignore[arg-type]


def test_the_journal_keeps_the_first_start_prunes_old_ends_and_is_bounded(
        tmp_path: Path) -> None:
    launch = TaskLaunch(job_id="J", task_id="w-0", attempt=1, image="", command=("x",),
                        env={"SECRET": "s", "KAIROS_SIM_MEMORY_MIB": "10"},
                        gpus=(GpuGrant(3, memory_mib=1000, compute_pct=25),), cpu_milli=1,
                        memory_mib=2)
    j = Journal(tmp_path)
    first = j.started(launch, time_limit_s=60, grace_s=5).started_at
    assert j.started(launch, time_limit_s=60, grace_s=5).started_at == first  # kept
    back = Journal(tmp_path).get(launch.key)
    assert back is not None and back.launch().gpus == launch.gpus
    assert back.env == {"KAIROS_SIM_MEMORY_MIB": "10"}  # no secret on disk
    assert "SECRET" not in (tmp_path / "J%2Fw-0%2F1.json").read_text()
    done = JobStatus(job_id="J", state=JobState.SUCCEEDED, reason="completed", task="w-0",
                     cause=EndCause.COMPLETED)
    j.ended(launch.key, done)
    assert Journal(tmp_path).outcome(launch.key) == done
    assert Journal(tmp_path, keep_s=-1).outcome(launch.key) is None  # pruned when old
    assert not list(tmp_path.glob("*.json"))

    small = Journal(tmp_path / "b", limit=3)
    for i in range(5):
        small.ended(f"J{i}/w-0/1", done.model_copy(update={"job_id": f"J{i}"}))
    assert sorted(small.ended_keys()) == ["J2/w-0/1", "J3/w-0/1", "J4/w-0/1"]
    assert len(list((tmp_path / "b").glob("*.json"))) == 3


def test_a_task_its_restarted_agent_lost_is_requeued_without_spending_a_retry() -> None:
    """``lost`` (the agent holds no record of the task) is the platform's doing: the job
    runs again with its maxRetry untouched, as for a lost node. Before causes, with
    ``maxRetry: 0`` it ended ``failed: out of retries``."""
    from scheduling import first_fit
    from services.scheduler.state import SchedulerState
    from tests.services.builders import node, ready, step

    s = SchedulerState(epoch=1, placer=first_fit)
    step(s, node("n1"))
    step(s, ready("A").gpus(1).duration(600).retries(0).build())
    step(s, JobStatus(job_id="A", state=JobState.RUNNING, reason="started", task="worker-0",
                      node_id="n1"))
    step(s, JobStatus(job_id="A", state=JobState.FAILED, task="worker-0", node_id="n1",
                      reason="lost: not running on this node", cause=EndCause.LOST))
    job = s.jobs["A"]
    assert (job.state, job.attempt) == (JobState.BOUND, 2)  # placed again at once
    step(s, JobStatus(job_id="A", state=JobState.FAILED, task="worker-0", node_id="n1",
                      attempt=2, reason="error", cause=EndCause.FAILED, exit_code=1))
    assert s.jobs["A"].state is JobState.FAILED  # its own failure spends the retry it had
