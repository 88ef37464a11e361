"""What the bare broker path costs per message on this machine: the floor under any
per-job figure.

Starts the embedded broker (Tansu) alone and the same four bare consumer->producer relays
bench/e2e_latency.py times as its latency floor (aiokafka, 20 ms fetch wait, no decoding,
no database), feeds them at steady rates and reads the CPU each part spends per message
that crosses all four hops: the relays' process, the broker, and this process (the
producer at the start and the reader at the end).

A job on the platform crosses at least as many hops (jobs.submitted, jobs.ready, bindings,
the agent's report) and its events are read by more consumers besides (the gateway's read
model, queueing, the scheduler, the monitor), so what one message costs here, times the
hops, bounds from below what a job can cost, whatever the services do with it.

    python bench/floor_cost.py [--rates 50,100,200] [--seconds 20]

Prints a table and writes bench/results/floor_cost.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import psutil
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

from e2e_latency import RELAY_CODE, pct  # noqa: E402

from kairos.embedded import EmbeddedBroker  # noqa: E402
from shared.bus import ensure_topics  # noqa: E402
from shared.topics import Topic  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "floor_cost.json"
HOPS = 4


def cpu_s(pid: int) -> float:
    t = psutil.Process(pid).cpu_times()
    return t.user + t.system


async def one_rate(bootstrap: str, broker_pid: int, rate: float, seconds: float) -> dict[str, Any]:
    prefix = "cost" + uuid.uuid4().hex[:6]
    await ensure_topics(bootstrap, [Topic(f"{prefix}.{i}", "k", 4, 3_600_000, (), "")
                                    for i in range(HOPS + 1)])
    relays = subprocess.Popen([sys.executable, "-c", RELAY_CODE, bootstrap, prefix],
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    try:
        sink = AIOKafkaConsumer(f"{prefix}.{HOPS}", bootstrap_servers=bootstrap,
                                auto_offset_reset="latest", fetch_max_wait_ms=20)
        await sink.start()
        while not sink.assignment():
            await asyncio.sleep(0.05)
        for tp in sink.assignment():
            await sink.position(tp)
        await asyncio.sleep(8)  # the relays' consumer groups join
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=0)
        await producer.start()
        lat: list[float] = []

        async def collect() -> None:
            while True:
                for rs in (await sink.getmany(timeout_ms=100)).values():
                    now = time.time()
                    lat.extend((now - float(r.value.decode())) * 1000 for r in rs if r.value)

        collector = asyncio.create_task(collect())
        n = int(rate * seconds)
        before = {"relays": cpu_s(relays.pid), "broker": cpu_s(broker_pid),
                  "producer and reader": cpu_s(os.getpid())}
        start = time.monotonic()
        for i in range(n):
            delay = start + i / rate - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            await producer.send(f"{prefix}.0", str(time.time()).encode(), key=str(i % 64).encode())
        await producer.flush()
        deadline = time.monotonic() + 20
        while len(lat) < n and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        elapsed = time.monotonic() - start
        after = {"relays": cpu_s(relays.pid), "broker": cpu_s(broker_pid),
                 "producer and reader": cpu_s(os.getpid())}
        collector.cancel()
        await producer.stop()
        await sink.stop()
    finally:
        relays.terminate()
        relays.wait()
    spent = {k: after[k] - before[k] for k in before}
    return {
        "rate": rate, "messages": n, "received": len(lat),
        "p50_ms": round(pct(lat, 50), 1), "p99_ms": round(pct(lat, 99), 1),
        "cpu_ms_per_message": {k: round(1000 * v / max(1, len(lat)), 2) for k, v in spent.items()},
        "cpu_ms_per_message_total": round(1000 * sum(spent.values()) / max(1, len(lat)), 2),
        "cpu_ms_per_hop": round(1000 * sum(spent.values()) / max(1, len(lat)) / HOPS, 2),
        "cores": round(sum(spent.values()) / elapsed, 2),
    }


async def main(rates: list[float], seconds: float) -> list[dict[str, Any]]:
    broker = EmbeddedBroker()
    bootstrap = broker.start()
    assert broker._proc is not None
    try:
        return [await one_rate(bootstrap, broker._proc.pid, r, seconds) for r in rates]
    finally:
        broker.stop()


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--rates", default="50,100,200")
    ap.add_argument("--seconds", type=float, default=20)
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args()
    runs = asyncio.run(main([float(r) for r in args.rates.split(",")], args.seconds))
    print(" rate/s  received  p50/p99 ms     CPU ms/message (all parts)  per hop  cores")
    for r in runs:
        print(f" {r['rate']:6g}  {r['received']:8d}  {r['p50_ms']:5.1f}/{r['p99_ms']:<7.1f}"
              f"  {r['cpu_ms_per_message_total']:26.2f}  {r['cpu_ms_per_hop']:7.2f}"
              f"  {r['cores']:5.2f}")
    args.out.write_text(json.dumps({"hops": HOPS, "machine": f"{os.cpu_count()} cores",
                                    "runs": runs}, indent=2) + "\n")
    print(f"wrote {args.out}")
