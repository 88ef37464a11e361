"""GPU health in admission's node read model, from ``nodes.telemetry``.

``nodes_view.gpu_health`` lists a node's GPUs that are not healthy (index, health, and the
sample's values that explain it); ``gpu_health_key`` is the set in short form
("0:degraded,3:degraded") and ``gpu_health_changed_at`` when it last changed.

Telemetry arrives every few seconds from every node, so this keeps the set it last saw
stored per node in memory and touches the database only when the set changes: steady
telemetry costs no query at all. A first sample (after a restart, or for a node this
replica just took over) checks the row once and writes only if it differs. Entries are
re-checked after ``RECHECK_S``, so a replica that gets a node back after another replica
owned its partition for a while does not trust a stale memory forever.
"""

from __future__ import annotations

import json
import time
from typing import Any

from pydantic import BaseModel, Field
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from shared.events import GpuHealth, NodeTelemetry

RECHECK_S = 300.0


class GpuHealthOut(BaseModel):
    """A GPU the node's agent reports as not healthy, with the sample that said so."""

    index: int
    health: str = Field(description="degraded (ECC/XID errors, over temperature)")
    temperature_c: float | None = None
    utilization_pct: float | None = None
    memory_used_mib: int | None = None
    power_w: float | None = None


def unhealthy(ev: NodeTelemetry) -> list[dict[str, Any]]:
    return [{"index": g.index, "health": g.health.value, "temperature_c": g.temperature_c,
             "utilization_pct": g.utilization_pct, "memory_used_mib": g.memory_used_mib,
             "power_w": g.power_w}
            for g in sorted(ev.gpus, key=lambda g: g.index) if g.health != GpuHealth.HEALTHY]


def health_key(gpus: list[dict[str, Any]]) -> str:
    """What decides a write: which GPUs and how unhealthy, not their changing readings."""
    return ",".join(f"{g['index']}:{g['health']}" for g in gpus)


class GpuHealthTracker:
    """The per-node memory of what the database holds. ``skip`` tells the consumer which
    samples need no transaction; ``apply`` runs inside the read model's transaction and
    stages what it saw, made permanent by ``commit`` once that transaction committed."""

    def __init__(self) -> None:
        self._seen: dict[str, tuple[str, float]] = {}  # node -> (key, checked at)
        self._staged: dict[str, str] = {}
        self._staged_writes = 0
        self.writes = 0  # rows changed; steady telemetry leaves it alone

    def _known(self, node_id: str) -> str | None:
        if node_id in self._staged:
            return self._staged[node_id]
        seen = self._seen.get(node_id)
        if seen is None or time.monotonic() - seen[1] > RECHECK_S:
            return None
        return seen[0]

    def skip(self, ev: NodeTelemetry) -> bool:
        return self._known(ev.node_id) == health_key(unhealthy(ev))

    async def apply(self, conn: AsyncConnection, ev: NodeTelemetry) -> None:
        gpus = unhealthy(ev)
        key = health_key(gpus)
        if self._known(ev.node_id) == key:
            return
        changed = await conn.scalar(
            text("""UPDATE nodes_view SET gpu_health = CAST(:h AS jsonb), gpu_health_key = :k,
                        gpu_health_changed_at = now()
                    WHERE node_id = :n AND gpu_health_key IS DISTINCT FROM :k
                    RETURNING 1"""),
            {"n": ev.node_id, "h": json.dumps(gpus), "k": key})
        if changed:
            self._staged_writes += 1
        elif not await conn.scalar(text("SELECT 1 FROM nodes_view WHERE node_id = :n"),
                                   {"n": ev.node_id}):
            return  # not registered yet: remember nothing, the next sample tries again
        self._staged[ev.node_id] = key

    def commit(self) -> None:
        now = time.monotonic()
        for node_id, key in self._staged.items():
            self._seen[node_id] = (key, now)
        self.writes += self._staged_writes
        self.rollback()

    def rollback(self) -> None:
        self._staged.clear()
        self._staged_writes = 0
