"""Forecasts end to end: jobs that must wait on the session's cluster each get a forecast
(the forecaster's process reading the scheduler's rows, jobs.forecasts, the gateway's
read model) in GET /v1/jobs/{id}, `kairos describe` and `kairos jobs --start`; the
forecaster's what-if answers; and killed and started again, it forecasts anew."""

from __future__ import annotations

import json
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
WAITING = {"pending", "admitted"}


def spec(name: str) -> dict[str, Any]:
    """A whole 8-GPU node for two minutes, not preemptible (so the wait is plain)."""
    return {"name": name, "duration": 120, "runtimeEstimate": 120, "preemptible": False,
            "tasks": [{"name": "w", "resources": {"gpu": 8}}]}


def until(what: str, check: Callable[[], bool], timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout_s}s: {what}")
        time.sleep(0.5)


def cli(stack: Stack, *args: str) -> str:
    r = CliRunner().invoke(app, [*args, "--url", stack.url, "--token", stack.token or ""],
                           env={"COLUMNS": "200"})
    assert r.exit_code == 0, r.output
    return r.output


def test_every_waiting_job_gets_a_forecast_and_a_restarted_forecaster_forecasts_again(
        stack: Stack, tmp_path: Path) -> None:
    c = httpx.Client(base_url=stack.url, headers={"Authorization": f"Bearer {stack.token}"},
                     timeout=30)
    ids: list[str] = []
    try:
        nodes = [n for n in c.get("/v1/nodes").json() if n["state"] == "ready"]
        full = sum(n["gpus_total"] // 8 for n in nodes)  # whole 8-GPU nodes
        for i in range(full + 3):
            r = c.post("/v1/jobs", json=spec(f"fc-{i}"))
            assert r.status_code == 201, r.text
            ids.append(r.json()["id"])

        def jobs() -> dict[str, dict[str, Any]]:
            return {j: c.get(f"/v1/jobs/{j}").json() for j in ids}

        def every_waiting_job_has_one() -> bool:
            now = jobs()
            waiting = [j for j in now.values() if j["state"] in WAITING]
            return len(waiting) >= 3 and all(
                j["forecast"] and j["forecast"]["start"] for j in waiting)

        until("a forecast for every waiting job", every_waiting_job_has_one)
        waiting = [j for j in jobs().values() if j["state"] in WAITING]
        for j in waiting:
            f = j["forecast"]
            assert f["nodes"] and f["start_low"] <= f["start"] <= f["start_high"]
            assert f["start"] > f["as_of"]  # the cluster is full: not now
        running = [j for j in jobs().values() if j["state"] not in WAITING]
        assert all(j["forecast"] is None for j in running)  # dropped once placed

        # the last to start; its start may have come due already (the session's earlier
        # jobs can run past their estimates): "now" then, else "in about ..."
        last = max(waiting, key=lambda j: j["forecast"]["start"])["id"]
        out = cli(stack, "describe", last)
        assert re.search(r"Expected start: (in about \d|now)", out), out
        listed = cli(stack, "jobs", "--start")
        assert all(j["id"] in listed for j in waiting)

        forecaster = stack.proc("forecaster")
        r = httpx.post(f"{forecaster.url}/v1/what-if", timeout=30, json={"candidates": [
            {"job_id": "what-if-1", "queue": "default", "tenant": "t", "user": "u",
             "spec": spec("what-if-1")}]})
        assert r.status_code == 200, r.text
        [one] = r.json()["forecasts"]
        assert one["job_id"] == "what-if-1" and one["start"] > r.json()["as_of"]

        # a dry run through the gateway asks the real forecaster: a start later than now
        # (the cluster is full), on nodes, and nothing stored
        r = c.post("/v1/jobs", params={"dryRun": "All"}, json=spec("fc-dry"))
        assert r.status_code == 200, r.text
        dry = r.json()
        assert dry["forecast_unavailable"] is None, dry
        assert dry["forecast"]["nodes"] and dry["forecast"]["in_seconds"] >= 0
        assert re.search(r"would start (in about \d|now)", dry["summary"]), dry["summary"]
        assert "fc-dry" not in _names(c)
        spec_file = tmp_path / "dry.json"
        spec_file.write_text(json.dumps(spec("fc-whatif")))
        table = cli(stack, "submit", "--dry-run", "--what-if", "gpu=8,16", str(spec_file))
        assert "gpu=8" in table and "gpu=16" in table, table

        # the forecaster killed: a job submitted meanwhile is forecast once it is back
        forecaster.popen.kill()
        forecaster.popen.wait(15)
        r = c.post("/v1/jobs", json=spec("fc-late"))
        assert r.status_code == 201, r.text
        late = r.json()["id"]
        ids.append(late)
        time.sleep(3)
        assert c.get(f"/v1/jobs/{late}").json()["forecast"] is None
        forecaster.restart()
        until("the forecaster ready again", lambda: _ready(forecaster.url))
        until("the late job's forecast", lambda: bool(
            (c.get(f"/v1/jobs/{late}").json().get("forecast") or {}).get("start")))
    finally:
        for job_id in ids:
            c.delete(f"/v1/jobs/{job_id}")
        c.close()


def _names(c: httpx.Client) -> set[str]:
    """Every job's name, page by page."""
    names: set[str] = set()
    cursor: str | None = None
    while True:
        page = c.get("/v1/jobs", params={"limit": 100, **({"cursor": cursor} if cursor else {})}).json()
        names |= {j["name"] for j in page["items"]}
        cursor = page["next_cursor"]
        if cursor is None:
            return names


def _ready(url: str) -> bool:
    try:
        return httpx.get(f"{url}/readyz", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False
