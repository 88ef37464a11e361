"""Admission's read model for node operations and interactive environments.

- ``nodes_view.scheduling``: schedulable | cordoned | draining | drained, as the scheduler
  last announced it (``node.scheduling``). Admission also writes it when it accepts a
  command, so a second command sees the first at once; ``scheduling_generation`` orders
  them: a late announcement of an older command never overwrites a newer one.
- ``jobs.connection``: where an interactive environment's running attempt listens, from
  the agent's ``running`` report of its task.
"""

from __future__ import annotations

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from shared.events import JobState, JobStatus, NodeSchedulingChanged


async def apply_node_scheduling(conn: AsyncConnection, ev: NodeSchedulingChanged) -> None:
    await conn.execute(
        text("""UPDATE nodes_view SET scheduling = :s, scheduling_reason = :r,
                    scheduling_generation = :g
                WHERE node_id = :n AND scheduling_generation <= :g"""),
        {"n": ev.node_id, "s": ev.scheduling.value, "r": ev.reason, "g": ev.generation})


async def apply_connection(conn: AsyncConnection, st: JobStatus) -> None:
    """Keep the newest attempt's connection; a late report of an older one is ignored."""
    if st.connection is None or st.state is not JobState.RUNNING:
        return
    await conn.execute(
        text("""UPDATE jobs SET connection = CAST(:c AS jsonb), connection_attempt = :a
                WHERE id = :j AND (connection_attempt IS NULL OR connection_attempt <= :a)"""),
        {"j": st.job_id, "a": st.attempt, "c": st.connection.model_dump_json()})
