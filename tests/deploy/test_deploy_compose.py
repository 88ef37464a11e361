"""docker-compose.yml: valid against the Compose Specification schema, and built the way
the platform needs (health-gated start, one-shot init, scalable services). Docker is
never run here."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import check_jsonschema
import pytest
import yaml

from .conftest import OLD_CAPPED_QUEUES, ROOT, SERVICES, admits, run, tool

COMPOSE = ROOT / "docker-compose.yml"
SCALABLE = set(SERVICES)
INIT = "init"


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    # PyYAML resolves the anchors and `<<` merge keys the file uses, as Compose does.
    return yaml.safe_load(COMPOSE.read_text())


def test_compose_spec_schema_ships_with_check_jsonschema() -> None:
    """The schema is vendored in the wheel: validation needs no network."""
    vendored = (
        Path(check_jsonschema.__file__).parent / "builtin_schemas" / "vendor" / "compose-spec.json"
    )
    assert vendored.is_file()


def test_compose_validates_against_the_compose_spec() -> None:
    proc = run([tool("check-jsonschema"), "--builtin-schema", "vendor.compose-spec", str(COMPOSE)])
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_schema_check_rejects_a_broken_file(tmp_path: Path) -> None:
    broken = tmp_path / "docker-compose.yml"
    text = COMPOSE.read_text()
    broken.write_text(text.replace("  kafka:\n    image:", "  kafka:\n    imag:", 1))
    assert broken.read_text() != text
    proc = run([tool("check-jsonschema"), "--builtin-schema", "vendor.compose-spec", str(broken)])
    assert proc.returncode != 0


def test_every_service_has_a_healthcheck(compose) -> None:
    for name, svc in compose["services"].items():
        hc = svc.get("healthcheck")
        assert hc, f"{name} has no healthcheck"
        if name == INIT:
            # A one-shot job: done when it exits 0; dependants wait for that instead.
            assert hc == {"disable": True}
            assert svc["restart"] == "no"
            continue
        assert hc["test"], name
        assert hc["test"][0] in {"CMD", "CMD-SHELL"}, name
        assert {"interval", "timeout", "retries"} <= set(hc), name


def test_dependencies_wait_for_health_or_completion(compose) -> None:
    services = compose["services"]
    for name, svc in services.items():
        deps = svc.get("depends_on", {})
        assert isinstance(deps, dict), f"{name}: depends_on must use the long form with conditions"
        for dep, spec in deps.items():
            cond = spec["condition"]
            if dep == INIT:
                assert cond == "service_completed_successfully", name
            else:
                assert cond == "service_healthy", f"{name} -> {dep}"
                assert services[dep]["healthcheck"].get("test"), dep
    for name in SCALABLE:
        deps = services[name]["depends_on"]
        assert {"kafka", "postgres", INIT} <= set(deps), name


def test_scalable_services_have_no_fixed_name_or_host_port(compose) -> None:
    for name in SCALABLE:
        svc = compose["services"][name]
        assert "container_name" not in svc, name
        for port in svc.get("ports", []):
            assert isinstance(port, str), f"{name}: use the short port syntax"
            # With interpolation defaults applied, the host side must be a range.
            parts = re.sub(r"\$\{[A-Z_]+:-([^}]*)\}", r"\1", port).split(":")
            if len(parts) == 1:
                continue  # container port only: Docker picks a free host port per replica
            lo, _, hi = parts[-2].partition("-")
            assert hi, f"{name}: fixed host port {port}"
            assert int(hi) > int(lo), f"{name}: empty port range {port}"


def test_kairos_services_follow_the_contract(compose) -> None:
    for name, module in SERVICES.items():
        svc = compose["services"][name]
        assert svc["build"] == {"context": ".", "dockerfile": "Dockerfile"}
        assert svc["command"] == ["python", "-m", module]
        env = svc["environment"]
        assert env["KAIROS_SERVICE_NAME"] == name
        assert env["KAIROS_HTTP_PORT"] == "8080"
        assert env["KAIROS_HTTP_HOST"] == "0.0.0.0"
        assert env["KAIROS_KAFKA_BOOTSTRAP"] == "kafka:9092"
        assert env["KAIROS_DATABASE_URL"].startswith("postgresql+asyncpg://kairos:")
        assert env["KAIROS_DATABASE_URL"].endswith("@postgres:5432/kairos")
        assert "8080" in [str(p) for p in svc.get("expose", [])]
        assert "/readyz" in " ".join(svc["healthcheck"]["test"])
    assert compose["services"]["admission"]["environment"]["KAIROS_DEV_TOKEN"].startswith(
        "${KAIROS_DEV_TOKEN:?"
    )
    agent = compose["services"]["node-agent"]["environment"]
    assert agent["KAIROS_NODE_RUNTIME"] == "simulated"
    assert re.fullmatch(r"\$\{KAIROS_SIM_NODES:-\d+\}", agent["KAIROS_SIM_NODES"])
    assert "KAIROS_NODE_ID" not in agent  # defaults to the hostname: unique per replica
    assert (
        compose["services"]["scheduler"]["environment"]["KAIROS_POLICY_FILE"]
        == "/etc/kairos/policy.yaml"
    )
    # queueing alone reads the queue tree (services/queueing/settings.py)
    assert (
        compose["services"]["queueing"]["environment"]["KAIROS_QUEUES_FILE"]
        == "/etc/kairos/queues.yaml"
    )
    assert {"source": "kairos-queues", "target": "/etc/kairos/queues.yaml"} in compose[
        "services"
    ]["queueing"]["configs"]
    assert "KAIROS_QUEUES_FILE" not in compose["services"]["scheduler"]["environment"]
    # the gateway -> agent log proxy token: optional, and the same variable on both sides
    for name in ("admission", "node-agent"):
        assert compose["services"][name]["environment"]["KAIROS_AGENT_TOKEN"] == (
            "${KAIROS_AGENT_TOKEN:-}"
        )


def test_infrastructure(compose) -> None:
    services = compose["services"]
    kafka = services["kafka"]
    assert kafka["image"].startswith("apache/kafka:")
    assert "controller" in kafka["environment"]["KAFKA_PROCESS_ROLES"]  # KRaft, no ZooKeeper
    assert kafka["environment"]["KAFKA_AUTO_CREATE_TOPICS_ENABLE"] == "false"
    assert not any("zookeeper" in n for n in services)
    assert services["postgres"]["image"] in {"postgres:16", "postgres:16-alpine"}
    init = services[INIT]
    assert "kairos.topics" in " ".join(init["command"])
    assert "kairos.migrate" in " ".join(init["command"])
    assert init["depends_on"] == {
        "kafka": {"condition": "service_healthy"},
        "postgres": {"condition": "service_healthy"},
    }
    for name in ("prometheus", "grafana"):
        assert services[name]["healthcheck"]["test"]


def test_mounted_files_exist_and_configs_parse(compose) -> None:
    for name, svc in compose["services"].items():
        for vol in svc.get("volumes", []):
            src = vol.split(":")[0]
            if src.startswith("./"):
                assert (ROOT / src).exists(), f"{name} mounts missing {src}"
    for name, cfg in compose["configs"].items():
        assert isinstance(yaml.safe_load(cfg["content"]), dict), name


def test_required_variables_are_documented(compose) -> None:
    text = COMPOSE.read_text()
    required = set(re.findall(r"\$\{([A-Z_]+):\?", text))
    assert {"KAIROS_DEV_TOKEN", "POSTGRES_PASSWORD"} <= required
    docs = (ROOT / "docs" / "deploy.md").read_text()
    for var in set(re.findall(r"\$\{([A-Z_]+)", text)):
        assert var in docs, f"docs/deploy.md does not mention {var}"


def test_the_compose_policy_is_one_the_scheduler_loads(compose: dict[str, Any]) -> None:
    from scheduling import SchedulerConfig

    config = SchedulerConfig.from_yaml(compose["configs"]["kairos-policy"]["content"])
    assert [p.name for p in config.plugins][:2] == ["gang", "priority"]


def test_the_compose_queues_do_not_cap_the_cluster(compose: dict[str, Any]) -> None:
    """The shipped queue tree is valid for queueing and lets a job use any number of GPUs
    (the cluster's size is the only limit: compose scales node agents freely)."""
    queues = yaml.safe_load(compose["configs"]["kairos-queues"]["content"])
    names = {q["name"] for q in queues["queues"]}
    assert "default" in names  # jobs that name no queue go there
    assert admits(queues, "default", 64)
    assert admits(queues, "default", 512, used_gpus=1024)
    # what compose shipped before refuses past its 16 GPUs: the check above bites
    assert admits(OLD_CAPPED_QUEUES, "default", 16)
    assert not admits(OLD_CAPPED_QUEUES, "default", 17)


def test_the_commented_team_quota_sketch_is_a_valid_tree(compose: dict[str, Any]) -> None:
    """Uncommented, the team-quota sketch in the compose queues is a queue file queueing
    accepts, and its vision queue borrows the default queue's unused guarantee."""
    content = compose["configs"]["kairos-queues"]["content"]
    sketch = content.split("# Team quotas", 1)[1].split("\n", 1)[1]
    lines = [line.removeprefix("# ") for line in sketch.splitlines() if line.startswith("# ")]
    queues = yaml.safe_load("\n".join(lines))
    assert admits(queues, "vision", 24)  # 16 guaranteed + 8 borrowed
    assert not admits(queues, "vision", 25)  # past its borrowing limit


def test_the_example_queue_file_parses() -> None:
    """examples/config/queues.yaml, which the shipped configs point to for team quotas."""
    queues = yaml.safe_load((ROOT / "examples" / "config" / "queues.yaml").read_text())
    assert admits(queues, "vision-train", 12)
