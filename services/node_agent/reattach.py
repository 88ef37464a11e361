"""After an agent restart: take back what the runtime still runs, and report what ended
while the agent was down.

Down past its lease (or with it expired now), the agent adopts nothing: the scheduler
may have placed those tasks elsewhere, so they are stopped and, like those that ended,
reported fenced; and bindings sent while it was down are not started either.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable

from services.node_agent.fencing import LeaseFence
from services.node_agent.runtimes.base import Runtime
from services.node_agent.tasks import TaskBook, split_key
from shared.events import FENCED, EndCause, JobState, JobStatus
from shared.logging import get_logger

log = get_logger(__name__)
Final = Callable[[str, JobStatus], Awaitable[bool]]  # the agent's last report of a task
Adopt = Callable[[str], None]


async def reattach(node_id: str, runtime: Runtime, tasks: TaskBook, fence: LeaseFence,
                   final: Final, adopt: Adopt) -> int:
    """Returns how many running tasks were adopted (and kept)."""
    lapsed = fence.lapsed_while_down or not fence.check()
    why = (f"the agent was down longer than its lease (fence_after_s="
           f"{fence.lease.fence_after_s:g}): the scheduler may have placed it elsewhere")
    for ex in await runtime.reconcile():
        job_id, task_id, attempt = split_key(ex.key)
        tasks.remember(ex.key)
        state, cause = ((JobState.SUCCEEDED, EndCause.COMPLETED) if ex.exit_code == 0
                        else (JobState.FAILED, EndCause.FAILED))
        reason = f"{ex.reason} while the agent was down"
        if lapsed:
            state, cause, reason = JobState.FAILED, EndCause.FENCED, f"{FENCED}: {reason}; {why}"
        if await final(ex.key, JobStatus(
                job_id=job_id, state=state, reason=reason, cause=cause, attempt=attempt,
                exit_code=ex.exit_code, task=task_id, node_id=node_id,
                message=ex.message or None, ran_s=ex.ran_s, checkpoint=ex.checkpoint)):
            await runtime.forget(ex.key)
    adopted = await runtime.running()
    for key in adopted:
        adopt(key)
    if lapsed:  # and what was sent while it was down is not started either
        fence.not_before = time.time()
    if lapsed and adopted:
        log.warning("down past the lease: stopping the tasks found running",
                    node=node_id, tasks=adopted)
        fence.stop_all(why)
        return 0
    return len(adopted)
