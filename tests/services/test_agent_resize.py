"""The node agent carries out ``resize`` bindings: new replicas start with the job's new
rendezvous, removed ones get the checkpoint signal and the grace period, the others keep
running untouched, and a redelivered resize does nothing twice."""

from __future__ import annotations

import asyncio
from pathlib import Path

import psutil

from services.node_agent.agent import NodeAgent
from services.node_agent.devices.simulated import SimulatedDevices
from services.node_agent.inventory import node_inventory
from services.node_agent.runtimes.base import ExitCallback, Runtime, TaskLaunch
from services.node_agent.runtimes.local_process import LocalProcessRuntime
from services.node_agent.runtimes.simulated import SimulatedRuntime
from shared.events import (
    Binding,
    BindingAction,
    ClusterMember,
    GpuAssignment,
    JobState,
    JobStatus,
    TaskBinding,
)
from tests.services.test_agent_shell import Recorder, wait_for


def task(replica: int, rank: int, task_id: str | None = None, command: list[str] | None = None,
         local_rank: int | None = None, local_world_size: int | None = None) -> TaskBinding:
    return TaskBinding(task_id=task_id or f"w-{replica}", task_name="w", role="worker",
                       replica=replica, rank=rank, local_rank=local_rank,
                       local_world_size=local_world_size, command=command or [],
                       gpus=[GpuAssignment(index=replica, uuid=f"GPU-{replica}")])


def allocate(command: list[str] | None = None, epoch: int = 1) -> Binding:
    return Binding(binding_id="J-1-n1", action=BindingAction.ALLOCATE, node_id="n1",
                   epoch=epoch, job_id="J", world_size=2, master_addr="n1.local",
                   duration_s=600, grace_period_s=1,
                   cluster=[ClusterMember(role="worker", rank=r, host="n1.local")
                            for r in (0, 1)],
                   tasks=[task(0, 0, command=command), task(1, 1, command=command)])


def grow(command: list[str] | None = None, epoch: int = 1) -> Binding:
    """Replicas 2 and 3 join here (ranks 2, 3): four on this node, a fifth elsewhere."""
    return Binding(binding_id="J-1-n1-rz1", action=BindingAction.RESIZE, node_id="n1",
                   epoch=epoch, job_id="J", world_size=5, master_addr="n1.local",
                   duration_s=600, reason="grow into idle GPUs",
                   cluster=[ClusterMember(role="worker", rank=r, host="n1.local" if r < 4
                                          else "n2.local") for r in range(5)],
                   tasks=[task(2, 2, "w-2.1", command, local_rank=2, local_world_size=4),
                          task(3, 3, "w-3.1", command, local_rank=3, local_world_size=4)])


def shrink(*task_ids: str, grace: float = 1, epoch: int = 1) -> Binding:
    return Binding(binding_id="J-1-n1-rz2", action=BindingAction.RESIZE, node_id="n1",
                   epoch=epoch, job_id="J", world_size=2, grace_period_s=grace,
                   reason="shrink for H", stop_task_ids=list(task_ids))


class RecordingRuntime(SimulatedRuntime):
    """The simulated runtime, keeping every launch it was asked for."""

    def __init__(self, on_exit: ExitCallback) -> None:
        super().__init__(on_exit)
        self.launches: list[TaskLaunch] = []
        self.stops: list[tuple[str, float, str]] = []

    async def start(self, launch: TaskLaunch) -> None:
        self.launches.append(launch)
        await super().start(launch)

    async def stop(self, key: str, grace_s: float, reason: str = "stopped",
                   message: str = "") -> None:
        self.stops.append((key, grace_s, reason))
        await super().stop(key, grace_s, reason, message)


def sim_agent(rec: Recorder) -> tuple[NodeAgent, RecordingRuntime]:
    devices = SimulatedDevices("n1", 8)
    agent = NodeAgent(node_inventory("n1", devices, 64_000, 512_000, "r0"), devices,
                      RecordingRuntime, rec)
    assert isinstance(agent.runtime, RecordingRuntime)
    return agent, agent.runtime


def reports(rec: Recorder) -> list[JobStatus]:
    return [e for e in rec.events if isinstance(e, JobStatus)]


async def test_grow_starts_the_new_replicas_with_the_new_rendezvous() -> None:
    rec = Recorder()
    agent, rt = sim_agent(rec)
    await agent.handle(allocate())
    before = dict(rt._tasks)
    await agent.handle(grow())
    new = {launch.task_id: launch for launch in rt.launches[2:]}
    assert sorted(new) == ["w-2.1", "w-3.1"]
    env = new["w-3.1"].env
    assert (env["RANK"], env["WORLD_SIZE"], env["LOCAL_RANK"], env["LOCAL_WORLD_SIZE"],
            env["MASTER_ADDR"]) == ("3", "5", "3", "4", "n1.local")
    assert [g.uuid for g in new["w-2.1"].gpus] == ["GPU-2"]
    assert [(s.task, s.state.value) for s in reports(rec)] == [
        ("w-0", "running"), ("w-1", "running"), ("w-2.1", "running"), ("w-3.1", "running")]
    # the replicas that were there keep running: the same timers, never restarted
    assert all(rt._tasks[k] is t and not t.done() for k, t in before.items())
    await agent.handle(grow())  # redelivered: starts nothing twice
    assert len(rt.launches) == 4 and len(reports(rec)) == 4
    await agent.close()


