"""One node's agent: carries out bindings through a runtime and reports every transition.

Bindings are idempotent (a task is keyed by job/task/attempt and started once) and
fenced (a binding from a lower scheduler epoch than one already seen is refused).
A ``resize`` binding stops the replicas it names (checkpoint signal, grace period,
kill) and starts the new ones; the job's other tasks are not touched.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

from services.node_agent.datasets import DatasetCache
from services.node_agent.devices.base import DeviceBackend, GpuSample
from services.node_agent.devices.simulated import SimulatedDevices
from services.node_agent.interactive import allocate, session_env
from services.node_agent.rendezvous import rendezvous_env
from services.node_agent.runtimes.base import (
    GpuGrant,
    Runtime,
    RuntimeStartError,
    TaskExit,
    TaskLaunch,
)
from services.node_agent.shares import SHARE_EXCEEDED, ShareEnforcement, ShareLimits
from shared.events import (
    TIME_LIMIT_REACHED,
    Binding,
    BindingAction,
    BindingRefused,
    Connection,
    Event,
    GpuHealth,
    GpuInfo,
    GpuTelemetry,
    JobState,
    JobStatus,
    NodeHeartbeat,
    NodeInventory,
    NodeTelemetry,
    TaskBinding,
)
from shared.logging import get_logger

log = get_logger(__name__)
Publish = Callable[[Event, str | None], Awaitable[None]]


@dataclass
class TaskRecord:
    launch: TaskLaunch
    stop_state: JobState | None = None  # set when the scheduler asked for a stop
    stop_reason: str = "stopped by scheduler"
    connection: Connection | None = None  # an interactive session's, once running
    timer: asyncio.Task[None] | None = None  # stops it at the spec's timeLimit
    started: float | None = None  # monotonic clock at its start here (None: adopted)


class NodeAgent:
    def __init__(self, inventory: NodeInventory, devices: DeviceBackend,
                 runtime_factory: Callable[[Callable[[TaskExit], Awaitable[None]]], Runtime],
                 publish: Publish, state_dir: str = "", *, shares: ShareLimits | None = None,
                 datasets: DatasetCache | None = None) -> None:
        self.inventory = inventory
        self.node_id = inventory.node_id
        self.devices = devices
        self.runtime = runtime_factory(self._on_exit)
        self.shares = ShareEnforcement(devices, self.runtime, self._stop_over_share, shares)
        self.datasets = datasets or DatasetCache(configured=inventory.datasets)
        self._publish = publish
        self._tasks: dict[str, TaskRecord] = {}
        self._gpu_load: dict[int, tuple[float, int]] = {}  # index -> (compute %, MiB)
        self._done: OrderedDict[str, None] = OrderedDict()  # keys that ran; never start again
        self._epoch_file = Path(state_dir, self.node_id, "epoch") if state_dir else None
        self.max_epoch = self._load_epoch()

    def _load_epoch(self) -> int:
        if self._epoch_file and self._epoch_file.exists():
            return int(self._epoch_file.read_text() or 0)
        return 0

    def _save_epoch(self) -> None:
        if self._epoch_file:
            self._epoch_file.parent.mkdir(parents=True, exist_ok=True)
            self._epoch_file.write_text(str(self.max_epoch))

    async def handle(self, b: Binding) -> None:
        if b.epoch < self.max_epoch:
            log.warning("binding from a stale scheduler refused", binding=b.binding_id,
                        epoch=b.epoch, current=self.max_epoch)
            await self._publish(BindingRefused(
                job_id=b.job_id, node_id=self.node_id, binding_id=b.binding_id,
                reason="stale_epoch", epoch=b.epoch, current_epoch=self.max_epoch),
                f"refused-{b.binding_id}-e{b.epoch}")
            return
        if b.epoch > self.max_epoch:
            self.max_epoch = b.epoch
            self._save_epoch()
        if b.action is BindingAction.ALLOCATE:
            for t in b.tasks:
                await self._start(b, t)
        elif b.action is BindingAction.STOP:
            stop_state = (JobState.PREEMPTED if b.reason.startswith("preempt")
                          else JobState.CANCELLED)
            for t in b.tasks:
                await self._stop(b, t.task_id, stop_state)
        elif b.action is BindingAction.RESIZE:
            await self._resize(b)
        elif b.action is BindingAction.RECONCILE:
            await self._reconcile_owned(b)

    async def _reconcile_owned(self, b: Binding) -> None:
        """The scheduler lists every task it holds on this node (after a registration, or
        when the node came back after it was declared lost). Any other task still running
        here was requeued elsewhere: stop it (checkpoint signal, grace, kill) and report
        it. A listed task this agent does not run and never ran is reported failed, so the
        scheduler places it again. Tasks bound after this binding come after it: untouched."""
        owned = set(b.owned)
        stale = [key for key, rec in self._tasks.items()
                 if key not in owned and rec.stop_state is None]
        why = f"no longer owned: {b.reason}; the scheduler placed it elsewhere"
        for key in stale:
            self._tasks[key].stop_state, self._tasks[key].stop_reason = JobState.CANCELLED, why
        if stale:
            log.warning("stopping tasks this node no longer owns", node=self.node_id,
                        tasks=stale, reason=b.reason)
        await asyncio.gather(*(self.runtime.stop(key, b.grace_period_s, reason="not_owned",
                                                 message=why) for key in stale))
        for key in sorted(owned - self._tasks.keys() - self._done.keys()):
            job_id, task_id, attempt = key.split("/")
            self._remember(key)
            await self._publish(JobStatus(
                job_id=job_id, state=JobState.FAILED, attempt=int(attempt), task=task_id,
                reason="lost: not running on this node (the agent restarted or never got "
                "its binding)", node_id=self.node_id, epoch=b.epoch), f"failed-{key}")

    async def _stop_over_share(self, key: str, grace_s: float, reason: str,
                               message: str) -> None:
        """The share watchdog's stop: the task fails with the figures as its reason."""
        rec = self._tasks.get(key)
        if rec is None or rec.stop_state is not None:
            return
        rec.stop_state, rec.stop_reason = JobState.FAILED, f"{SHARE_EXCEEDED}: {message}"
        await self.runtime.stop(key, grace_s, reason=reason, message=message)

    async def _resize(self, b: Binding) -> None:
        """Stop the removed replicas (together: each gets the grace period), then start
        the added ones. A redelivery does nothing twice: a stopped or stopping task is
        not signalled again, a started one not started again."""
        stops = [tid for tid in b.stop_task_ids
                 if (rec := self._tasks.get(f"{b.job_id}/{tid}/{b.attempt}")) is None
                 or rec.stop_state is None]
        if stops:
            log.info("resize: stopping replicas", job=b.job_id, tasks=stops, reason=b.reason)
            await asyncio.gather(*(self._stop(b, tid, JobState.CANCELLED, "resized")
                                   for tid in stops))
        for t in b.tasks:
            await self._start(b, t)

    async def _start(self, b: Binding, t: TaskBinding) -> None:
        key = f"{b.job_id}/{t.task_id}/{b.attempt}"
        if key in self._tasks or key in self._done:
            return  # a redelivered binding: started once already
        # a runtime that names its tasks (Kubernetes: each Pod's DNS name on the Pod
        # network) gives the gang its addresses; others run on the node's address
        peer_host = getattr(self.runtime, "peer_host", None)
        host_of = None if peer_host is None else (
            lambda rank: str(peer_host(b.job_id, b.attempt, rank)))
        env = {**t.env, **rendezvous_env(b, t, host_of=host_of)}
        conn = None
        if b.interactive:  # a port for the session, passed as KAIROS_PORT
            conn = allocate(self.inventory.runtime, self.inventory.address, key,
                            host=host_of(t.rank) if host_of else "")
            env.update(session_env(conn))
        launch = TaskLaunch(
            job_id=b.job_id, task_id=t.task_id, attempt=b.attempt, image=t.image,
            command=tuple(t.command), env=env,
            gpus=tuple(GpuGrant(g.index, g.uuid, g.memory_mib, g.compute_pct) for g in t.gpus),
            cpu_milli=t.cpu_milli, memory_mib=t.memory_mib, duration_s=b.duration_s,
            rank=t.rank)
        self._tasks[launch.key] = rec = TaskRecord(launch, connection=conn,
                                                   started=time.monotonic())
        try:
            await self.runtime.start(launch)
        except RuntimeStartError as exc:
            self._tasks.pop(launch.key, None)
            self._remember(launch.key)
            await self._report(launch, JobState.FAILED, "start_failed", 127, str(exc))
            return
        if launch.key not in self._tasks:
            return  # the runtime knew it had already ended (a restart): reported that
        self._load(launch, +1)
        self.shares.started(launch, self._gpu_memory)
        if b.time_limit_s:
            rec.timer = asyncio.create_task(
                self._expire(launch.key, b.time_limit_s, b.grace_period_s))
        await self._report(launch, JobState.RUNNING, "started", connection=conn)

    async def _expire(self, key: str, limit_s: float, grace_s: float) -> None:
        """The spec's timeLimit: stop the task (signal, grace, kill) and say why."""
        await asyncio.sleep(limit_s)
        rec = self._tasks.get(key)
        if rec is None or rec.stop_state is not None:
            return
        log.info("time limit reached: stopping", task=key, limit_s=limit_s)
        rec.stop_state, rec.stop_reason = JobState.CANCELLED, TIME_LIMIT_REACHED
        await self.runtime.stop(key, grace_s, reason="time_limit", message=TIME_LIMIT_REACHED)

    async def _stop(self, b: Binding, task_id: str, state: JobState,
                    why: str = "stopped by scheduler") -> None:
        """Checkpoint signal, grace period, then kill (the runtime's stop)."""
        key = f"{b.job_id}/{task_id}/{b.attempt}"
        rec = self._tasks.get(key)
        if rec is None:
            if key not in self._done:  # never started here: nothing to stop, say so
                self._remember(key)
                await self._publish(JobStatus(
                    job_id=b.job_id, state=state,
                    reason=f"{why}: stopped before start: {b.reason}",
                    attempt=b.attempt, task=task_id, node_id=self.node_id, epoch=b.epoch),
                    f"{state.value}-{key}")
            return
        rec.stop_state, rec.stop_reason = state, why
        await self.runtime.stop(key, b.grace_period_s, reason=state.value, message=b.reason)

    async def _on_exit(self, ex: TaskExit) -> None:
        rec = self._tasks.pop(ex.key, None)
        if rec is None:
            return
        self._remember(ex.key)
        self._load(rec.launch, -1)
        self.shares.ended(rec.launch)
        if rec.timer is not None and rec.timer is not asyncio.current_task():
            rec.timer.cancel()
        if rec.stop_state is not None:
            state, reason = rec.stop_state, rec.stop_reason
        elif ex.exit_code == 0:
            state, reason = JobState.SUCCEEDED, ex.reason
        else:
            state, reason = JobState.FAILED, ex.reason
        ran_s = ex.ran_s  # the work done: the runtime's figure, else this agent's clock
        if ran_s is None and rec.started is not None:
            ran_s = round(time.monotonic() - rec.started, 3)
        await self._report(rec.launch, state, reason, ex.exit_code, ex.message or None,
                           ran_s=ran_s, checkpoint=ex.checkpoint)
        await self.runtime.forget(ex.key)  # published: a restart need not report it again

    async def reconcile(self) -> int:
        """After a restart: adopt the tasks the runtime still runs, and report those that
        ended while the agent was down. Returns how many tasks were adopted."""
        for ex in await self.runtime.reconcile():
            job_id, task_id, attempt = ex.key.split("/")
            self._remember(ex.key)
            state = JobState.SUCCEEDED if ex.exit_code == 0 else JobState.FAILED
            await self._publish(JobStatus(
                job_id=job_id, state=state, reason=f"{ex.reason} while the agent was down",
                attempt=int(attempt), exit_code=ex.exit_code, task=task_id,
                node_id=self.node_id, message=ex.message or None, ran_s=ex.ran_s,
                checkpoint=ex.checkpoint), f"{state.value}-{ex.key}")
            await self.runtime.forget(ex.key)
        adopted = await self.runtime.running()
        for key in adopted:
            job_id, task_id, attempt = key.split("/")
            self._tasks[key] = TaskRecord(TaskLaunch(
                job_id=job_id, task_id=task_id, attempt=int(attempt), image="", command=(),
                env={}, gpus=(), cpu_milli=0, memory_mib=0))
        return len(adopted)

    def _gpu_memory(self, index: int) -> int:
        gpus = {g.index: g.memory_mib for g in self.inventory.gpus}
        return gpus.get(index, 0)

    def log_keys(self, job_id: str) -> list[str]:
        """Keys (job/task/attempt) of the job's tasks this agent runs or ran."""
        prefix = f"{job_id}/"
        return sorted({*(k for k in self._tasks if k.startswith(prefix)),
                       *(k for k in self._done if k.startswith(prefix))})

    def running(self, key: str) -> bool:
        return key in self._tasks

    def _remember(self, key: str) -> None:
        self._done[key] = None
        if len(self._done) > 100_000:
            self._done.popitem(last=False)

    def _load(self, launch: TaskLaunch, sign: int) -> None:
        for g in launch.gpus:
            busy, mem = self._gpu_load.get(g.index, (0.0, 0))
            share = g.compute_pct if g.memory_mib else 100
            used = g.memory_mib or int(self.inventory.gpus[g.index].memory_mib * 0.9)
            busy, mem = max(0.0, busy + sign * share * 0.95), max(0, mem + sign * used)
            self._gpu_load[g.index] = (busy, mem)
            if isinstance(self.devices, SimulatedDevices):  # real GPUs report themselves
                self.devices.set_load(g.index, busy, mem)

    async def _report(self, launch: TaskLaunch, state: JobState, reason: str,
                      exit_code: int | None = None, message: str | None = None,
                      connection: Connection | None = None, ran_s: float | None = None,
                      checkpoint: str | None = None) -> None:
        await self._publish(JobStatus(
            job_id=launch.job_id, state=state, reason=reason, attempt=launch.attempt,
            exit_code=exit_code, task=launch.task_id, node_id=self.node_id, message=message,
            connection=connection, ran_s=ran_s, checkpoint=checkpoint),
            f"{state.value}-{launch.key}")

    def heartbeat(self) -> NodeHeartbeat:
        return NodeHeartbeat(node_id=self.node_id, running_tasks=len(self._tasks),
                             max_epoch_seen=self.max_epoch, datasets=self.datasets.list())

    async def tick(self) -> NodeTelemetry:
        """One telemetry interval: a sample of the GPUs, judged by the share watchdog
        (tasks over their share are stopped) and returned as telemetry."""
        samples = (self.devices.sample() if isinstance(self.devices, SimulatedDevices)
                   else await asyncio.to_thread(self.devices.sample))
        self.shares.check(samples)
        return self.telemetry(samples)

    def telemetry(self, samples: list[GpuSample] | None = None) -> NodeTelemetry:
        return NodeTelemetry(node_id=self.node_id, gpus=[
            GpuTelemetry(index=s.index, utilization_pct=s.utilization_pct,
                         memory_used_mib=s.memory_used_mib, temperature_c=s.temperature_c,
                         power_w=s.power_w,
                         health=GpuHealth.DEGRADED if s.degraded() else GpuHealth.HEALTHY)
            for s in (self.devices.sample() if samples is None else samples)])

    async def close(self) -> None:
        await self.runtime.close()


def simulated_inventory(node_id: str, devices: DeviceBackend, cpu_milli: int,
                        memory_mib: int, rack: str, runtime: str = "simulated",
                        address: str = "127.0.0.1", agent_url: str = "",
                        datasets: list[str] | None = None) -> NodeInventory:
    """The node as the scheduler sees it: its GPUs from the device backend."""
    return NodeInventory(
        node_id=node_id, hostname=node_id, address=address, cpu_milli=cpu_milli,
        memory_mib=memory_mib, rack=rack, runtime=runtime, agent_url=agent_url,
        datasets=datasets or [],
        gpus=[GpuInfo(index=d.index, uuid=d.uuid, model=d.model, memory_mib=d.memory_mib,
                      nvlink_domain=d.nvlink_domain, nvlink_peers=list(d.nvlink_peers))
              for d in devices.devices()])
