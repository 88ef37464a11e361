"""Gangs on the Kubernetes runtime rendezvous across nodes, on the Pod network.

Two node agents (each with its own ``KubernetesRuntime`` bound to its node) carry out the
scheduler's own bindings for one job against ``tests/fakes/fake_k8s.py`` — a FAKE API
server over real HTTP that implements the calls the runtime makes (Pods, Services) and
what Kubernetes promises around them: a running Pod gets an IP, cluster DNS names a Pod
behind a headless Service ``<hostname>.<subdomain>.<namespace>.svc``, and the garbage
collector deletes a Service whose owners are all gone. The test checks that the address
every rank is given resolves to the right Pod on whichever node it runs.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from scheduling import first_fit
from services.node_agent.agent import NodeAgent
from services.node_agent.devices.simulated import SimulatedDevices
from services.node_agent.inventory import node_inventory
from services.node_agent.runtimes.base import ExitCallback, Runtime
from services.node_agent.runtimes.kubernetes import KubernetesRuntime
from services.node_agent.runtimes.kubernetes_names import gang_service, pod_name
from services.scheduler.state import Output, SchedulerState
from shared.events import Binding, BindingAction, JobReady, JobState, utcnow
from shared.jobspec import parse_job_spec
from tests.fakes.fake_k8s import FakeKubernetes
from tests.node_agent.helpers import until
from tests.services.builders import node
from tests.services.test_agent_shell import Recorder

NEVER = {"FAKE_K8S_EXIT": "never"}


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeKubernetes]:
    server = FakeKubernetes()
    server.start()
    yield server
    server.stop()


def k8s_agent(fake: FakeKubernetes, node_id: str, rec: Recorder, gpus: int = 2) -> NodeAgent:
    devices = SimulatedDevices(node_id, gpus)

    def runtime(on_exit: ExitCallback) -> Runtime:
        return KubernetesRuntime.from_config(on_exit, node_id, host=fake.host, poll_s=0.05)

    return NodeAgent(node_inventory(node_id, devices, 64_000, 512_000, "r0",
                                    runtime="kubernetes", address=f"{node_id}.local"),
                     devices, runtime, rec)


def bindings(spec: dict[str, Any], job_id: str) -> dict[str, Binding]:
    """The scheduler's allocate bindings for the job, by node (two nodes of 2 GPUs)."""
    sched = SchedulerState(epoch=1, placer=first_fit)
    out = Output()
    sched.handle(node("n1", gpus=2), out)
    sched.handle(node("n2", gpus=2), out)
    sched.handle(JobReady(job_id=job_id, queue="q", tenant="t", user="u",
                          spec=parse_job_spec(spec), submitted_at=utcnow(),
                          admitted_at=utcnow()), out)
    sched.cycle(0, out)
    found = [e.payload() for e, t in out.events if t == "bindings"]
    return {b.node_id: b for b in found
            if isinstance(b, Binding) and b.action is BindingAction.ALLOCATE}


def env_of(pod: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e["value"] for e in pod["spec"]["containers"][0]["env"]}


def stop_of(b: Binding) -> Binding:
    return b.model_copy(update={"action": BindingAction.STOP, "grace_period_s": 0,
                                "binding_id": b.binding_id + "-stop", "reason": "cancelled"})


