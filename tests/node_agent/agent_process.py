"""A node agent as a process of its own (``python -m services.node_agent``) against the
real broker, so a test can pause it (SIGSTOP) or kill it (SIGKILL) as an operator or a
loaded machine would; and a feed of what it publishes on jobs.status and
nodes.lifecycle."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import httpx
from aiokafka import AIOKafkaConsumer, TopicPartition

from kairos.embedded import free_port
from shared.events import Envelope, Event, NodeHeartbeat, NodeRegistered
from shared.topics import JOBS_STATUS, NODES_LIFECYCLE
from tests.node_agent.harness import StatusFeed

REPO = Path(__file__).resolve().parents[2]


@dataclass
class AgentProcess:
    node_id: str
    port: int
    proc: asyncio.subprocess.Process
    log: Path

    def pause(self) -> None:
        self.proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        self.proc.send_signal(signal.SIGCONT)

    async def kill(self) -> None:
        """kill -9: nothing runs on the way out."""
        with contextlib.suppress(ProcessLookupError):
            self.proc.kill()
        await self.proc.wait()


@contextlib.asynccontextmanager
async def agent_process(bootstrap: str, state_dir: Path, node_id: str,
                        **settings: Any) -> AsyncIterator[AgentProcess]:
    """Started and serving (its bindings consumer is positioned before its HTTP port
    opens); killed on the way out. ``settings``: AgentSettings fields."""
    port = free_port()
    env = {**os.environ, "KAIROS_KAFKA_BOOTSTRAP": bootstrap, "KAIROS_NODE_ID": node_id,
           "KAIROS_STATE_DIR": str(state_dir), "KAIROS_HTTP_PORT": str(port),
           "KAIROS_HEARTBEAT_S": "0.2", "KAIROS_TELEMETRY_S": "1", "KAIROS_LOG_JSON": "false",
           "KAIROS_SIM_GPUS_PER_NODE": "8",
           **{f"KAIROS_{k.upper()}": str(v) for k, v in settings.items()}}
    log = state_dir / f"{node_id}-{port}.log"
    with _log_file(log) as out:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "services.node_agent", env=env, cwd=REPO,
            stdin=asyncio.subprocess.DEVNULL, stdout=out, stderr=asyncio.subprocess.STDOUT)
    agent = AgentProcess(node_id, port, proc, log)
    try:
        async with httpx.AsyncClient() as client, asyncio.timeout(90):
            while True:
                if proc.returncode is not None:
                    raise RuntimeError(f"the agent exited: {log.read_text()[-3000:]}")
                with contextlib.suppress(httpx.HTTPError):
                    if (await client.get(f"http://127.0.0.1:{port}/readyz")).status_code == 200:
                        break
                await asyncio.sleep(0.1)
        yield agent
    finally:
        if proc.returncode is None:
            await agent.kill()  # SIGKILL ends a stopped (paused) process too


def _log_file(path: Path) -> BinaryIO:
    path.parent.mkdir(parents=True, exist_ok=True)
    return open(path, "wb")  # the caller closes it


@dataclass
class Feed(StatusFeed):
    def registrations(self, node_id: str) -> list[NodeRegistered]:
        return [e for e in self.events
                if isinstance(e, NodeRegistered) and e.inventory.node_id == node_id]

    sent: list[float] = field(default_factory=list)  # each event's occurred_at

    def node_events(self, node_id: str, since: float = 0) -> list[Event]:
        """The node's heartbeats and registrations sent from ``since`` (wall clock) on,
        in order (they share a partition)."""
        return [e for e, at in zip(self.events, self.sent, strict=True) if at >= since and (
            (isinstance(e, NodeHeartbeat) and e.node_id == node_id)
            or (isinstance(e, NodeRegistered) and e.inventory.node_id == node_id))]


@contextlib.asynccontextmanager
async def feed(bootstrap: str) -> AsyncIterator[Feed]:
    """Every event on jobs.status and nodes.lifecycle from the moment it returns."""
    found = Feed()
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, fetch_max_wait_ms=20,
                                enable_auto_commit=False)
    await consumer.start()
    tps = [TopicPartition(topic, p) for topic in (JOBS_STATUS.name, NODES_LIFECYCLE.name)
           for p in sorted(consumer.partitions_for_topic(topic) or set())]
    consumer.assign(tps)
    await consumer.seek_to_end(*tps)
    for tp in tps:
        await consumer.position(tp)

    async def follow() -> None:
        while True:
            for records in (await consumer.getmany(timeout_ms=100)).values():
                for r in records:
                    env = Envelope.decode(r.value or b"")
                    found.sent.append(env.occurred_at.timestamp())
                    found.events.append(env.payload())

    task = asyncio.create_task(follow())
    try:
        yield found
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await consumer.stop()
