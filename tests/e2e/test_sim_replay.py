"""Shadow replay on the real stack: jobs run to completion through every service, the
history is exported from the platform's PostgreSQL and replayed through two policies."""

from __future__ import annotations

import json
import time
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from kairos.stack import Stack
from sim.cli import app
from sim.history_trace import TaskShape, load_history

pytestmark = [pytest.mark.e2e, pytest.mark.broker, pytest.mark.db]


def submit(c: httpx.Client, name: str, duration: float, gpu: int, replicas: int = 1) -> str:
    r = c.post("/v1/jobs", json={"name": name, "queue": "default", "duration": duration,
                                 "minAvailable": replicas,
                                 "tasks": [{"name": "worker", "replicas": replicas, "resources": {"gpu": gpu}}]})
    assert r.status_code == 201, r.text
    return str(r.json()["id"])


def wait_states(c: httpx.Client, ids: list[str], states: set[str], timeout_s: float = 120) -> dict[str, str]:
    deadline = time.monotonic() + timeout_s
    seen: dict[str, str] = {}
    while time.monotonic() < deadline:
        seen = {i: c.get(f"/v1/jobs/{i}").json()["state"] for i in ids}
        if all(s in states for s in seen.values()):
            return seen
        time.sleep(0.5)
    raise AssertionError(f"jobs not in {states}: {seen}")


def test_export_and_replay_the_stacks_history(stack: Stack, tmp_path):
    with httpx.Client(base_url=stack.url, headers={"Authorization": f"Bearer {stack.token}"},
                      timeout=30) as c:
        short = [submit(c, f"replay-one-{k}", 1.0, 1) for k in range(4)]
        short += [submit(c, "replay-gang", 1.5, 4, replicas=2), submit(c, "replay-eight", 1.0, 8)]
        long = submit(c, "replay-long", 600.0, 1)
        assert set(wait_states(c, short, {"succeeded", "failed", "cancelled"}).values()) == {"succeeded"}
        wait_states(c, [long], {"running"})
        try:
            path = tmp_path / "history.csv"
            r = CliRunner().invoke(app, ["export", "--since", "1h", "--database-url", str(stack.database_url),
                                         "--out", str(path)])
            assert r.exit_code == 0, r.output
            jobs, head = load_history(path)
            by = {j.job_id: j for j in jobs}
            # the stack is shared: earlier tests may have added nodes (all of 8 GPUs)
            known = len(c.get("/v1/nodes").json())
            assert head["cluster"]["nodes"] == known and head["cluster"]["gpus_per_node"] == 8
            for i in short:
                j = by[i]
                assert (j.state, j.censored, j.attempts) == ("succeeded", False, 1)
                assert j.duration_s > 0 and j.submit_s <= j.first_start_s <= j.end_s  # type: ignore[operator]
                assert j.end_s - j.first_start_s == pytest.approx(j.duration_s, abs=1e-6)  # type: ignore[operator]
            assert by[short[4]].tasks == (TaskShape("worker", 2, 4, 0, 0, 1000, 1024),)
            assert (by[short[4]].num_gpus, by[short[4]].min_available, by[short[5]].num_gpus) == (8, 2, 8)
            assert (by[long].state, by[long].censored, by[long].end_s) == ("running", True, None)
            assert by[long].duration_s > 0  # its running time so far
            ran = sum(j.ran for j in jobs)

            docs: list[dict[str, Any]] = []
            for source in (["--from", str(path)], ["--database-url", str(stack.database_url), "--since", "1h"]):
                out = tmp_path / f"replay{len(docs)}.json"
                r = CliRunner().invoke(app, ["replay", *source, "--policy", "fifo", "--current", "default",
                                             "--out", str(out)], env={"COLUMNS": "160"})
                assert r.exit_code == 0, r.output
                docs.append(json.loads(out.read_text()))
            from_file, from_db = docs
            assert from_file["cluster"] == from_db["cluster"] == f"{known}x8"
            for doc in docs:
                figs = doc["figures"]
                assert figs["current"]["jobs"] == figs["candidate"]["jobs"] == figs["recorded"]["jobs"]
                assert figs["candidate"]["jobs"] >= ran  # the database may have gained jobs since
                assert figs["candidate"]["avg_jct_s"] > 0 and figs["current"]["gpu_allocation_ratio"] > 0
            assert from_file["figures"]["candidate"]["jobs"] == ran
        finally:
            c.delete(f"/v1/jobs/{long}")
