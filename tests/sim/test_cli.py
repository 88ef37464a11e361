from __future__ import annotations

import json

from typer.testing import CliRunner

from sim.cli import app


def test_run_synthetic(tmp_path):
    out = tmp_path / "r.json"
    r = CliRunner().invoke(app, ["run", "synthetic", "--limit", "30", "--nodes", "2", "--policy", "SJF",
                                 "--out", str(out)])
    assert r.exit_code == 0, r.output
    m = json.loads(out.read_text())
    assert m["finished"] == 30 and m["rules"]["estimates"] == "oracle"


def test_compare_small_slice(tmp_path):
    out = tmp_path / "c.json"
    r = CliRunner().invoke(app, ["compare", "muri-trace1", "--limit", "25", "--nodes", "2", "--gpus", "8",
                                 "--policy", "FIFO", "--policy", "Tiresias", "--out", str(out)])
    assert r.exit_code == 0, r.output
    doc = json.loads(out.read_text())
    assert set(doc["2x8"]) == {"FIFO", "Tiresias"}
    assert doc["2x8"]["FIFO"]["avg_jct_s"] > 0


def test_run_on_a_mixed_cluster(tmp_path):
    out = tmp_path / "r.json"
    r = CliRunner().invoke(app, ["run", "gavel-795a4c", "--cluster", "v100:8,k80:8", "--policy", "Kairos-aware",
                                 "--out", str(out)])
    assert r.exit_code == 0, r.output
    doc = json.loads(out.read_text())
    assert doc["cluster"] == "v100:8,k80:8" and doc["finished"] == doc["jobs"] == 3
    assert set(doc["gpu_hours_by_model"]) <= {"V100", "K80"} and sum(doc["gpu_hours_by_model"].values()) > 0


def test_a_bad_mixed_cluster_is_a_clear_error():
    r = CliRunner().invoke(app, ["run", "gavel-795a4c", "--cluster", "v100:3"])
    assert r.exit_code != 0 and "whole nodes of 4" in r.output
