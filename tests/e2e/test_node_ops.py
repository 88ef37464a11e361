"""Cordon, drain and uncordon through the whole stack (every service its own process):
the CLI's commands travel through admission's outbox to the scheduler; a drained
node's job is stopped and requeued (not failed) on another node; a cordoned node gets
nothing new while a job that could run only there waits with reason ``cordoned``; an
uncordon lets it start there. Every node is uncordoned again at the end."""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from kairos.cli import app
from kairos.stack import Stack

pytestmark = [pytest.mark.e2e, pytest.mark.broker, pytest.mark.db]


def cli(stack: Stack, *args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, [*args, "--url", stack.url, "--token", stack.token or ""])
    return result.exit_code, result.output


def api(stack: Stack, method: str, path: str, **kw: Any) -> httpx.Response:
    return httpx.request(method, f"{stack.url}{path}", timeout=10,
                         headers={"Authorization": f"Bearer {stack.token}"}, **kw)


def until(what: str, pred: Callable[[], Any], timeout: float = 90) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = pred()
        if got:
            return got
        time.sleep(0.3)
    raise AssertionError(f"timed out waiting for {what}")


def scheduling(stack: Stack) -> dict[str, str]:
    return {n["node_id"]: n["scheduling"] for n in api(stack, "GET", "/v1/nodes").json()}


def leader_metric(stack: Stack, name: str) -> float | None:
    """A sample of the leading scheduler's /metrics (the test suite may have failed over)."""
    for p in stack.procs:
        if not p.name.startswith("scheduler") or p.popen.poll() is not None:
            continue
        try:
            text = httpx.get(f"http://127.0.0.1:{p.port}/metrics", timeout=5).text
        except httpx.HTTPError:
            continue
        if re.search(r"^kairos_scheduler_is_leader 1", text, re.M):
            m = re.search(rf"^{re.escape(name)} (\S+)$", text, re.M)
            return float(m[1]) if m else None
    return None


def submit(stack: Stack, tmp_path: Path, name: str, gpus: int, duration: float) -> str:
    spec = tmp_path / f"{name}.yaml"
    spec.write_text(f"name: {name}\nduration: {duration}\nmaxRetry: 0\n"
                    f"tasks: [{{name: w, resources: {{gpu: {gpus}}}}}]\n")
    code, out = cli(stack, "submit", str(spec))
    assert code == 0, out
    return re.search(r"submitted (j-[0-9a-f]+)", out)[1]  # type: ignore[index]


def job(stack: Stack, job_id: str) -> dict[str, Any]:
    return dict(api(stack, "GET", f"/v1/jobs/{job_id}").json())


def nodes_of(j: dict[str, Any]) -> set[str]:
    return {p["node_id"] for p in j["placement"] or []}


def test_drain_requeues_and_a_cordoned_node_waits_for_its_uncordon(
        stack: Stack, tmp_path: Path) -> None:
    # the live nodes: an earlier test of the session may have left a lost one behind
    names = sorted(n["node_id"] for n in api(stack, "GET", "/v1/nodes").json() if n["state"] != "lost")
    started: list[str] = []
    try:
        # --- drain: the job there is stopped gracefully and runs again elsewhere
        j = submit(stack, tmp_path, "drained", 8, 600)
        started.append(j)
        until("the job to run", lambda: job(stack, j)["state"] == "running")
        (where,) = nodes_of(job(stack, j))
        code, out = cli(stack, "node", "drain", where, "--reason", "e2e", "--grace-period", "5")
        assert code == 0 and f"node {where} draining" in out, out
        until(f"{where} drained", lambda: scheduling(stack)[where] == "drained")
        again = until("the job to run again", lambda: (
            (x := job(stack, j))["state"] == "running" and x["attempt"] == 2 and x))
        assert where not in nodes_of(again)
        trail = [(h["state"], h["reason"]) for h in again["history"] if h["task"] is None]
        assert ("preempted", f"preempted for drain of node {where}") in trail
        assert "failed" not in {s for s, _ in trail}
        code, out = cli(stack, "node", "drain", where)
        assert code == 1 and "409" in out and "already drained" in out
        code, out = cli(stack, "nodes")
        assert code == 0 and "drained" in out
        api(stack, "DELETE", f"/v1/jobs/{j}")
        until("the job to end", lambda: job(stack, j)["state"] == "cancelled")

        # --- cordon: while the drained node is cordoned, fill every other node; the job
        # that could only run there waits, saying why
        fill = [submit(stack, tmp_path, f"fill-{i}", 8, 600) for i in range(len(names) - 1)]
        started += fill
        until("the other nodes to fill", lambda: all(
            job(stack, f)["state"] == "running" for f in fill))
        assert all(where not in nodes_of(job(stack, f)) for f in fill)
        last = submit(stack, tmp_path, "waits", 8, 600)
        started.append(last)
        until("a pending reason 'cordoned'", lambda: leader_metric(
            stack, 'kairos_scheduler_pending_jobs{reason="cordoned"}') == 1)
        assert job(stack, last)["state"] == "admitted" and not job(stack, last)["placement"]
        code, out = cli(stack, "node", "uncordon", where)
        assert code == 0 and f"node {where} schedulable" in out, out
        placed = until("the waiting job to run there", lambda: (
            (x := job(stack, last))["state"] == "running" and x))
        assert nodes_of(placed) == {where}
        until("the scheduler to count it schedulable", lambda: leader_metric(
            stack, 'kairos_scheduler_nodes{scheduling="schedulable"}') == len(names))
    finally:
        for n, s in scheduling(stack).items():
            if s != "schedulable":
                api(stack, "POST", f"/v1/nodes/{n}/uncordon")
        for j in started:
            api(stack, "DELETE", f"/v1/jobs/{j}")
        for j in started:
            until(f"{j} to end", lambda j=j: job(stack, j)["state"] in (
                "cancelled", "succeeded", "failed"))


def test_node_commands_are_refused_for_users_and_unknown_nodes(stack: Stack) -> None:
    code, out = cli(stack, "node", "cordon", "no-such-node")
    assert code == 1 and "404" in out and "no node no-such-node" in out
    name = sorted(scheduling(stack))[0]
    code, out = cli(stack, "node", "uncordon", name)
    assert code == 1 and "409" in out and "not cordoned" in out
    user = api(stack, "POST", "/v1/tokens", json={"tenant": "ops-e2e", "name": "eve"}).json()
    r = httpx.post(f"{stack.url}/v1/nodes/{name}/drain", timeout=10,
                   headers={"Authorization": f"Bearer {user['token']}"})
    assert r.status_code == 403 and "admin role required" in r.json()["detail"]
    assert scheduling(stack)[name] == "schedulable"
