"""`kairos up` passes the user's KAIROS_* settings to the services that read them
(issue 19): every setting docs/deploy.md documents, read back through the service's own
settings class from the environment the stack gives its process. The few the stack sets
itself win, and say so."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
from pydantic_settings import BaseSettings

from kairos.stack import Stack
from services.admission.settings import AdmissionSettings, LogProxySettings
from services.monitor.settings import MonitorSettings
from services.node_agent.settings import AgentSettings
from services.queueing.settings import QueueingSettings
from services.scheduler.forecaster.settings import ForecasterSettings
from services.scheduler.settings import SchedulerSettings

from .fake_stack import fake_stack

ROOT = Path(__file__).resolve().parents[2]
# the stack's process for each service, and the settings classes that service reads
READERS: dict[str, tuple[str, tuple[type[BaseSettings], ...]]] = {
    "admission": ("admission", (AdmissionSettings, LogProxySettings)),
    "queueing": ("queueing", (QueueingSettings,)),
    "scheduler": ("scheduler", (SchedulerSettings,)),
    "monitor": ("monitor", (MonitorSettings,)),
    "forecaster": ("forecaster", (ForecasterSettings,)),
    "node-agent": ("node-agent#node0", (AgentSettings,)),
}
# docs/deploy.md's Configuration section: its table headings, by service
SECTIONS = {"Every service": list(READERS), "Admission": ["admission"],
            "Queueing": ["queueing"], "Scheduler": ["scheduler"], "Monitor": ["monitor"],
            "Forecaster": ["forecaster"],
            "Node agent": ["node-agent"]}
# what the stack sets itself, winning over the user's (kairos/stack.py service_env and
# start_agents): per service, or "*" for every one
STACK_SETS = {"*": {"KAIROS_KAFKA_BOOTSTRAP", "KAIROS_DATABASE_URL", "KAIROS_DEV_TOKEN",
                    "KAIROS_HTTP_PORT", "KAIROS_SERVICE_NAME"},
              "node-agent": {"KAIROS_NODE_ID", "KAIROS_SIM_NODES",
                             "KAIROS_SIM_GPUS_PER_NODE", "KAIROS_STATE_DIR", "KAIROS_SIM_FIRST_NODE"}}


def documented() -> list[tuple[str, str]]:
    """(service, variable) for every variable in docs/deploy.md#configuration's tables."""
    text = (ROOT / "docs" / "deploy.md").read_text()
    section = text.split("\n## Configuration\n", 1)[1].split("\n## ", 1)[0]
    out = []
    for heading, services in SECTIONS.items():
        body = section.split(f"\n{heading} (", 1)[1].split("\n\n", 2)[1]
        rows = [line.split("|")[1] for line in body.splitlines() if line.startswith("| ")]
        for var in sorted({v for row in rows for v in re.findall(r"`(KAIROS_\w+)`", row)}):
            out += [(service, var) for service in services]
    return out


DOCUMENTED = documented()


def stack_sets(service: str, var: str) -> bool:
    return var in STACK_SETS["*"] | STACK_SETS.get(service, set())


def user_value(cls: type[BaseSettings], field: str) -> tuple[str, Any]:
    """A value the user might export for the field, unlike its default: (env, parsed)."""
    info = cls.model_fields[field]
    default = info.get_default(call_default_factory=True)
    if field == "tenant_submit_limits":
        limits = {"vision": {"rate_per_s": 2.0, "burst": 10}}
        return json.dumps(limits), limits
    if info.annotation is bool:
        return str(not default).lower(), not default
    if info.annotation is int or field == "topic_partitions_max":
        return str((default or 0) + 3), (default or 0) + 3
    if info.annotation is float:
        return str(default + 0.5), default + 0.5
    assert info.annotation is str, (field, info.annotation)
    return f"from-the-user-{field}", f"from-the-user-{field}"


def test_the_docs_list_what_the_test_walks() -> None:
    assert len(DOCUMENTED) > 60
    for pair in [("queueing", "KAIROS_QUEUES_FILE"), ("admission", "KAIROS_SUBMIT_RATE_PER_S"),
                 ("admission", "KAIROS_TENANT_SUBMIT_LIMITS"),
                 ("admission", "KAIROS_MAX_SUBMITS_IN_FLIGHT"),
                 ("scheduler", "KAIROS_POLICY_FILE"), ("monitor", "KAIROS_LOST_AFTER_S"),
                 ("node-agent", "KAIROS_FENCE_AFTER_S"), ("monitor", "KAIROS_LOG_LEVEL")]:
        assert pair in DOCUMENTED


