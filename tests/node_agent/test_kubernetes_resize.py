"""A resize on the Kubernetes runtime (against ``tests/fakes/fake_k8s.py``): the agent
creates the new replicas' Pods and deletes the removed ones with the grace period; the
other Pods of the job are the same objects throughout."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from services.node_agent.agent import NodeAgent
from services.node_agent.devices.simulated import SimulatedDevices
from services.node_agent.inventory import node_inventory
from services.node_agent.runtimes.base import ExitCallback, Runtime
from services.node_agent.runtimes.kubernetes import KubernetesRuntime
from services.node_agent.runtimes.kubernetes_names import pod_name
from shared.events import JobState, JobStatus
from tests.fakes.fake_k8s import FakeKubernetes
from tests.node_agent.helpers import until
from tests.services.test_agent_resize import allocate, grow, shrink
from tests.services.test_agent_shell import Recorder

NEVER = ["sh", "-c", "train"]


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeKubernetes]:
    server = FakeKubernetes()
    server.start()
    yield server
    server.stop()


def k8s_agent(fake: FakeKubernetes, rec: Recorder) -> NodeAgent:
    devices = SimulatedDevices("n1", 8)

    def runtime(on_exit: ExitCallback) -> Runtime:
        return KubernetesRuntime.from_config(on_exit, "n1", host=fake.host, poll_s=0.05)

    return NodeAgent(node_inventory("n1", devices, 64_000, 512_000, "r0",
                                    runtime="kubernetes"), devices, runtime, rec)


def uid(fake: FakeKubernetes, key: str) -> str | None:
    pod = fake.pod(pod_name(key))
    return pod["metadata"]["uid"] if pod else None


async def test_resize_creates_and_deletes_replica_pods_only(fake: FakeKubernetes) -> None:
    rec = Recorder()
    agent = k8s_agent(fake, rec)
    a = allocate(NEVER)
    a = a.model_copy(update={"tasks": [t.model_copy(update={"env": {"FAKE_K8S_EXIT": "never"}})
                                       for t in a.tasks]})
    g = grow(NEVER)
    g = g.model_copy(update={"tasks": [t.model_copy(update={"env": {"FAKE_K8S_EXIT": "never"}})
                                       for t in g.tasks]})
    await agent.handle(a)
    kept = {k: uid(fake, k) for k in ("J/w-0/1", "J/w-1/1")}
    assert all(kept.values())
    await agent.handle(g)
    pod = fake.pod(pod_name("J/w-3.1/1"))
    assert pod is not None
    env = {e["name"]: e["value"] for e in pod["spec"]["containers"][0]["env"]}
    assert (env["RANK"], env["WORLD_SIZE"], env["LOCAL_WORLD_SIZE"]) == ("3", "5", "4")
    assert env["NVIDIA_VISIBLE_DEVICES"] == "GPU-3"
    assert pod["metadata"]["labels"]["kairos.io/task-id"] == "w-3.1"
    creates = sum(1 for m, *_ in fake.calls if m == "POST")
    await agent.handle(g)  # redelivered: no new Pod
    assert sum(1 for m, *_ in fake.calls if m == "POST") == creates

    await agent.handle(shrink("w-2.1", "w-3.1", grace=20))
    assert {(pod_name(k), 20) for k in ("J/w-2.1/1", "J/w-3.1/1")} <= set(fake.deletions)
    await until(lambda: uid(fake, "J/w-2.1/1") is None and uid(fake, "J/w-3.1/1") is None)
    stopped = sorted((e.task, e.reason) for e in rec.events
                     if isinstance(e, JobStatus) and e.state is JobState.CANCELLED)
    assert stopped == [("w-2.1", "resized"), ("w-3.1", "resized")]
    assert {k: uid(fake, k) for k in kept} == kept  # the same Pods, never recreated
    assert sorted(await agent.runtime.running()) == sorted(kept)
    deletions = len(fake.deletions)
    await agent.handle(shrink("w-2.1", "w-3.1", grace=20))  # redelivered: nothing more
    assert len(fake.deletions) == deletions
    for key in kept:
        await agent.runtime.stop(key, 0)
    await agent.close()
