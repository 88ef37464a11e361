"""The scheduling cycle's latency with the forecaster on and off, in the same run.

One embedded stack (kairos.stack.Stack: broker, PostgreSQL, every service, simulated
nodes). Phases alternate off, on, off, on, ... (--pairs of them): before an "off" phase the forecaster process
is stopped, before an "on" phase it is started again (and has made its first round).
Every phase runs the same seeded workload, submitted over HTTP at a steady rate, more
than the cluster holds, so a queue of waiting jobs builds that the forecaster replays
every round (KAIROS_FORECAST_EVERY_S: --every, default 1 s, five times the service's
default, to make its load visible if there is any):
    1 GPU (50%), 4 GPUs (30%), 8 GPUs (20%), 5-20 s each (runtimeEstimate = duration).
After each phase every job of it is cancelled and the cluster drains before the next.

Measured per phase, from the scheduler's own /metrics (kairos_scheduler_cycle_seconds,
phase "total": a whole cycle, core + persist + publish), as deltas over the phase:
cycles, mean (from _sum / _count, exact), and p50 / p99 interpolated within buckets as
Prometheus' histogram_quantile does (the buckets are .5, 1, 2.5, 5, 10, 25 ms, ...);
and in "on" phases the forecaster's rounds, their mean time, the forecasts published and
its CPU; the "place" phase (the core alone, pure CPU) beside the whole cycle, and the
machine's load average, since a shared machine's other work moves these figures. Off and
on are pooled over their phases each, and the median of the phases' means is given too
(one disturbed phase moves a pooled mean, not a median).

    python bench/forecaster_overhead.py [--nodes 8] [--rate 3] [--seconds 40] [--pairs 3] [--every 1]
        [--out bench/results/forecaster_overhead.json]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from kairos.embedded import free_port
from kairos.stack import Proc, Stack

LINE = re.compile(r'^(\w+)\{([^}]*)\} (\S+)$', re.M)
PLAIN = re.compile(r'^(\w+) (\S+)$', re.M)
LABEL = re.compile(r'(\w+)="([^"]*)"')


def histogram(text: str, name: str, **want: str) -> tuple[dict[float, float], float, float]:
    """(cumulative count per bucket upper bound, sum, count) of one labelled series."""
    buckets: dict[float, float] = {}
    total = count = 0.0
    for metric, labels, value in LINE.findall(text):
        lab = dict(LABEL.findall(labels))
        if any(lab.get(k) != v for k, v in want.items()):
            continue
        if metric == f"{name}_bucket":
            le = lab["le"]
            buckets[float("inf") if le == "+Inf" else float(le)] = float(value)
        elif metric == f"{name}_sum":
            total = float(value)
        elif metric == f"{name}_count":
            count = float(value)
    if not want:
        for metric, value in PLAIN.findall(text):
            total = float(value) if metric == f"{name}_sum" else total
            count = float(value) if metric == f"{name}_count" else count
    return buckets, total, count


def scalar(text: str, name: str) -> float:
    for metric, value in PLAIN.findall(text):
        if metric == name:
            return float(value)
    return 0.0


def labelled(text: str, name: str, **want: str) -> float:
    for metric, labels, value in LINE.findall(text):
        if metric == name and all(dict(LABEL.findall(labels)).get(k) == v for k, v in want.items()):
            return float(value)
    return 0.0


def quantile(q: float, buckets: dict[float, float]) -> float | None:
    """histogram_quantile: linear within the bucket the rank falls in."""
    bounds = sorted(buckets)
    total = buckets[bounds[-1]] if bounds else 0
    if not total:
        return None
    rank, prev_b, prev_c = q * total, 0.0, 0.0
    for b in bounds:
        c = buckets[b]
        if c >= rank:
            if b == float("inf"):
                return prev_b
            return prev_b + (b - prev_b) * ((rank - prev_c) / (c - prev_c) if c > prev_c else 0)
        prev_b, prev_c = b, c
    return prev_b


def delta(a: dict[float, float], b: dict[float, float]) -> dict[float, float]:
    return {k: b[k] - a.get(k, 0.0) for k in b}


def workload(n: int, seed: int) -> list[dict[str, Any]]:
    rnd = random.Random(seed)
    out = []
    for i in range(n):
        gpus = rnd.choices([1, 4, 8], [50, 30, 20])[0]
        d = round(rnd.uniform(5, 20), 1)
        out.append({"name": f"ovh-{i}", "duration": d, "runtimeEstimate": d,
                    "tasks": [{"name": "w", "resources": {"gpu": gpus}}]})
    return out


def ready(url: str) -> bool:
    try:
        return httpx.get(f"{url}/readyz", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def wait(what: str, check: Any, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        time.sleep(0.5)


def run_phase(stack: Stack, c: httpx.Client, specs: list[dict[str, Any]], rate: float,
              forecaster: Proc | None) -> dict[str, Any]:
    sched = stack.proc("scheduler").url
    before = httpx.get(f"{sched}/metrics").text
    f_before = httpx.get(f"{forecaster.url}/metrics").text if forecaster else ""
    cpu0 = sum(psutil.Process(forecaster.popen.pid).cpu_times()[:2]) if forecaster else 0.0
    ids, waiting_max, t0 = [], 0, time.monotonic()
    for i, spec in enumerate(specs):  # open loop: each submit at its own time
        time.sleep(max(0.0, t0 + i / rate - time.monotonic()))
        r = c.post("/v1/jobs", json=spec)
        r.raise_for_status()
        ids.append(r.json()["id"])
        if forecaster and i % 20 == 0:
            waiting_max = max(waiting_max, int(labelled(
                httpx.get(f"{forecaster.url}/metrics").text, "kairos_forecaster_waiting_jobs",
                kind="scheduler")))
    wall = time.monotonic() - t0
    after = httpx.get(f"{sched}/metrics").text
    b0, s0, n0 = histogram(before, "kairos_scheduler_cycle_seconds", phase="total")
    b1, s1, n1 = histogram(after, "kairos_scheduler_cycle_seconds", phase="total")
    _, p0, m0 = histogram(before, "kairos_scheduler_cycle_seconds", phase="place")
    _, p1, m1 = histogram(after, "kairos_scheduler_cycle_seconds", phase="place")
    out: dict[str, Any] = {"forecaster": "on" if forecaster else "off", "jobs": len(ids),
                           "seconds": round(wall, 1), "buckets": delta(b0, b1),
                           "cycle_sum_s": s1 - s0, "cycles": int(n1 - n0),
                           "cycle_mean_ms": round(1000 * (s1 - s0) / max(1, n1 - n0), 3),
                           "place_mean_ms": round(1000 * (p1 - p0) / max(1, m1 - m0), 3),
                           "loadavg_1m": round(os.getloadavg()[0], 2)}
    if forecaster:
        f_after = httpx.get(f"{forecaster.url}/metrics").text
        _, rs0, rn0 = histogram(f_before, "kairos_forecaster_round_seconds", phase="total")
        _, rs1, rn1 = histogram(f_after, "kairos_forecaster_round_seconds", phase="total")
        rounds = max(1, rn1 - rn0)
        split = {}
        for part in ("load", "forecast", "publish"):
            _, a, _ = histogram(f_before, "kairos_forecaster_round_seconds", phase=part)
            _, b, _ = histogram(f_after, "kairos_forecaster_round_seconds", phase=part)
            split[f"round_{part}_ms"] = round(1000 * (b - a) / rounds, 2)
        out.update(split)
        out.update(rounds=int(rn1 - rn0), round_mean_s=(rs1 - rs0) / max(1, rn1 - rn0),
                   published=int(scalar(f_after, "kairos_forecaster_published_total")
                                 - scalar(f_before, "kairos_forecaster_published_total")),
                   waiting_max=waiting_max,
                   cpu_cores=(sum(psutil.Process(forecaster.popen.pid).cpu_times()[:2]) - cpu0) / wall)
    for j in ids:  # drain: the next phase starts on an empty cluster
        c.delete(f"/v1/jobs/{j}")
    wait("the cluster drained", lambda: not any(
        c.get("/v1/jobs", params={"state": s, "limit": 1}).json()["items"]
        for s in ("pending", "admitted", "bound", "running")))
    time.sleep(2)
    return out


def summary(phases: list[dict[str, Any]]) -> dict[str, Any]:
    """Pooled over the phases (bucket deltas added up), and the median phase mean."""
    buckets: dict[float, float] = {}
    for p in phases:
        for k, v in p["buckets"].items():
            buckets[k] = buckets.get(k, 0.0) + v
    cycles = sum(p["cycles"] for p in phases)
    p50, p99 = quantile(0.5, buckets), quantile(0.99, buckets)
    return {"cycles": cycles,
            "mean_ms": round(1000 * sum(p["cycle_sum_s"] for p in phases) / max(1, cycles), 3),
            "p50_ms": None if p50 is None else round(1000 * p50, 3),
            "p99_ms": None if p99 is None else round(1000 * p99, 3),
            "median_phase_mean_ms": statistics.median(p["cycle_mean_ms"] for p in phases),
            "median_phase_place_ms": statistics.median(p["place_mean_ms"] for p in phases)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=8)
    ap.add_argument("--rate", type=float, default=3.0)
    ap.add_argument("--seconds", type=float, default=40.0)
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--every", type=float, default=1.0, help="seconds between forecast rounds")
    ap.add_argument("--out", default="bench/results/forecaster_overhead.json")
    args = ap.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="kairos-fc-bench-"))
    stack = Stack(workdir=workdir, nodes=args.nodes, gpus_per_node=8, nodes_per_agent=args.nodes,
                  admission_port=free_port(), env={"KAIROS_FORECAST_EVERY_S": str(args.every)})
    stack.start()
    phases: list[dict[str, Any]] = []
    try:
        c = httpx.Client(base_url=stack.url, headers={"Authorization": f"Bearer {stack.token}"},
                         timeout=30)
        specs = workload(int(args.rate * args.seconds), seed=1)
        fc = stack.proc("forecaster")
        for state in ("off", "on") * args.pairs:
            if state == "off":
                stack.stop_proc(fc)
            else:
                fc.wanted = True
                fc.restart()
                wait("the forecaster ready", lambda: ready(fc.url))
                time.sleep(2)  # its first round made
            phases.append(run_phase(stack, c, specs, args.rate, fc if state == "on" else None))
            p = phases[-1]
            print(f"phase {len(phases)} forecaster {state}: {p['cycles']} cycles of "
                  f"{p['cycle_mean_ms']} ms (core {p['place_mean_ms']} ms), load {p['loadavg_1m']}, "
                  f"{p['jobs']} jobs in {p['seconds']} s"
                  + (f", {p['rounds']} rounds of {1000 * p['round_mean_s']:.1f} ms "
                     f"(load {p['round_load_ms']}, forecast {p['round_forecast_ms']}), "
                     f"{p['published']} published, up to {p['waiting_max']} waiting, "
                     f"{p['cpu_cores']:.2f} core" if state == "on" else ""), flush=True)
    finally:
        stack.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    off = summary([p for p in phases if p["forecaster"] == "off"])
    on = summary([p for p in phases if p["forecaster"] == "on"])
    print(f"{'':15}{'cycles':>8}{'mean ms':>10}{'p50 ms':>10}{'p99 ms':>10}"
          f"{'median phase':>14}{'core ms':>9}")
    for name, s in (("forecaster off", off), ("forecaster on", on)):
        print(f"{name:15}{s['cycles']:>8}{s['mean_ms']:>10}{s['p50_ms']:>10}{s['p99_ms']:>10}"
              f"{s['median_phase_mean_ms']:>14}{s['median_phase_place_ms']:>9}")
    result = {
        "bench": "forecaster_overhead",
        "setup": {"nodes": args.nodes, "gpus_per_node": 8, "rate_per_s": args.rate,
                  "seconds_per_phase": args.seconds, "forecast_every_s": args.every,
                  "forecast_nice": 10, "forecast_max_busy": 0.2, "cpus": os.cpu_count(),
                  "earlier_runs": "forecaster_overhead_first_run.json (before the nice, the "
                                  "node-flap fix and index-only reads), _run2.json (before "
                                  "index-only reads and the busy bound)",
                  "order": [p["forecaster"] for p in phases],
                  "cycle_metric": 'kairos_scheduler_cycle_seconds{phase="total"}, deltas per phase; '
                                  "p50/p99 interpolated within buckets"},
        "off": off, "on": on,
        "phases": [{**p, "buckets": {str(k): v for k, v in p["buckets"].items()}} for p in phases],
    }
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
