"""Hundreds of simulated nodes in one node-agent process, against the real broker.

Starts the embedded broker (unless --bootstrap names one), then one agent process
(``python -m services.node_agent`` with ``KAIROS_SIM_NODES=N``) hosting N simulated nodes
of 8 GPUs, and reads ``nodes.lifecycle``, ``nodes.telemetry`` and ``jobs.status`` to check
that

- every node registers (figure: seconds from the process start to the last one),
- every node heartbeats and sends telemetry at its interval through the window,
- a binding to every node is carried out: one 1-GPU task of ``--task-s`` seconds each,
  sent together (figures: binding sent -> ``running`` report p50 / p99 / max, and all
  ``succeeded``),

and reports the agent process's CPU (% of one core, over the heartbeat window and over
the binding burst) and its memory (RSS).

    python bench/agents_scale.py [--nodes 300] [--seconds 10] [--heartbeat-s 2]

Prints the figures and writes bench/results/agents_scale.json; exits 1 when a check
fails. ``tests/node_agent/test_agents_scale.py`` runs ``measure`` with 100 nodes.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
from aiokafka import AIOKafkaConsumer, TopicPartition

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kairos.embedded import EmbeddedBroker, free_port  # noqa: E402
from shared.bus import Producer, ensure_topics  # noqa: E402
from shared.events import (  # noqa: E402
    Binding,
    BindingAction,
    Envelope,
    GpuAssignment,
    JobStatus,
    NodeHeartbeat,
    NodeRegistered,
    NodeTelemetry,
    TaskBinding,
)
from shared.topics import JOBS_STATUS, NODES_LIFECYCLE, NODES_TELEMETRY  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "agents_scale.json"


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, round(q / 100 * (len(s) - 1)))]


@dataclass
class Seen:
    """What the topics said about our nodes, with the local time it arrived."""

    prefix: str
    registered: dict[str, float] = field(default_factory=dict)
    heartbeats: list[tuple[str, float]] = field(default_factory=list)
    telemetry: list[tuple[str, float]] = field(default_factory=list)
    running: dict[str, float] = field(default_factory=dict)  # job -> time
    succeeded: set[str] = field(default_factory=set)

    def add(self, event: Any, now: float) -> None:
        if isinstance(event, NodeRegistered):
            if event.inventory.node_id.startswith(self.prefix):
                self.registered.setdefault(event.inventory.node_id, now)
        elif isinstance(event, NodeHeartbeat) and event.node_id.startswith(self.prefix):
            self.heartbeats.append((event.node_id, now))
        elif isinstance(event, NodeTelemetry) and event.node_id.startswith(self.prefix):
            self.telemetry.append((event.node_id, now))
        elif isinstance(event, JobStatus) and (event.node_id or "").startswith(self.prefix):
            if event.state.value == "running":
                self.running.setdefault(event.job_id, now)
            elif event.state.value == "succeeded":
                self.succeeded.add(event.job_id)


async def _follow(bootstrap: str, seen: Seen, ready: asyncio.Event) -> None:
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, fetch_max_wait_ms=50,
                                enable_auto_commit=False)
    await consumer.start()
    try:
        tps = [TopicPartition(t.name, p) for t in (NODES_LIFECYCLE, NODES_TELEMETRY, JOBS_STATUS)
               for p in sorted(consumer.partitions_for_topic(t.name) or set())]
        consumer.assign(tps)
        await consumer.seek_to_end(*tps)
        for tp in tps:
            await consumer.position(tp)
        ready.set()
        while True:
            for records in (await consumer.getmany(timeout_ms=200)).values():
                now = time.monotonic()
                for r in records:
                    seen.add(Envelope.decode(r.value or b"").payload(), now)
    finally:
        await consumer.stop()


async def _until(predicate: Any, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.05)
    return True


def _cpu(proc: psutil.Process) -> float:
    t = proc.cpu_times()
    return float(t.user + t.system)


async def measure(bootstrap: str, nodes: int = 300, seconds: float = 10.0,
                  heartbeat_s: float = 2.0, telemetry_s: float = 5.0,
                  task_s: float = 1.0) -> dict[str, Any]:
    """Run one agent process of ``nodes`` simulated nodes against ``bootstrap``; return
    the figures and the checks (``ok`` is True when every check passed)."""
    prefix = f"scale{uuid.uuid4().hex[:6]}"
    seen = Seen(prefix + "-")
    ready = asyncio.Event()
    follower = asyncio.create_task(_follow(bootstrap, seen, ready))
    await asyncio.wait_for(ready.wait(), 30)
    state = tempfile.mkdtemp(prefix="kairos-scale-")
    env = {**os.environ, "KAIROS_KAFKA_BOOTSTRAP": bootstrap, "KAIROS_NODE_ID": prefix,
           "KAIROS_NODE_RUNTIME": "simulated", "KAIROS_SIM_NODES": str(nodes),
           "KAIROS_HEARTBEAT_S": str(heartbeat_s), "KAIROS_TELEMETRY_S": str(telemetry_s),
           "KAIROS_HTTP_PORT": str(free_port()), "KAIROS_STATE_DIR": state,
           "KAIROS_LOG_JSON": "false", "KAIROS_LOG_LEVEL": "WARNING"}
    started = time.monotonic()
    agent = subprocess.Popen([sys.executable, "-m", "services.node_agent"], cwd=ROOT, env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    proc = psutil.Process(agent.pid)
    producer = Producer(bootstrap, "bench-agents-scale")
    await producer.start()
    out: dict[str, Any] = {"nodes": nodes, "heartbeat_s": heartbeat_s,
                           "telemetry_s": telemetry_s, "window_s": seconds, "task_s": task_s}
    checks: dict[str, bool] = {}
    try:
        checks["all_registered"] = await _until(lambda: len(seen.registered) == nodes, 120)
        out["registered"] = len(seen.registered)
        if seen.registered:
            out["register_all_s"] = round(max(seen.registered.values()) - started, 2)

        # the heartbeat window, from the first heartbeat of every node: each, each interval
        checks["first_heartbeats"] = await _until(
            lambda: len({n for n, _ in seen.heartbeats}) == nodes, 30 + 2 * heartbeat_s)
        cpu0, t0 = _cpu(proc), time.monotonic()
        await asyncio.sleep(seconds)
        cpu1, t1 = _cpu(proc), time.monotonic()
        beats = Counter(n for n, t in seen.heartbeats if t0 <= t < t1)
        tele = Counter(n for n, t in seen.telemetry if t0 <= t < t1)
        expected = int(seconds / heartbeat_s) - 1  # one interval of slack at each end
        out["heartbeats_per_s"] = round(sum(beats.values()) / (t1 - t0), 1)
        out["telemetry_per_s"] = round(sum(tele.values()) / (t1 - t0), 1)
        out["heartbeats_per_node_min"] = min((beats[n] for n in seen.registered), default=0)
        out["telemetry_per_node_min"] = min((tele[n] for n in seen.registered), default=0)
        out["idle_cpu_pct_of_core"] = round(100 * (cpu1 - cpu0) / (t1 - t0), 1)
        out["rss_mib"] = round(proc.memory_info().rss / 2**20, 1)
        checks["all_heartbeat"] = out["heartbeats_per_node_min"] >= max(1, expected)
        checks["all_telemetry"] = out["telemetry_per_node_min"] >= max(
            1, int(seconds / telemetry_s) - 1)

        # a binding to every node at once
        sent: dict[str, float] = {}
        cpu2, t2 = _cpu(proc), time.monotonic()
        batch = []
        for i in range(nodes):
            node, job = f"{prefix}-{i}", f"{prefix}-job-{i}"
            b = Binding(binding_id=f"{job}-1-{node}", action=BindingAction.ALLOCATE,
                        node_id=node, epoch=1, job_id=job, duration_s=task_s,
                        tasks=[TaskBinding(task_id="w-0", task_name="w", role="worker",
                                           replica=0, rank=0,
                                           gpus=[GpuAssignment(index=i % 8)])])
            batch.append((Envelope.wrap(b, "bench-agents-scale", None), "bindings"))
            sent[job] = time.monotonic()
        await producer.publish_many(batch)
        checks["all_ran"] = await _until(lambda: len(seen.succeeded) >= nodes, 60 + 2 * task_s)
        cpu3, t3 = _cpu(proc), time.monotonic()
        latency = [1000 * (seen.running[j] - sent[j]) for j in sent if j in seen.running]
        out["bound_running"] = len(latency)
        out["succeeded"] = len(seen.succeeded)
        out["bind_to_running_ms"] = {"p50": round(pct(latency, 50), 1),
                                     "p99": round(pct(latency, 99), 1),
                                     "max": round(max(latency, default=float("nan")), 1)}
        out["burst_cpu_pct_of_core"] = round(100 * (cpu3 - cpu2) / (t3 - t2), 1)
        out["rss_mib_after"] = round(proc.memory_info().rss / 2**20, 1)
        checks["agent_alive"] = agent.poll() is None
    finally:
        await producer.stop()
        agent.terminate()
        try:
            _, err = agent.communicate(timeout=15)
        except subprocess.TimeoutExpired:
            agent.kill()
            _, err = agent.communicate()
        follower.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await follower
    out["checks"] = checks
    out["ok"] = bool(checks) and all(checks.values())
    if not out["ok"]:
        out["agent_stderr_tail"] = (err or b"").decode(errors="replace")[-2000:]
    return out


async def _main(args: argparse.Namespace) -> int:
    broker = None
    bootstrap = args.bootstrap
    if not bootstrap:
        broker = EmbeddedBroker()
        bootstrap = broker.start()
        await ensure_topics(bootstrap, max_partitions=args.partitions)
    try:
        result = await measure(bootstrap, args.nodes, args.seconds, args.heartbeat_s,
                               args.telemetry_s, args.task_s)
    finally:
        if broker is not None:
            broker.stop()
    result["partitions_max"] = args.partitions if broker is not None else None
    result["cpus"] = os.cpu_count()
    print(json.dumps(result, indent=2))
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    return 0 if result["ok"] else 1


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nodes", type=int, default=300)
    p.add_argument("--seconds", type=float, default=10.0, help="heartbeat window")
    p.add_argument("--heartbeat-s", type=float, default=2.0)
    p.add_argument("--telemetry-s", type=float, default=5.0)
    p.add_argument("--task-s", type=float, default=1.0, help="each bound task runs this long")
    p.add_argument("--partitions", type=int, default=8,
                   help="cap topic partitions of the embedded broker (CPU)")
    p.add_argument("--bootstrap", default="", help="an existing broker (topics already made)")
    return asyncio.run(_main(p.parse_args()))


if __name__ == "__main__":
    sys.exit(main())
