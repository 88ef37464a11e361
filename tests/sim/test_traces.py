from __future__ import annotations

import itertools

import pytest

from sim.traces import (
    MURI,
    OPENB,
    PHILLY,
    TraceError,
    load_cluster_spec,
    load_muri,
    load_openb_nodes,
    load_openb_pods,
    load_philly,
    synthetic,
    uniform_cluster,
)


def test_philly_slice(slice_file):
    jobs = load_philly(slice_file(PHILLY, 50))
    assert len(jobs) == 50
    assert jobs[0].submit_s == 0.0
    assert all(a.submit_s <= b.submit_s for a, b in itertools.pairwise(jobs))
    assert all(j.duration_s >= 1 and j.num_gpus >= 1 for j in jobs)
    assert jobs[0].tenant  # the virtual cluster


def test_philly_limit_keeps_earliest(slice_file):
    jobs = load_philly(slice_file(PHILLY, 30), limit=5)
    assert len(jobs) == 5 and jobs[-1].submit_s <= max(j.submit_s for j in load_philly(slice_file(PHILLY, 30)))


def test_muri_slice_is_in_seconds(slice_file):
    jobs = load_muri(slice_file(MURI / "trace1.csv", 20))
    assert len(jobs) == 20
    first = next(j for j in jobs if j.job_id == "muri-1")
    assert first.submit_s == pytest.approx(201694.0)  # 201,694,000 ms
    assert first.num_gpus == 8
    assert load_cluster_spec(MURI / "n8g8.csv") == (8, 8)


def test_openb_pods_default_and_five_column_variant(slice_file):
    full = load_openb_pods(slice_file(OPENB / "openb_pod_list_default.csv", 40))
    five = load_openb_pods(slice_file(OPENB / "openb_pod_list_multigpu50.csv", 40))
    assert len(full) == len(five) == 40
    share = [p for p in full if p.shared]
    assert share and all(0 < p.gpu_request_milli < 1000 for p in share)
    assert all(p.gpu_request_milli == 1000 * p.num_gpu for p in full if not p.shared)


def test_openb_nodes(slice_file):
    nodes = load_openb_nodes(slice_file(OPENB / "openb_node_list_gpu_node.csv", 10))
    assert len(nodes) == 10
    assert all(len(n.gpus) > 0 and n.gpus[0].model for n in nodes)


def test_missing_column_is_reported(tmp_path):
    bad = tmp_path / "bad.csv"
    bad.write_text("name,cpu_milli\nx,1\n")
    with pytest.raises(TraceError, match="num_gpu"):
        load_openb_pods(bad)


def test_synthetic_is_deterministic():
    a, b = synthetic(200, seed=3), synthetic(200, seed=3)
    assert a == b
    assert {j.num_gpus for j in a} <= {1, 2, 4, 8, 16}
    assert len(uniform_cluster(4, 8)) == 4
