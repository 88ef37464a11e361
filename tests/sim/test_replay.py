"""``kairos sim replay``: two policies over a small exported history, the table's
figures held against a direct ``kairos sim run`` of the same file."""

from __future__ import annotations

import json
import random

import pytest
import yaml
from typer.testing import CliRunner

from scheduling import SchedulerConfig
from sim.cli import app
from sim.engine import SimSettings
from sim.history_trace import HistoryJob, TaskShape, write_history
from sim.replay import ReplaySimulation, current_policy, replay, uniform
from sim.replay_report import table_rows


def job(k: int, submit: float, dur: float, tenant: str, gpu: int = 1, replicas: int = 1, **kw) -> HistoryJob:
    return HistoryJob(f"j{k}", submit, dur, gpu * replicas, tenant, queue=tenant, user=f"u-{tenant}",
                      tasks=(TaskShape("w", replicas, gpu, 0, 0, 1000, 1024),), submitted_at=f"2025-01-01T00:{k:02d}:00+00:00",
                      first_start_s=submit + 1.0 if dur else None,
                      end_s=None if kw.get("censored") else submit + 1.0 + dur, **kw)


def history(n: int = 40) -> list[HistoryJob]:
    """One-GPU jobs (so where a job lands changes nothing) overloading one 8-GPU node,
    two tenants; one still running at export (censored) and one that never ran."""
    rnd = random.Random(7)
    jobs = [job(k, k * 30.0, float(rnd.choice([60, 300, 1200, 3600])), "t1" if k % 3 else "t2")
            for k in range(n)]
    jobs.append(job(n, n * 30.0, 500.0, "t2", censored=True, state="running"))
    jobs.append(job(n + 1, n * 30.0, 0.0, "t1", censored=True, state="pending"))
    return jobs


@pytest.fixture
def exported(tmp_path):
    path = tmp_path / "history.csv"
    write_history(path, history(), {"cluster": {"nodes": 1, "gpus_per_node": 8, "groups": [
        {"count": 1, "gpus": 8, "gpu_model": "H100", "gpu_memory_mib": 81559, "cpu_milli": 64000,
         "memory_mib": 512000}]}, "exported_at": "2025-01-02T00:00:00+00:00"})
    fifo = tmp_path / "fifo.yaml"
    fifo.write_text(yaml.safe_dump(SchedulerConfig.preset("fifo", preemption={"enabled": False})
                                   .model_dump(mode="json")))
    return path, fifo


def test_replay_table_matches_a_direct_sim_run(exported, tmp_path, monkeypatch):
    path, fifo = exported
    monkeypatch.delenv("KAIROS_POLICY_FILE", raising=False)
    monkeypatch.delenv("KAIROS_POLICY", raising=False)
    out = tmp_path / "replay.json"
    r = CliRunner().invoke(app, ["replay", "--from", str(path), "--policy", str(fifo), "--out", str(out)],
                           env={"COLUMNS": "200"})
    assert r.exit_code == 0, r.output
    doc = json.loads(out.read_text())
    assert doc["cluster"] == "1x8" and doc["policies"] == {"current": "preset default", "candidate": str(fifo)}
    assert (tmp_path / "replay_1x8.png").stat().st_size > 0
    assert "queueing delay (s): t2" in r.output and "shadow replay of history.csv" in r.output

    direct = tmp_path / "run.json"
    r = CliRunner().invoke(app, ["run", str(path), "--policy", "FIFO", "--nodes", "1", "--gpus", "8",
                                 "--cycle-s", "0", "--out", str(direct)])
    assert r.exit_code == 0, r.output
    m = json.loads(direct.read_text())
    cand = doc["figures"]["candidate"]
    assert m["jobs"] == cand["jobs"] == 41  # the 40 ended and the one running at export
    for key in ("avg_jct_s", "p99_jct_s", "avg_queue_s", "preemptions", "unfinished"):
        assert cand[key] == m[key], key
    assert cand["gpu_allocation_ratio"] == pytest.approx(m["gpu_allocation_ratio"], abs=1e-4)
    assert cand["jain_tenant_slowdown"] == m["jain_index_tenant_slowdown"]
    # the two policies really ran: FIFO holds the order, the default preset reorders
    assert doc["figures"]["current"]["avg_jct_s"] != cand["avg_jct_s"]
    rec = doc["figures"]["recorded"]
    assert rec["avg_queue_s"] == 1.0 and rec["unfinished"] == 1 and set(rec["queue_s_by_tenant"]) == {"t1", "t2"}
    labels = [label for label, _ in table_rows(doc["figures"])]
    assert "fairness: Jain over tenants' slowdown" in labels


def test_drop_censored_and_since(exported, tmp_path):
    path, fifo = exported
    out = tmp_path / "r.json"
    r = CliRunner().invoke(app, ["replay", "--from", str(path), "--policy", "fifo", "--current", str(fifo),
                                 "--drop-censored", "--since", "24h", "--out", str(out)])
    assert r.exit_code == 0, r.output
    doc = json.loads(out.read_text())
    assert doc["figures"]["candidate"]["jobs"] == 40
    # both are FIFO (a preset and the same file): the same figures
    assert doc["figures"]["candidate"]["avg_jct_s"] == doc["figures"]["current"]["avg_jct_s"]


def test_recorded_gang_shape_is_kept():
    """A 2 x 4-GPU gang fits on two 4-GPU nodes; as the engine's plain trace job (one
    8-GPU task) it would never fit."""
    gang = job(0, 0.0, 100.0, "t1", gpu=4, replicas=2, min_available=2)
    res = ReplaySimulation(uniform(2, 4), [gang], SchedulerConfig.preset("default"), SimSettings()).run()
    (jr,) = res.jobs
    assert jr.finish == 100.0
    assert [(t.replicas, t.gpu) for t in jr.request.tasks] == [(2, 4)] and jr.request.min_available == 2


def test_current_policy_reads_the_scheduler_settings(tmp_path):
    f = tmp_path / "p.yaml"
    f.write_text("preemption:\n  enabled: false\n")
    assert current_policy({"KAIROS_POLICY_FILE": str(f)}).config.preemption.enabled is False
    assert current_policy({"KAIROS_POLICY": "drf"}).label == "preset drf"
    assert current_policy({}).label == "preset default"
    runs = replay([job(0, 0.0, 10.0, "t1")], uniform(1, 8), {"a": current_policy({})}, SimSettings())
    assert runs["a"].jobs[0].finish == 10.0


def test_unknown_policy_is_a_bad_parameter(exported):
    path, _ = exported
    r = CliRunner().invoke(app, ["replay", "--from", str(path), "--policy", "nope.yaml"],
                           env={"COLUMNS": "300"})
    assert r.exit_code == 2 and "neither a policy file nor a preset" in r.output

