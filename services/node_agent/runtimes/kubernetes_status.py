"""Reading a Pod's status: whether it ended, how (a ``TaskExit``), what work it did, and
whether a container stuck waiting will ever start. Pure: the runtime fetches the Pods."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from services.node_agent.runtimes.base import TaskExit, exit_reason, read_checkpoint
from services.node_agent.runtimes.kubernetes_manifests import CONTAINER

# waiting reasons that will not resolve by themselves: fail at once
FATAL_WAITING = frozenset({"InvalidImageName", "ErrImageNeverPull", "CreateContainerConfigError"})
# waiting reasons that may resolve: fail once they last the runtime's pending timeout
SLOW_WAITING = frozenset({"ErrImagePull", "ImagePullBackOff", "CreateContainerError"})


def is_terminal(pod: Any) -> bool:
    return pod.status is not None and pod.status.phase in ("Succeeded", "Failed")


def container_state(pod: Any) -> Any:
    for cs in (pod.status.container_statuses or []) if pod.status else []:
        if cs.name == CONTAINER:
            return cs.state
    return None


def terminated(pod: Any) -> Any:
    state = container_state(pod)
    return state.terminated if state is not None else None


def waiting(pod: Any) -> Any:
    state = container_state(pod)
    return state.waiting if state is not None else None


def work_done(pod: Any) -> tuple[float | None, str | None]:
    """Seconds the container ran (to its end, or now) and the checkpoint it left in
    its termination message; None where the Pod never ran."""
    state = container_state(pod) if pod is not None else None
    ended_state = state.terminated if state is not None else None
    started = (ended_state.started_at if ended_state is not None else
               state.running.started_at if state is not None and state.running else None)
    if started is None and pod is not None and pod.status is not None:
        started = pod.status.start_time
    ended = (ended_state.finished_at if ended_state is not None else None) or datetime.now(UTC)
    ran_s = (round(max(0.0, (ended - started).total_seconds()), 3)
             if isinstance(started, datetime) else None)
    return ran_s, read_checkpoint(ended_state.message if ended_state is not None else None)


def exit_of(key: str, pod: Any, message: str = "") -> TaskExit:
    """How the Pod of task ``key`` ended (``message``: said first, where given)."""
    ended_state = terminated(pod)
    ran_s, checkpoint = work_done(pod)
    if ended_state is None:  # e.g. evicted before the container ran
        reason = pod.status.reason if pod.status else None
        return TaskExit(key, 0 if pod.status and pod.status.phase == "Succeeded" else 1,
                        "completed" if pod.status and pod.status.phase == "Succeeded"
                        else "error", message or (reason or ""), ran_s, checkpoint)
    code = ended_state.exit_code
    detail = (ended_state.reason
              if ended_state.reason not in (None, "Completed", "Error") else "")
    return TaskExit(key, code, exit_reason(code), "; ".join(filter(None, [message, detail])),
                    ran_s, checkpoint)
