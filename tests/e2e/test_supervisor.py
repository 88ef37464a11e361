"""A supervised stack brings back what dies: a service killed with SIGKILL, the embedded
broker and PostgreSQL. Real processes; deadlines only bound the waits."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import httpx
import pytest
from aiokafka.admin import AIOKafkaAdminClient
from sqlalchemy import text

from kairos.embedded import free_port
from kairos.stack import Stack
from shared.db import make_engine
from shared.topics import ALL_TOPICS

pytestmark = [pytest.mark.e2e, pytest.mark.broker, pytest.mark.db]
FAST = {"KAIROS_HEARTBEAT_S": "1", "KAIROS_TELEMETRY_S": "1", "KAIROS_LOST_AFTER_S": "10",
        "KAIROS_SESSION_TIMEOUT_MS": "6000", "KAIROS_REBALANCE_TIMEOUT_MS": "6000",
        "KAIROS_HEARTBEAT_INTERVAL_MS": "500"}
JOB = {"name": "after-restart", "duration": 0.5,
       "tasks": [{"name": "worker", "replicas": 1, "resources": {"gpu": 1}}]}


T = TypeVar("T")


def wait_for(cond: Callable[[], T], timeout_s: float, what: str) -> T:
    """Poll until ``cond`` gives something true, and return it."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if value := cond():
            return value
        time.sleep(0.2)
    raise AssertionError(f"{what} within {timeout_s}s")


def ready(port: int) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def dump_tracebacks(workdir: Path) -> None:
    for p in workdir.glob("logs/*.log"):  # surface crashes in the test output
        log = p.read_text(errors="replace")
        if "Traceback" in log:
            print(f"--- {p.name} ---\n{log[-4000:]}")


@pytest.fixture(scope="module")
def supervised() -> Iterator[tuple[Stack, list[str]]]:
    # outside pytest's 0700 tmp tree: the embedded PostgreSQL runs as its own user
    workdir = Path(tempfile.mkdtemp(prefix="kairos-sup-"))
    notes: list[str] = []
    s = Stack(workdir=workdir, nodes=2, gpus_per_node=8, nodes_per_agent=2,
              admission_port=free_port(), supervise=True, say=notes.append, env=FAST)
    try:
        s.start()
        yield s, notes
    finally:
        s.stop()
        dump_tracebacks(workdir)
        shutil.rmtree(workdir, ignore_errors=True)


def job_state(stack: Stack, job_id: str) -> str:
    r = httpx.get(f"{stack.url}/v1/jobs/{job_id}", timeout=10,
                  headers={"Authorization": f"Bearer {stack.token}"})
    return str(r.json()["state"]) if r.status_code == 200 else f"http {r.status_code}"


def test_a_killed_service_is_restarted_and_jobs_flow(supervised: tuple[Stack, list[str]]
                                                     ) -> None:
    stack, notes = supervised
    queueing = stack.proc("queueing")
    old = queueing.popen.pid
    os.kill(old, signal.SIGKILL)
    wait_for(lambda: queueing.popen.pid != old and ready(queueing.port), 90,
             "queueing restarted and ready")
    assert any("queueing exited (killed by SIGKILL)" in n for n in notes), notes
    assert "supervisor: queueing exited (killed by SIGKILL)" in queueing.log.read_text()
    assert "supervisor: queueing restarted" in queueing.log.read_text()

    def submitted() -> str | None:
        try:
            r = httpx.post(f"{stack.url}/v1/jobs", json=JOB, timeout=10,
                           headers={"Authorization": f"Bearer {stack.token}"})
        except httpx.HTTPError:
            return None
        return str(r.json()["id"]) if r.status_code == 201 else None

    job_id = wait_for(submitted, 60, "the job was accepted")
    try:
        wait_for(lambda: job_state(stack, job_id) == "succeeded", 180, "the job succeeded")
    except AssertionError as exc:
        raise AssertionError(f"{exc}: {job_id} is {job_state(stack, job_id)}") from None


def test_the_embedded_broker_and_postgres_come_back(supervised: tuple[Stack, list[str]]
                                                    ) -> None:
    stack, notes = supervised
    assert stack._broker and stack._pg and stack.kafka_bootstrap and stack.database_url
    # the broker: same port, the topics there again (it keeps nothing in memory storage)
    broker = stack._broker._proc
    assert broker is not None
    broker.kill()
    wait_for(lambda: stack._broker is not None and stack._broker._proc is not broker
             and any("supervisor: broker restarted" in n for n in notes), 90,
             "the broker restarted")
    assert {t.name for t in ALL_TOPICS} <= asyncio.run(topics(stack.kafka_bootstrap))
    # PostgreSQL: the same data directory, so the data is still there
    pid = stack._pg._server.get_postmaster_info().pid if stack._pg._server else 0
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: any("supervisor: postgres restarted" in n for n in notes), 90,
             "PostgreSQL restarted")
    assert asyncio.run(count_tokens(stack.database_url)) >= 1  # the dev token survived


async def topics(bootstrap: str) -> set[str]:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        return set(await admin.list_topics())
    finally:
        await admin.close()


async def count_tokens(url: str) -> int:
    engine = make_engine(url, pool_size=1)
    try:
        async with engine.connect() as conn:
            return int(await conn.scalar(text("SELECT count(*) FROM api_tokens")) or 0)
    finally:
        await engine.dispose()
