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
