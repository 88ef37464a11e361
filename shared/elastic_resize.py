"""Which elastic task a resize names, and whether its replica count is allowed.

One rule for both sides: the gateway refuses a bad resize with a clear 4xx, and the
scheduler ignores a command that would break it (one written before a spec changed, or
sent by something other than the gateway).
"""

from __future__ import annotations

from shared.jobspec import JobSpec, TaskSpec


class ResizeRefused(Exception):
    """Why a resize cannot be taken. ``field`` is the request field at fault, or ``None``
    when the job itself cannot be resized (it has no elastic task)."""

    def __init__(self, field: str | None, message: str) -> None:
        super().__init__(message)
        self.field = field
        self.message = message


def elastic_task(spec: JobSpec, task: str | None, replicas: int) -> TaskSpec:
    """The elastic task a resize to ``replicas`` applies to: the one named, or the only
    elastic task when none is named. Raises ``ResizeRefused``."""
    elastic = [t for t in spec.tasks if t.elastic]
    if not elastic:
        raise ResizeRefused(None, "no task sets minReplicas/maxReplicas")
    chosen = (next((t for t in elastic if t.name == task), None) if task
              else elastic[0] if len(elastic) == 1 else None)
    if chosen is None:
        raise ResizeRefused("task", "name one of the elastic tasks: "
                            + ", ".join(t.name for t in elastic))
    if not chosen.least_replicas <= replicas <= chosen.most_replicas:
        raise ResizeRefused("replicas", f"task {chosen.name} runs {chosen.least_replicas} "
                            f"to {chosen.most_replicas} replicas, not {replicas}")
    return chosen
