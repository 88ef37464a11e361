"""A large cluster's control plane: 2,000 simulated nodes x 8 GPUs, idle and under load.

Starts the embedded stack (kairos.stack.Stack: broker, PostgreSQL, admission, queueing,
scheduler, monitor) with the simulated nodes packed many to a node-agent process, every
agent heartbeating and sending per-GPU telemetry at its default interval (5 s each;
nothing here changes them). Then two phases:

1. Idle. Once every node has registered and every consumer's lag has come back under
   0.5 s (the registration burst absorbed), the CPU of each part (each service, the agents
   together, the broker, PostgreSQL) over a window with no jobs and nothing scraped:
   the cost of merely keeping 2,000 nodes alive.

2. Load. Mixed jobs submitted over HTTP at a steady rate (open loop, as a real client
   would: Authorization: Bearer, an Idempotency-Key per request), 5-30 s long so the
   cluster never fills:
       1 GPU (50%), 4 GPUs on one node (20%), a 2 x 8-GPU gang (10%),
       a share of one GPU (20%: 20 GiB, 25% of its compute).
   Measured over the submit window:
   - submit -> bound: HTTP 201 to the agent's 'running' report for the job's last task
     (read from jobs.status; the report's occurred_at is the agent's clock, the same
     machine's), p50/p99, overall and per kind;
   - the scheduler's cycle p50/p99: bucket deltas of its kairos_scheduler_cycle_seconds
     histogram (phase "total"), so each figure is the upper bound of a bucket;
   - each consumer group's lag, in seconds, sampled every --scrape-s (below); its
     maximum, and whether it grows (the median of the last third of the samples above
     the median of the first third by more than 0.25 s and by more than 50%: medians,
     so that one spike is not read as growth);
   - CPU cores per part;
   - lost jobs: accepted (201) but with no terminal state (succeeded, failed,
     cancelled) on jobs.status by the end of the drain window.

Lag in seconds. Every consumer exports kairos_consumer_lag{group, topic, partition}:
messages between the highwater of its last fetch and its position, refreshed at most
once a second. This bench also samples every partition's end offset from the broker at
each scrape, and turns a lag of L messages into the age of the oldest message the group
has not consumed: the position is end - L, and the time the partition's end passed that
offset is interpolated in the sampled (time, end offset) history (the "time lag" of
kafka-lag-exporter). Unlike L / rate, this holds for bursty topics. A consumer keeping
up reads 0. The gauge can be up to about a second old (more while the service's loop is
blocked), so one figure can be off by about that much either way; a consumer falling
behind for good shows in lag_growing, and the JSON keeps every sample (lag_series_s).

A /metrics over 1 MB (the monitor's: per-GPU gauges, ~16,000 GPUs here) is scraped
only every --large-scrape-s, so that this bench does not become the monitor's largest
load; Prometheus would scrape it every 15-30 s.

CPU is read per process (psutil) for this stack's processes only: its services and
agents, its broker and its PostgreSQL's postmaster with its backends (another stack on
the same machine is not counted). The bench client is reported beside, not in totals.

    python bench/cluster_scale.py [--nodes 2000] [--nodes-per-agent 250] [--rate 20]
        [--seconds 120] [--idle-seconds 60] [--out bench/results/cluster_scale.json]

250 nodes per agent process (8 processes at 2,000 nodes): bench/agents_scale.py measured
one process with 300 nodes at 5% of a core with heartbeats every 2 s and a 300-binding
burst carried out in < 0.6 s, so 250 stays within what was measured, and 8 processes
rather than 125 of 16 keep the per-process overhead (interpreter, idle fetch loops,
HTTP server) from dominating the idle figure.

Prints a table and writes the JSON (targets: every lag < 2 s and not growing, p99
submit -> bound < 500 ms, the idle platform < 0.5 core).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from bisect import bisect_right
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import psutil
from aiokafka import AIOKafkaConsumer, TopicPartition

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

# helpers shared with bench/e2e_latency.py (bench/ is on the path above)
from e2e_latency import bucket_quantile, cpu_ms_per_job, pct  # noqa: E402
from rawhttp import RawHttpClient, TransportError  # noqa: E402

from kairos.embedded import free_port  # noqa: E402
from kairos.stack import Stack  # noqa: E402
from services.node_agent.settings import AgentSettings  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "cluster_scale.json"
TERMINAL = ("succeeded", "failed", "cancelled")
BENCH_CLIENT = "bench client"


class ScaleStack(Stack):
    """The stack, given longer to come up: thousands of nodes register through a few
    agent processes on a small machine (Stack.start waits 90 s)."""

    ready_timeout_s: float = 600

    def wait_ready(self, timeout_s: float = 90.0) -> None:
        super().wait_ready(max(timeout_s, self.ready_timeout_s))


# --- the job mix ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Kind:
    name: str
    weight: float
    tasks: list[dict[str, Any]]
    min_available: int | None = None

    @property
    def replicas(self) -> int:  # the task reports that make the job fully bound
        return sum(t.get("replicas", 1) for t in self.tasks)

    def spec(self, duration: float) -> dict[str, Any]:
        spec: dict[str, Any] = {"name": f"scale-{self.name}", "duration": duration,
                                "tasks": self.tasks}
        if self.min_available:
            spec["minAvailable"] = self.min_available
        return spec


KINDS = (
    Kind("gpu1", 0.5, [{"name": "w", "resources": {"gpu": 1}}]),
    Kind("gpu4", 0.2, [{"name": "w", "resources": {"gpu": 4}}]),
    Kind("gang2x8", 0.1, [{"name": "w", "replicas": 2, "resources": {"gpu": 8}}],
         min_available=2),
    Kind("share", 0.2, [{"name": "w", "resources": {"gpuMemory": 20480, "gpuCompute": 25}}]),
)
BY_KIND = {k.name: k for k in KINDS}


# --- CPU of this stack's processes ----------------------------------------------------------


def stack_pids(stack: Stack) -> dict[int, str]:
    """Pid -> part for this stack only (e2e_latency's cpu_by_process matches any Tansu
    broker and any pgserver process: wrong beside another stack on the same machine)."""
    parts = {p.popen.pid: p.name.split("#")[0] for p in stack.procs}
    broker = getattr(stack._broker, "_proc", None)
    if broker is not None:
        parts[broker.pid] = "broker"
    lock = stack.workdir / "pg" / "postmaster.pid"
    if stack._pg is not None and lock.exists():
        try:
            postmaster = psutil.Process(int(lock.read_text().split()[0]))
            for proc in [postmaster, *postmaster.children(recursive=True)]:
                parts[proc.pid] = "postgresql"
        except (psutil.Error, ValueError):
            pass
    parts[os.getpid()] = BENCH_CLIENT
    return parts


def cpu_reading(stack: Stack) -> dict[int, tuple[str, float]]:
    """CPU seconds used so far, by pid, with its part (the shape cpu_ms_per_job takes)."""
    out: dict[int, tuple[str, float]] = {}
    for pid, part in stack_pids(stack).items():
        try:
            t = psutil.Process(pid).cpu_times()
            out[pid] = (part, t.user + t.system)
        except psutil.Error:
            pass
    return out


def cores_by_part(before: dict[int, tuple[str, float]], after: dict[int, tuple[str, float]],
                  wall_s: float) -> dict[str, float]:
    """Cores each part kept busy between two readings (processes alive at both)."""
    ms = cpu_ms_per_job(before, after, 1)
    return {part: round(v / 1000 / wall_s, 3) for part, v in ms.items()}


def platform_total(cores: dict[str, float]) -> float:
    return round(sum(v for part, v in cores.items() if part != BENCH_CLIENT), 3)


# --- consumer lag, in messages and in seconds -----------------------------------------------

LAG_LINE = re.compile(r"^kairos_consumer_lag\{([^}]*)\} (\S+)$", re.M)
CYCLE_LINE = re.compile(r'^kairos_scheduler_cycle_seconds_bucket\{([^}]*)\} (\S+)$', re.M)
LABEL = re.compile(r'(\w+)="([^"]*)"')
LARGE_METRICS = 1_000_000  # bytes


def parse_lags(text: str) -> list[tuple[str, TopicPartition, float]]:
    out = []
    for labels, value in LAG_LINE.findall(text):
        lab = dict(LABEL.findall(labels))
        out.append((lab["group"], TopicPartition(lab["topic"], int(lab["partition"])),
                    float(value)))
    return out


def cycle_buckets(text: str, phase: str = "total") -> dict[float, float]:
    """The scheduler's cycle histogram (cumulative count per bucket upper bound)."""
    out: dict[float, float] = {}
    for labels, value in CYCLE_LINE.findall(text):
        lab = dict(LABEL.findall(labels))
        if lab.get("phase") == phase:
            le = lab["le"]
            out[float("inf") if le == "+Inf" else float(le)] = float(value)
    return out


