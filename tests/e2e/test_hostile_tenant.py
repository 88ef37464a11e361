"""Issue 42's attacks on the real stack: one tenant (or a process without credentials)
against another. Each test asserts that the attack is refused; one still open is marked
``xfail(strict=True)`` with the issue's row, so the suite shows what is open, and turns
red the day it is closed while its marker stays (remove the marker with the fix)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from kairos.stack import Stack
from tests.e2e.conftest import running_stack
from tests.e2e.test_supervisor import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.broker, pytest.mark.db]


@pytest.fixture(scope="module")
def one_node() -> Iterator[Stack]:
    """One node of 8 GPUs: a job of 8 GPUs fills the cluster."""
    with running_stack("hostile", nodes=1, gpus_per_node=8,
                       env={"KAIROS_HEARTBEAT_S": "1", "KAIROS_TELEMETRY_S": "1"}) as s:
        yield s


def user(stack: Stack, tenant: str) -> dict[str, str]:
    """The Authorization header of a new plain user of ``tenant``."""
    r = httpx.post(f"{stack.url}/v1/tokens", timeout=30, json={"tenant": tenant, "role": "user"},
                   headers={"Authorization": f"Bearer {stack.token}"})
    assert r.status_code in (200, 201), r.text
    return {"Authorization": f"Bearer {r.json()['token']}"}


def job(stack: Stack, who: dict[str, str], job_id: str) -> dict[str, Any]:
    r = httpx.get(f"{stack.url}/v1/jobs/{job_id}", headers=who, timeout=30)
    assert r.status_code == 200, r.text
    body: dict[str, Any] = r.json()
    return body


@pytest.mark.xfail(strict=True, reason=(
    "issue 42, row 'priority': any user may ask for priorityClass urgent, priority 1000 and "
    "preemptible false, and class preemption stops another tenant's running job"))
def test_a_user_cannot_take_another_tenants_gpus_by_asking_for_urgent(one_node: Stack) -> None:
    """Tenant ta runs an 8-GPU job on the full cluster; a plain user of tenant tb submits
    an urgent, non-preemptible 8-GPU job at priority 1000. Refused with a 403 that names
    the queue's limit, and ta's job runs on; today it is accepted and ta's job stopped."""
    ta, tb = user(one_node, "ta"), user(one_node, "tb")
    gpus8 = [{"name": "w", "resources": {"gpu": 8}}]
    r = httpx.post(f"{one_node.url}/v1/jobs", headers=ta, timeout=30,
                   json={"name": "victim", "duration": 120, "tasks": gpus8})
    assert r.status_code == 201, r.text
    victim = r.json()["id"]
    bully = None
    try:
        wait_for(lambda: job(one_node, ta, victim)["state"] == "running", 60, "ta's job running")
        r = httpx.post(f"{one_node.url}/v1/jobs", headers=tb, timeout=30, json={
            "name": "bully", "priorityClass": "urgent", "priority": 1000, "preemptible": False,
            "duration": 1, "tasks": gpus8})
        if r.status_code == 201:
            bully = r.json()["id"]
        assert r.status_code == 403 and "queue" in r.text, r.text
        assert job(one_node, ta, victim)["state"] == "running"
    finally:
        admin = {"Authorization": f"Bearer {one_node.token}"}
        for job_id in (victim, bully):
            if job_id:
                httpx.delete(f"{one_node.url}/v1/jobs/{job_id}", headers=admin, timeout=30)
