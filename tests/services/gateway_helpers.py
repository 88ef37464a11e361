"""The gateway served by uvicorn on a local port (so responses really stream) against a
real, migrated PostgreSQL database, with helpers that feed its read model the way its
consumer does (``store.apply_events``, the code the jobs.status consumer runs)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import httpx
from fastapi import FastAPI
from sqlalchemy.ext.asyncio import AsyncEngine

from kairos.embedded import free_port
from services.admission import store, tokens
from services.admission.app import create_app
from services.admission.settings import AdmissionSettings
from shared.db import make_engine
from shared.events import (
    Envelope,
    Event,
    GpuInfo,
    JobState,
    JobStatus,
    NodeInventory,
    NodeRegistered,
    QueueChanged,
    utcnow,
)
from shared.http import HttpServer
from shared.queuespec import QueueSpec

JOB: dict[str, Any] = {"name": "train", "tasks": [{"name": "w", "resources": {"gpu": 1}}]}


def auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@dataclass
class Gateway:
    http: httpx.AsyncClient
    engine: AsyncEngine
    app: FastAPI
    admin: str  # an admin token of tenant "ops"
    _events: int = 0
    _last: tuple[Envelope, Event] | None = None

    async def token(self, tenant: str, role: str = "user", name: str | None = None) -> str:
        return (await tokens.create_token(self.engine, tenant, role, name))[1]

    async def submit(self, token: str, spec: dict[str, Any] | None = None) -> str:
        r = await self.http.post("/v1/jobs", json=spec or JOB, headers=auth(token))
        assert r.status_code == 201, r.text
        return str(r.json()["id"])

    async def apply(self, event: Event, at: datetime | None = None) -> None:
        """Apply one event to the read model as the consumer does."""
        self._events += 1
        env = Envelope.wrap(event, "test", event_id=f"test-{self._events}")
        if at is not None:
            env = env.model_copy(update={"occurred_at": at})
        self._last = (env, event)
        await store.apply_events(self.engine, [(env, event)])

    async def apply_replay(self) -> None:
        """Deliver the last event again, as an at-least-once broker may."""
        assert self._last is not None
        await store.apply_events(self.engine, [self._last])

    async def status(self, job_id: str, state: JobState, task: str | None = None,
                     attempt: int = 1, at: datetime | None = None, node: str | None = "n1",
                     reason: str | None = None) -> None:
        await self.apply(JobStatus(job_id=job_id, state=state, task=task, attempt=attempt,
                                   reason=reason or f"test {state.value}",
                                   node_id=node if task else None), at)

    async def queue(self, name: str, **fields: Any) -> None:
        """An open queue in the read model, as queueing announces it."""
        spec = QueueSpec.model_validate({"name": name, **fields})
        await self.apply(QueueChanged(queue=name, change="created", version=1, settings={
            **spec.public(), "effective_tenant": fields.get("tenant", "")}))

    async def node(self, node_id: str, gpus: int = 8, gpu_memory_mib: int = 81_920,
                   cpu_milli: int = 128_000, memory_mib: int = 1_048_576,
                   model: str = "H100") -> None:
        await self.apply(NodeRegistered(inventory=NodeInventory(
            node_id=node_id, cpu_milli=cpu_milli, memory_mib=memory_mib,
            gpus=[GpuInfo(index=i, uuid=f"GPU-{node_id}-{i}", model=model,
                          memory_mib=gpu_memory_mib) for i in range(gpus)]),
            agent_started_at=utcnow()))


@asynccontextmanager
async def gateway(db_url: str, **settings: Any) -> AsyncIterator[Gateway]:
    engine = make_engine(db_url, pool_size=4)

    async def ready() -> dict[str, bool]:
        return {"database": True}

    app = create_app(AdmissionSettings(database_url=db_url, **settings), engine, ready)
    _, admin = await tokens.create_token(engine, "ops", "admin", "root")
    port = free_port()
    server = HttpServer(app, "127.0.0.1", port)
    await server.start()
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=30) as http:
            yield Gateway(http, engine, app, admin)
    finally:
        await server.stop()
        await engine.dispose()
