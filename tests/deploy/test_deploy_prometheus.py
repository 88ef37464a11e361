"""Alert rules and the compose Prometheus config, checked and unit-tested with promtool."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from .conftest import ROOT, SERVICES, run, series_names, tool
from .promql import promtool_check, selectors

PROM = ROOT / "monitoring" / "prometheus"
ALERTS = PROM / "alerts.yml"

# What the platform must alert on (the monitoring issue), by alert name.
REQUIRED_ALERTS = {
    "KairosNodeLost",
    "KairosGPUDegraded",
    "KairosQueueStarving",
    "KairosConsumerLagHigh",
    "KairosDeadLetters",
    "KairosSchedulerNoLeader",
}


def alert_rules() -> list[dict]:
    doc = yaml.safe_load(ALERTS.read_text())
    return [r for g in doc["groups"] for r in g["rules"] if "alert" in r]


def test_promtool_check_rules() -> None:
    proc = run([tool("promtool"), "check", "rules", str(ALERTS)])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS" in proc.stdout


def test_promtool_unit_tests_pass() -> None:
    proc = run([tool("promtool"), "test", "rules", "alerts_test.yml"], cwd=PROM)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS" in proc.stdout


def test_promtool_unit_tests_catch_a_broken_rule(tmp_path: Path) -> None:
    """The unit tests bite: raise one threshold and promtool must report a failure."""
    broken = ALERTS.read_text().replace(") > 1000\n", ") > 100000\n")
    assert broken != ALERTS.read_text()
    (tmp_path / "alerts.yml").write_text(broken)
    (tmp_path / "alerts_test.yml").write_text((PROM / "alerts_test.yml").read_text())
    proc = run([tool("promtool"), "test", "rules", "alerts_test.yml"], cwd=tmp_path)
    assert proc.returncode != 0
    assert "KairosConsumerLagHigh" in proc.stdout + proc.stderr


def test_required_alerts_exist_with_severity_and_runbook() -> None:
    rules = alert_rules()
    names = {r["alert"] for r in rules}
    assert names >= REQUIRED_ALERTS, REQUIRED_ALERTS - names
    docs = (ROOT / "docs" / "deploy.md").read_text().lower()
    for r in rules:
        assert r["labels"]["severity"] in {"critical", "warning", "info"}, r["alert"]
        assert r["annotations"]["summary"], r["alert"]
        anchor = r["annotations"]["runbook_url"].split("#", 1)[1]
        assert f"#### {anchor}" in docs, f"docs/deploy.md has no runbook heading for {anchor}"


def test_every_alert_has_a_unit_test() -> None:
    tests = yaml.safe_load((PROM / "alerts_test.yml").read_text())["tests"]
    tested = {case["alertname"] for t in tests for case in t.get("alert_rule_test", [])}
    firing = {
        case["alertname"]
        for t in tests
        for case in t.get("alert_rule_test", [])
        if case.get("exp_alerts")
    }
    names = {r["alert"] for r in alert_rules()}
    assert names <= tested, f"alerts without a test: {names - tested}"
    assert names <= firing, f"alerts never shown to fire: {names - firing}"


def test_alert_metrics_are_in_the_catalogue(catalogue) -> None:
    known = series_names(catalogue)
    for r in alert_rules():
        for name, labels in selectors(r["expr"]):
            assert name in known, f"{r['alert']}: {name} is not in monitoring/METRICS.md"
            extra = labels - known[name].labels - {"le", "job", "instance"}
            assert not extra, f"{r['alert']}: {name} has no label(s) {extra} in METRICS.md"


def test_promtool_rejects_a_bad_expression() -> None:
    """The expression check used for dashboards really parses PromQL."""
    rc, out = promtool_check(["sum(rate(kairos_messages_total[5m])"])
    assert rc != 0, out


def test_compose_prometheus_config_is_valid(tmp_path: Path) -> None:
    config = yaml.safe_load((PROM / "prometheus.yml").read_text())
    # In the container the rules are mounted at /etc/prometheus/alerts.yml.
    assert config["rule_files"] == ["/etc/prometheus/alerts.yml"]
    config["rule_files"] = [str(ALERTS)]
    path = tmp_path / "prometheus.yml"
    path.write_text(yaml.safe_dump(config))
    proc = run([tool("promtool"), "check", "config", str(path)])
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_compose_prometheus_scrapes_every_replica_of_every_service() -> None:
    config = yaml.safe_load((PROM / "prometheus.yml").read_text())
    scraped = {}
    for job in config["scrape_configs"]:
        for sd in job.get("dns_sd_configs", []):
            assert sd["type"] == "A", job["job_name"]
            assert sd["port"] == 8080, job["job_name"]
            for name in sd["names"]:
                scraped[name] = job["job_name"]
    assert set(SERVICES) <= set(scraped), set(SERVICES) - set(scraped)
    # Dashboards select Kairos targets with up{job=~".*kairos.*"}.
    assert all(re.search("kairos", job) for job in scraped.values())
