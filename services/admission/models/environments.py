"""Interactive environments as the API asks for and shows them."""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

from services.admission.models.jobs import row_spec
from shared.events import Connection, JobState
from shared.jobspec import JobSpec, PriorityClass, parse_job_spec

MAX_TIME_LIMIT_S = 7 * 86400
SESSION_TASK = "session"


class EnvironmentIn(BaseModel):
    """What a user asks for; camelCase like a job spec. A whole-GPU count or a share."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True,
                              extra="forbid")
    name: str = Field(default="env", max_length=63)
    queue: str = Field(default="default", max_length=63)
    gpu: int | None = Field(default=None, ge=0, le=64,
                            description="whole GPUs; default 1 unless a share is asked")
    gpu_memory: int = Field(default=0, ge=0, description="MiB of one shared GPU")
    gpu_compute: int = Field(default=0, ge=0, le=100, description="percent of one GPU")
    cpu: int = Field(default=4000, ge=0, description="millicores")
    memory: int = Field(default=16384, ge=0, description="MiB")
    image: str | None = Field(default=None, max_length=500)
    command: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)
    time_limit: int = Field(default=3600, ge=1, le=MAX_TIME_LIMIT_S,
                            description="seconds it is held at most")
    priority: int = Field(default=0, ge=-1000, le=1000)
    priority_class: PriorityClass = PriorityClass.NORMAL
    preemptible: bool = True
    duration: float | None = Field(default=None, ge=0, description=(
        "simulated nodes only: seconds the session 'runs' (default: until returned)"))

    def to_spec(self) -> JobSpec:
        shared = bool(self.gpu_memory or self.gpu_compute)
        resources = {"gpuMemory": self.gpu_memory, "gpuCompute": self.gpu_compute} if shared \
            else {"gpu": 1 if self.gpu is None else self.gpu}
        if shared and self.gpu:
            resources["gpu"] = self.gpu  # let the spec refuse "both" with its own message
        task: dict[str, Any] = {"name": SESSION_TASK, "replicas": 1, "command": self.command,
                                "env": self.env, "resources": {**resources, "cpu": self.cpu,
                                                               "memory": self.memory}}
        if self.image:
            task["image"] = self.image
        doc: dict[str, Any] = {
            "kind": "Interactive", "name": self.name, "queue": self.queue,
            "timeLimit": self.time_limit, "priority": self.priority,
            "priorityClass": self.priority_class.value, "preemptible": self.preemptible,
            "maxRetry": 0, "tasks": [task]}
        if self.duration is not None:
            doc["duration"] = self.duration
        return parse_job_spec(doc)


class EnvironmentOut(BaseModel):
    id: str
    name: str
    queue: str
    tenant: str
    user: str
    state: str
    reason: str
    attempt: int
    time_limit_s: int
    resources: dict[str, Any]
    image: str
    submitted_at: datetime
    updated_at: datetime
    connection: Connection | None = Field(
        default=None, description="where to connect, while it runs")
    running_since: datetime | None = None
    expires_at: datetime | None = Field(
        default=None, description="when its time limit stops it, while it runs")


class EnvironmentList(BaseModel):
    items: list[EnvironmentOut]
    limit: int
    offset: int
    next_offset: int | None


def env_out(row: dict[str, Any]) -> EnvironmentOut:
    """The environment an Interactive job's row holds."""
    spec = row_spec(row)
    task = spec["tasks"][0]
    running = row["state"] == JobState.RUNNING.value
    conn = row.get("connection")
    if isinstance(conn, str):
        conn = json.loads(conn)
    out = EnvironmentOut(
        **{k: row[k] for k in ("id", "name", "queue", "tenant", "user", "state", "reason",
                               "attempt", "submitted_at", "updated_at")},
        time_limit_s=spec["timeLimit"], resources=task["resources"], image=task["image"],
        connection=Connection.model_validate(conn) if running and conn
        and row.get("connection_attempt") == row["attempt"] else None)
    if running:
        started = [h["occurred_at"] for h in row.get("history", [])
                   if h["state"] == "running" and h["task"] is None
                   and h["attempt"] == row["attempt"]]
        if started:
            out.running_since = started[-1]
            out.expires_at = started[-1] + timedelta(seconds=spec["timeLimit"])
    return out