async def test_a_gang_across_two_nodes_resolves_its_master_and_tf_cluster(
        fake: FakeKubernetes) -> None:
    spec = {"name": "ps-job", "tasks": [
        {"name": "ps", "role": "ps", "resources": {"gpu": 0}, "env": NEVER},
        {"name": "worker", "replicas": 3, "resources": {"gpu": 1}, "env": NEVER}]}
    by_node = bindings(spec, "G1")
    assert sorted(by_node) == ["n1", "n2"]  # the gang spans both nodes
    recs = {n: Recorder() for n in by_node}
    agents = {n: k8s_agent(fake, n, recs[n]) for n in by_node}
    for n, b in by_node.items():
        await agents[n].handle(b)
    keys = {f"G1/{t.task_id}/1": t.rank for b in by_node.values() for t in b.tasks}
    assert len(keys) == 4
    pods = {key: fake.pod(pod_name(key)) for key in keys}
    await until(lambda: all(p["status"].get("podIP") for p in pods.values()))  # Running
    ip_of_rank = {keys[k]: p["status"]["podIP"] for k, p in pods.items()}
    gang = gang_service("G1", 1)

    masters = set()
    clusters = []
    for key, pod in pods.items():
        spec_ = pod["spec"]
        assert not spec_.get("hostNetwork")  # the Pod network: ports never collide
        assert (spec_["hostname"], spec_["subdomain"]) == (f"rank-{keys[key]}", gang)
        env = env_of(pod)
        masters.add(env["MASTER_ADDR"])
        assert fake.resolve(env["MASTER_ADDR"]) == ip_of_rank[0]  # from either node
        assert env["MASTER_PORT"] == "29500" and env["WORLD_SIZE"] == "4"
        tf = json.loads(env["TF_CONFIG"])
        clusters.append(tf["cluster"])
        for kind, addresses in tf["cluster"].items():
            for address in addresses:
                host, _, port = address.rpartition(":")
                assert fake.resolve(host) is not None, (kind, address)
                assert port.isdigit()
        me = tf["cluster"][tf["task"]["type"]][tf["task"]["index"]]
        assert fake.resolve(me.rpartition(":")[0]) == pod["status"]["podIP"]  # itself
    assert masters == {f"rank-0.{gang}.kairos.svc"}
    assert all(c == clusters[0] for c in clusters)  # every node computed the same cluster

    svc = fake.service(gang)
    assert svc is not None
    assert svc["spec"]["clusterIP"] == "None"
    assert svc["spec"]["publishNotReadyAddresses"] is True
    assert svc["spec"]["selector"] == {"kairos.io/gang": gang}
    assert [(p["name"], p["port"]) for p in svc["spec"]["ports"]] == [("rendezvous", 29500)]
    owners = {o["uid"] for o in svc["metadata"]["ownerReferences"]}
    assert owners == {p["metadata"]["uid"] for p in pods.values()}  # each node added its own

    # the gang ends node by node: the Service lives while any of its Pods does
    await agents["n1"].handle(stop_of(by_node["n1"]))
    assert fake.service(gang) is not None
    await agents["n2"].handle(stop_of(by_node["n2"]))
    assert fake.service(gang) is None  # collected with the last Pod
    for n in by_node:
        assert {s.state for s in recs[n].events} == {JobState.RUNNING, JobState.CANCELLED}
        await agents[n].close()


async def test_an_interactive_pod_is_reached_through_its_service(fake: FakeKubernetes) -> None:
    spec = {"name": "nb", "kind": "Interactive", "timeLimit": 600,
            "tasks": [{"name": "session", "resources": {"gpu": 1}, "env": NEVER}]}
    (b,) = bindings(spec, "ENV1").values()
    rec = Recorder()
    agent = k8s_agent(fake, b.node_id, rec)
    await agent.handle(b)
    running = next(s for s in rec.events if s.state is JobState.RUNNING)
    conn = running.connection
    assert conn is not None
    gang = gang_service("ENV1", 1)
    assert (conn.host, conn.port, conn.service) == (f"rank-0.{gang}.kairos.svc", 8888, gang)
    pod = fake.pod(pod_name(f"ENV1/{b.tasks[0].task_id}/1"))
    assert env_of(pod)["KAIROS_PORT"] == "8888"
    await until(lambda: pod["status"].get("podIP") is not None)
    assert fake.resolve(conn.host) == pod["status"]["podIP"]
    svc = fake.service(gang)
    assert ("session", 8888) in [(p["name"], p["port"]) for p in svc["spec"]["ports"]]
    await agent.handle(stop_of(b))
    assert fake.service(gang) is None
    await agent.close()


async def test_a_pod_whose_gang_service_is_refused_does_not_run(fake: FakeKubernetes) -> None:
    spec = {"name": "w", "tasks": [{"name": "w", "resources": {"gpu": 1}, "env": NEVER}]}
    (b,) = bindings(spec, "NOSVC").values()
    rec = Recorder()
    agent = k8s_agent(fake, b.node_id, rec)
    fake.denied.add("services")  # the agent's Role lacks services
    try:
        await agent.handle(b)
    finally:
        fake.denied.discard("services")
    (failed,) = rec.events
    assert failed.state is JobState.FAILED and failed.reason == "start_failed"
    assert f"gang service {gang_service('NOSVC', 1)} not created: 403" in failed.message
    assert fake.pod(pod_name(f"NOSVC/{b.tasks[0].task_id}/1")) is None  # deleted, not left
    await agent.close()
