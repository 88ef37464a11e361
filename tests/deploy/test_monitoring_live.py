"""The dashboards and alert rules against a real Prometheus (the Debian ``prometheus``
server) scraping a running embedded stack with jobs flowing: every PromQL query of every
dashboard panel returns data, every template variable has values, every series an alert
rule reads exists, and Prometheus evaluates every rule without error. (Whether the rules
fire when they should is `promtool test rules`' part: test_deploy_prometheus.py.)

The work: whole-GPU jobs, a gang, GPU shares, an elastic job that grows, one cancelled,
one that fails (its node is lost and it may not retry), an undecodable message (dead
letters), a queue with a GPU quota, and a GPU reported degraded. No Grafana server can be
installed here; Grafana would send exactly these queries to this data source."""

from __future__ import annotations

import asyncio
import json
import math
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from kairos.embedded import free_port
from kairos.stack import Stack
from shared.bus import Producer
from shared.events import GpuHealth, GpuTelemetry, NodeTelemetry, QueueChanged
from tests.deploy.conftest import ROOT, tool
from tests.deploy.promql import degrafana, vector_selector_nodes

pytestmark = [pytest.mark.e2e, pytest.mark.broker, pytest.mark.db]

DASHBOARDS = sorted((ROOT / "monitoring" / "grafana" / "dashboards").glob("*.json"))
ALERTS = ROOT / "monitoring" / "prometheus" / "alerts.yml"
SCRAPE_S = 1
# Grafana's range variables at this scrape interval (a rate needs two samples in range)
RANGES = {"$__rate_interval": "8s", "$__interval": "2s", "$__range": "5m"}
TERMINAL = {"succeeded", "failed", "cancelled"}


def promql(expr: str) -> str:
    for var, value in RANGES.items():
        expr = expr.replace(var, value)
    return degrafana(expr)


@dataclass
class Prometheus:
    url: str
    proc: subprocess.Popen[bytes]

    def get(self, path: str, **params: Any) -> Any:
        r = httpx.get(f"{self.url}{path}", params=params, timeout=30)
        body = r.json()
        assert r.status_code == 200 and body.get("status") == "success", (path, params, body)
        return body["data"]


