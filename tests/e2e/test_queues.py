"""Queues through the whole stack (every service its own process): the CLI creates a
queue with a 2-GPU quota, three 1-GPU jobs go to it and never more than two hold GPUs at
once, the third waits with its reason and position and runs when one ends; a closed
queue refuses new jobs."""

from __future__ import annotations

import re
import time
import uuid
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

from kairos.cli import app
from kairos.stack import Stack

pytestmark = [pytest.mark.e2e]


def cli(stack: Stack, *args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, [*args, "--url", stack.url, "--token", stack.token or ""])
    return result.exit_code, result.output


def test_a_queue_holds_jobs_to_its_quota_and_explains_the_wait(stack: Stack,
                                                               tmp_path: Path) -> None:
    name = f"team-{uuid.uuid4().hex[:6]}"
    code, out = cli(stack, "queue", "create", name, "--gpus", "2")
    assert code == 0, out
    assert f"queue {name} created" in out and "guaranteed 2 GPUs" in out
    spec = tmp_path / "job.yaml"
    spec.write_text(f"name: q\nqueue: {name}\nduration: 4\n"
                    "tasks: [{name: w, resources: {gpu: 1}}]\n")
    ids = []
    for _ in range(3):
        code, out = cli(stack, "submit", str(spec))
        assert code == 0, out
        ids.append(re.search(r"submitted (j-[0-9a-f]+)", out)[1])  # type: ignore[index]
    headers = {"Authorization": f"Bearer {stack.token}"}
    seen_waiting = False
    deadline = time.monotonic() + 120
    while True:
        jobs = [httpx.get(f"{stack.url}/v1/jobs/{j}", headers=headers, timeout=5).json()
                for j in ids]
        # the quota holds; one list query reads the three at one moment (one GET each may
        # see a job still running and, later, the job admitted when it ended)
        listed = httpx.get(f"{stack.url}/v1/jobs", params={"queue": name}, headers=headers,
                           timeout=5).json()["items"]
        holding = [j for j in listed if j["state"] in ("admitted", "bound", "running")]
        assert len(holding) <= 2, [(j["id"], j["state"]) for j in listed]
        waiting = [j for j in jobs if j.get("waiting")]
        if waiting and not seen_waiting:
            w = waiting[0]["waiting"]
            assert (w["queue"], w["reason"], w["position"]) == (name, "quota", 1)
            code, out = cli(stack, "describe", waiting[0]["id"])
            assert code == 0 and f"waiting in queue {name}: position 1, quota" in out, out
            code, out = cli(stack, "queues")
            assert code == 0 and name in out, out
            row = next(line for line in out.splitlines() if name in line)
            assert "2/2" in row  # GPUs used / guaranteed
            seen_waiting = True
        if all(j["state"] == "succeeded" for j in jobs):
            break
        assert not any(j["state"] in ("failed", "cancelled") for j in jobs), jobs
        assert time.monotonic() < deadline, [(j["id"], j["state"]) for j in jobs]
        time.sleep(0.3)
    assert seen_waiting
    # the third job waited for quota, then was admitted
    history = httpx.get(f"{stack.url}/v1/jobs/{ids[2]}", headers=headers, timeout=5).json()
    reasons = [h["reason"] for h in history["history"]]
    assert "waiting: quota" in reasons and f"admitted by queue {name}" in reasons
    code, out = cli(stack, "queue", "close", name)
    assert code == 0 and "state closed" in out, out
    code, out = cli(stack, "submit", str(spec))
    assert code == 1 and "409" in out and f"queue {name} is closed" in out
    code, out = cli(stack, "queue", "close", name)
    assert code == 1 and "already closed" in out
    user = httpx.post(f"{stack.url}/v1/tokens", headers=headers, timeout=5,
                      json={"tenant": "other", "role": "user"}).json()["token"]
    result = CliRunner().invoke(app, ["queue", "open", name, "--url", stack.url,
                                      "--token", user])
    assert result.exit_code == 1 and "403" in result.output