async def test_shrink_stops_only_the_removed_replicas_and_reports_them() -> None:
    rec = Recorder()
    agent, rt = sim_agent(rec)
    await agent.handle(allocate())
    await agent.handle(grow())
    kept = {k: t for k, t in rt._tasks.items() if k in ("J/w-0/1", "J/w-1/1")}
    await agent.handle(shrink("w-2.1", "w-3.1", grace=7))
    assert sorted(rt.stops) == [("J/w-2.1/1", 7, "cancelled"), ("J/w-3.1/1", 7, "cancelled")]
    stopped = [s for s in reports(rec) if s.state is JobState.CANCELLED]
    assert sorted((s.task, s.reason, s.node_id) for s in stopped) == [
        ("w-2.1", "resized", "n1"), ("w-3.1", "resized", "n1")]
    assert sorted(rt._tasks) == ["J/w-0/1", "J/w-1/1"]
    assert all(rt._tasks[k] is t and not t.done() for k, t in kept.items())
    # redelivered: nothing signalled or reported twice; a task never seen here is
    # reported stopped so the scheduler frees what it holds
    await agent.handle(shrink("w-2.1", "w-3.1", grace=7))
    assert len(rt.stops) == 2 and len(reports(rec)) == 6
    await agent.handle(shrink("w-9.4").model_copy(update={"binding_id": "J-1-n1-rz3"}))
    assert [(s.task, s.state.value) for s in reports(rec)[6:]] == [("w-9.4", "cancelled")]
    assert reports(rec)[6].reason.startswith("resized: stopped before start")
    await agent.close()


async def test_a_resize_from_a_stale_epoch_is_refused() -> None:
    rec = Recorder()
    agent, rt = sim_agent(rec)
    await agent.handle(allocate(epoch=5))
    await agent.handle(shrink("w-1", epoch=4))
    assert rt.stops == [] and len(rt._tasks) == 2
    assert [type(e).__name__ for e in rec.events][-1] == "BindingRefused"
    await agent.close()


def process_agent(state: Path, rec: Recorder) -> NodeAgent:
    devices = SimulatedDevices("n1", 4)

    def runtime(on_exit: ExitCallback) -> Runtime:
        return LocalProcessRuntime(on_exit, state, poll_s=0.05)

    return NodeAgent(node_inventory("n1", devices, 8000, 16384, "r0", runtime="process"),
                     devices, runtime, rec, str(state))


async def test_local_processes_checkpoint_on_shrink_and_the_kept_ones_are_untouched(
        tmp_path: Path) -> None:
    # a training stand-in: says who it is, checkpoints and exits cleanly on SIGTERM
    script = ('trap \'echo checkpointed; exit 0\' TERM; '
              'echo "rank=$RANK world=$WORLD_SIZE local=$LOCAL_RANK/$LOCAL_WORLD_SIZE"; '
              'while :; do sleep 0.05; done')
    cmd = ["sh", "-c", script]
    rec = Recorder()
    agent = process_agent(tmp_path, rec)
    rt = agent.runtime
    assert isinstance(rt, LocalProcessRuntime)
    await agent.handle(allocate(cmd))
    await agent.handle(grow(cmd))
    await wait_for(lambda: "world=5" in _log(rt, "J/w-3.1/1"))
    assert _log(rt, "J/w-3.1/1").strip() == "rank=3 world=5 local=3/4"
    kept = {k: psutil.Process(rt._pids[k]).create_time() for k in ("J/w-0/1", "J/w-1/1")}

    await agent.handle(shrink("w-2.1", "w-3.1", grace=10))
    stopped = {s.task: s for s in reports(rec) if s.state is JobState.CANCELLED}
    assert sorted(stopped) == ["w-2.1", "w-3.1"]
    assert {(s.reason, s.exit_code) for s in stopped.values()} == {("resized", 0)}
    assert "checkpointed" in _log(rt, "J/w-2.1/1")  # it got the signal, not a kill
    assert sorted(await rt.running()) == ["J/w-0/1", "J/w-1/1"]
    for key, created in kept.items():  # the same processes, still alive
        proc = psutil.Process(rt._pids[key])
        assert proc.is_running() and proc.create_time() == created
    await agent.handle(grow(cmd))  # a late redelivery of the grow starts nothing again
    await asyncio.sleep(0.2)
    assert sorted(await rt.running()) == ["J/w-0/1", "J/w-1/1"]
    for key in kept:
        await rt.stop(key, 1)
    await agent.close()


def _log(rt: LocalProcessRuntime, key: str) -> str:
    try:
        return rt.logs(key)
    except KeyError:
        return ""
