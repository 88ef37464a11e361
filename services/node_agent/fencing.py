"""Fencing on both sides: stale schedulers are refused, and a node whose lease ran out
stops its own work.

- The scheduler's epoch: a binding from a lower epoch than one already seen comes from a
  deposed scheduler and is refused. The highest epoch seen is kept on disk, so a
  restarted agent still refuses it.
- The node's lease (``lease.py``), renewed by every heartbeat the broker acknowledges.
  Expired, the agent fences itself: it stops every task (a short grace, then a kill),
  starts nothing, and reports each task ``failed`` with a ``fenced:`` reason, so no job
  runs in two places once the monitor declares the node lost. The lease is checked first
  at every entry (a binding, an exit, a timer, a heartbeat), so after a pause the gap is
  noticed before anything that piled up during it is carried out or reported.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from services.node_agent.lease import Lease
from services.node_agent.runtimes.base import Runtime
from services.node_agent.tasks import TaskBook
from shared.events import FENCED, EndCause, JobState
from shared.logging import get_logger

log = get_logger(__name__)
FENCE_GRACE_S = 1.0  # the checkpoint signal's grace when fenced: the lost-node timeout is near


class EpochGate:
    """The highest scheduler epoch seen, kept in ``path`` where given."""

    def __init__(self, path: Path | None) -> None:
        self._path = path
        self.max_epoch = int(path.read_text() or 0) if path and path.exists() else 0

    def stale(self, epoch: int) -> bool:
        return epoch < self.max_epoch

    def observe(self, epoch: int) -> None:
        if epoch > self.max_epoch:
            self.max_epoch = epoch
            if self._path:
                self._path.parent.mkdir(parents=True, exist_ok=True)
                self._path.write_text(str(self.max_epoch))


class LeaseFence:
    def __init__(self, node_id: str, lease: Lease, tasks: TaskBook, runtime: Runtime) -> None:
        self.node_id = node_id
        self.lease = lease
        self._tasks = tasks
        self._runtime = runtime
        # a restart after the lease ran out: the scheduler may have placed our tasks
        # elsewhere, so what a reattach finds is stopped, not adopted
        self.lapsed_while_down = lease.expired()
        self.reason: str | None = None  # why, while fenced
        self.needs_register = False  # the fence was lifted: register again
        # bindings sent before this (wall clock) are not started: they piled up while the
        # node was fenced or unheard, and the scheduler may have placed them elsewhere
        self.not_before = 0.0
        self._stopping: set[asyncio.Task[None]] = set()

    def check(self) -> bool:
        """True while the lease is live; an expired one fences the agent now. Called
        before anything is carried out or reported: after a pause (the monotonic clock
        jumped past the lease) the fence comes first."""
        if self.reason is None and self.lease.expired():
            self._fence(f"lease not renewed for {self.lease.age():.1f}s (fence_after_s="
                        f"{self.lease.fence_after_s:g}): the node may be declared lost and "
                        "its tasks placed elsewhere")
        return self.reason is None

    def _fence(self, why: str) -> None:
        self.reason = why
        log.warning("fenced: stopping every task, starting none", node=self.node_id,
                    reason=why, tasks=len(self._tasks))
        self.stop_all(why)

    def renew(self, sent_at: float) -> None:
        """A heartbeat sent at ``sent_at`` (monotonic) was acknowledged by the broker."""
        self.check()  # a gap is noticed before this renewal can hide it
        self.lease.renew(sent_at)
        if self.reason is not None and not self.lease.expired():
            log.info("lease renewed: fence lifted, registering again", node=self.node_id,
                     was=self.reason)
            self.reason = None
            self.not_before = time.time()
            self.needs_register = True  # the scheduler's reconcile says what we still own

    def refusal(self, sent_at: float | None) -> str | None:
        """Why a binding sent at ``sent_at`` (wall clock) may not start tasks here, if it
        may not."""
        if not self.check():
            return self.reason
        if sent_at is not None and sent_at < self.not_before:
            return "sent before this node's fence was lifted"  # a pause's backlog
        return None

    def stop_all(self, why: str) -> None:
        """Stop every task now (short grace, then kill); each is reported fenced unless
        the scheduler had already asked for its stop. In the background: a report that
        waits on the broker must not hold up the kill."""
        for key, rec in self._tasks.live.items():
            if rec.stop_state is None:
                rec.stopping(JobState.FAILED, f"{FENCED}: {why}", EndCause.FENCED)
            self.kill_soon(key, why)

    def kill_soon(self, key: str, why: str) -> None:
        async def kill() -> None:
            try:
                await self._runtime.stop(key, FENCE_GRACE_S, reason=FENCED, message=why)
            except Exception:
                log.exception("a fenced task could not be stopped", node=self.node_id, task=key)

        task = asyncio.create_task(kill())
        self._stopping.add(task)
        task.add_done_callback(self._stopping.discard)

    def cancel(self) -> None:
        for task in self._stopping:
            task.cancel()
