"""How soon a consumer restarted after kill -9 reads again, on the embedded broker (Tansu).

A member of a consumer group is killed (SIGKILL: it never leaves the group) and a new
process joins the same group at once; measured: from the kill until the new member holds
its partitions, for several session timeouts, with and without static membership
(``group.instance.id``), against a reader with a manual assignment that commits as the
group (what the scheduler does: it holds a lease, so it reads alone). Each case runs
``--rounds`` times; the median is reported.

    python bench/group_rejoin.py [--rounds 3]

Writes bench/results/group_rejoin.json: per case ``session_ms``, ``static``, ``manual``,
``first_join_s`` (a fresh group's first join) and ``rejoin_after_kill_s`` (median, and
every round).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from aiokafka import AIOKafkaProducer

from kairos.embedded import EmbeddedBroker

RESULTS = Path(__file__).parent / "results" / "group_rejoin.json"

# one member: joins (or assigns itself the partitions), says when it holds them, reads on
MEMBER = r'''
import asyncio, sys, time
from aiokafka import AIOKafkaConsumer, TopicPartition
async def main(bs, group, topic, session_ms, static, manual):
    t0 = time.monotonic()
    if manual == "1":
        c = AIOKafkaConsumer(bootstrap_servers=bs, group_id=group, enable_auto_commit=False,
                             fetch_max_wait_ms=50, auto_offset_reset="earliest")
        await c.start()
        c.assign([TopicPartition(topic, 0)])
    else:
        kw = {"group_instance_id": group + "-0"} if static == "1" else {}
        c = AIOKafkaConsumer(topic, bootstrap_servers=bs, group_id=group,
                             enable_auto_commit=False, session_timeout_ms=session_ms,
                             heartbeat_interval_ms=max(100, session_ms // 5),
                             fetch_max_wait_ms=50, auto_offset_reset="earliest", **kw)
        await c.start()
    while not c.assignment():
        await c.getmany(timeout_ms=100)
    await c.getmany(timeout_ms=100)
    print("HELD", round(time.monotonic() - t0, 3), flush=True)
    while True:
        await c.getmany(timeout_ms=200)
s = sys.argv
asyncio.run(main(s[1], s[2], s[3], int(s[4]), s[5], s[6]))
'''


def member(bs: str, group: str, topic: str, session_ms: int, static: bool,
           manual: bool) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-c", MEMBER, bs, group, topic, str(session_ms),
                             "1" if static else "0", "1" if manual else "0"],
                            stdout=subprocess.PIPE, text=True)


def held(proc: subprocess.Popen[str]) -> float:
    assert proc.stdout is not None
    line = proc.stdout.readline().split()
    if not line or line[0] != "HELD":
        raise RuntimeError(f"the member never held its partitions: {line}")
    return float(line[1])


async def one_round(bs: str, session_ms: int, static: bool, manual: bool) -> tuple[float, float]:
    topic, group = f"rejoin-{uuid.uuid4().hex[:8]}", f"g-{uuid.uuid4().hex[:8]}"
    p = AIOKafkaProducer(bootstrap_servers=bs)
    await p.start()
    await p.send_and_wait(topic, b"x")
    await p.stop()
    first = member(bs, group, topic, session_ms, static, manual)
    first_join = held(first)
    first.kill()
    first.wait()
    killed = time.monotonic()
    again = member(bs, group, topic, session_ms, static, manual)
    try:
        held(again)
        return first_join, time.monotonic() - killed
    finally:
        again.kill()
        again.wait()


async def run(rounds: int) -> dict[str, object]:
    cases = [(10_000, False, False), (6_000, False, False), (3_000, False, False),
             (2_000, False, False), (1_000, False, False), (10_000, True, False),
             (2_000, True, False), (0, False, True)]
    broker = EmbeddedBroker()
    bs = broker.start()
    out = []
    try:
        for session_ms, static, manual in cases:
            runs = [await one_round(bs, session_ms, static, manual) for _ in range(rounds)]
            row = {"session_ms": session_ms or None, "static": static, "manual": manual,
                   "first_join_s": round(statistics.median(r[0] for r in runs), 2),
                   "rejoin_after_kill_s": round(statistics.median(r[1] for r in runs), 2),
                   "rounds_s": [round(r[1], 2) for r in runs]}
            out.append(row)
            print(json.dumps(row), flush=True)
    finally:
        broker.stop()
    return {"cases": out, "rounds": rounds,
            "note": "from SIGKILL of a member to a new process holding its partitions; "
                    "includes the new process's start (about 0.1 s of Python and aiokafka)",
            "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                        "cpu_hog": os.environ.get("KAIROS_CPU_HOG")}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default=str(RESULTS))
    args = ap.parse_args()
    result = asyncio.run(run(args.rounds))
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(f"\n{'session ms':>10} {'static':>6} {'manual':>6} {'first join s':>12} "
          f"{'after kill -9 s':>15}")
    for r in result["cases"]:  # type: ignore[attr-defined]
        print(f"{r['session_ms'] or '-'!s:>10} {r['static']!s:>6} {r['manual']!s:>6} "
              f"{r['first_join_s']:>12} {r['rejoin_after_kill_s']:>15}")


if __name__ == "__main__":
    main()
