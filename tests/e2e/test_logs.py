"""Task logs end to end: a job runs on simulated nodes of the real stack (every service
its own process, the real broker and PostgreSQL); the gateway proxies its tasks' output
from the agent that runs them, over HTTP and through ``kairos logs``, to its tenant only."""

from __future__ import annotations

import time

import httpx
import pytest
from typer.testing import CliRunner

from kairos.cli import app
from kairos.stack import Stack

pytestmark = [pytest.mark.e2e, pytest.mark.broker, pytest.mark.db]


def cli(stack: Stack, token: str, *args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, [*args, "--url", stack.url, "--token", token])
    return result.exit_code, result.output


def test_a_running_jobs_logs_come_from_its_agent_to_its_tenant_only(stack: Stack) -> None:
    dev = {"Authorization": f"Bearer {stack.token}"}
    with httpx.Client(base_url=stack.url, timeout=30) as c:
        owner, stranger = (c.post("/v1/tokens", headers=dev, json={"tenant": t}).json()["token"]
                           for t in ("logs-a", "logs-b"))
        mine = {"Authorization": f"Bearer {owner}"}
        job = c.post("/v1/jobs", headers=mine, json={
            "name": "logs-e2e", "duration": 3,
            "tasks": [{"name": "w", "replicas": 2, "resources": {"gpu": 1}}]}).json()["id"]
        deadline = time.monotonic() + 60
        while (state := c.get(f"/v1/jobs/{job}", headers=mine).json()["state"]) != "running":
            assert state in ("pending", "admitted", "bound"), state
            assert time.monotonic() < deadline, "the job never ran"
            time.sleep(0.2)

        r = c.get(f"/v1/jobs/{job}/logs", headers=mine)
        assert r.status_code == 200, r.text
        assert f"[kairos-sim] w-0 of {job} attempt 1: rank 0 of 2" in r.text
        node = r.headers["x-kairos-node"]
        placed = c.get(f"/v1/jobs/{job}", headers=mine).json()["placement"]
        assert node == next(p["node_id"] for p in placed if p["task_id"] == "w-0")
        nodes = {n["node_id"]: n for n in c.get("/v1/nodes", headers=mine).json()}
        assert nodes[node]["inventory"]["agent_url"].startswith("http://127.0.0.1:")

        # another tenant: the job does not exist for it
        r = c.get(f"/v1/jobs/{job}/logs", headers={"Authorization": f"Bearer {stranger}"})
        assert r.status_code == 404 and r.json() == {"detail": f"no job {job}"}
        code, out = cli(stack, stranger, "logs", job)
        assert code == 1 and f"error 404: no job {job}" in out

    # the owner follows the second task until it ends
    code, out = cli(stack, owner, "logs", job, "--task", "w-1", "--follow")
    assert code == 0, out
    lines = out.splitlines()
    assert f"w-1 of {job} attempt 1: rank 1 of 2" in lines[0]
    assert any("step 2: loss" in line for line in lines)
    assert lines[-1].endswith("[kairos-sim] training finished: exit 0")
    code, out = cli(stack, owner, "logs", job, "--task", "w-1", "--tail", "1")
    assert code == 0 and out.splitlines() == lines[-1:]
