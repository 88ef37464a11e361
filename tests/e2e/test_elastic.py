"""End to end: an elastic job grows into idle GPUs, shrinks (and is not preempted) when a
higher-priority job needs them, grows back, and resizes on a user's request — every
service its own process, over the real broker and PostgreSQL. The replicas a shrink did
not remove are never restarted."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from kairos.stack import Stack
from shared.events import Binding, BindingAction
from tests.e2e.test_job_life import headers, read_topic, wait_terminal

pytestmark = [pytest.mark.e2e, pytest.mark.broker, pytest.mark.db]

ELASTIC = {"name": "elastic-train", "priorityClass": "low", "duration": 900,
           "tasks": [{"name": "w", "replicas": 1, "minReplicas": 1, "maxReplicas": 4,
                      "resources": {"gpu": 8}}]}
URGENT = {"name": "urgent", "priorityClass": "high", "duration": 2, "minAvailable": 2,
          "tasks": [{"name": "w", "replicas": 2, "resources": {"gpu": 8}}]}


def poll(c: httpx.Client, job_id: str, done: Callable[[dict[str, Any]], bool],
         what: str, timeout_s: float = 180) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while True:
        job: dict[str, Any] = c.get(f"/v1/jobs/{job_id}").json()
        if done(job):
            return job
        assert time.monotonic() < deadline, f"{what}: {job['state']} {job.get('replicas')} " \
            f"{[(h['state'], h['task'], h['reason']) for h in job['history'][-6:]]}"
        time.sleep(0.3)


def running_tasks(job: dict[str, Any]) -> set[str]:
    """Tasks placed now that have reported running."""
    ran = {h["task"] for h in job["history"] if h["task"] and h["state"] == "running"}
    return {p["task_id"] for p in job["placement"]} & ran


def task_reports(job: dict[str, Any], task: str) -> list[str]:
    return [h["state"] for h in job["history"] if h["task"] == task]


def test_elastic_job_grows_shrinks_for_a_higher_priority_job_and_grows_back(
        stack: Stack) -> None:
    with httpx.Client(base_url=stack.url, headers=headers(stack), timeout=30) as c:
        deadline = time.monotonic() + 180  # other tests' jobs on this shared stack end first
        while busy := [a for n in c.get("/v1/nodes").json() for a in n["allocations"]]:
            assert time.monotonic() < deadline, f"the cluster never became idle: {busy[:4]}"
            time.sleep(0.5)

        # 1. it starts with one replica, then grows into the idle GPUs: 4 nodes x 8
        r = c.post("/v1/jobs", json=ELASTIC)
        assert r.status_code == 201, r.text
        el = r.json()["id"]
        # the tasks' own reports reach the read model before the scheduler's job-level
        # "running" that follows them: wait for both, then judge
        job = poll(c, el, lambda j: j["replicas"] == {"w": 4} and len(running_tasks(j)) == 4
                   and j["state"] != "bound", "never grew to 4 running replicas")
        assert job["state"] == "running" and job["attempt"] == 1
        grows = [h for h in job["history"] if h["task"] is None and h["reason"] == "resized"]
        assert grows and grows[-1]["message"].startswith("w: ") and \
            grows[-1]["message"].endswith("-> 4 replicas (grow into idle GPUs)")

        # the resize endpoint refuses what it cannot do, with a clear 4xx
        r = c.post(f"/v1/jobs/{el}/resize", json={"replicas": 9})
        assert r.status_code == 422 and r.json()["detail"][0]["field"] == "replicas"
        assert "1 to 4 replicas" in r.json()["detail"][0]["message"]

        # 2. a higher-priority gang needs two whole nodes: the elastic job shrinks
        r = c.post("/v1/jobs", json=URGENT)
        assert r.status_code == 201, r.text
        urgent = r.json()["id"]
        r = c.post(f"/v1/jobs/{urgent}/resize", json={"replicas": 3})
        assert r.status_code == 409 and "not elastic" in r.json()["detail"]
        done = wait_terminal(stack, [urgent])
        assert done[urgent] == "succeeded"
        job = c.get(f"/v1/jobs/{el}").json()
        assert job["state"] == "running" and job["attempt"] == 1  # shrunk, never preempted
        jobwide = [(h["state"], h["reason"]) for h in job["history"] if h["task"] is None]
        assert ("preempted" not in {s for s, _ in jobwide}
                and [s for s, _ in jobwide].count("admitted") == 1)
        shrinks = [h for h in job["history"] if h["task"] is None and h["reason"] == "resized"
                   and f"shrink for {urgent}" in (h["message"] or "")]
        assert [h["message"].split(" (")[0] for h in shrinks] == ["w: 4 -> 2 replicas"]
        removed = sorted(h["task"] for h in job["history"]
                         if h["task"] and h["state"] == "cancelled" and h["reason"] == "resized")
        assert len(removed) == 2
        kept = {h["task"] for h in ran_before_the_shrink(job)} - set(removed)
        assert len(kept) == 2 and kept <= {p["task_id"] for p in job["placement"]}

        # 3. the GPUs are idle again: it grows back, with new replicas
        job = poll(c, el, lambda j: j["replicas"] == {"w": 4} and len(running_tasks(j)) == 4,
                   "never grew back to 4")
        regrown = {p["task_id"] for p in job["placement"]} - kept
        assert len(regrown) == 2 and not regrown & set(removed)
        for t in kept:  # the replicas the shrink left alone: started once, never stopped
            assert task_reports(job, t) == ["running"], (t, task_reports(job, t))

        # 4. the user asks for 2: the two highest replicas stop, the rest keep running
        r = c.post(f"/v1/jobs/{el}/resize", json={"replicas": 2})
        assert r.status_code == 202, r.text
        job = poll(c, el, lambda j: j["replicas"] == {"w": 2}, "the user's resize never happened")
        assert any("resize to 2 requested" in (h["message"] or "") for h in job["history"])
        assert job["state"] == "running" and job["attempt"] == 1

        survivors = {p["task_id"] for p in job["placement"]}
        assert "w-0" in survivors and survivors <= kept | regrown
        for t in survivors:
            assert task_reports(job, t) == ["running"], (t, task_reports(job, t))

        assert c.delete(f"/v1/jobs/{el}").status_code == 202
    assert wait_terminal(stack, [el])[el] == "cancelled"

    # on the wire: each kept replica was in exactly one binding that starts tasks
    bindings = [e.payload() for e in asyncio.run(read_topic(stack.kafka_bootstrap or "",
                                                            "bindings"))]
    starts = [t.task_id for b in bindings if isinstance(b, Binding) and b.job_id == el
              and b.action in (BindingAction.ALLOCATE, BindingAction.RESIZE) for t in b.tasks]
    assert all(starts.count(t) == 1 for t in kept)
    resizes = [b for b in bindings if isinstance(b, Binding) and b.job_id == el
               and b.action is BindingAction.RESIZE]
    assert any(b.stop_task_ids for b in resizes) and any(b.tasks for b in resizes)


def ran_before_the_shrink(job: dict[str, Any]) -> list[dict[str, Any]]:
    """Running reports of the replicas that ran before the shrink."""
    cut = next(i for i, h in enumerate(job["history"])
               if h["task"] is None and "shrink for" in (h["message"] or ""))
    return [h for h in job["history"][:cut] if h["task"] and h["state"] == "running"]