class EndOffsets:
    """Each partition's end offset over time, sampled from the broker, to date offsets."""

    def __init__(self, bootstrap: str) -> None:
        self._consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
        self.history: dict[TopicPartition, tuple[list[float], list[int]]] = defaultdict(
            lambda: ([], []))

    async def start(self) -> None:
        await self._consumer.start()

    async def stop(self) -> None:
        await self._consumer.stop()

    async def sample(self, tps: set[TopicPartition]) -> dict[TopicPartition, int]:
        ends = await self._consumer.end_offsets(list(tps)) if tps else {}
        now = time.time()
        for tp, end in ends.items():
            times, offsets = self.history[tp]
            times.append(now)
            offsets.append(end)
        return ends

    def produced_at(self, tp: TopicPartition, offset: int) -> float:
        """When the message at ``offset`` reached the broker, interpolated between the
        last sample that did not have it yet and the first that did (the first sample
        when it is older than every sample: a lower bound of its age)."""
        times, offsets = self.history[tp]
        i = bisect_right(offsets, offset)  # first sample whose end is past the offset
        if i == 0:
            return times[0]
        if i == len(offsets):  # not produced yet as far as we know: it is no lag
            return times[-1]
        t0, e0, t1, e1 = times[i - 1], offsets[i - 1], times[i], offsets[i]
        return t0 + (t1 - t0) * (offset - e0 + 1) / (e1 - e0)


