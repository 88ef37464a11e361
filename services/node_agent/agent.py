"""One node's agent: carries out bindings through a runtime and reports every transition.

Bindings are idempotent (a task is keyed by job/task/attempt and started once,
``tasks.py``) and fenced (``fencing.py``: a binding from a stale scheduler epoch is
refused; with its lease expired the agent stops its tasks and starts none). A ``resize``
binding stops the replicas it names (checkpoint signal, grace period, kill) and starts
the new ones; the job's other tasks are not touched. A binding granting a MIG instance
this node does not have is refused whole (``mig.py``), its tasks reported failed.
Reports go out through ``reports.py`` (kept in the outbox while they cannot be
published). Every task's start and end are kept in the node's journal (``journal.py``):
after a restart ``reattach.py`` takes back what the runtime still runs with all it had
(time limit, GPUs, connection), and a reconcile that still lists a task that ended here
gets its outcome again. Why a task ended travels as a code (``EndCause``) beside the words.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable, Callable
from functools import partial
from pathlib import Path

from services.node_agent.datasets import DatasetCache
from services.node_agent.devices.base import DeviceBackend, GpuSample
from services.node_agent.fencing import EpochGate, LeaseFence
from services.node_agent.interactive import allocate, session_env
from services.node_agent.inventory import gpu_memory_mib
from services.node_agent.journal import Journal, TaskEntry
from services.node_agent.lease import Lease
from services.node_agent.mig import MigRefused, refusal, task_grants
from services.node_agent.outbox import Outbox
from services.node_agent.reattach import reattach
from services.node_agent.rendezvous import rendezvous_env
from services.node_agent.reports import Publish, Reporter
from services.node_agent.runtimes.base import (
    GpuGrant,
    Runtime,
    RuntimeStartError,
    TaskExit,
    TaskLaunch,
)
from services.node_agent.shares import SHARE_EXCEEDED, ShareEnforcement, ShareLimits
from services.node_agent.tasks import TaskBook, TaskRecord, split_key, task_key
from services.node_agent.telemetry import GpuLoad, node_telemetry, sample_gpus
from shared.events import (
    FENCED,
    TIME_LIMIT_REACHED,
    Binding,
    BindingAction,
    BindingRefused,
    EndCause,
    JobState,
    JobStatus,
    NodeHeartbeat,
    NodeInventory,
    NodeTelemetry,
    TaskBinding,
)
from shared.logging import get_logger

log = get_logger(__name__)


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
        self._tasks = TaskBook()
        # every task's start and end on this node, kept across restarts
        self.journal = Journal(Path(state_dir, self.node_id, "journal") if state_dir else None)
        for key in self.journal.ended_keys():  # ended here: never started again
            self._tasks.remember(key)
        self._gpu_load = GpuLoad(inventory, devices)
        self._epochs = EpochGate(Path(state_dir, self.node_id, "epoch") if state_dir else None)
        # no lease given: never fenced (unit tests)
        self.fence = LeaseFence(self.node_id, lease or Lease(math.inf), self._tasks,
                                self.runtime)
        self.outbox = Outbox(Path(state_dir, self.node_id, "outbox") if state_dir else None)
        self._reports = Reporter(self.node_id, publish, self.outbox, self.fence)

    @property
    def max_epoch(self) -> int:
        return self._epochs.max_epoch

    @property
    def lease(self) -> Lease:
        return self.fence.lease

    @property
    def fenced(self) -> str | None:
        """Why the agent is fenced, while it is."""
        return self.fence.reason

    @property
    def needs_register(self) -> bool:
        """The fence was lifted: the node registers again (the host clears this)."""
        return self.fence.needs_register

    @needs_register.setter
    def needs_register(self, value: bool) -> None:
        self.fence.needs_register = value

    # --- the lease ----------------------------------------------------------------------

    def check_lease(self) -> bool:
        """True while the lease is live; an expired one fences the agent now."""
        return self.fence.check()

    def renewed(self, sent_at: float) -> None:
        """A heartbeat sent at ``sent_at`` (monotonic) was acknowledged by the broker."""
        self.fence.renew(sent_at)
        if self.outbox:
            self._reports.flush_soon()

    # --- bindings ---------------------------------------------------------------------

    async def handle(self, b: Binding, sent_at: float | None = None) -> None:
        """``sent_at``: when the scheduler sent it (wall clock), where known."""
        refused = self.fence.refusal(sent_at)  # after a pause, the fence comes first
        if self._epochs.stale(b.epoch):
            log.warning("binding from a stale scheduler refused", binding=b.binding_id,
                        epoch=b.epoch, current=self.max_epoch)
            await self._reports.send(BindingRefused(
                job_id=b.job_id, node_id=self.node_id, binding_id=b.binding_id,
                reason="stale_epoch", epoch=b.epoch, current_epoch=self.max_epoch),
                f"refused-{b.binding_id}-e{b.epoch}")
            return
        self._epochs.observe(b.epoch)
        if b.action is BindingAction.ALLOCATE:
            await self._start_all(b, refused)
        elif b.action is BindingAction.STOP:
            cause = b.stop_cause()
            stop_state = (JobState.PREEMPTED if cause in (EndCause.PREEMPTED, EndCause.DRAINED)
                          else JobState.CANCELLED)
            for t in b.tasks:
                await self._stop(b, t.task_id, stop_state, cause)
        elif b.action is BindingAction.RESIZE:
            await self._resize(b, refused)
        elif b.action is BindingAction.RECONCILE:
            await self._reconcile_owned(b)

    async def _reconcile_owned(self, b: Binding) -> None:
        """The scheduler lists every task it holds on this node (after a registration, a
        broker refill, or when the node came back after it was declared lost). Any other
        task still running here was requeued elsewhere: stop it (checkpoint signal, grace,
        kill) and report it. A listed task that ended here is reported again from the
        journal: the scheduler never stored its end (a report the broker lost). A listed
        task this node holds no record of is reported ``lost`` (a platform cause), so
        the scheduler places it again. Tasks bound after this binding come after it."""
        owned = set(b.owned)
        stale = [key for key, rec in self._tasks.live.items()
                 if key not in owned and rec.stop_state is None]
        why = f"no longer owned: {b.reason}; the scheduler placed it elsewhere"
        for key in stale:
            self._tasks.live[key].stopping(JobState.CANCELLED, why, EndCause.NOT_OWNED)
        if stale:
            log.warning("stopping tasks this node no longer owns", node=self.node_id,
                        tasks=stale, reason=b.reason)
        await asyncio.gather(*(self.runtime.stop(key, b.grace_period_s, reason="not_owned",
                                                 message=why) for key in stale))
        for key in sorted(owned - self._tasks.live.keys()):
            ended = self.journal.outcome(key)
            if ended is not None:  # its end never reached the scheduler's store: again
                log.info("reporting a task's end again", node=self.node_id, task=key,
                         state=ended.state.value)
                await self._reports.send(ended, f"{ended.state.value}-{key}")
                continue
            job_id, task_id, attempt = split_key(key)
            self._tasks.remember(key)
            await self._final(key, JobStatus(
                job_id=job_id, state=JobState.FAILED, attempt=attempt, task=task_id,
                reason="lost: not running on this node (the agent restarted or never got "
                "its binding)", cause=EndCause.LOST, node_id=self.node_id, epoch=b.epoch))

    async def _final(self, key: str, status: JobStatus) -> bool:
        """A task's last report: into the journal first (the node's record of how it
        ended, kept until the scheduler stops listing the task), then sent. True when
        the report is safe (published, or kept on disk)."""
        self.journal.ended(key, status)
        return await self._reports.send(status, f"{status.state.value}-{key}")

    async def _stop_over_share(self, key: str, grace_s: float, reason: str,
                               message: str) -> None:
        """The share watchdog's stop: the task fails with the figures as its reason."""
        rec = self._tasks.live.get(key)
        if rec is None or rec.stop_state is not None:
            return
        rec.stopping(JobState.FAILED, f"{SHARE_EXCEEDED}: {message}", EndCause.SHARE_EXCEEDED)
        await self.runtime.stop(key, grace_s, reason=reason, message=message)

    async def _resize(self, b: Binding, refused: str | None = None) -> None:
        """Stop the removed replicas (together: each gets the grace period), then start
        the added ones. A redelivery does nothing twice: a stopped or stopping task is
        not signalled again, a started one not started again."""
        stops = [tid for tid in b.stop_task_ids
                 if (rec := self._tasks.live.get(task_key(b.job_id, tid, b.attempt))) is None
                 or rec.stop_state is None]
        if stops:
            log.info("resize: stopping replicas", job=b.job_id, tasks=stops, reason=b.reason)
            cause = b.cause or EndCause.RESIZED
            await asyncio.gather(*(self._stop(b, tid, JobState.CANCELLED, cause, "resized")
                                   for tid in stops))
        await self._start_all(b, refused)

    async def _start_all(self, b: Binding, refused: str | None) -> None:
        """Start the binding's tasks, or none: a MIG instance missing here refuses it whole
        (never run on the whole GPU), its tasks reported failed so they are placed again."""
        fresh = [t for t in b.tasks
                 if not self._tasks.seen(task_key(b.job_id, t.task_id, b.attempt))]
        devices = self.devices.devices() if not refused else []  # read once for all its tasks
        try:
            grants = {} if refused else {t.task_id: task_grants(self.node_id, devices, t) for t in fresh}
        except MigRefused as exc:
            notice, ends = refusal(b, self.node_id, self.max_epoch, fresh, str(exc))
            log.warning("binding refused", binding=b.binding_id, reason=str(exc))
            await self._reports.send(notice, f"refused-{b.binding_id}-e{b.epoch}")
            for key, status in ends:
                self._tasks.remember(key)
                await self._final(key, status)
            return
        for t in fresh:
            await self._start(b, t, refused, grants.get(t.task_id, ()))

    async def _start(self, b: Binding, t: TaskBinding, refused: str | None = None,
                     grants: tuple[GpuGrant, ...] = ()) -> None:
        key = task_key(b.job_id, t.task_id, b.attempt)
        if self._tasks.seen(key):
            return  # a redelivered binding: started once already
        if refused is not None:  # and said so: the scheduler places it again
            self._tasks.remember(key)
            log.warning("fenced: binding not carried out", node=self.node_id, task=key,
                        reason=refused)
            await self._final(key, JobStatus(
                job_id=b.job_id, state=JobState.FAILED, attempt=b.attempt, task=t.task_id,
                reason=f"{FENCED}: not started: {refused}", cause=EndCause.FENCED,
                node_id=self.node_id, epoch=b.epoch))
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
            gpus=grants,
            cpu_milli=t.cpu_milli, memory_mib=t.memory_mib, duration_s=b.duration_s,
            rank=t.rank)
        self._tasks.live[launch.key] = rec = TaskRecord(launch, connection=conn,
                                                        started=time.monotonic())
        # before the start: a kill right after it still leaves the limit and the GPUs
        entry = self.journal.started(launch, time_limit_s=b.time_limit_s,
                                     grace_s=b.grace_period_s, connection=conn)
        try:
            await self.runtime.start(launch)
        except RuntimeStartError as exc:
            self._tasks.live.pop(launch.key, None)
            self._tasks.remember(launch.key)
            await self._final(launch.key, self._ended(
                launch, JobState.FAILED, "start_failed", EndCause.START_FAILED, 127, str(exc)))
            return
        if launch.key not in self._tasks.live:
            return  # the runtime knew it had already ended (a restart): reported that
        if self.fence.reason is not None:  # fenced while it started: marked, not stopped
            self.fence.kill_soon(launch.key, self.fence.reason)
        self._watch(rec, entry.limit_left(time.time()), entry.grace_s)
        await self._reports.started(launch, conn)

    def _watch(self, rec: TaskRecord, limit_left_s: float | None, grace_s: float) -> None:
        """What a running task has on this node: its GPUs' load, the share watchdog, and
        the timer of its time limit (what is left of it)."""
        self._gpu_load.add(rec.launch)
        self.shares.started(rec.launch, partial(gpu_memory_mib, self.inventory))
        if limit_left_s is not None:
            rec.timer = asyncio.create_task(self._expire(rec.launch.key, limit_left_s, grace_s))

    def _ended(self, launch: TaskLaunch, state: JobState, reason: str, cause: EndCause,
               exit_code: int | None = None, message: str | None = None,
               ran_s: float | None = None, checkpoint: str | None = None) -> JobStatus:
        return JobStatus(job_id=launch.job_id, state=state, reason=reason, cause=cause,
                         attempt=launch.attempt, exit_code=exit_code, task=launch.task_id,
                         node_id=self.node_id, message=message, ran_s=ran_s,
                         checkpoint=checkpoint)

    async def _expire(self, key: str, delay_s: float, grace_s: float) -> None:
        """The spec's timeLimit: stop the task (signal, grace, kill) and say why."""
        await asyncio.sleep(delay_s)
        self.fence.check()
        rec = self._tasks.live.get(key)
        if rec is None or rec.stop_state is not None:
            return
        log.info("time limit reached: stopping", task=key)
        rec.stopping(JobState.CANCELLED, TIME_LIMIT_REACHED, EndCause.TIME_LIMIT)
        await self.runtime.stop(key, grace_s, reason="time_limit", message=TIME_LIMIT_REACHED)

    async def _stop(self, b: Binding, task_id: str, state: JobState, cause: EndCause,
                    why: str = "stopped by scheduler") -> None:
        """Checkpoint signal, grace period, then kill (the runtime's stop)."""
        key = task_key(b.job_id, task_id, b.attempt)
        rec = self._tasks.live.get(key)
        if rec is None:
            if not self._tasks.ran(key):  # never started here: nothing to stop, say so
                self._tasks.remember(key)
                await self._final(key, JobStatus(
                    job_id=b.job_id, state=state, cause=cause,
                    reason=f"{why}: stopped before start: {b.reason}",
                    attempt=b.attempt, task=task_id, node_id=self.node_id, epoch=b.epoch))
            return
        rec.stopping(state, why, cause)
        await self.runtime.stop(key, b.grace_period_s, reason=state.value, message=b.reason)

    async def _on_exit(self, ex: TaskExit) -> None:
        # an exit seen with an expired lease (it ended during a pause, or a partition)
        # is reported fenced, never succeeded: the task may already run elsewhere
        self.fence.check()
        rec = self._tasks.live.pop(ex.key, None)
        if rec is None:
            return
        self._tasks.remember(ex.key)
        self._gpu_load.remove(rec.launch)
        self.shares.ended(rec.launch)
        if rec.timer is not None and rec.timer is not asyncio.current_task():
            rec.timer.cancel()
        if rec.stop_state is not None:
            state, reason, cause = rec.stop_state, rec.stop_reason, rec.stop_cause
        elif ex.exit_code == 0:
            state, reason, cause = JobState.SUCCEEDED, ex.reason, EndCause.COMPLETED
        else:
            state, reason, cause = JobState.FAILED, ex.reason, EndCause.FAILED
        ran_s = ex.ran_s  # the work done: the runtime's figure, else this agent's clock
        if ran_s is None and rec.started is not None:
            ran_s = round(time.monotonic() - rec.started, 3)
        if await self._final(ex.key, self._ended(rec.launch, state, reason, cause,
                                                 ex.exit_code, ex.message or None, ran_s,
                                                 ex.checkpoint)):
            await self.runtime.forget(ex.key)  # a restart need not report it again

    async def reconcile(self) -> int:
        """After a restart: adopt the tasks the runtime still runs, each with what the
        journal kept of it (``reattach.py``), and report those that ended while the agent
        was down. Returns how many were adopted."""
        return await reattach(self.node_id, self.runtime, self._tasks, self.fence,
                              self._final, self._adopt)

    def _adopt(self, key: str) -> None:
        """Take back a task the runtime still runs, with its limit (counted from its
        first start), its GPUs (the share watchdog's and telemetry's) and connection."""
        # started before the node kept a journal: nothing to restore but its key
        entry = self.journal.get(key) or TaskEntry(key=key)
        rec = self._tasks.adopt(entry.launch(), entry.conn())
        self._watch(rec, entry.limit_left(time.time()), entry.grace_s)

    def log_keys(self, job_id: str) -> list[str]:
        """Keys (job/task/attempt) of the job's tasks this agent runs or ran."""
        return self._tasks.keys_of(job_id)

    def running(self, key: str) -> bool:
        return key in self._tasks.live

    def heartbeat(self) -> NodeHeartbeat:
        return NodeHeartbeat(node_id=self.node_id, running_tasks=len(self._tasks),
                             max_epoch_seen=self.max_epoch, datasets=self.datasets.list())

    async def tick(self) -> NodeTelemetry:
        """One telemetry interval: a sample of the GPUs, judged by the share watchdog
        (tasks over their share are stopped) and returned as telemetry."""
        samples = await sample_gpus(self.devices)
        self.shares.check(samples)
        return self.telemetry(samples)

    def telemetry(self, samples: list[GpuSample] | None = None) -> NodeTelemetry:
        return node_telemetry(self.node_id,
                              self.devices.sample() if samples is None else samples)

    async def close(self) -> None:
        self.fence.cancel()
        self._reports.cancel()
        await self.runtime.close()
