"""Job arrays end to end, through the CLI and the API over the whole platform: one submit,
one job per index with its index in its environment, the ``%N`` cap kept while they
run, listing by array, and cancel of one element or of the whole array."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from kairos.stack import Stack
from tests.e2e.test_cli import run_cli

pytestmark = [pytest.mark.e2e, pytest.mark.broker, pytest.mark.db]
TERMINAL = {"succeeded", "failed", "cancelled"}
HOLDING = {"admitted", "bound", "running"}


def _elements(stack: Stack, array_id: str) -> list[dict[str, Any]]:
    r = httpx.get(f"{stack.url}/v1/jobs", params={"array": array_id, "limit": 500},
                  headers={"Authorization": f"Bearer {stack.token}"})
    r.raise_for_status()
    return r.json()["items"]


def test_an_array_runs_each_index_once_and_keeps_its_cap(stack: Stack, tmp_path: Path) -> None:
    spec = tmp_path / "sweep.yaml"
    spec.write_text("name: sweep\nduration: 1.0\ntasks:\n"
                    "  - name: w\n    resources: {gpu: 1}\n    env: {SLURM_ARRAY_TASK_ID: x}\n")
    code, out = run_cli(stack, "submit", str(spec), "--array", "0-5%2", "-q")
    assert code == 0, out
    array_id = out.strip()
    assert array_id.startswith("a-")
    elements = _elements(stack, array_id)
    assert sorted(e["array_index"] for e in elements) == [0, 1, 2, 3, 4, 5]
    assert {e["id"] for e in elements} == {f"{array_id}-{i}" for i in range(6)}
    env = next(e for e in elements if e["array_index"] == 4)["spec"]["tasks"][0]["env"]
    assert env["SLURM_ARRAY_TASK_ID"] == env["KAIROS_ARRAY_INDEX"] == "4"  # ours win
    assert env["SLURM_ARRAY_TASK_COUNT"] == "6" and env["KAIROS_ARRAY_ID"] == array_id
    most = 0
    deadline = time.monotonic() + 120
    while True:  # the cluster has room for all six: only the cap holds them back
        states = [e["state"] for e in _elements(stack, array_id)]
        most = max(most, sum(s in HOLDING for s in states))
        if all(s in TERMINAL for s in states):
            break
        assert time.monotonic() < deadline, states
        time.sleep(0.05)
    assert states == ["succeeded"] * 6
    assert most >= 1 and most <= 2  # never more than %2 at once
    code, out = run_cli(stack, "describe", array_id)
    assert code == 0 and "succeeded" in out and "0-5%2" in out
    code, out = run_cli(stack, "jobs", "--array", array_id)
    assert code == 0 and out.count("sweep") == 6


def test_cancel_one_element_then_the_whole_array(stack: Stack) -> None:
    auth = {"Authorization": f"Bearer {stack.token}"}
    body = {"name": "long", "duration": 600, "array": "0-3%1",
            "tasks": [{"name": "w", "resources": {"gpu": 1}}]}
    r = httpx.post(f"{stack.url}/v1/jobs", json=body,
                   headers={**auth, "Idempotency-Key": "arr-cancel-1"})
    assert r.status_code == 201, r.text
    arr = r.json()
    assert (arr["size"], arr["max_running"], r.headers["Location"]) == (
        4, 1, f"/v1/arrays/{arr['id']}")
    again = httpx.post(f"{stack.url}/v1/jobs", json=body,
                       headers={**auth, "Idempotency-Key": "arr-cancel-1"})
    assert again.status_code == 200 and again.json()["id"] == arr["id"]  # a retry: the same
    assert len(_elements(stack, arr["id"])) == 4
    code, out = run_cli(stack, "cancel", f"{arr['id']}-3")
    assert code == 0, out
    deadline = time.monotonic() + 60
    while (s := {e["array_index"]: e["state"] for e in _elements(stack, arr["id"])})[3] \
            != "cancelled" or s[0] != "running":
        assert time.monotonic() < deadline, s
        time.sleep(0.1)
    assert s[1] == s[2] == "pending"  # behind the cap, not the cluster
    while (httpx.get(f"{stack.url}/v1/jobs/{arr['id']}-1", headers=auth).json()["waiting"]
           or {}).get("reason") != "array_limit":
        assert time.monotonic() < deadline
        time.sleep(0.1)
    code, out = run_cli(stack, "cancel", arr["id"])
    assert code == 0 and "3 jobs" in out, out  # the one cancelled already is not counted
    while not all(e["state"] == "cancelled" for e in _elements(stack, arr["id"])):
        assert time.monotonic() < deadline, _elements(stack, arr["id"])
        time.sleep(0.1)
    summary = httpx.get(f"{stack.url}/v1/arrays/{arr['id']}", headers=auth).json()
    assert summary["states"] == {"cancelled": 4}
    assert json.dumps(summary["spec"]).count("0-3%1") == 1  # the request as submitted