@dataclass
class LagSample:
    t: float
    seconds: dict[str, float]  # group -> worst partition's age of its oldest unread message
    messages: dict[str, float]  # group -> worst partition's lag in messages
    topic: dict[str, str]  # group -> the topic of that worst partition


@dataclass
class Scraper:
    """Reads every process's /metrics: the consumer lags (and the scheduler's cycle
    histogram, on demand)."""

    stack: Stack
    ends: EndOffsets
    large_every_s: float
    client: httpx.AsyncClient = field(default_factory=lambda: httpx.AsyncClient(timeout=30))
    samples: list[LagSample] = field(default_factory=list)
    metrics_bytes: dict[str, int] = field(default_factory=dict)
    _next: dict[str, float] = field(default_factory=dict)  # when a large one is due again

    async def _fetch(self, url: str) -> str | None:
        try:
            r = await self.client.get(url)
            return r.text if r.status_code == 200 else None
        except httpx.HTTPError:
            return None

    async def sample(self, force: bool = False) -> LagSample:
        """One lag sample of every group whose process was scraped now (a large /metrics
        only when due, or ``force``d): a gauge read earlier is not reused against a newer
        end offset, which would date it wrongly."""
        now = time.monotonic()
        due = [p for p in self.stack.procs if force or self._next.get(p.name, 0.0) <= now]
        texts = await asyncio.gather(*(self._fetch(f"{p.url}/metrics") for p in due))
        lags: list[tuple[str, TopicPartition, float]] = []
        for proc, text in zip(due, texts, strict=True):
            if text is None:
                continue
            self.metrics_bytes[proc.name] = len(text)
            if len(text) > LARGE_METRICS:
                self._next[proc.name] = now + self.large_every_s
            lags += parse_lags(text)
        ends = await self.ends.sample({tp for _, tp, _ in lags})
        t = time.time()
        seconds: dict[str, float] = defaultdict(float)
        messages: dict[str, float] = defaultdict(float)
        topic: dict[str, str] = {}
        for group, tp, lag in lags:
            age = 0.0
            if lag > 0 and tp in ends:
                age = max(0.0, t - self.ends.produced_at(tp, int(ends[tp] - lag)))
            if age > seconds[group] or group not in topic:
                seconds[group] = age
                topic[group] = tp.topic
            messages[group] = max(messages[group], lag)
        s = LagSample(t, dict(seconds), dict(messages), topic)
        self.samples.append(s)
        return s

    async def scheduler_cycles(self) -> dict[float, float]:
        text = await self._fetch(f"{self.stack.proc('scheduler').url}/metrics")
        return cycle_buckets(text or "")

    async def close(self) -> None:
        await self.client.aclose()


