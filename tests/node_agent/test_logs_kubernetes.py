"""The agent's /logs endpoint over the Kubernetes runtime: the Pod's log read through the
client from tests/fakes/fake_k8s.py (a fake API server over real HTTP implementing the
calls the runtime makes, including the Pod log with tailLines; no cluster here)."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from fastapi import FastAPI

from services.node_agent.agent import NodeAgent
from services.node_agent.devices.simulated import SimulatedDevices
from services.node_agent.inventory import node_inventory
from services.node_agent.logs_api import add_log_routes
from services.node_agent.runtimes.kubernetes import KubernetesRuntime
from shared.events import Binding, BindingAction, TaskBinding
from tests.fakes.fake_k8s import FakeKubernetes
from tests.services.test_agent_shell import Recorder


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeKubernetes]:
    server = FakeKubernetes()
    server.start()
    yield server
    server.stop()


async def test_a_pods_log_is_served_and_tailed(fake: FakeKubernetes) -> None:
    devices = SimulatedDevices("gpu-node-9", 2)
    agent = NodeAgent(
        node_inventory("gpu-node-9", devices, 8_000, 16_000, "r0", runtime="kubernetes"),
        devices, lambda on_exit: KubernetesRuntime.from_config(
            on_exit, "gpu-node-9", host=fake.host, poll_s=0.05), Recorder())
    app = FastAPI()
    add_log_routes(app, {"gpu-node-9": agent})
    await agent.handle(Binding(
        binding_id="b", action=BindingAction.ALLOCATE, node_id="gpu-node-9", epoch=1,
        job_id="k8s-logs", tasks=[TaskBinding(task_id="w-0", task_name="w", role="worker",
                                              replica=0, rank=0, image="pytorch:2.4",
                                              command=["python", "train.py"])]))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                 base_url="http://agent") as http:
        r = await http.get("/logs/k8s-logs")
        assert r.status_code == 200 and r.headers["x-kairos-task"] == "k8s-logs/w-0/1"
        assert "ran: python train.py" in r.text
        r = await http.get("/logs/k8s-logs", params={"tail": 1})
        assert r.text == "done\n"
    await agent.close()
