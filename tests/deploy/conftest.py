"""Shared helpers for the deployment-artifact tests (Dockerfile, compose, Helm chart,
Prometheus rules, Grafana dashboards). Nothing here runs Docker, Kubernetes or Grafana:
everything is checked statically, with the tools scripts/install-deploy-tools.sh installs."""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
METRICS_MD = ROOT / "monitoring" / "METRICS.md"
CHART = ROOT / "charts" / "kairos"

# The contract: compose/Kubernetes name -> Python module.
SERVICES = {
    "admission": "services.admission",
    "queueing": "services.queueing",
    "scheduler": "services.scheduler",
    "node-agent": "services.node_agent",
    "monitor": "services.monitor",
    "forecaster": "services.scheduler.forecaster",
}
ONE_SHOT_MODULES = ("kairos.topics", "kairos.migrate")
INSTALL_HINT = "run scripts/install-deploy-tools.sh"

# Python tools the deploy tests import (module -> PyPI package).
TOOL_MODULES = {
    "yaml": "pyyaml",
    "jsonschema": "jsonschema",
    "check_jsonschema": "check-jsonschema",
    "helm_python": "helm-python-sdk",
    "kubernetes_validate": "kubernetes-validate",
    "promql_parser": "promql-parser",
    "dockerfile": "dockerfile",
}
MISSING_PACKAGES = sorted(
    pkg for mod, pkg in TOOL_MODULES.items() if importlib.util.find_spec(mod) is None
)
if MISSING_PACKAGES:
    # Do not break collection of the whole suite: skip collecting the modules that import
    # the tools, and let test_deploy_tools.py fail, saying what to install.
    collect_ignore = [
        p.name
        for p in Path(__file__).parent.glob("test_deploy_*.py")
        if p.name != "test_deploy_tools.py"
    ]


def tool(name: str) -> str:
    """Path of a command-line tool: next to this Python first (the venv), then PATH."""
    local = Path(sys.executable).parent / name
    if local.exists():
        return str(local)
    found = shutil.which(name)
    if not found:
        pytest.fail(f"{name} is not installed: {INSTALL_HINT}")
    return found


def run(cmd: list[str], **kw: object) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "NO_COLOR": "1"}
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env, **kw)  # type: ignore[call-overload]


@dataclass(frozen=True)
class CatalogueEntry:
    name: str
    type: str
    labels: frozenset[str]


def load_catalogue() -> dict[str, CatalogueEntry]:
    """The metric tables of monitoring/METRICS.md."""
    row = re.compile(
        r"^\|\s*`(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)`\s*\|\s*(?P<type>\w+)\s*\|(?P<labels>[^|]*)\|"
    )
    entries: dict[str, CatalogueEntry] = {}
    for line in METRICS_MD.read_text(encoding="utf-8").splitlines():
        m = row.match(line)
        if m:
            labels = frozenset(re.findall(r"`([a-zA-Z_][a-zA-Z0-9_]*)`", m["labels"]))
            entries[m["name"]] = CatalogueEntry(m["name"], m["type"], labels)
    return entries


def series_names(catalogue: dict[str, CatalogueEntry]) -> dict[str, CatalogueEntry]:
    """Every series name a query may select: histograms add _bucket, _sum and _count."""
    names: dict[str, CatalogueEntry] = {}
    for e in catalogue.values():
        names[e.name] = e
        if e.type == "histogram":
            for suffix in ("_bucket", "_sum", "_count"):
                names[e.name + suffix] = e
    return names


@pytest.fixture(scope="session")
def catalogue() -> dict[str, CatalogueEntry]:
    return load_catalogue()


# --- shipped queue trees ----------------------------------------------------------------------

# What compose and the chart used to ship: one queue in a cohort with nothing to lend, which
# capped the whole cluster at 16 GPUs (8 in the chart) whatever its size.
OLD_CAPPED_QUEUES = {
    "cohorts": [{"name": "cluster"}],
    "queues": [{"name": "default", "cohort": "cluster", "guaranteed": {"gpus": 16},
                "borrowing_limit": {"gpus": 16}}],
}


def admits(queues: object, queue: str, gpus: float, used_gpus: float = 0.0) -> bool:
    """Whether queueing's quota check (services/queueing/quota.py, the code queueing runs)
    admits a job of ``gpus`` GPUs (16 cores and 64 GiB each) into ``queue`` of the queue
    file ``queues`` while ``used_gpus`` are already admitted there. The file is validated
    first with services.queueing.config.parse_queues, as queueing does at start."""
    from services.queueing.config import parse_queues
    from services.queueing.quota import QueueTree, QuotaState

    _, specs = parse_queues(queues)
    state = QuotaState(QueueTree(specs), {queue: (used_gpus, used_gpus * 16_000, used_gpus * 65_536)})
    return state.check(queue, (gpus, gpus * 16_000.0, gpus * 65_536.0)).admitted
