"""Grafana dashboards: valid provisioning JSON, generated from the committed script,
queries that parse as PromQL and name only catalogued metrics.

No Grafana server can be installed here (no Grafana package on PyPI, npm or Debian's
archive that runs a server offline), so the dashboards are validated statically."""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from .conftest import CHART, ROOT, series_names
from .promql import degrafana, promtool_check, selectors

GRAFANA = ROOT / "monitoring" / "grafana"
DASHBOARD_DIR = GRAFANA / "dashboards"
DASHBOARDS = sorted(DASHBOARD_DIR.glob("*.json"))
EXPECTED_UIDS = {"kairos-cluster", "kairos-queues", "kairos-jobs", "kairos-gpus", "kairos-platform"}
PANEL_TYPES = {
    "row",
    "timeseries",
    "stat",
    "gauge",
    "bargauge",
    "heatmap",
    "table",
    "piechart",
    "state-timeline",
    "status-history",
    "text",
}


def load(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text(encoding="utf-8"))


def panels(dashboard: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for p in dashboard["panels"]:
        yield p
        yield from p.get("panels", [])


def exprs() -> Iterator[tuple[str, str, str]]:
    for path in DASHBOARDS:
        for p in panels(load(path)):
            for t in p.get("targets", []):
                yield path.name, p["title"], t["expr"]


def test_dashboards_are_generated_from_the_script() -> None:
    spec = importlib.util.spec_from_file_location("gen", GRAFANA / "generate_dashboards.py")
    assert spec
    assert spec.loader
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    rendered = gen.render()
    for out in (DASHBOARD_DIR, CHART / "files" / "dashboards"):
        on_disk = {p.name: p.read_text(encoding="utf-8") for p in out.glob("*.json")}
        assert on_disk == rendered, (
            f"{out.relative_to(ROOT)} is stale: run python monitoring/grafana/generate_dashboards.py"
        )


def test_dashboard_set_and_uids() -> None:
    uids = [load(p)["uid"] for p in DASHBOARDS]
    assert len(uids) == len(set(uids)), "duplicate dashboard uid"
    assert set(uids) == EXPECTED_UIDS
    titles = [load(p)["title"] for p in DASHBOARDS]
    assert len(titles) == len(set(titles))


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.name)
def test_dashboard_is_valid_for_file_provisioning(path: Path) -> None:
    d = load(path)
    assert isinstance(d["uid"], str)
    assert 0 < len(d["uid"]) <= 40
    assert d["title"]
    assert isinstance(d["schemaVersion"], int)
    assert d["schemaVersion"] >= 36
    assert "id" not in d or d["id"] is None, "provisioned dashboards must not carry a fixed id"
    variables = {v["name"]: v for v in d["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    ids = [p["id"] for p in panels(d)]
    assert len(ids) == len(set(ids)), "duplicate panel id"
    occupied: set[tuple[int, int]] = set()
    for p in panels(d):
        assert p["type"] in PANEL_TYPES, p["type"]
        g = p["gridPos"]
        assert g["x"] >= 0, p["title"]
        assert g["x"] + g["w"] <= 24, p["title"]
        assert g["h"] > 0, p["title"]
        cells = {
            (x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])
        }
        assert not cells & occupied, f"panel {p['title']!r} overlaps another"
        occupied |= cells
        if p["type"] == "row":
            continue
        assert p["title"]
        assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, p["title"]
        assert p["targets"], f"panel {p['title']!r} has no target"
        refs = [t["refId"] for t in p["targets"]]
        assert len(refs) == len(set(refs))
        for t in p["targets"]:
            assert t["expr"].strip(), f"panel {p['title']!r} has an empty expr"
            assert t["datasource"]["uid"] == "${datasource}"
    for name, var in variables.items():
        if var["type"] == "query":
            assert var["query"]["query"].startswith("label_values("), name


def test_every_expr_parses_as_promql_with_promtool() -> None:
    all_exprs = [degrafana(e) for _, _, e in exprs()]
    assert len(all_exprs) > 50
    rc, out = promtool_check(all_exprs)
    assert rc == 0, out


def test_every_metric_is_in_the_catalogue(catalogue) -> None:
    known = series_names(catalogue)
    for dashboard, title, expr in exprs():
        for name, labels in selectors(degrafana(expr)):
            assert name in known, f"{dashboard} / {title}: {name} is not in monitoring/METRICS.md"
            extra = labels - known[name].labels - {"le", "job", "instance"}
            assert not extra, f"{dashboard} / {title}: {name} has no label(s) {extra}"


def test_template_variables_use_catalogued_metrics(catalogue) -> None:
    known = series_names(catalogue)
    for path in DASHBOARDS:
        for var in load(path)["templating"]["list"]:
            if var["type"] != "query":
                continue
            metric, label = var["query"]["query"][len("label_values(") : -1].split(", ")
            assert metric in known, f"{path.name} ${var['name']}: {metric}"
            assert label in known[metric].labels


def test_dashboards_cover_the_required_views() -> None:
    """cluster: allocation, utilisation, fragmentation; queues: pending, waits, fair share;
    jobs: JCT and wait distributions, states; GPUs: per-GPU heatmaps; platform: cycle
    latency, consumer lag, dead letters."""
    text = {load(p)["uid"]: json.dumps(load(p)) for p in DASHBOARDS}
    need = {
        "kairos-cluster": [
            "kairos_cluster_gpus",
            "kairos_gpu_utilization_ratio",
            "kairos_cluster_fragmentation_ratio",
        ],
        "kairos-queues": [
            "kairos_queue_pending_jobs",
            "kairos_job_queueing_seconds_bucket",
            "kairos_queue_dominant_share_ratio",
            "kairos_queue_quota_gpus",
        ],
        "kairos-jobs": [
            "kairos_job_completion_seconds_bucket",
            "kairos_job_queueing_seconds_bucket",
            "kairos_jobs",
        ],
        "kairos-gpus": [
            "kairos_gpu_utilization_ratio",
            "kairos_gpu_memory_used_bytes",
            "kairos_gpu_temperature_celsius",
        ],
        "kairos-platform": [
            "kairos_scheduler_cycle_seconds_bucket",
            "kairos_consumer_lag",
            "kairos_deadletters_total",
        ],
    }
    for uid, metrics in need.items():
        for m in metrics:
            assert m in text[uid], f"{uid} does not show {m}"
    gpus = load(DASHBOARD_DIR / "gpus.json")
    assert sum(p["type"] == "heatmap" for p in panels(gpus)) >= 3


def test_provisioning_files() -> None:
    ds = yaml.safe_load((GRAFANA / "provisioning" / "datasources" / "prometheus.yaml").read_text())
    assert ds["apiVersion"] == 1
    (prom,) = ds["datasources"]
    assert prom["type"] == "prometheus"
    assert prom["url"] == "http://prometheus:9090"
    dash = yaml.safe_load((GRAFANA / "provisioning" / "dashboards" / "kairos.yaml").read_text())
    (provider,) = dash["providers"]
    assert provider["type"] == "file"
    # docker-compose.yml mounts monitoring/grafana/dashboards at the provider's path.
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    mounts = compose["services"]["grafana"]["volumes"]
    assert f"./monitoring/grafana/dashboards:{provider['options']['path']}:ro" in mounts
