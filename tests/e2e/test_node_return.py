"""A node that comes back after it was declared lost, end to end: its agent process is
paused (SIGSTOP) until the monitor declares the node lost and the scheduler requeues its
job; when it resumes, the scheduler tells it what it still owns and the agent stops the
stale task, while the job's new attempt, placed on the same node afterwards, runs on."""

from __future__ import annotations

import os
import signal
import time
from typing import Any

import httpx
import pytest

from kairos.stack import Stack

pytestmark = [pytest.mark.e2e, pytest.mark.broker, pytest.mark.db]
NODE = "returning-0"


def wait(what: str, fetch: Any, done: Any, timeout: float = 90) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = fetch()
        if done(value):
            return value
        assert time.monotonic() < deadline, f"{what}: {value}"
        time.sleep(0.3)


def test_a_node_back_from_lost_stops_its_stale_task(stack: Stack) -> None:
    # The agent's own lease would fence its task on resume (it was silent past
    # fence_after_s) in a race with the scheduler's answer; this test is about the answer,
    # the safety net for an agent that could not fence (a frozen VM), so its lease is long.
    extra = stack.start_service("node-agent#returning", module="services.node_agent",
                                extra_env={"KAIROS_NODE_ID": NODE, "KAIROS_SIM_NODES": "1",
                                           "KAIROS_SIM_GPUS_PER_NODE": "8",
                                           "KAIROS_FENCE_AFTER_S": "600",
                                           "KAIROS_STATE_DIR": str(stack.workdir / "agents")})
    h = {"Authorization": f"Bearer {stack.token}"}
    with httpx.Client(base_url=stack.url, headers=h, timeout=30) as c:
        def nodes() -> dict[str, dict[str, Any]]:
            return {n["node_id"]: n for n in c.get("/v1/nodes").json()}

        ready = [n for n, v in wait("the node never registered", nodes,
                                    lambda ns: NODE in ns).items() if v["state"] == "ready"]
        # one long 8-GPU job per ready node, so one of them runs on ours
        ids = [c.post("/v1/jobs", json={"name": f"hold-{i}", "duration": 600, "maxRetry": 3,
                                        "tasks": [{"name": "w", "resources": {"gpu": 8}}]}
                      ).json()["id"] for i in range(len(ready))]

        def ours() -> str | None:
            for job_id in ids:
                job = c.get(f"/v1/jobs/{job_id}").json()
                if job["state"] == "running" and any(
                        p["node_id"] == NODE for p in job["placement"]):
                    return str(job_id)
            return None

        try:
            victim = wait("no job ran on the node", ours, lambda v: v is not None)
            os.kill(extra.popen.pid, signal.SIGSTOP)  # silent, but its task still "runs"
            try:
                wait("never declared lost", nodes, lambda ns: ns[NODE]["state"] == "lost")
                wait("never requeued", lambda: c.get(f"/v1/jobs/{victim}").json(),
                     lambda j: j["attempt"] == 2)
            finally:
                os.kill(extra.popen.pid, signal.SIGCONT)

            def history() -> list[dict[str, Any]]:
                return list(c.get(f"/v1/jobs/{victim}").json()["history"])

            events = wait("the stale task was not stopped", history, lambda hs: any(
                e["task"] == "w-0" and e["attempt"] == 1 and e["state"] == "cancelled"
                for e in hs))
            stale = next(e for e in events if e["task"] == "w-0" and e["attempt"] == 1
                         and e["state"] == "cancelled")
            assert stale["node_id"] == NODE
            assert stale["reason"].startswith(
                "no longer owned: node back after it was declared lost")
            # the node is back: the requeued attempt is placed (ours is the free node) and runs
            job = wait("the new attempt never ran", lambda: c.get(f"/v1/jobs/{victim}").json(),
                       lambda j: j["state"] == "running" and j["attempt"] == 2)
            assert nodes()[NODE]["state"] == "ready"
            again = [p for p in job["placement"] if p["attempt"] == 2]
            assert [p["node_id"] for p in again] == [NODE]  # bound after the answer: left alone
            assert [e["state"] for e in history() if e["attempt"] == 2 and e["task"]] == ["running"]
        finally:  # a failure must not leave every node held for the tests after it
            for job_id in ids:
                c.delete(f"/v1/jobs/{job_id}")
        wait("the jobs never ended", lambda: [c.get(f"/v1/jobs/{j}").json()["state"]
                                              for j in ids],
             lambda states: set(states) == {"cancelled"})
    stack.stop_proc(extra)