def start_prometheus(stack: Stack, workdir: Path) -> Prometheus:
    jobs: dict[str, list[str]] = {}
    for p in stack.procs:
        jobs.setdefault(f"kairos-{p.name.split('#')[0]}", []).append(f"127.0.0.1:{p.port}")
    config = {
        "global": {"scrape_interval": f"{SCRAPE_S}s", "evaluation_interval": f"{SCRAPE_S}s"},
        "rule_files": [str(ALERTS)],
        "scrape_configs": [{"job_name": job, "static_configs": [{"targets": targets}]}
                           for job, targets in jobs.items()],
    }
    (workdir / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = free_port()
    proc = subprocess.Popen(
        [tool("prometheus"), f"--config.file={workdir / 'prometheus.yml'}",
         f"--storage.tsdb.path={workdir / 'tsdb'}", f"--web.listen-address=127.0.0.1:{port}"],
        stdout=open(workdir / "prometheus.log", "wb"), stderr=subprocess.STDOUT)  # noqa: SIM115
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        assert proc.poll() is None, (workdir / "prometheus.log").read_text()[-3000:]
        try:
            if httpx.get(f"{url}/-/ready", timeout=1).status_code == 200:
                return Prometheus(url, proc)
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise TimeoutError("prometheus never became ready")


def wait_scraped(prom: Prometheus, targets: int, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while sum(t["health"] == "up" for t in prom.get("/api/v1/targets")["activeTargets"]) < \
            targets:
        assert time.monotonic() < deadline, "prometheus never scraped every target"
        time.sleep(0.2)
    time.sleep(2 * SCRAPE_S)


class Client:
    def __init__(self, stack: Stack) -> None:
        self.http = httpx.Client(base_url=stack.url, timeout=30,
                                 headers={"Authorization": f"Bearer {stack.token}"})

    def submit(self, name: str, resources: dict[str, int], duration: float, **spec: Any) -> str:
        task = {"name": "w", "replicas": spec.pop("replicas", 1), "resources": resources,
                **spec.pop("task", {})}
        r = self.http.post("/v1/jobs", json={"name": name, "duration": duration,
                                             "tasks": [task], **spec})
        assert r.status_code == 201, r.text
        return str(r.json()["id"])

    def job(self, job_id: str) -> dict[str, Any]:
        return dict(self.http.get(f"/v1/jobs/{job_id}").json())

    def wait(self, job_id: str, states: set[str], timeout_s: float = 60) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        while (job := self.job(job_id))["state"] not in states:
            assert time.monotonic() < deadline, f"{job_id} stayed {job['state']}: {job['reason']}"
            time.sleep(0.3)
        return job


async def side_events(bootstrap: str) -> None:
    """What the platform's other parts would send: a queue's quota (queueing's admin API),
    a GPU an agent reports degraded, and a message no consumer can decode."""
    p = Producer(bootstrap, "live-test")
    await p.start()
    try:
        await p.publish(QueueChanged(queue="default", change="updated",
                                     settings={"tenant": "default", "nominal": {"gpu": 8}}))
        await p.publish(NodeTelemetry(node_id="live-degraded", gpus=[
            GpuTelemetry(index=0, utilization_pct=0, memory_used_mib=0, temperature_c=90,
                         power_w=70, health=GpuHealth.DEGRADED)]))
        await p.send_raw("jobs.commands", b"garbage", b"{not json")
    finally:
        await p.stop()


@pytest.fixture(scope="module")
def live() -> Iterator[tuple[Stack, Prometheus, float]]:
    workdir = Path(tempfile.mkdtemp(prefix="kairos-live-"))  # the embedded PG runs as its user
    stack = Stack(workdir=workdir, nodes=4, gpus_per_node=8, nodes_per_agent=2,
                  admission_port=free_port(),
                  env={"KAIROS_HEARTBEAT_S": "1", "KAIROS_TELEMETRY_S": "1",
                       "KAIROS_LOST_AFTER_S": "5", "KAIROS_CHECK_EVERY_S": "1",
                       "KAIROS_SESSION_TIMEOUT_MS": "6000", "KAIROS_REBALANCE_TIMEOUT_MS": "6000",
                       "KAIROS_HEARTBEAT_INTERVAL_MS": "500"})
    prom: Prometheus | None = None
    try:
        stack.start()
        prom = start_prometheus(stack, workdir)
        started = time.time()
        wait_scraped(prom, len(stack.procs))  # a rate needs the counters' values before
        run_the_mix(stack)
        time.sleep(4 * SCRAPE_S)  # the last changes scraped, and rules evaluated on them
        yield stack, prom, started
    finally:
        if prom is not None:
            prom.proc.send_signal(signal.SIGTERM)
            prom.proc.wait(15)
        stack.stop()
        for log in workdir.glob("logs/*.log"):
            text = log.read_text(errors="replace")
            if "Traceback" in text:
                print(f"--- {log.name} ---\n{text[-3000:]}")
        shutil.rmtree(workdir, ignore_errors=True)


def run_the_mix(stack: Stack) -> None:
    assert stack.kafka_bootstrap
    asyncio.run(side_events(stack.kafka_bootstrap))
    c = Client(stack)
    doomed = c.submit("live-doomed", {"gpu": 1}, 600, maxRetry=0, timeLimit=15)
    cancel = c.submit("live-cancel", {"gpu": 1}, 600)
    ids = [c.submit(f"live-one-{i}", {"gpu": 1}, 3) for i in range(2)]
    ids.append(c.submit("live-gang", {"gpu": 4}, 3, replicas=2, minAvailable=2))
    ids += [c.submit(f"live-share-{i}", {"gpuMemory": 20480, "gpuCompute": 25}, 4)
            for i in range(2)]
    elastic = c.submit("live-elastic", {"gpu": 2}, 6, task={"minReplicas": 1, "maxReplicas": 3})
    ids.append(elastic)
    c.wait(cancel, {"running"})
    assert c.http.delete(f"/v1/jobs/{cancel}").status_code == 202
    # the doomed job's node is lost: its agent is killed, the monitor declares the node
    # lost; the job is placed again (a node loss spends no retry) and fails at its time
    # limit
    node = c.wait(doomed, {"running"})["placement"][0]["node_id"]
    agent = next(p for p in stack.procs if p.name == f"node-agent#{node.rsplit('-', 1)[0]}")
    stack.stop_proc(agent, signal.SIGKILL)
    assert c.wait(doomed, TERMINAL, timeout_s=60)["state"] == "failed"
    assert c.wait(cancel, TERMINAL)["state"] == "cancelled"
    # a second wave, started while Prometheus watches (the first may start before a scrape)
    ids += [c.submit(f"live-late-{i}", {"gpu": 1}, 2) for i in range(2)]
    for job_id in ids:
        c.wait(job_id, TERMINAL, timeout_s=60)
    history = c.job(elastic)["history"]
    assert any(h.get("reason") == "resized" for h in history), "the elastic job never grew"


def has_data(result: list[dict[str, Any]]) -> bool:
    return any(not math.isnan(float(v)) for series in result for _, v in series["values"])


def dashboard_queries() -> Iterator[tuple[str, str, str]]:
    for path in DASHBOARDS:
        d = json.loads(path.read_text())
        nested = [inner for row in d["panels"] for inner in row.get("panels", [])]
        for p in [*d["panels"], *nested]:
            for t in p.get("targets", []):
                yield path.stem, p["title"], t["expr"]


def test_every_dashboard_query_returns_data(live: tuple[Stack, Prometheus, float]) -> None:
    _, prom, started = live
    empty = []
    queries = list(dashboard_queries())
    assert len(queries) > 50
    for dashboard, title, expr in queries:
        result = prom.get("/api/v1/query_range", query=promql(expr), start=started,
                          end=time.time(), step=SCRAPE_S)["result"]
        if not has_data(result):
            empty.append(f"{dashboard} / {title}: {expr}")
    assert not empty, "no data for:\n" + "\n".join(empty)


def test_every_template_variable_has_values(live: tuple[Stack, Prometheus, float]) -> None:
    _, prom, _ = live
    for path in DASHBOARDS:
        for var in json.loads(path.read_text())["templating"]["list"]:
            if var["type"] != "query":
                continue
            metric, label = var["query"]["query"][len("label_values("):-1].split(", ")
            values = prom.get(f"/api/v1/label/{label}/values", **{"match[]": metric})
            assert values, f"{path.stem} ${var['name']}: no {label} on {metric}"


def test_every_series_an_alert_reads_exists_and_every_rule_evaluates(
        live: tuple[Stack, Prometheus, float]) -> None:
    import promql_parser

    _, prom, _ = live
    rules = [r for g in yaml.safe_load(ALERTS.read_text())["groups"] for r in g["rules"]]
    missing = []
    for rule in rules:
        for selector in map(str, vector_selector_nodes(promql_parser.parse(rule["expr"]))):
            if not prom.get("/api/v1/query", query=selector)["result"]:
                missing.append(f"{rule['alert']}: {selector}")
    assert not missing, "series no target exports:\n" + "\n".join(missing)
    loaded = [r for g in prom.get("/api/v1/rules")["groups"] for r in g["rules"]]
    assert {r["name"] for r in loaded} == {r["alert"] for r in rules}
    assert all(r["health"] == "ok" for r in loaded), [r for r in loaded if r["health"] != "ok"]


def test_every_target_is_scraped(live: tuple[Stack, Prometheus, float]) -> None:
    stack, prom, _ = live
    targets = prom.get("/api/v1/targets")["activeTargets"]
    alive = {f"127.0.0.1:{p.port}" for p in stack.procs if p.popen.poll() is None}
    up = {t["labels"]["instance"] for t in targets if t["health"] == "up"}
    assert alive <= up, alive - up
    assert {t["labels"]["job"] for t in targets} == {
        "kairos-admission", "kairos-queueing", "kairos-scheduler", "kairos-monitor",
        "kairos-node-agent", "kairos-forecaster"}
