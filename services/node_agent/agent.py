"""One node's agent: carries out bindings through a runtime and reports every transition.

Bindings are idempotent (a task is keyed by job/task/attempt and started once) and
fenced (a binding from a lower scheduler epoch than one already seen is refused).
A ``resize`` binding stops the replicas it names (checkpoint signal, grace period,
kill) and starts the new ones; the job's other tasks are not touched.

The agent holds a lease (``lease.py``), renewed by every heartbeat the broker
acknowledges. Expired, the agent fences itself: it stops every task (a short grace,
then a kill), starts nothing, and reports each task ``failed`` with a ``fenced:``
reason, so no job runs in two places once the monitor declares the node lost. The
lease is checked first at every entry (a binding, an exit, a timer, a heartbeat), so
after a pause the gap is noticed before anything that piled up during it is carried out
or reported. Reports that cannot be published wait in the outbox (``outbox.py``).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

from services.node_agent.datasets import DatasetCache
from services.node_agent.devices.base import DeviceBackend, GpuSample
from services.node_agent.devices.simulated import SimulatedDevices
from services.node_agent.interactive import allocate, session_env
from services.node_agent.lease import Lease
from services.node_agent.outbox import Outbox
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
    FENCED,
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
FENCE_GRACE_S = 1.0  # the checkpoint signal's grace when fenced: the lost-node timeout is near


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
                 datasets: DatasetCache | None = None, lease: Lease | None = None) -> None:
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
        self.lease = lease or Lease(math.inf)  # none given: never fenced (unit tests)
        # a restart after the lease ran out: the scheduler may have placed our tasks
        # elsewhere, so what reconcile() finds is stopped, not adopted
        self._lapsed_while_down = self.lease.expired()
        self.fenced: str | None = None  # why, while fenced
        self.needs_register = False  # the fence was lifted: register again
        # bindings sent before this (wall clock) are not started: they piled up while the
        # node was fenced or unheard, and the scheduler may have placed them elsewhere
        self._fenced_before = 0.0
        self.outbox = Outbox(Path(state_dir, self.node_id, "outbox") if state_dir else None)
        self._flusher: asyncio.Task[None] | None = None
        self._stopping: set[asyncio.Task[None]] = set()

    def _load_epoch(self) -> int:
        if self._epoch_file and self._epoch_file.exists():
            return int(self._epoch_file.read_text() or 0)
        return 0

    def _save_epoch(self) -> None:
        if self._epoch_file:
            self._epoch_file.parent.mkdir(parents=True, exist_ok=True)
            self._epoch_file.write_text(str(self.max_epoch))

    # --- the lease ----------------------------------------------------------------------

    def check_lease(self) -> bool:
        """True while the lease is live; an expired one fences the agent now. Called
        before anything is carried out or reported: after a pause (the monotonic clock
        jumped past the lease) the fence comes first."""
        if self.fenced is None and self.lease.expired():
            self._fence(f"lease not renewed for {self.lease.age():.1f}s (fence_after_s="
                        f"{self.lease.fence_after_s:g}): the node may be declared lost and "
                        "its tasks placed elsewhere")
        return self.fenced is None

    def _fence(self, why: str) -> None:
        self.fenced = why
        log.warning("fenced: stopping every task, starting none", node=self.node_id,
                    reason=why, tasks=len(self._tasks))
        self._stop_all(why)

    def _stop_all(self, why: str) -> None:
        """Stop every task now (short grace, then kill); each is reported fenced unless
        the scheduler had already asked for its stop. In the background: a report that
        waits on the broker must not hold up the kill."""
        for key, rec in self._tasks.items():
            if rec.stop_state is None:
                rec.stop_state, rec.stop_reason = JobState.FAILED, f"{FENCED}: {why}"
            self._kill_soon(key, why)

    def _kill_soon(self, key: str, why: str) -> None:
        async def kill() -> None:
            try:
                await self.runtime.stop(key, FENCE_GRACE_S, reason=FENCED, message=why)
            except Exception:
                log.exception("a fenced task could not be stopped", node=self.node_id, task=key)

        task = asyncio.create_task(kill())
        self._stopping.add(task)
        task.add_done_callback(self._stopping.discard)

    def renewed(self, sent_at: float) -> None:
        """A heartbeat sent at ``sent_at`` (monotonic) was acknowledged by the broker."""
        self.check_lease()  # a gap is noticed before this renewal can hide it
        self.lease.renew(sent_at)
        if self.fenced is not None and not self.lease.expired():
            log.info("lease renewed: fence lifted, registering again", node=self.node_id,
                     was=self.fenced)
            self.fenced = None
            self._fenced_before = time.time()
            self.needs_register = True  # the scheduler's reconcile says what we still own
        if self.outbox:
            self._flush_soon()

    async def _send(self, event: Event, event_id: str | None) -> bool:
        """Publish a report, or keep it in the outbox (in order) until it can be: while
        fenced, while earlier ones wait, or when the broker does not take it. True when
        it is safe, published or kept on disk: the runtime may forget the exit."""
        if self.check_lease() and not self.outbox:
            try:
                await self._publish(event, event_id)
                return True
            except Exception as exc:
                log.warning("report not published: kept until the broker takes it",
                            node=self.node_id, kind=event.TYPE, error=repr(exc))
        self.outbox.put(event, event_id)
        if self.fenced is None:
            self._flush_soon()
        return self.outbox.durable

    def _flush_soon(self) -> None:
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.create_task(self._flush())

    async def _flush(self) -> None:
        while self.outbox and self.check_lease():
            event, event_id = self.outbox.head()
            try:
                await self._publish(event, event_id)
            except Exception as exc:  # the next renewal tries again
                log.warning("pending reports still not published", node=self.node_id,
                            pending=len(self.outbox), error=repr(exc))
                return
            self.outbox.pop()

    # --- bindings ---------------------------------------------------------------------

    def _refusal(self, sent_at: float | None) -> str | None:
        """Why a binding may not start tasks here, if it may not."""
        if not self.check_lease():
            return self.fenced
        if sent_at is not None and sent_at < self._fenced_before:
            return "sent before this node's fence was lifted"  # a pause's backlog
        return None

    async def handle(self, b: Binding, sent_at: float | None = None) -> None:
        """``sent_at``: when the scheduler sent it (wall clock), where known."""
        refused = self._refusal(sent_at)  # after a pause, the fence comes first
        if b.epoch < self.max_epoch:
            log.warning("binding from a stale scheduler refused", binding=b.binding_id,
                        epoch=b.epoch, current=self.max_epoch)
            await self._send(BindingRefused(
                job_id=b.job_id, node_id=self.node_id, binding_id=b.binding_id,
                reason="stale_epoch", epoch=b.epoch, current_epoch=self.max_epoch),
                f"refused-{b.binding_id}-e{b.epoch}")
            return
        if b.epoch > self.max_epoch:
            self.max_epoch = b.epoch
            self._save_epoch()
        if b.action is BindingAction.ALLOCATE:
            for t in b.tasks:
                await self._start(b, t, refused)
        elif b.action is BindingAction.STOP:
            stop_state = (JobState.PREEMPTED if b.reason.startswith("preempt")
                          else JobState.CANCELLED)
            for t in b.tasks:
                await self._stop(b, t.task_id, stop_state)
        elif b.action is BindingAction.RESIZE:
            await self._resize(b, refused)
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
            await self._send(JobStatus(
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

    async def _resize(self, b: Binding, refused: str | None = None) -> None:
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
            await self._start(b, t, refused)

    async def _start(self, b: Binding, t: TaskBinding, refused: str | None = None) -> None:
        key = f"{b.job_id}/{t.task_id}/{b.attempt}"
        if key in self._tasks or key in self._done:
            return  # a redelivered binding: started once already
        if refused is not None:  # and said so: the scheduler places it again
            self._remember(key)
            log.warning("fenced: binding not carried out", node=self.node_id, task=key,
                        reason=refused)
            await self._send(JobStatus(
                job_id=b.job_id, state=JobState.FAILED, attempt=b.attempt, task=t.task_id,
                reason=f"{FENCED}: not started: {refused}", node_id=self.node_id,
                epoch=b.epoch), f"failed-{key}")
            return
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
        if self.fenced is not None:  # fenced while it started: it was marked, not stopped
            self._kill_soon(launch.key, self.fenced)
        self._load(launch, +1)
        self.shares.started(launch, self._gpu_memory)
        if b.time_limit_s:
            rec.timer = asyncio.create_task(
                self._expire(launch.key, b.time_limit_s, b.grace_period_s))
        await self._report(launch, JobState.RUNNING, "started", connection=conn)

    async def _expire(self, key: str, limit_s: float, grace_s: float) -> None:
        """The spec's timeLimit: stop the task (signal, grace, kill) and say why."""
        await asyncio.sleep(limit_s)
        self.check_lease()
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
                await self._send(JobStatus(
                    job_id=b.job_id, state=state,
                    reason=f"{why}: stopped before start: {b.reason}",
                    attempt=b.attempt, task=task_id, node_id=self.node_id, epoch=b.epoch),
                    f"{state.value}-{key}")
            return
        rec.stop_state, rec.stop_reason = state, why
        await self.runtime.stop(key, b.grace_period_s, reason=state.value, message=b.reason)

    async def _on_exit(self, ex: TaskExit) -> None:
        # an exit seen with an expired lease (it ended during a pause, or a partition)
        # is reported fenced, never succeeded: the task may already run elsewhere
        self.check_lease()
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
        if await self._report(rec.launch, state, reason, ex.exit_code, ex.message or None,
                              ran_s=ran_s, checkpoint=ex.checkpoint):
            await self.runtime.forget(ex.key)  # a restart need not report it again

    async def reconcile(self) -> int:
        """After a restart: adopt the tasks the runtime still runs, and report those that
        ended while the agent was down. Down past its lease (or with it expired now), it
        adopts nothing: the tasks are stopped and, like those that ended, reported
        fenced. Returns how many tasks were adopted."""
        lapsed = self._lapsed_while_down or not self.check_lease()
        why = (f"the agent was down longer than its lease (fence_after_s="
               f"{self.lease.fence_after_s:g}): the scheduler may have placed it elsewhere")
        for ex in await self.runtime.reconcile():
            job_id, task_id, attempt = ex.key.split("/")
            self._remember(ex.key)
            state = JobState.SUCCEEDED if ex.exit_code == 0 else JobState.FAILED
            reason = f"{ex.reason} while the agent was down"
            if lapsed:
                state, reason = JobState.FAILED, f"{FENCED}: {reason}; {why}"
            if await self._send(JobStatus(
                    job_id=job_id, state=state, reason=reason, attempt=int(attempt),
                    exit_code=ex.exit_code, task=task_id, node_id=self.node_id,
                    message=ex.message or None, ran_s=ex.ran_s, checkpoint=ex.checkpoint),
                    f"{state.value}-{ex.key}"):
                await self.runtime.forget(ex.key)
        adopted = await self.runtime.running()
        for key in adopted:
            job_id, task_id, attempt = key.split("/")
            self._tasks[key] = TaskRecord(TaskLaunch(
                job_id=job_id, task_id=task_id, attempt=int(attempt), image="", command=(),
                env={}, gpus=(), cpu_milli=0, memory_mib=0))
        if lapsed:  # and what was sent while it was down is not started either
            self._fenced_before = time.time()
        if lapsed and adopted:
            log.warning("down past the lease: stopping the tasks found running",
                        node=self.node_id, tasks=adopted)
            self._stop_all(why)
            return 0
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
                      checkpoint: str | None = None) -> bool:
        return await self._send(JobStatus(
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
        for task in (*self._stopping, *([self._flusher] if self._flusher else [])):
            task.cancel()
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
