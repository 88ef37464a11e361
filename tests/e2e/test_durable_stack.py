"""The embedded stack keeps its state: a second Stack on the same workdir with
fresh=False still knows the first one's jobs and tokens, and reuses its development
token (what `kairos up` does)."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import httpx
import pytest

from kairos.embedded import free_port
from kairos.stack import Stack, wipe_state
from tests.e2e.test_supervisor import FAST, JOB, dump_tracebacks, job_state, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.broker, pytest.mark.db]


def small_stack(workdir: Path) -> Stack:
    return Stack(workdir=workdir, nodes=2, gpus_per_node=8, nodes_per_agent=2,
                 admission_port=free_port(), fresh=False, env=FAST)


def test_jobs_and_tokens_outlive_a_restart() -> None:
    # outside pytest's 0700 tmp tree: the embedded PostgreSQL runs as its own user
    workdir = Path(tempfile.mkdtemp(prefix="kairos-durable-"))
    try:
        first = small_stack(workdir)  # an empty workdir: a blank database all the same
        try:
            first.start()
            admin = {"Authorization": f"Bearer {first.token}"}
            r = httpx.post(f"{first.url}/v1/jobs", json=JOB, headers=admin, timeout=30)
            assert r.status_code == 201, r.text
            job_id = r.json()["id"]
            wait_for(lambda: job_state(first, job_id) == "succeeded", 180, "the job succeeded")
            r = httpx.post(f"{first.url}/v1/tokens", headers=admin, timeout=30,
                           json={"tenant": "default", "role": "user", "name": "alice"})
            assert r.status_code == 201, r.text
            alice = {"Authorization": f"Bearer {r.json()['token']}"}
        finally:
            first.stop()
            dump_tracebacks(workdir)

        second = small_stack(workdir)
        try:
            second.start()
            assert second.token == first.token  # kept in the workdir: saved CLIs work on
            with pytest.raises(RuntimeError, match="stop the platform first"):
                wipe_state(workdir)  # never under a running PostgreSQL
            r = httpx.get(f"{second.url}/v1/jobs/{job_id}", headers=alice, timeout=30)
            assert r.status_code == 200, r.text  # alice's token authenticates still
            assert r.json()["state"] == "succeeded"
            listed = httpx.get(f"{second.url}/v1/jobs", headers=admin, timeout=30).json()
            assert {j["id"]: j["state"] for j in listed["items"]}[job_id] == "succeeded"
        finally:
            second.stop()
            dump_tracebacks(workdir)
        wipe_state(workdir)  # what `kairos reset` does
        assert not workdir.exists()
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
