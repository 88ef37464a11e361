"""charts/kairos: linted and rendered with Helm itself (the helm-python-sdk wheel binds
Helm's Go SDK; no helm binary), every manifest validated against the Kubernetes OpenAPI
schemas (kubernetes-validate, strict: unknown fields fail) and the prometheus-operator
custom resources against their CRD schemas vendored in tests/deploy/schemas/."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any

import helm_python as helm
import jsonschema
import kubernetes_validate
import pytest
import yaml

from .conftest import CHART, OLD_CAPPED_QUEUES, ONE_SHOT_MODULES, ROOT, SERVICES, admits

SCHEMAS = Path(__file__).parent / "schemas"
CRD_SCHEMAS = {
    ("monitoring.coreos.com/v1", "ServiceMonitor"): SCHEMAS
    / "monitoring.coreos.com_v1_servicemonitor.json",
    ("monitoring.coreos.com/v1", "PrometheusRule"): SCHEMAS
    / "monitoring.coreos.com_v1_prometheusrule.json",
}
# The chart's kubeVersion is >=1.27; validate against the oldest supported and the newest.
KUBE_VERSIONS = ("1.27.0", kubernetes_validate.latest_version())
RELEASE, NAMESPACE = "kairos", "gpu-platform"

FULL = {
    "admission": {"autoscaling": {"enabled": True}},
    "queueing": {"autoscaling": {"enabled": True}},
    "monitor": {"autoscaling": {"enabled": True}, "replicas": 2},
    "serviceMonitor": {"enabled": True, "labels": {"release": "kube-prometheus-stack"}},
    "prometheusRule": {"enabled": True},
    "simulatedNodes": {"enabled": True},
}
EXISTING = {
    "database": {"existingSecret": "pg-credentials", "existingSecretKey": "url"},
    "auth": {"existingSecret": "api-token", "agentToken": {"existingSecret": "agent-token"}},
    "kafka": {"bootstrap": "broker-0.kafka:9092,broker-1.kafka:9092"},
    "nodeAgent": {"nvml": {"mode": "hostPath"}, "podNamespace": "training"},
}
VARIANTS = {"defaults": None, "hpa+servicemonitor": FULL, "existing-secrets+hostpath": EXISTING}


def render(values: dict[str, Any] | None) -> list[dict[str, Any]]:
    with helm.Chart.load(CHART) as chart:
        out = chart.render(
            copy.deepcopy(values), name=RELEASE, namespace=NAMESPACE, is_install=True
        )
    docs = []
    for path, text in sorted(out.items()):
        if path.endswith("NOTES.txt"):
            continue
        docs += [d for d in yaml.safe_load_all(text) if d]
    return docs


def by_kind(docs: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for d in docs if d["kind"] == kind}


def validate(doc: dict[str, Any], version: str) -> None:
    key = (doc["apiVersion"], doc["kind"])
    if key in CRD_SCHEMAS:
        schema = json.loads(CRD_SCHEMAS[key].read_text())
        jsonschema.Draft202012Validator(schema).validate(doc)
    else:
        kubernetes_validate.validate(doc, version, strict=True)


def env_of(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container.get("env", [])}


@pytest.fixture(scope="module", params=list(VARIANTS), ids=list(VARIANTS))
def rendered(request) -> tuple[str, list[dict[str, Any]]]:
    return request.param, render(VARIANTS[request.param])


# --- lint and schema validation -------------------------------------------------------------


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_helm_lint_strict(variant: str) -> None:
    report = helm.lint(
        CHART,
        copy.deepcopy(VARIANTS[variant]),
        strict=True,
        namespace=NAMESPACE,
        kube_version="v1.30.0",
    )
    assert report["errors"] == [], report
    problems = [m for m in report["messages"] if m["severity"] >= 2]
    assert problems == [], problems


def test_every_manifest_validates_against_kubernetes_schemas(rendered) -> None:
    _, docs = rendered
    assert len(docs) > 20
    for doc in docs:
        for version in KUBE_VERSIONS:
            try:
                validate(doc, version)
            except (kubernetes_validate.ValidationError, jsonschema.ValidationError) as e:
                path = ".".join(str(p) for p in e.path)
                pytest.fail(
                    f"{doc['kind']}/{doc['metadata']['name']} on {version}: {path}: {e.message}"
                )
            except kubernetes_validate.SchemaNotFoundError as e:
                pytest.fail(f"no schema for {doc['apiVersion']} {doc['kind']}: {e.message}")


def test_validation_rejects_unknown_fields() -> None:
    """Strict validation bites, for built-in kinds and for the vendored CRD schemas."""
    docs = render(FULL)
    deploy = copy.deepcopy(next(iter(by_kind(docs, "Deployment").values())))
    deploy["spec"]["template"]["spec"]["containers"][0]["livenessProbes"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        validate(deploy, KUBE_VERSIONS[0])
    sm = copy.deepcopy(next(iter(by_kind(docs, "ServiceMonitor").values())))
    sm["spec"]["endpoints"][0]["interval"] = "thirty seconds"
    with pytest.raises(jsonschema.ValidationError):
        validate(sm, KUBE_VERSIONS[0])
    sm["spec"]["endpoints"][0]["interval"] = "30s"
    sm["spec"]["endpoint"] = []
    with pytest.raises(jsonschema.ValidationError):
        validate(sm, KUBE_VERSIONS[0])


def test_names_are_unique_per_kind(rendered) -> None:
    _, docs = rendered
    keys = [(d["kind"], d["metadata"].get("namespace"), d["metadata"]["name"]) for d in docs]
    assert len(keys) == len(set(keys))
    for d in docs:
        assert len(d["metadata"]["name"]) <= 63


# --- workloads --------------------------------------------------------------------------------


def test_a_deployment_per_service_running_the_contract_command(rendered) -> None:
    variant, docs = rendered
    deployments = by_kind(docs, "Deployment")
    for name, module in SERVICES.items():
        if name == "node-agent":
            continue
        d = deployments[f"{RELEASE}-{name}"]
        (c,) = d["spec"]["template"]["spec"]["containers"]
        assert c["command"] == ["python", "-m", module]
        env = env_of(c)
        assert env["KAIROS_SERVICE_NAME"] == name
        assert env["KAIROS_HTTP_PORT"] == "8080"
        assert env["KAIROS_HTTP_HOST"] == "0.0.0.0"
        assert "secretKeyRef" in env["KAIROS_DATABASE_URL"]
        assert c["resources"]["requests"]
        assert c["resources"]["limits"]
        hpa = (VARIANTS[variant] or {}).get(name, {}).get("autoscaling", {}).get("enabled")
        assert ("replicas" in d["spec"]) != bool(hpa)
    assert (
        env_of(deployments[f"{RELEASE}-scheduler"]["spec"]["template"]["spec"]["containers"][0])[
            "KAIROS_POLICY_FILE"
        ]
        == "/etc/kairos/policy.yaml"
    )


def test_probes_on_healthz_and_readyz(rendered) -> None:
    _, docs = rendered
    workloads = [*by_kind(docs, "Deployment").values(), *by_kind(docs, "DaemonSet").values()]
    assert workloads
    for w in workloads:
        for c in w["spec"]["template"]["spec"]["containers"]:
            assert c["livenessProbe"]["httpGet"]["path"] == "/healthz", w["metadata"]["name"]
            assert c["readinessProbe"]["httpGet"]["path"] == "/readyz", w["metadata"]["name"]
            assert c["startupProbe"]["httpGet"]["path"] == "/healthz"
            assert c["ports"] == [{"name": "http", "containerPort": 8080, "protocol": "TCP"}]


def test_node_agent_daemonset_on_gpu_nodes(rendered) -> None:
    variant, docs = rendered
    ds = by_kind(docs, "DaemonSet")[f"{RELEASE}-node-agent"]
    spec = ds["spec"]["template"]["spec"]
    assert spec["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in spec[
        "tolerations"
    ]
    (c,) = spec["containers"]
    assert c["command"] == ["python", "-m", "services.node_agent"]
    env = env_of(c)
    assert env["KAIROS_NODE_ID"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    assert env["KAIROS_NODE_RUNTIME"] == "kubernetes"
    # the node's address is the host's; the agent (not on the host network) is reached at
    # its pod IP, a variable defined before the one that refers to it
    assert env["KAIROS_NODE_ADDRESS"] == {"fieldRef": {"fieldPath": "status.hostIP"}}
    assert env["KAIROS_POD_IP"] == {"fieldRef": {"fieldPath": "status.podIP"}}
    assert env["KAIROS_AGENT_URL"] == "http://$(KAIROS_POD_IP):8080"
    names = [e["name"] for e in c["env"]]
    assert names.index("KAIROS_POD_IP") < names.index("KAIROS_AGENT_URL")
    assert "hostNetwork" not in spec
    # the share watchdog maps NVML's host pids to pods through /proc
    assert spec["hostPID"] is True
    # MPS: its pipe and log directories live under the state dir, a hostPath mounted at
    # its own path, so the pipe path the agent hands job pods exists on the host; the
    # server shares the host IPC namespace with its clients
    state_dir = "/var/lib/kairos-agent"
    assert env["KAIROS_STATE_DIR"] == state_dir
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert volumes["state"]["hostPath"]["path"] == state_dir
    mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
    assert mounts["state"] == state_dir
    assert spec["hostIPC"] is True
    assert env["KAIROS_MPS_ENABLED"] == "true"
    # the log-proxy token: the same Secret key as admission's
    adm = by_kind(docs, "Deployment")[f"{RELEASE}-admission"]["spec"]["template"]["spec"]
    assert env["KAIROS_AGENT_TOKEN"]["secretKeyRef"] == env_of(adm["containers"][0])[
        "KAIROS_AGENT_TOKEN"
    ]["secretKeyRef"]
    if variant == "existing-secrets+hostpath":
        assert c["securityContext"]["privileged"] is True
        assert mounts["dev"] == "/dev"
        assert "nvidia-lib" in mounts
        assert "runtimeClassName" not in spec
    else:
        assert spec["runtimeClassName"] == "nvidia"
        assert env["NVIDIA_VISIBLE_DEVICES"] == "all"
        # compute: the NVIDIA runtime then brings nvidia-cuda-mps-control
        assert env["NVIDIA_DRIVER_CAPABILITIES"] == "compute,utility"
        assert not c["securityContext"].get("privileged")
        assert spec["securityContext"]["runAsNonRoot"] is True


def test_node_agent_options_mps_off_no_token_and_agent_url() -> None:
    docs = render({
        "nodeAgent": {"mps": {"enabled": False}, "agentUrl": "http://[$(KAIROS_POD_IP)]:8080",
                      "stateDir": "/data/kairos"},
        "auth": {"agentToken": {"enabled": False}},
        "simulatedNodes": {"enabled": True},
    })
    spec = by_kind(docs, "DaemonSet")[f"{RELEASE}-node-agent"]["spec"]["template"]["spec"]
    env = env_of(spec["containers"][0])
    assert "hostIPC" not in spec
    assert spec["hostPID"] is True
    assert env["NVIDIA_DRIVER_CAPABILITIES"] == "utility"
    assert env["KAIROS_MPS_ENABLED"] == "false"
    assert env["KAIROS_AGENT_URL"] == "http://[$(KAIROS_POD_IP)]:8080"
    assert env["KAIROS_STATE_DIR"] == "/data/kairos"
    assert {"name": "state", "mountPath": "/data/kairos"} in spec["containers"][0]["volumeMounts"]
    workloads = [*by_kind(docs, "Deployment").values(), *by_kind(docs, "DaemonSet").values()]
    for w in workloads:
        assert "KAIROS_AGENT_TOKEN" not in env_of(w["spec"]["template"]["spec"]["containers"][0])
    assert set(by_kind(docs, "Secret")[RELEASE]["data"]) == {"dev-token", "database-url"}
    for doc in docs:
        validate(doc, KUBE_VERSIONS[-1])


def test_simulated_nodes_deployment_when_enabled() -> None:
    docs = render(FULL)
    sim = by_kind(docs, "Deployment")[f"{RELEASE}-node-agent-simulated"]
    env = env_of(sim["spec"]["template"]["spec"]["containers"][0])
    assert env["KAIROS_NODE_RUNTIME"] == "simulated"
    assert env["KAIROS_SIM_NODES"] == "4"
    assert env["KAIROS_SIM_GPUS_PER_NODE"] == "8"
    assert env["KAIROS_AGENT_TOKEN"]["secretKeyRef"] == {"name": RELEASE, "key": "agent-token"}
    assert f"{RELEASE}-node-agent-simulated" not in by_kind(render(None), "Deployment")


def test_init_job_is_a_hook_running_topics_then_migrations(rendered) -> None:
    variant, docs = rendered
    job = by_kind(docs, "Job")[f"{RELEASE}-init"]
    assert job["metadata"]["annotations"]["helm.sh/hook"] == "pre-install,pre-upgrade"
    spec = job["spec"]["template"]["spec"]
    commands = [c["command"] for c in [*spec["initContainers"], *spec["containers"]]]
    assert commands == [["python", "-m", m] for m in ONE_SHOT_MODULES]
    db_secret = env_of(spec["containers"][0])["KAIROS_DATABASE_URL"]["secretKeyRef"]["name"]
    secrets = by_kind(docs, "Secret")
    if variant == "existing-secrets+hostpath":
        assert db_secret == "pg-credentials"
    else:
        # A hook runs before the release's own Secret exists: it reads a hook-owned copy.
        hook_secret = secrets[db_secret]
        assert hook_secret["metadata"]["annotations"]["helm.sh/hook"] == "pre-install,pre-upgrade"
        assert int(hook_secret["metadata"]["annotations"]["helm.sh/hook-weight"]) < 0


# --- configuration and secrets --------------------------------------------------------------


def test_config_maps_hold_policy_and_queues(rendered) -> None:
    _, docs = rendered
    cm = by_kind(docs, "ConfigMap")[f"{RELEASE}-config"]
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert yaml.safe_load(cm["data"]["policy.yaml"]) == values["policy"]
    # the scheduler loads it as its policy (a bad one would stop it from starting)
    from scheduling import SchedulerConfig

    assert SchedulerConfig.from_yaml(cm["data"]["policy.yaml"]).plugins
    assert yaml.safe_load(cm["data"]["queues.yaml"]) == values["queues"]
    # queueing validates it at start (a bad one stops it) and, with it, quota does not
    # cap the cluster: a job far bigger than the old 8-GPU cap is admitted
    queues = yaml.safe_load(cm["data"]["queues.yaml"])
    assert "default" in {q["name"] for q in queues["queues"]}
    assert admits(queues, "default", 64)
    assert admits(queues, "default", 512, used_gpus=1024)
    assert not admits(OLD_CAPPED_QUEUES, "default", 17)  # the check bites
    deployments = by_kind(docs, "Deployment")
    for name in ("scheduler", "queueing"):
        tpl = deployments[f"{RELEASE}-{name}"]["spec"]["template"]
        assert "checksum/config" in tpl["metadata"]["annotations"]
        vols = {v["name"]: v for v in tpl["spec"]["volumes"]}
        assert vols["config"]["configMap"]["name"] == f"{RELEASE}-config"
    queueing = deployments[f"{RELEASE}-queueing"]["spec"]["template"]["spec"]["containers"][0]
    assert env_of(queueing)["KAIROS_QUEUES_FILE"] == "/etc/kairos/queues.yaml"
    assert {"name": "config", "mountPath": "/etc/kairos", "readOnly": True} in queueing[
        "volumeMounts"
    ]


def test_secrets_and_existing_secret_options() -> None:
    docs = render(None)
    secret = by_kind(docs, "Secret")[RELEASE]
    assert set(secret["data"]) == {"dev-token", "agent-token", "database-url"}
    import base64

    assert len(base64.b64decode(secret["data"]["dev-token"])) >= 32  # generated, not a placeholder
    assert len(base64.b64decode(secret["data"]["agent-token"])) >= 32
    assert secret["data"]["agent-token"] != secret["data"]["dev-token"]
    url = base64.b64decode(secret["data"]["database-url"]).decode()
    assert url.startswith("postgresql+asyncpg://")
    assert ":" not in url.split("//")[1].split("@")[0]

    docs = render(EXISTING)
    assert RELEASE not in by_kind(docs, "Secret")
    adm = by_kind(docs, "Deployment")[f"{RELEASE}-admission"]
    env = env_of(adm["spec"]["template"]["spec"]["containers"][0])
    assert env["KAIROS_DEV_TOKEN"]["secretKeyRef"] == {"name": "api-token", "key": "dev-token"}
    assert env["KAIROS_AGENT_TOKEN"]["secretKeyRef"] == {"name": "agent-token", "key": "agent-token"}
    assert env["KAIROS_DATABASE_URL"]["secretKeyRef"] == {"name": "pg-credentials", "key": "url"}
    assert env["KAIROS_KAFKA_BOOTSTRAP"] == "broker-0.kafka:9092,broker-1.kafka:9092"

    docs = render({"database": {"passwordSecret": {"name": "pg", "key": "password"}}})
    env = env_of(
        by_kind(docs, "Deployment")[f"{RELEASE}-monitor"]["spec"]["template"]["spec"]["containers"][
            0
        ]
    )
    assert env["PGPASSWORD"]["secretKeyRef"] == {"name": "pg", "key": "password"}


def test_no_secret_values_in_plain_env(rendered) -> None:
    _, docs = rendered
    for w in [
        *by_kind(docs, "Deployment").values(),
        *by_kind(docs, "DaemonSet").values(),
        *by_kind(docs, "Job").values(),
    ]:
        for c in w["spec"]["template"]["spec"]["containers"]:
            env = env_of(c)
            for key in ("KAIROS_DATABASE_URL", "KAIROS_DEV_TOKEN", "KAIROS_AGENT_TOKEN", "PGPASSWORD"):
                if key in env:
                    assert isinstance(env[key], dict), key
                    assert "secretKeyRef" in env[key], key


# --- RBAC -------------------------------------------------------------------------------------


def rules_of(docs: list[dict[str, Any]], kind: str, name: str) -> dict[tuple[str, str], set[str]]:
    role = by_kind(docs, kind)[name]
    return {
        (g, r): set(rule["verbs"])
        for rule in role["rules"]
        for g in rule["apiGroups"]
        for r in rule["resources"]
    }


KUBERNETES_RUNTIME = ROOT / "services" / "node_agent" / "runtimes" / "kubernetes.py"
# kubernetes client method verb -> RBAC verb
CLIENT_VERBS = {"create": "create", "read": "get", "list": "list", "patch": "patch",
                "replace": "update", "delete": "delete", "watch": "watch"}


def runtime_api_calls() -> dict[tuple[str, str], set[str]]:
    """(API group, resource) -> verbs of every CoreV1Api call the agent's Kubernetes
    runtime makes, read from its source: `_call("read_namespaced_pod", ...)` and direct
    `self._api.read_namespaced_pod_log(...)` (a subresource: pods/log)."""
    source = KUBERNETES_RUNTIME.read_text()
    methods = set(re.findall(r'_call\(\s*"(\w+)"', source))
    methods |= set(re.findall(r"self\._api\.(\w+)\(", source))
    calls: dict[tuple[str, str], set[str]] = {}
    for method in methods:
        m = re.fullmatch(r"(create|read|list|patch|replace|delete|watch)_namespaced_(\w+)", method)
        assert m, f"{method}: not a namespaced CoreV1Api call; grant it in rbac.yaml and here"
        kind, _, sub = m[2].partition("_")
        resource = f"{kind}s/{sub}" if sub else f"{kind}s"
        calls.setdefault(("", resource), set()).add(CLIENT_VERBS[m[1]])
    return calls


def test_rbac_for_agent_and_scheduler() -> None:
    """The agent's Role grants exactly the calls its Kubernetes runtime makes; nothing else
    in Kairos calls the API server, so nothing else gets RBAC or an API token."""
    calls = runtime_api_calls()
    assert calls[("", "pods")] >= {"create", "get", "list", "patch", "delete"}  # sanity
    assert calls[("", "pods/log")] == {"get"}
    for variant in (None, EXISTING):
        docs = render(variant)
        assert rules_of(docs, "Role", f"{RELEASE}-node-agent") == calls
        # the scheduler's leader lock and the monitor's election are PostgreSQL locks
        assert set(by_kind(docs, "Role")) == {f"{RELEASE}-node-agent"}
        assert not by_kind(docs, "ClusterRole")
        assert not by_kind(docs, "ClusterRoleBinding")
        (binding,) = by_kind(docs, "RoleBinding").values()
        assert binding["roleRef"]["name"] == f"{RELEASE}-node-agent"
        (subject,) = binding["subjects"]
        assert subject == {"kind": "ServiceAccount", "name": f"{RELEASE}-node-agent",
                           "namespace": NAMESPACE}
        sas = by_kind(docs, "ServiceAccount")
        assert {n for n, sa in sas.items() if sa["automountServiceAccountToken"]} == {
            f"{RELEASE}-node-agent"}
        ds = by_kind(docs, "DaemonSet")[f"{RELEASE}-node-agent"]["spec"]["template"]["spec"]
        assert ds["serviceAccountName"] == f"{RELEASE}-node-agent"
        assert ds["automountServiceAccountToken"] is True
        # services that do not call the API get no token
        for name, d in by_kind(docs, "Deployment").items():
            assert d["spec"]["template"]["spec"]["automountServiceAccountToken"] is False, name
    docs = render(EXISTING)
    assert by_kind(docs, "Role")[f"{RELEASE}-node-agent"]["metadata"]["namespace"] == "training"
    assert by_kind(docs, "RoleBinding")[f"{RELEASE}-node-agent"]["metadata"]["namespace"] == (
        "training")
    sched = by_kind(docs, "Deployment")[f"{RELEASE}-scheduler"]["spec"]["template"]["spec"]
    env = env_of(sched["containers"][0])
    assert not {"KAIROS_POD_NAME", "KAIROS_POD_NAMESPACE", "KAIROS_QUEUES_FILE"} & set(env)


# --- scaling and monitoring -------------------------------------------------------------------


def test_hpa_and_service_monitor_when_enabled() -> None:
    docs = render(None)
    assert not by_kind(docs, "HorizontalPodAutoscaler")
    assert not by_kind(docs, "ServiceMonitor")
    assert not by_kind(docs, "PrometheusRule")
    docs = render(FULL)
    hpas = by_kind(docs, "HorizontalPodAutoscaler")
    assert set(hpas) == {f"{RELEASE}-admission", f"{RELEASE}-queueing", f"{RELEASE}-monitor"}
    for name, hpa in hpas.items():
        assert hpa["spec"]["scaleTargetRef"] == {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "name": name,
        }
    (sm,) = by_kind(docs, "ServiceMonitor").values()
    assert sm["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    (endpoint,) = sm["spec"]["endpoints"]
    assert endpoint["port"] == "http"
    assert endpoint["path"] == "/metrics"
    assert endpoint["honorLabels"] is True  # keep the metrics' own `service` label
    selected = [
        s
        for s in by_kind(docs, "Service").values()
        if all(
            s["metadata"]["labels"].get(k) == v
            for k, v in sm["spec"]["selector"]["matchLabels"].items()
        )
    ]
    components = {s["metadata"]["labels"]["app.kubernetes.io/component"] for s in selected}
    assert set(SERVICES) <= components


def test_prometheus_rule_matches_monitoring_alerts() -> None:
    alerts = yaml.safe_load((ROOT / "monitoring" / "prometheus" / "alerts.yml").read_text())
    assert (CHART / "files" / "alerts.yml").read_text() == (
        ROOT / "monitoring" / "prometheus" / "alerts.yml"
    ).read_text(), (
        "charts/kairos/files/alerts.yml differs: cp monitoring/prometheus/alerts.yml charts/kairos/files/"
    )
    (rule,) = by_kind(render(FULL), "PrometheusRule").values()
    assert rule["spec"] == alerts


def test_dashboards_ship_as_sidecar_config_maps() -> None:
    docs = render(None)
    maps = [
        c
        for c in by_kind(docs, "ConfigMap").values()
        if c["metadata"]["labels"].get("grafana_dashboard") == "1"
    ]
    shipped = {}
    for cm in maps:
        assert cm["metadata"]["annotations"]["grafana_folder"] == "Kairos"
        ((name, text),) = cm["data"].items()
        shipped[name] = text
    source = {
        p.name: p.read_text()
        for p in (ROOT / "monitoring" / "grafana" / "dashboards").glob("*.json")
    }
    assert set(shipped) == set(source)
    for name, text in shipped.items():
        assert json.loads(text) == json.loads(source[name]), name
    assert not [
        c
        for c in by_kind(render({"dashboards": {"enabled": False}}), "ConfigMap").values()
        if "grafana_dashboard" in c["metadata"]["labels"]
    ]


def test_pod_security(rendered) -> None:
    _variant, docs = rendered
    for w in [*by_kind(docs, "Deployment").values(), *by_kind(docs, "Job").values()]:
        spec = w["spec"]["template"]["spec"]
        assert spec["securityContext"]["runAsNonRoot"] is True
        for c in spec["containers"] + spec.get("initContainers", []):
            assert c["securityContext"]["allowPrivilegeEscalation"] is False
            assert c["securityContext"]["readOnlyRootFilesystem"] is True