async def sample_every(scraper: Scraper, every_s: float, stop: asyncio.Event) -> None:
    while not stop.is_set():
        await scraper.sample()
        try:
            await asyncio.wait_for(stop.wait(), every_s)
        except TimeoutError:
            pass


def summarize_lag(samples: list[LagSample]) -> dict[str, Any]:
    """Per group: its largest lag, and whether it grows over the run."""
    groups = sorted({g for s in samples for g in s.seconds})
    out: dict[str, Any] = {"max_lag_s": {}, "max_lag_topic": {}, "max_lag_messages": {},
                           "lag_growing": {}, "lag_first_third_median_s": {},
                           "lag_last_third_median_s": {}, "lag_series_s": {}}
    for g in groups:
        # the samples that read this group (a large /metrics is read less often)
        series = [s.seconds[g] for s in samples if g in s.seconds]
        third = max(1, len(series) // 3)
        first = statistics.median(series[:third])
        last = statistics.median(series[-third:])
        worst = max((s for s in samples if g in s.seconds), key=lambda s: s.seconds[g])
        out["max_lag_s"][g] = round(worst.seconds[g], 3)
        out["max_lag_topic"][g] = worst.topic[g]
        out["max_lag_messages"][g] = max(s.messages[g] for s in samples if g in s.messages)
        # under 0.25 s the difference is sampling noise (2 s samples, a 1 s gauge)
        out["lag_growing"][g] = last - first > max(0.25, 0.5 * first)
        out["lag_first_third_median_s"][g] = round(first, 3)
        out["lag_last_third_median_s"][g] = round(last, 3)
        out["lag_series_s"][g] = [round(v, 2) for v in series]
    return out


SETTLED_LAG_S = 0.5


async def settle(scraper: Scraper, min_s: float, max_s: float) -> tuple[float, bool]:
    """Wait until every consumer's lag has read under SETTLED_LAG_S twice in a row (not
    0 messages: with hundreds of heartbeats a second, a consumer keeping up may still
    hold a few), and at least ``min_s`` (consumer groups join, the first telemetry
    round goes out); the seconds waited, and whether it settled before ``max_s``."""
    start = time.monotonic()
    quiet = 0
    while time.monotonic() - start < max_s:
        s = await scraper.sample(force=True)  # every process, the monitor's too
        quiet = quiet + 1 if s.seconds and max(s.seconds.values()) < SETTLED_LAG_S else 0
        if quiet >= 2 and time.monotonic() - start >= min_s:
            return round(time.monotonic() - start, 1), True
        await asyncio.sleep(2)
    return round(time.monotonic() - start, 1), False


# --- jobs: submit, and follow on jobs.status ------------------------------------------------


class JobTail:
    """Reads jobs.status from now on: per job, when each task first reported running and
    whether the job reached a terminal state. Times come from the events' occurred_at,
    so a lazy fetch (200 ms) costs the broker less and does not change them."""

    def __init__(self, bootstrap: str) -> None:
        self._consumer = AIOKafkaConsumer("jobs.status", bootstrap_servers=bootstrap,
                                          auto_offset_reset="latest", fetch_max_wait_ms=200,
                                          max_poll_records=5000)
        self.running: dict[str, dict[str, float]] = defaultdict(dict)  # job -> task -> t
        self.ended: dict[str, str] = {}
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        await self._consumer.start()
        while not self._consumer.assignment():
            await asyncio.sleep(0.05)
        for tp in self._consumer.assignment():
            await self._consumer.position(tp)  # "latest" now, not at the first fetch
        self._task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        while True:
            batch = await self._consumer.getmany(timeout_ms=500)
            for records in batch.values():
                for r in records:
                    env = json.loads(r.value or b"{}")
                    if env.get("type") != "job.status":
                        continue
                    d = env["data"]
                    if d.get("task") is None:
                        if d["state"] in TERMINAL:
                            self.ended.setdefault(d["job_id"], d["state"])
                    elif d["state"] == "running":
                        t = datetime.fromisoformat(env["occurred_at"]).timestamp()
                        self.running[d["job_id"]].setdefault(d["task"], t)

    async def stop(self) -> None:
        if self._task:
            self._task.cancel()
        await self._consumer.stop()


@dataclass
class Submitted:
    accepted: dict[str, tuple[str, float]] = field(default_factory=dict)  # id -> kind, 201 at
    errors: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    behind_s: float = 0.0  # how far the client fell behind its schedule
    elapsed_s: float = 0.0


async def submit(stack: Stack, rate: float, seconds: float, rng: random.Random) -> Submitted:
    """Mixed jobs at a steady rate, open loop: a slow answer does not slow the next."""
    out = Submitted()
    url = httpx.URL(stack.url)
    # the lean client (bench/rawhttp.py): httpx cost as much CPU as the gateway
    c = RawHttpClient(url.host, url.port or 80, connections=128, headers={
        "Authorization": f"Bearer {stack.token}", "Content-Type": "application/json"})

    async def one(kind: Kind, duration: float) -> None:
        body = json.dumps(kind.spec(duration)).encode()
        # an idempotency key makes retrying a transport error safe
        headers = {"Idempotency-Key": uuid.uuid4().hex}
        for attempt in range(3):
            try:
                r = await c.post("/v1/jobs", body, headers)
                break
            except TransportError as exc:
                if attempt == 2:
                    out.errors[type(exc).__name__] += 1
                    return
        if r.status_code == 201:
            out.accepted[r.json()["id"]] = (kind.name, time.time())
        else:
            out.errors[f"http {r.status_code}"] += 1

    start = time.monotonic()
    tasks = []
    for i in range(int(rate * seconds)):
        delay = start + i / rate - time.monotonic()
        out.behind_s = max(out.behind_s, -delay)
        if delay > 0:
            await asyncio.sleep(delay)
        kind = rng.choices(KINDS, weights=[k.weight for k in KINDS])[0]
        tasks.append(asyncio.create_task(one(kind, round(rng.uniform(5, 30), 1))))
    await asyncio.gather(*tasks)
    out.elapsed_s = time.monotonic() - start
    await c.aclose()
    return out


async def drain(tail: JobTail, jobs: dict[str, Any], window_s: float) -> int:
    """Wait for every accepted job to end, up to ``window_s``; the jobs that did not."""
    deadline = time.monotonic() + window_s
    while time.monotonic() < deadline:
        if all(j in tail.ended for j in jobs):
            break
        await asyncio.sleep(1)
    return sum(1 for j in jobs if j not in tail.ended)


def bound_latencies(sub: Submitted, tail: JobTail) -> dict[str, list[float]]:
    """Per kind, ms from the 201 to the running report of the job's last task."""
    out: dict[str, list[float]] = defaultdict(list)
    for job, (kind, t201) in sub.accepted.items():
        tasks = tail.running.get(job, {})
        if len(tasks) >= BY_KIND[kind].replicas:
            out[kind].append((max(tasks.values()) - t201) * 1000)
    return out


# --- the phases -----------------------------------------------------------------------------


async def idle_phase(stack: Stack, args: argparse.Namespace, scraper: Scraper
                     ) -> dict[str, Any]:
    print("waiting for the cluster to settle (every consumer's lag at 0) ...", flush=True)
    settled_s, settled = await settle(scraper, args.settle_seconds, args.settle_max_seconds)
    print(f"{'settled' if settled else 'NOT settled (lag stayed up)'} after {settled_s:g} s; "
          f"idle window of {args.idle_seconds:g} s ...", flush=True)
    # nothing scraped, no jobs, no reader of ours: only the platform keeping nodes alive
    cpu0, t0 = cpu_reading(stack), time.monotonic()
    await asyncio.sleep(args.idle_seconds)
    cores = cores_by_part(cpu0, cpu_reading(stack), time.monotonic() - t0)
    return {"settled_after_s": settled_s, "settled": settled, "idle_cpu_cores": platform_total(cores),
            "idle_cpu_cores_by_part": cores}


async def load_phase(stack: Stack, args: argparse.Namespace, scraper: Scraper
                     ) -> dict[str, Any]:
    tail = JobTail(stack.kafka_bootstrap or "")
    await tail.start()
    scraper.samples.clear()  # the lag series of the load window only
    cycles0 = await scraper.scheduler_cycles()
    stop = asyncio.Event()
    sampler = asyncio.create_task(sample_every(scraper, args.scrape_s, stop))
    print(f"load: {args.rate:g} submits/s for {args.seconds:g} s ...", flush=True)
    cpu0, t0 = cpu_reading(stack), time.monotonic()
    sub = await submit(stack, args.rate, args.seconds, random.Random(args.seed))
    cpu1, t1 = cpu_reading(stack), time.monotonic()
    stop.set()
    await sampler
    cycles1 = await scraper.scheduler_cycles()
    print(f"accepted {len(sub.accepted)}; draining (up to {args.drain_seconds:g} s) ...",
          flush=True)
    lost = await drain(tail, sub.accepted, args.drain_seconds)
    await tail.stop()

    by_kind = bound_latencies(sub, tail)
    bound = [v for vs in by_kind.values() for v in vs]
    cores = cores_by_part(cpu0, cpu1, t1 - t0)
    cycles = (cycles1.get(float("inf"), 0.0) - cycles0.get(float("inf"), 0.0))
    return {
        "accepted": len(sub.accepted),
        "submits_per_s": round(len(sub.accepted) / sub.elapsed_s, 1),
        "errors": dict(sub.errors),
        "client_behind_s": round(sub.behind_s, 2),
        "lost": lost,
        "bound_measured": len(bound),
        "p50_bound_ms": round(pct(bound, 50), 1),
        "p99_bound_ms": round(pct(bound, 99), 1),
        "p99_bound_ms_by_kind": {k: round(pct(v, 99), 1) for k, v in sorted(by_kind.items())},
        "cycle_p50_ms": bucket_quantile(cycles0, cycles1, 50),
        "cycle_p99_ms": bucket_quantile(cycles0, cycles1, 99),
        "cycles_per_s": round(cycles / (t1 - t0), 2),
        "cpu_cores": cores,
        "cpu_cores_total": platform_total(cores),
        "lag_samples": len(scraper.samples),
        **summarize_lag(scraper.samples),
    }


def targets(r: dict[str, Any]) -> dict[str, bool]:
    lags = r["max_lag_s"].values()
    return {
        "lag_under_2s_not_growing": bool(lags) and all(v < 2 for v in lags)
        and not any(r["lag_growing"].values()),
        "p99_bound_under_500ms": r["p99_bound_ms"] < 500,  # NaN (nothing bound) fails
        "idle_under_half_core": r["idle_cpu_cores"] < 0.5,
        "nothing_lost": r["lost"] == 0,
    }


async def phases(stack: Stack, args: argparse.Namespace) -> dict[str, Any]:
    ends = EndOffsets(stack.kafka_bootstrap or "")
    await ends.start()
    scraper = Scraper(stack, ends, args.large_scrape_s)
    try:
        idle = await idle_phase(stack, args, scraper)
        print(json.dumps(idle), flush=True)
        load = await load_phase(stack, args, scraper)
    finally:
        await scraper.close()
        await ends.stop()
    return {**idle, **load, "metrics_bytes": scraper.metrics_bytes}


def print_table(r: dict[str, Any]) -> None:
    print(f"\n{r['nodes']} nodes x {r['gpus_per_node']} GPUs, {r['agent_processes']} agent "
          f"processes; {r['rate']:g} submits/s for {r['seconds']:g} s "
          f"({r['submits_per_s']:g}/s achieved, {r['accepted']} accepted, {r['lost']} lost)")
    print(f"submit->bound p50 / p99: {r['p50_bound_ms']} / {r['p99_bound_ms']} ms  "
          f"by kind p99: {r['p99_bound_ms_by_kind']}")
    print(f"scheduler cycle p50 / p99 (bucket bound): {r['cycle_p50_ms']} / "
          f"{r['cycle_p99_ms']} ms, {r['cycles_per_s']} cycles/s")
    print(f"\n {'consumer group':<30} {'max lag s':>9} {'(topic)':<16} {'max msgs':>8} "
          f"{'1st/3rd s':>9} {'last/3rd s':>10}  growing")
    for g, v in r["max_lag_s"].items():
        print(f" {g:<30} {v:9.3f} {r['max_lag_topic'][g]:<16} "
              f"{r['max_lag_messages'][g]:8.0f} {r['lag_first_third_median_s'][g]:9.3f} "
              f"{r['lag_last_third_median_s'][g]:10.3f}  {r['lag_growing'][g]}")
    print(f"\n {'part':<14} {'idle cores':>10} {'load cores':>10}")
    for part in sorted(set(r["idle_cpu_cores_by_part"]) | set(r["cpu_cores"])):
        print(f" {part:<14} {r['idle_cpu_cores_by_part'].get(part, 0):10.3f} "
              f"{r['cpu_cores'].get(part, 0):10.3f}")
    print(f" {'platform':<14} {r['idle_cpu_cores']:10.3f} {r['cpu_cores_total']:10.3f}")
    print("\ntargets: " + ", ".join(f"{k} {'PASS' if v else 'FAIL'}"
                                    for k, v in r["targets"].items()))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=2000)
    ap.add_argument("--nodes-per-agent", type=int, default=250,
                    help="simulated nodes per node-agent process")
    ap.add_argument("--rate", type=float, default=20, help="submits per second")
    ap.add_argument("--seconds", type=float, default=120, help="the submit window")
    ap.add_argument("--idle-seconds", type=float, default=60, help="the idle window")
    ap.add_argument("--drain-seconds", type=float, default=60,
                    help="after the last submit, how long jobs may take to end (jobs run "
                    "5-30 s) before one still not ended counts as lost")
    ap.add_argument("--settle-seconds", type=float, default=15,
                    help="the least wait before the idle window")
    ap.add_argument("--settle-max-seconds", type=float, default=180)
    ap.add_argument("--scrape-s", type=float, default=2, help="lag sampling interval")
    ap.add_argument("--large-scrape-s", type=float, default=10,
                    help="the interval for a /metrics over 1 MB (the monitor's)")
    ap.add_argument("--seed", type=int, default=16)
    ap.add_argument("--out", type=Path, default=RESULTS)
    ap.add_argument("--keep", action="store_true", help="keep the stack's workdir (logs)")
    args = ap.parse_args()

    workdir = Path(tempfile.mkdtemp(prefix="kairos-scale-"))
    stack = ScaleStack(workdir=workdir, nodes=args.nodes, gpus_per_node=8,
                  nodes_per_agent=args.nodes_per_agent, admission_port=free_port(),
                  env={"KAIROS_LOG_LEVEL": "WARNING"})
    agents = -(-args.nodes // args.nodes_per_agent)
    print(f"starting the stack: {args.nodes} simulated nodes x 8 GPUs in {agents} agent "
          f"processes ({workdir}) ...", flush=True)
    started = time.monotonic()
    try:
        stack.start()
        print(f"all {args.nodes} nodes registered after {time.monotonic() - started:.1f} s",
              flush=True)
        measured = asyncio.run(phases(stack, args))
    finally:
        stack.stop()
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
    defaults = AgentSettings()
    result: dict[str, Any] = {
        "nodes": args.nodes,
        "gpus_per_node": 8,
        "nodes_per_agent": args.nodes_per_agent,
        "agent_processes": agents,
        "rate": args.rate,
        "seconds": args.seconds,
        "idle_seconds": args.idle_seconds,
        "drain_seconds": args.drain_seconds,
        "scrape_s": args.scrape_s,
        "large_scrape_s": args.large_scrape_s,
        "seed": args.seed,
        "heartbeat_s": defaults.heartbeat_s,
        "telemetry_s": defaults.telemetry_s,
        "mix": {k.name: {"weight": k.weight, "spec": k.spec(0)} for k in KINDS},
        "job_seconds": [5, 30],
        "lag_seconds_method": "age of the oldest unconsumed message: position = sampled "
                              "end offset - kairos_consumer_lag, dated by interpolation in "
                              "the sampled end-offset history",
        "machine": f"{os.cpu_count()} cores",
        **measured,
    }
    result["targets"] = targets(result)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print_table(result)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