@pytest.mark.parametrize(("service", "var"),
                         [p for p in DOCUMENTED if not stack_sets(*p)],
                         ids=[f"{s}:{v}" for s, v in DOCUMENTED if not stack_sets(s, v)])
def test_a_documented_setting_the_user_exports_reaches_its_service(
        service: str, var: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    proc_name, classes = READERS[service]
    field = var.removeprefix("KAIROS_").lower()
    cls = next(c for c in classes if field in c.model_fields)
    raw, want = user_value(cls, field)
    monkeypatch.setenv(var, raw)
    st = fake_stack(monkeypatch, tmp_path)
    env = st.proc(proc_name).env
    assert env[var] == raw
    with mock.patch.dict(os.environ, env, clear=True):  # as the service's process sees it
        got = getattr(cls(), field)
    if field == "tenant_submit_limits":
        got = {k: v.model_dump() for k, v in got.items()}
    assert got == want


@pytest.mark.parametrize(("var", "user", "service", "stack_value"), [
    ("KAIROS_HTTP_PORT", "9999", "admission", "8000"),
    ("KAIROS_SERVICE_NAME", "mine", "queueing", "queueing"),
    ("KAIROS_KAFKA_BOOTSTRAP", "elsewhere:9092", "scheduler", "broker.example:9092"),
    ("KAIROS_DATABASE_URL", "postgresql+asyncpg://x@y/z", "monitor",
     "postgresql+asyncpg://kairos:s3cret@db.example:5432/kairos"),
    ("KAIROS_DEV_TOKEN", "kdev-the-users", "admission", "kdev-from-the-stack"),
    ("KAIROS_NODE_ID", "my-node", "node-agent#node0", "node0"),
    ("KAIROS_SIM_NODES", "99", "node-agent#node0", "4"),
    ("KAIROS_SIM_GPUS_PER_NODE", "1", "node-agent#node0", "8"),
])
def test_what_the_stack_sets_itself_wins(var: str, user: str, service: str, stack_value: str,
                                         monkeypatch: pytest.MonkeyPatch,
                                         tmp_path: Path) -> None:
    """A stack given its own broker, database and token (Stack.start() takes the user's
    when set, so these are the user's in `kairos up`); ports, names and agent sizes are
    the stack's to choose."""
    monkeypatch.setenv(var, user)
    st = fake_stack(monkeypatch, tmp_path)
    assert st.proc(service).env[var] == stack_value


def test_agents_state_stays_in_the_workdir_and_the_embedded_partition_cap_wins(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("KAIROS_STATE_DIR", "/somewhere/else")
    monkeypatch.setenv("KAIROS_TOPIC_PARTITIONS_MAX", "64")
    st = fake_stack(monkeypatch, tmp_path)
    assert st.proc("node-agent#node0").env["KAIROS_STATE_DIR"] == str(st.workdir / "agents")
    # with an external broker the user's cap passes; with the embedded one (whose topics
    # the stack made with its own cap) the stack's wins
    assert st.proc("queueing").env["KAIROS_TOPIC_PARTITIONS_MAX"] == "64"
    st._broker = object()  # type: ignore[assignment]
    assert st.service_env("queueing", 1)["KAIROS_TOPIC_PARTITIONS_MAX"] == \
        str(st.embedded_partitions)


def test_the_callers_env_still_wins_over_the_users(monkeypatch: pytest.MonkeyPatch,
                                                   tmp_path: Path) -> None:
    """Stack(env=...) (tests, benchmarks) keeps the last word, as before."""
    monkeypatch.setenv("KAIROS_LOST_AFTER_S", "99")
    st = fake_stack(monkeypatch, tmp_path, env={"KAIROS_LOST_AFTER_S": "3"})
    assert st.proc("monitor").env["KAIROS_LOST_AFTER_S"] == "3"
    assert isinstance(st, Stack)
