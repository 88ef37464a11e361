"""End-to-end latency of the platform, beside the floor of the broker itself.

Starts the embedded stack (32 simulated nodes x 8 GPUs), submits 1-GPU, 1-second jobs
over HTTP at steady rates, and reads the topics to time each job:

  submit -> bound    HTTP 201 to the agent receiving its binding (the agent's
                     'started' report, stamped when it handled the binding)
  submit -> running  HTTP 201 to the job-level 'running' transition

A negative submit -> bound means the 201 reached the client after the agent had the
binding (a slow HTTP response under load); request sent -> bound is reported beside it.
Also reported: the CPU each part of the platform spends per job.

In the same run, the floor: a bare chain of four consumer->producer relays through the
same broker, at the same rates, with the same consumer tuning.

    python bench/e2e_latency.py [--rates 50,100,200] [--seconds 60]

Prints a table and writes bench/results/e2e_latency.json, and bench/results/load.json:
the highest rate held (achieved within 5% of the target, no request failed, nothing
lost), its p99 submit -> bound, whether that p99 is within 3x the floor's, and every
job lost at any rate.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections import defaultdict
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from rawhttp import RawHttpClient, TransportError  # noqa: E402

from kairos.embedded import free_port  # noqa: E402
from kairos.stack import Stack  # noqa: E402

LOAD_RESULTS = ROOT / "bench" / "results" / "load.json"
RESULTS = ROOT / "bench" / "results" / "e2e_latency.json"
SPEC = {"name": "bench", "duration": 1.0, "tasks": [{"name": "w", "resources": {"gpu": 1}}]}


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, round(q / 100 * (len(s) - 1)))]


class TopicTail:
    """Reads jobs.status (and, with ``split_submit``, jobs.submitted, whose record
    timestamp is when admission's relay sent it) from now on and keeps, per job, the
    times that matter. The second reader is off by default: measured, it adds ~100 ms
    to queueing's hop at 20/s (a third reader of that topic on the embedded broker), so
    figures with it are not comparable with those without."""

    def __init__(self, bootstrap: str, split_submit: bool = False) -> None:
        self.bootstrap = bootstrap
        self.topics = ["jobs.status"] + (["jobs.submitted"] if split_submit else [])
        self.times: dict[str, dict[str, float]] = defaultdict(dict)
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._consumer = AIOKafkaConsumer(
            *self.topics, bootstrap_servers=self.bootstrap, auto_offset_reset="latest",
            fetch_max_wait_ms=20, max_poll_records=2000)
        await self._consumer.start()
        while not self._consumer.assignment():
            await asyncio.sleep(0.05)
        for tp in self._consumer.assignment():
            await self._consumer.position(tp)
        self._task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        while True:
            batch = await self._consumer.getmany(timeout_ms=100)
            for records in batch.values():
                for r in records:
                    env = json.loads(r.value or b"{}")
                    if env.get("type") == "job.submitted":  # CreateTime: the relay's send
                        self.times[env["data"]["job_id"]].setdefault("sent", r.timestamp / 1000)
                    if env.get("type") != "job.status":
                        continue
                    d = env["data"]
                    t = datetime.fromisoformat(env["occurred_at"]).timestamp()
                    key = d["state"] if d.get("task") is None else f"task_{d['state']}"
                    self.times[d["job_id"]].setdefault(key, t)

    async def stop(self) -> None:
        if self._task:
            self._task.cancel()
        await self._consumer.stop()


async def drive(stack: Stack, rate: float, seconds: float) -> dict[str, float]:
    """Submit at a steady rate (open loop), return the 201 times by job id. The client is
    bench/rawhttp.py: a lean one, so that the generator takes little of the two cores it
    shares with what it measures."""
    accepted: dict[str, float] = {}
    sent_at: dict[str, float] = {}
    errors: dict[str, int] = defaultdict(int)
    url = httpx.URL(stack.url)
    c = RawHttpClient(url.host, url.port or 80, connections=128, headers={
        "Authorization": f"Bearer {stack.token}", "Content-Type": "application/json"})
    body = json.dumps(SPEC).encode()

    async def one() -> None:
        # a real client: an idempotency key makes retrying a transport error safe
        headers = {"Idempotency-Key": uuid.uuid4().hex}
        sent = time.time()
        for attempt in range(3):
            try:
                r = await c.post("/v1/jobs", body, headers)
                break
            except TransportError as exc:
                if attempt == 2:
                    errors[type(exc).__name__] += 1
                    return
        if r.status_code == 201:
            accepted[r.json()["id"]] = time.time()
            sent_at[r.json()["id"]] = sent
        else:
            errors[f"http {r.status_code}"] += 1

    start = time.monotonic()
    n = int(rate * seconds)
    tasks = []
    behind = 0.0
    for i in range(n):
        delay = start + i / rate - time.monotonic()
        behind = max(behind, -delay)
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one()))
    await asyncio.gather(*tasks)
    elapsed = time.monotonic() - start
    await c.aclose()
    return {"accepted": accepted, "sent": sent_at, "errors": errors,  # type: ignore[dict-item]
            "elapsed": elapsed, "behind_s": behind}


def submit_buckets(stack: Stack) -> dict[float, float]:
    """The gateway's own histogram of accepted submits (cumulative count per bucket):
    its view of their latency, which a client on a saturated machine cannot give (its
    own event loop lags behind)."""
    text = httpx.get(f"{stack.url}/metrics", timeout=10).text
    out: dict[float, float] = {}
    for line in text.splitlines():
        if line.startswith("kairos_admission_submit_seconds_bucket{") and \
                'outcome="accepted"' in line:
            le = line.split('le="')[1].split('"')[0]
            out[float("inf") if le == "+Inf" else float(le)] = float(line.rsplit(" ", 1)[1])
    return out


def bucket_quantile(before: dict[float, float], after: dict[float, float],
                    q: float) -> float | None:
    """The upper bound (ms) of the bucket holding the q-th percentile of what was
    observed between the two readings (past the last finite bucket: that bucket's bound,
    read "at least"); None when nothing was."""
    delta = sorted((le, after[le] - before.get(le, 0.0)) for le in after)
    total = delta[-1][1] if delta else 0.0
    if total <= 0:
        return None
    finite = [le for le, _ in delta if le != float("inf")]
    for le, n in delta:
        if n >= total * q / 100:
            return (le if le != float("inf") else finite[-1]) * 1000
    return finite[-1] * 1000


def cpu_by_process(stack: Stack) -> dict[int, tuple[str, float]]:
    """CPU seconds used so far by each process of the platform: every service, the
    broker, PostgreSQL's processes, and this benchmark client."""
    import psutil

    parts = {p.popen.pid: p.name.split("#")[0] for p in stack.procs}
    out: dict[int, tuple[str, float]] = {}
    for proc in psutil.process_iter(["pid", "username", "cmdline"]):
        try:
            cmd = " ".join(proc.info["cmdline"] or [])
            if proc.info["pid"] in parts:
                part = parts[proc.info["pid"]]
            elif "tansu" in cmd and "broker" in cmd:
                part = "broker"
            elif proc.info["username"] == "pgserver":
                part = "postgresql"
            elif proc.info["pid"] == os.getpid():
                part = "bench client"
            else:
                continue
            t = proc.cpu_times()
            out[proc.info["pid"]] = (part, t.user + t.system)
        except psutil.Error:
            pass
    return out


def cpu_ms_per_job(before: dict[int, tuple[str, float]], after: dict[int, tuple[str, float]],
                   jobs: int) -> dict[str, float]:
    """Per part, CPU spent between the two readings by processes alive at both (a
    PostgreSQL backend that came and went in between is not counted)."""
    spent: dict[str, float] = defaultdict(float)
    for pid, (part, t1) in after.items():
        if pid in before:
            spent[part] += t1 - before[pid][1]
    return {k: round(v * 1000 / max(1, jobs), 2) for k, v in sorted(spent.items())}


async def measure_rate(stack: Stack, rate: float, seconds: float,
                       drain_s: float = 30, split_submit: bool = False) -> dict[str, Any]:
    tail = TopicTail(stack.kafka_bootstrap or "", split_submit)
    await tail.start()
    cpu0 = cpu_by_process(stack)
    gate0 = submit_buckets(stack)
    run = await drive(stack, rate, seconds)
    gate1 = submit_buckets(stack)
    accepted: dict[str, float] = run["accepted"]  # type: ignore[assignment]
    deadline = time.monotonic() + drain_s
    terminal = ("succeeded", "failed", "cancelled")
    while time.monotonic() < deadline:
        done = sum(1 for j in accepted if any(s in tail.times.get(j, {}) for s in terminal))
        if done == len(accepted):
            break
        await asyncio.sleep(0.5)
    await tail.stop()
    cpu = cpu_ms_per_job(cpu0, cpu_by_process(stack), len(run["accepted"]))  # type: ignore[arg-type]
    sent: dict[str, float] = run["sent"]  # type: ignore[assignment]
    bound, running, from_sent, http, phases = [], [], [], [], defaultdict(list)
    lost = 0
    for job, t201 in accepted.items():
        t = tail.times.get(job, {})
        if not any(s in t for s in terminal):
            lost += 1
        http.append((t201 - sent[job]) * 1000)
        if "task_running" in t:
            bound.append((t["task_running"] - t201) * 1000)
            from_sent.append((t["task_running"] - sent[job]) * 1000)
        if "running" in t:
            running.append((t["running"] - t201) * 1000)
        if {"sent", "admitted"} <= t.keys():  # admission's relay, then queueing's hop
            phases["http_201_to_submitted_sent"].append((t["sent"] - t201) * 1000)
            phases["submitted_sent_to_admitted"].append((t["admitted"] - t["sent"]) * 1000)
        if {"admitted", "bound", "task_running"} <= t.keys():
            phases["http_201_to_admitted"].append((t["admitted"] - t201) * 1000)
            phases["admitted_to_bound"].append((t["bound"] - t["admitted"]) * 1000)
            phases["bound_to_agent"].append((t["task_running"] - t["bound"]) * 1000)
        if {"task_running", "running"} <= t.keys():
            phases["agent_to_job_running"].append((t["running"] - t["task_running"]) * 1000)
    elapsed = float(run["elapsed"])  # type: ignore[arg-type]
    return {
        "target_rate": rate,
        "submits_per_s": round(len(accepted) / elapsed, 1),
        "accepted": len(accepted),
        "errors": sum(run["errors"].values()),  # type: ignore[attr-defined]
        "error_kinds": dict(run["errors"]),  # type: ignore[call-overload]
        # refused at once as overloaded: nothing stored, a client retries after Retry-After
        "refused_429": run["errors"].get("http 429", 0),  # type: ignore[attr-defined]
        "lost": lost,
        "p50_bound_ms": round(pct(bound, 50), 1),
        "p99_bound_ms": round(pct(bound, 99), 1),
        "p50_http_submit_ms": round(pct(http, 50), 1),
        "p99_http_submit_ms": round(pct(http, 99), 1),
        # the gateway's own view of accepted submits (a bucket's upper bound)
        "gateway_p50_submit_ms": bucket_quantile(gate0, gate1, 50),
        "gateway_p99_submit_ms": bucket_quantile(gate0, gate1, 99),
        # how far behind its schedule the client fell: past a few hundred ms, its
        # HTTP timings measure its own event loop as much as the platform
        "client_behind_s": round(float(run["behind_s"]), 2),  # type: ignore[arg-type]
        "p99_request_sent_to_bound_ms": round(pct(from_sent, 99), 1),
        "p50_running_ms": round(pct(running, 50), 1),
        "p99_running_ms": round(pct(running, 99), 1),
        "phases_p50_ms": {k: round(statistics.median(v), 1) for k, v in phases.items()},
        "phases_p99_ms": {k: round(pct(v, 99), 1) for k, v in phases.items()},
        "cpu_ms_per_job": cpu,
    }


# --- the floor: four bare relays ----------------------------------------------------------

RELAY_CODE = r"""
import asyncio, sys
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
async def relay(bs, src, dst):
    c = AIOKafkaConsumer(src, bootstrap_servers=bs, group_id="floor-" + src,
                         enable_auto_commit=False, auto_offset_reset="latest",
                         fetch_max_wait_ms=20, session_timeout_ms=10000,
                         heartbeat_interval_ms=1000)
    p = AIOKafkaProducer(bootstrap_servers=bs, linger_ms=0)
    await c.start(); await p.start()
    print("ready", flush=True)
    while True:
        batch = await c.getmany(timeout_ms=200)
        futs = [await p.send(dst, r.value, key=r.key) for rs in batch.values() for r in rs]
        if futs:
            await asyncio.gather(*futs)
            await c.commit()
async def main(bs, prefix):
    await asyncio.gather(*(relay(bs, f"{prefix}.{i}", f"{prefix}.{i+1}") for i in range(4)))
asyncio.run(main(sys.argv[1], sys.argv[2]))
"""


async def floor(bootstrap: str, rate: float, seconds: float) -> dict[str, float]:
    from shared.bus import ensure_topics
    from shared.topics import Topic

    prefix = "floor" + uuid.uuid4().hex[:6]
    await ensure_topics(bootstrap, [Topic(f"{prefix}.{i}", "k", 4, 3_600_000, (), "")
                                    for i in range(5)])
    proc = subprocess.Popen([sys.executable, "-c", RELAY_CODE, bootstrap, prefix],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    try:
        sink = AIOKafkaConsumer(f"{prefix}.4", bootstrap_servers=bootstrap,
                                auto_offset_reset="latest", fetch_max_wait_ms=20)
        await sink.start()
        while not sink.assignment():
            await asyncio.sleep(0.05)
        for tp in sink.assignment():
            await sink.position(tp)
        await asyncio.sleep(8)  # the relays' groups join
        lat: list[float] = []
        p = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=0)
        await p.start()

        async def collect() -> None:
            while True:
                for rs in (await sink.getmany(timeout_ms=100)).values():
                    now = time.time()
                    lat.extend((now - float(r.value.decode())) * 1000 for r in rs if r.value)

        collector = asyncio.create_task(collect())
        start = time.monotonic()
        n = int(rate * seconds)
        for i in range(n):
            delay = start + i / rate - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            await p.send(f"{prefix}.0", str(time.time()).encode(), key=str(i % 64).encode())
        await p.flush()
        deadline = time.monotonic() + 20
        while len(lat) < n and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
        collector.cancel()
        await p.stop()
        await sink.stop()
        return {"floor_p50_ms": round(pct(lat, 50), 1), "floor_p99_ms": round(pct(lat, 99), 1),
                "floor_received": len(lat), "floor_sent": n}
    finally:
        proc.terminate()
        proc.wait()


def held_rates(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rates held: every submit accepted at the rate asked, nothing lost."""
    return [r for r in runs if r["lost"] == 0 and r["errors"] == 0
            and r["submits_per_s"] >= 0.95 * r["target_rate"]]


def run_baseline(rev: str, rates: str, seconds: float, nodes: int) -> dict[str, Any]:
    """The same rates on another commit, from a git worktree, before this run's own
    stack starts (so the two never share the machine): its knee and its runs."""
    sha = subprocess.run(["git", "-C", str(ROOT), "rev-parse", rev], check=True,
                         capture_output=True, text=True).stdout.strip()
    tree = Path(tempfile.mkdtemp(prefix="kairos-baseline-"))
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(tree), sha],
                   check=True, capture_output=True)
    try:
        out = tree / "baseline.json"
        # the same harness on the other platform: this script and its client replace the
        # revision's own (an older one drove submits with httpx, which spent as much CPU
        # as the gateway and so measured a different machine); its other files stay in
        # its worktree, removed below
        for name in ("e2e_latency.py", "rawhttp.py"):
            shutil.copy(ROOT / "bench" / name, tree / "bench" / name)
        subprocess.run([sys.executable, "bench/e2e_latency.py", "--rates", rates,
                        "--seconds", str(seconds), "--nodes", str(nodes), "--out", str(out)],
                       cwd=tree, env={**os.environ, "PYTHONPATH": str(tree)}, check=True)
        data = json.loads(out.read_text())
    finally:
        subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)],
                       capture_output=True)
    runs = data.get("runs", [])
    ok = held_rates(runs)
    keep = ("target_rate", "submits_per_s", "errors", "lost", "p50_bound_ms", "p99_bound_ms",
            "p99_http_submit_ms", "floor_p99_ms", "cpu_ms_per_job")
    return {"rev": sha, "knee_per_s": max(r["target_rate"] for r in ok) if ok else 0.0,
            "runs": [{k: r.get(k) for k in keep} for r in runs]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--rates", default="50,100,200")
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--nodes", type=int, default=32)
    ap.add_argument("--out", type=Path, default=RESULTS)
    ap.add_argument("--load-out", type=Path, default=LOAD_RESULTS)
    ap.add_argument("--overload", action="store_true",
                    help="then submit at twice the knee: what is accepted, refused (429), lost")
    ap.add_argument("--baseline", metavar="REV", help="first run the same rates on "
                    "another commit (a git worktree) and report its knee beside this one's")
    ap.add_argument("--split-submit", action="store_true",
                    help="also time admission's relay send (a second reader: slows queueing)")
    args = ap.parse_args()
    rates = [float(r) for r in args.rates.split(",")]
    baseline = None
    if args.baseline:
        print(f"baseline {args.baseline}: the same rates on that commit ...", flush=True)
        baseline = run_baseline(args.baseline, args.rates, args.seconds, args.nodes)
        print(json.dumps({k: baseline[k] for k in ("rev", "knee_per_s")}), flush=True)
    workdir = Path(tempfile.mkdtemp(prefix="kairos-bench-"))
    stack = Stack(workdir=workdir, nodes=args.nodes, gpus_per_node=8, nodes_per_agent=16,
                  admission_port=free_port(), env={"KAIROS_LOG_LEVEL": "WARNING"})
    print(f"starting the stack: {args.nodes} simulated nodes x 8 GPUs ...", flush=True)
    stack.start()
    runs = []
    try:
        asyncio.run(measure_rate(stack, 20, 5))  # warm up connections and consumer groups
        for rate in rates:
            print(f"rate {rate:g}/s for {args.seconds:g}s ...", flush=True)
            r = asyncio.run(measure_rate(stack, rate, args.seconds,
                                         split_submit=args.split_submit))
            r.update(asyncio.run(floor(stack.kafka_bootstrap or "", rate, min(args.seconds, 30))))
            runs.append(r)
            print(json.dumps(r), flush=True)
        ok = held_rates(runs)
        knee = max(r["target_rate"] for r in ok) if ok else 0.0
        overload = None
        if args.overload and knee:
            print(f"overload: {2 * knee:g}/s for {args.seconds:g}s ...", flush=True)
            o = asyncio.run(measure_rate(stack, 2 * knee, args.seconds))
            overload = {"rate": 2 * knee, "accepted_per_s": o["submits_per_s"],
                        "refused_429": o["refused_429"], "other_errors": o["errors"]
                        - o["refused_429"], "lost": o["lost"],
                        "p50_http_accepted_ms": o["p50_http_submit_ms"],
                        "p99_http_accepted_ms": o["p99_http_submit_ms"],
                        "gateway_p50_accepted_ms": o["gateway_p50_submit_ms"],
                        "gateway_p99_accepted_ms": o["gateway_p99_submit_ms"],
                        "client_behind_s": o["client_behind_s"],
                        "p99_bound_ms": o["p99_bound_ms"], "cpu_ms_per_job": o["cpu_ms_per_job"]}
            print(json.dumps(overload), flush=True)
    finally:
        stack.stop()
    best = max(ok, key=lambda r: r["target_rate"]) if ok else runs[-1]
    result = {
        "submits_per_s": best["submits_per_s"],
        "p50_bound_ms": best["p50_bound_ms"],
        "p99_bound_ms": best["p99_bound_ms"],
        "p99_running_ms": best["p99_running_ms"],
        "floor_p99_ms": best["floor_p99_ms"],
        "lost": sum(r["lost"] for r in runs),
        "bound_p99_over_floor_p99": round(best["p99_bound_ms"] / best["floor_p99_ms"], 2),
        "knee_per_s": knee,
        "baseline": baseline,
        "cpu_ms_per_job": best["cpu_ms_per_job"],
        "overload": overload,
        "cluster": f"{args.nodes}x8 GPUs (simulated)",
        "job": "1 GPU, 1 s",
        "seconds_per_rate": args.seconds,
        "machine": f"{os.cpu_count()} cores",
        "runs": runs,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    held = max(ok, key=lambda r: r["target_rate"]) if ok else None
    load = {
        "max_rate_held": held["target_rate"] if held else 0,
        "p99_bound_ms": held["p99_bound_ms"] if held else None,
        "floor_p99_ms": held["floor_p99_ms"] if held else None,
        "p99_within_3x_floor": bool(held and held["p99_bound_ms"] <= 3 * held["floor_p99_ms"]),
        "lost": sum(r["lost"] for r in runs),
        "rates_tried": [r["target_rate"] for r in runs],
        "seconds_per_rate": args.seconds,
        "cluster": f"{args.nodes}x8 GPUs (simulated)",
        "machine": f"{os.cpu_count()} cores",
    }
    args.load_out.write_text(json.dumps(load, indent=2) + "\n")
    print("\n rate/s  achieved  lost  bound p50/p99 ms   running p99 ms  floor p99 ms")
    for r in runs:
        print(f" {r['target_rate']:6g}  {r['submits_per_s']:8.1f}  {r['lost']:4d}  "
              f"{r['p50_bound_ms']:7.1f}/{r['p99_bound_ms']:<8.1f}  {r['p99_running_ms']:13.1f}"
              f"  {r['floor_p99_ms']:11.1f}")
    print(f"\nwhere the time goes at {best['target_rate']:g}/s (p50 ms): {best['phases_p50_ms']}")
    print(f"CPU ms per job by part: {best['cpu_ms_per_job']}")
    if baseline is not None:
        print(f"knee {knee:g}/s; baseline {baseline['rev'][:8]}: {baseline['knee_per_s']:g}/s")
    print(f"wrote {args.out} and {args.load_out}")


if __name__ == "__main__":
    main()
