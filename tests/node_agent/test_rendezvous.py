"""Rendezvous environment from a binding."""

from __future__ import annotations

import json

import pytest

from services.node_agent.rendezvous import Member, rendezvous_env
from shared.events import Binding, BindingAction, TaskBinding


def task(role: str, replica: int, rank: int) -> TaskBinding:
    return TaskBinding(task_id=f"{role}-{replica}", task_name=role, role=role,
                       replica=replica, rank=rank)


def binding(tasks: list[TaskBinding], world_size: int, master: str = "10.0.0.1") -> Binding:
    return Binding(binding_id="b1", action=BindingAction.ALLOCATE, node_id="n2", epoch=3,
                   job_id="j1", tasks=tasks, world_size=world_size, master_addr=master,
                   master_port=29500)


def test_pytorch_gang_on_second_node() -> None:
    mine = [task("worker", 5, 5), task("worker", 4, 4)]  # this node holds ranks 4 and 5
    b = binding(mine, world_size=8)
    env = rendezvous_env(b, mine[0])
    assert env == {"MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500", "WORLD_SIZE": "8",
                   "RANK": "5", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"}
    assert rendezvous_env(b, mine[1])["LOCAL_RANK"] == "0"
    assert rendezvous_env(b, mine[0], local_rank=3)["LOCAL_RANK"] == "3"


def test_master_defaults_to_rank0_host_or_loopback() -> None:
    mine = [task("worker", 0, 0)]
    assert rendezvous_env(binding(mine, 1, master=""), mine[0])["MASTER_ADDR"] == "127.0.0.1"
    members = [Member("worker", 0, "10.0.0.9"), Member("worker", 1, "10.0.0.8")]
    env = rendezvous_env(binding(mine, 2, master=""), mine[0], members)
    assert env["MASTER_ADDR"] == "10.0.0.9"
    assert "TF_CONFIG" not in env


def test_tf_config_for_parameter_server_job() -> None:
    members = [Member("chief", 0, "h1"), Member("worker", 1, "h1"), Member("worker", 2, "h2"),
               Member("ps", 3, "h2"), Member("parameter-server", 4, "h3", 5000)]
    mine = [task("worker", 1, 2), task("ps", 0, 3)]
    b = binding(mine, world_size=5)
    worker = json.loads(rendezvous_env(b, mine[0], members)["TF_CONFIG"])
    assert worker == {
        "cluster": {"chief": ["h1:2222"], "worker": ["h1:2223", "h2:2224"],
                    "ps": ["h2:2225", "h3:5000"]},
        "task": {"type": "worker", "index": 1},
    }
    ps = json.loads(rendezvous_env(b, mine[1], members)["TF_CONFIG"])
    assert ps["task"] == {"type": "ps", "index": 0}
    assert ps["cluster"] == worker["cluster"]  # every task sees the same cluster


def test_tf_config_needs_the_cluster() -> None:
    mine = [task("ps", 0, 0)]
    with pytest.raises(ValueError, match="cluster"):
        rendezvous_env(binding(mine, 2), mine[0])
