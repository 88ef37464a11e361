"""The running agent service through the real broker (``tests/node_agent/harness.py``):
bindings go in on ``bindings``, statuses come out on ``jobs.status``.

- a redelivered binding starts nothing twice (the bus's own redelivery, a replay under a
  new event id, a new leader's resend with a higher epoch; while running and after);
- preemption with a grace period: the checkpoint signal, then the kill after the grace,
  reported ``preempted`` with the work done (run seconds, the checkpoint the task wrote);
- an agent crash and restart with running tasks: the running one is adopted, not started
  again; the one that ended while the agent was down is reported, once.

"Nothing more happened" is never a sleep: a sentinel binding for the same node is sent
after the ones under test; bindings are keyed by node, so once its ``running`` report is
out, every earlier binding has been handled.
"""

from __future__ import annotations

import contextlib
import uuid
from pathlib import Path
from urllib.parse import quote

import psutil
import pytest

from shared.events import Binding, BindingAction, TaskBinding
from tests.node_agent.harness import AgentRun, running_agent, until

pytestmark = pytest.mark.broker


def bind(node: str, job: str, command: list[str] | None = None, *, epoch: int = 1,
         duration: float = 600, task: str = "w-0", grace_s: float = 1) -> Binding:
    return Binding(binding_id=f"{job}-1-{node}", action=BindingAction.ALLOCATE, node_id=node,
                   epoch=epoch, job_id=job, duration_s=duration, grace_period_s=grace_s,
                   tasks=[TaskBinding(task_id=task, task_name="w", role="worker", replica=0,
                                      rank=0, command=command or [])])


def stop(b: Binding, reason: str, grace_s: float) -> Binding:
    return b.model_copy(update={"action": BindingAction.STOP, "reason": reason,
                                "grace_period_s": grace_s, "binding_id": b.binding_id + "-s"})


async def settle(run: AgentRun, epoch: int = 1) -> None:
    """Every binding sent before this one has been handled (same node, same partition);
    ``epoch``: the highest sent, so the sentinel is not refused."""
    node = run.agent().node_id
    sentinel = f"sentinel-{uuid.uuid4().hex[:6]}"
    await run.send(bind(node, sentinel, ["true"], duration=0.01, epoch=epoch))
    await run.feed.wait(sentinel, "running")


def states(run: AgentRun, job: str) -> list[str]:
    return [s.state.value for s in run.feed.statuses(job)]


async def test_a_redelivered_binding_starts_nothing_twice(broker: str, tmp_path: Path) -> None:
    async with running_agent(broker, tmp_path) as run:
        node = run.agent().node_id
        job = f"R{uuid.uuid4().hex[:6]}"
        b = bind(node, job, duration=1.5)
        await run.send(b, event_id=f"bind-{job}")
        await run.feed.wait(job, "running")
        await run.send(b, event_id=f"bind-{job}")  # the bus redelivers the same record
        await run.send(b, event_id=f"bind-{job}-replay")  # a replay under a new id
        await run.send(b.model_copy(update={"epoch": 2}), event_id=f"bind-{job}-e2")  # new leader
        await settle(run, epoch=2)
        assert states(run, job) == ["running"]
        await run.feed.wait(job, "succeeded")
        await run.send(b.model_copy(update={"epoch": 2}), event_id=f"bind-{job}-e2-late")
        await settle(run, epoch=2)
        assert states(run, job) == ["running", "succeeded"]
        assert run.agent().max_epoch == 2


# On SIGTERM (the checkpoint signal) one task saves and exits cleanly; the other records
# its checkpoint but goes on, so it is killed when the grace period is over.
SAVER = ["sh", "-c", 'trap \'echo "ckpt/step-42.pt" > "$KAIROS_CHECKPOINT_FILE"; exit 0\' TERM; '
         'echo ready; while :; do sleep 0.05; done']
STUBBORN = ["sh", "-c", 'trap \'echo "got TERM"; echo "ckpt/step-7.pt" > '
            '"$KAIROS_CHECKPOINT_FILE"\' TERM; echo ready; while :; do sleep 0.05; done']


