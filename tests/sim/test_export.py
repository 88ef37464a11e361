"""``kairos sim export``: jobs and transitions stored by the gateway's own store
functions in a real PostgreSQL, read back as a trace file, loaded back exactly."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from services.admission.store import apply_node_event, apply_status, insert_job
from shared.db import make_engine
from shared.events import GpuInfo, JobState, JobStatus, NodeInventory, NodeRegistered
from shared.jobspec import JobSpec
from sim.export import observe, read_history
from sim.history_trace import TaskShape, load_history, write_history

pytestmark = [pytest.mark.db]


def spec(name: str, **kw: Any) -> JobSpec:
    return JobSpec.model_validate({"name": name, "queue": kw.pop("queue", "default"), **kw})


async def store_history(url: str) -> tuple[dict[str, datetime], datetime]:
    """Five jobs as the gateway records them; returns (submit times by name, now)."""
    engine = make_engine(url, pool_size=2)
    sub: dict[str, datetime] = {}
    ids: dict[str, str] = {}
    specs = {
        "one": (spec("one", tasks=[{"name": "w", "resources": {"gpu": 1}}]), "t1", "ann"),
        "gang": (spec("gang", priority=5, priorityClass="high", minAvailable=2, runtimeEstimate=12.5,
                      tasks=[{"name": "worker", "replicas": 2, "resources": {"gpu": 4, "cpu": 8000}}]), "t2", "bob"),
        "live": (spec("live", preemptible=False, tasks=[{"name": "w", "resources": {"gpu": 2}}]), "t1", "ann"),
        "waits": (spec("waits", tasks=[{"name": "w", "resources": {"gpu": 8}}]), "t2", "bob"),
        "gone": (spec("gone", tasks=[{"name": "w", "resources": {"gpuMemory": 20480, "gpuCompute": 50}}]),
                 "t1", "cy"),
    }
    for name, (s, tenant, user) in specs.items():
        row, created = await insert_job(engine, s, tenant, user, None)
        assert created
        ids[name], sub[name] = row["id"], row["submitted_at"]
    moves = {  # (state, attempt, seconds after the job's submit)
        "one": [("admitted", 1, 0.5), ("bound", 1, 1.0), ("running", 1, 2.0), ("succeeded", 1, 12.0)],
        "gang": [("admitted", 1, 1.0), ("running", 1, 3.0), ("preempted", 1, 10.5), ("admitted", 2, 20.0),
                 ("running", 2, 25.0), ("succeeded", 2, 28.25)],
        "live": [("admitted", 1, 0.25), ("running", 1, 1.0)],
        "waits": [],
        "gone": [("cancelled", 1, 4.0)],
    }
    async with engine.begin() as conn:
        for name, steps in moves.items():
            for state, attempt, dt in steps:
                await apply_status(conn, uuid.uuid4().hex, JobStatus(
                    job_id=ids[name], state=JobState(state), reason=state, attempt=attempt),
                    sub[name] + timedelta(seconds=dt))
        for i in range(3):
            inv = NodeInventory(node_id=f"node-{i}", cpu_milli=64_000, memory_mib=512_000,
                                gpus=[GpuInfo(index=g, uuid=f"u{i}{g}", model="H100", memory_mib=81559)
                                      for g in range(8)])
            await apply_node_event(conn, NodeRegistered(inventory=inv, agent_started_at=datetime.now(UTC)),
                                   datetime.now(UTC))
    await engine.dispose()
    return sub, max(sub.values()) + timedelta(seconds=100)


async def test_export_round_trips_exactly(db_url, tmp_path):
    sub, now = await store_history(db_url)
    jobs, meta = await read_history(db_url, now - timedelta(days=7), now)
    by = {j.job_id: j for j in jobs}
    assert len(jobs) == 5
    one, gang, live, waits, gone = (next(j for j in jobs if j.submitted_at == sub[n].isoformat())
                                    for n in ("one", "gang", "live", "waits", "gone"))
    # durations: summed running time over attempts; censored for jobs not ended
    assert (one.duration_s, one.state, one.censored, one.attempts) == (10.0, "succeeded", False, 1)
    assert (gang.duration_s, gang.attempts, gang.num_gpus, gang.gpus_per_task, gang.replicas) == (10.75, 2, 8, 4, 2)
    assert gang.tasks == (TaskShape("worker", 2, 4, 0, 0, 8000, 1024),)
    assert (gang.priority, gang.priority_class, gang.min_available, gang.runtime_estimate_s) == (5, "high", 2, 12.5)
    assert (gang.tenant, gang.user, gang.queue) == ("t2", "bob", "default")
    assert gang.end_s - gang.first_start_s == 25.25  # first start to end, preemption's wait included
    assert live.censored and not live.preemptible
    assert live.duration_s == (now - sub["live"] - timedelta(seconds=1)).total_seconds()
    assert (waits.censored, waits.duration_s, waits.ran) == (True, 0.0, False)
    assert (gone.state, gone.ran, gone.num_gpus, gone.tasks[0].gpu_compute_pct) == ("cancelled", False, 0, 50)
    assert min(j.submit_s for j in jobs) == 0.0
    assert meta["cluster"]["nodes"] == 3 and meta["cluster"]["gpus_per_node"] == 8
    assert meta["cluster"]["groups"][0]["gpu_memory_mib"] == 81559

    path = tmp_path / "history.csv"
    write_history(path, jobs, meta)
    back, head = load_history(path)
    assert back == jobs  # every field, floats bit for bit
    assert head == {"version": 1, "time_unit": "s"} | meta
    ran, _ = load_history(path, ran_only=True)
    assert {j.job_id for j in ran} == {by[k].job_id for k in by if by[k].duration_s > 0} == {
        one.job_id, gang.job_id, live.job_id}


def test_a_later_attempt_ends_the_earlier_run():
    t0 = datetime(2025, 1, 1, tzinfo=UTC)
    obs = observe([("running", 1, t0), ("running", 2, t0 + timedelta(seconds=4)),
                   ("failed", 2, t0 + timedelta(seconds=6, microseconds=1))], t0 + timedelta(hours=1))
    # a later attempt's first report ends the earlier one; the end is exact to the microsecond
    assert (obs.run_time, obs.attempts, obs.censored) == (timedelta(seconds=6, microseconds=1), 2, False)


@pytest.mark.parametrize("unit", ["ms", "us"])
def test_a_history_file_refuses_another_unit(tmp_path, unit):
    from sim.traces import TraceError

    path = tmp_path / "h.csv"
    write_history(path, [], {"cluster": {}})
    with pytest.raises(TraceError, match="states its unit"):
        load_history(path, time_unit=unit)
