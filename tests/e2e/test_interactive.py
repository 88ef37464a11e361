"""Interactive GPU environments through the whole stack (simulated nodes): requested
with the CLI, queued and placed like any job, held with a (simulated) connection until
returned; another is stopped by its agent at its time limit."""

from __future__ import annotations

import re
import time
from collections.abc import Callable
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


def env(stack: Stack, env_id: str) -> dict[str, Any]:
    return dict(httpx.get(f"{stack.url}/v1/environments/{env_id}", timeout=10,
                          headers={"Authorization": f"Bearer {stack.token}"}).json())


def until(what: str, pred: Callable[[], Any], timeout: float = 90) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = pred()
        if got:
            return got
        time.sleep(0.3)
    raise AssertionError(f"timed out waiting for {what}")


def test_request_connect_and_return_an_environment(stack: Stack) -> None:
    code, out = cli(stack, "env", "request", "--gpu", "2", "--time-limit", "600",
                    "--name", "notebook", "--wait", "60")
    assert code == 0, out
    env_id = re.search(r"requested (j-[0-9a-f]+)", out)[1]  # type: ignore[index]
    got = env(stack, env_id)
    assert got["state"] == "running" and got["connection"]["simulated"]
    port = got["connection"]["port"]
    assert f"running: connect to {got['connection']['host']}:{port} (simulated)" in out
    assert got["expires_at"] is not None and got["time_limit_s"] == 600
    code, out = cli(stack, "env", "list")
    assert code == 0 and env_id in out and str(port) in out
    job = httpx.get(f"{stack.url}/v1/jobs/{env_id}", timeout=10,
                    headers={"Authorization": f"Bearer {stack.token}"}).json()
    assert job["spec"]["kind"] == "Interactive" and len(job["placement"]) == 1
    assert sum(len(p["gpus"]) for p in job["placement"]) == 2
    code, out = cli(stack, "env", "return", env_id)
    assert code == 0, out
    done = until("it to end", lambda: (e := env(stack, env_id))["state"] == "cancelled" and e)
    assert (done["reason"], done["connection"]) == ("returned", None)
    code, out = cli(stack, "env", "return", env_id)
    assert code == 1 and "409" in out and "already ended" in out


def test_the_agent_stops_an_environment_at_its_time_limit(stack: Stack) -> None:
    r = httpx.post(f"{stack.url}/v1/environments", timeout=10,
                   headers={"Authorization": f"Bearer {stack.token}"},
                   json={"gpuMemory": 8192, "gpuCompute": 25, "timeLimit": 2})
    assert r.status_code == 201, r.text
    env_id = r.json()["id"]
    until("it to run", lambda: env(stack, env_id)["state"] == "running")
    done = until("its time limit", lambda: (
        (e := env(stack, env_id))["state"] not in ("pending", "admitted", "bound", "running")
        and e))
    assert (done["state"], done["reason"], done["attempt"]) == (
        "cancelled", "time limit reached", 1)