async def test_preemption_signals_waits_the_grace_then_kills_and_reports_the_work(
        broker: str, tmp_path: Path) -> None:
    async with running_agent(broker, tmp_path, node_runtime="process") as run:
        node = run.agent().node_id
        saver, stubborn = f"S{uuid.uuid4().hex[:6]}", f"T{uuid.uuid4().hex[:6]}"
        bindings = {saver: bind(node, saver, SAVER), stubborn: bind(node, stubborn, STUBBORN)}
        for b in bindings.values():
            await run.send(b)
        rt = run.agent().runtime
        for job in bindings:
            await run.feed.wait(job, "running")
        await until(lambda: all("ready" in rt.logs(f"{j}/w-0/1") for j in bindings))
        for b in bindings.values():
            await run.send(stop(b, "preempted by urgent job", grace_s=1))

        saved = await run.feed.wait(saver, "preempted")
        assert (saved.exit_code, saved.checkpoint) == (0, "ckpt/step-42.pt")  # within grace
        assert saved.reason == "stopped by scheduler" and saved.ran_s is not None
        assert saved.ran_s > 0

        killed = await run.feed.wait(stubborn, "preempted")
        assert killed.exit_code == 137  # SIGKILL once the grace period was over
        assert killed.checkpoint == "ckpt/step-7.pt"  # the work it saved is still reported
        assert killed.ran_s is not None and killed.ran_s > 0
        assert "got TERM" in rt.logs(f"{stubborn}/w-0/1")  # the checkpoint signal came first
        for job in bindings:
            assert states(run, job) == ["running", "preempted"]


def _processes(marker: str) -> list[psutil.Process]:
    """The long task's command itself (its /bin/sh wrapper names it too: not counted)."""
    return [p for p in psutil.process_iter(["cmdline"])
            if p.info["cmdline"] == ["sleep", marker]]


async def test_a_restarted_agent_adopts_its_running_task_and_reports_the_ended_one(
        broker: str, tmp_path: Path) -> None:
    node = f"a{uuid.uuid4().hex[:8]}"
    long_job, short_job = f"L{uuid.uuid4().hex[:6]}", f"E{uuid.uuid4().hex[:6]}"
    marker = f"600.{uuid.uuid4().int % 10**9:09d}"  # the long task's process, and no other
    release = tmp_path / "release"
    long_b = bind(node, long_job, ["sleep", marker])
    short_b = bind(node, short_job, ["sh", "-c", f'while [ ! -e "{release}" ]; do sleep 0.05; '
                                                 'done; echo "ckpt/final" > '
                                                 '"$KAIROS_CHECKPOINT_FILE"; exit 3'])
    try:
        async with running_agent(broker, tmp_path, node_id=node, node_runtime="process") as run:
            await run.send(long_b)
            await run.send(short_b)
            await run.feed.wait(long_job, "running")
            await run.feed.wait(short_job, "running")
            await until(lambda: len(_processes(marker)) == 1)
        # the agent is gone; its tasks are not: one of them ends now
        (pid,) = [p.pid for p in _processes(marker)]
        release.touch()
        exit_file = tmp_path / node / "tasks" / quote(f"{short_job}/w-0/1", safe="") / "exit"
        await until(lambda: exit_file.exists())

        async with running_agent(broker, tmp_path, node_id=node, node_runtime="process") as run:
            ended = await run.feed.wait(short_job, "failed")
            assert (ended.exit_code, ended.reason) == (3, "error while the agent was down")
            assert ended.checkpoint == "ckpt/final" and ended.ran_s is not None
            assert run.agent().running(f"{long_job}/w-0/1")  # adopted
            await run.send(long_b)  # redelivered after the restart: not started again
            await run.send(short_b)  # nor the one that ended: its exit is reported again
            await settle(run)
            assert [p.pid for p in _processes(marker)] == [pid]
            assert states(run, long_job) == []  # no second "running"
            await run.send(stop(long_b, "cancelled by user", grace_s=1))
            cancelled = await run.feed.wait(long_job, "cancelled")
            assert cancelled.exit_code in (143, 137) and cancelled.ran_s is not None
            await until(lambda: not _processes(marker))
            assert states(run, long_job) == ["cancelled"]
            assert states(run, short_job) == ["failed"]  # reported once
    finally:  # never leave the long task behind, even when a check failed
        for p in _processes(marker):
            with contextlib.suppress(psutil.Error):
                p.kill()  # its wrapper then exits
