"""Rendezvous environment: what a gang's tasks need to find each other and start training.

PyTorch (torchrun / ``init_process_group("env://")``) reads ``MASTER_ADDR``,
``MASTER_PORT``, ``WORLD_SIZE``, ``RANK``, ``LOCAL_RANK`` (and ``LOCAL_WORLD_SIZE``);
TensorFlow parameter-server jobs read ``TF_CONFIG``: the whole cluster by task type
(``chief``, ``worker``, ``ps``, ``evaluator``) and this task's type and index.

The binding carries only this node's tasks, so the cluster (every task of the job, on
every node) comes from ``members`` or, once it exists, ``binding.cluster``. Every agent
computes the same TF ports from the same cluster: a member without a port gets
``tf_port_base`` plus its position in rank order.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from shared.events import Binding, TaskBinding

TF_PORT_BASE = 2222
_TF_ROLES = {"chief": "chief", "master": "chief", "ps": "ps", "parameter-server": "ps",
             "parameter_server": "ps", "server": "ps", "evaluator": "evaluator"}


class Member(NamedTuple):
    """One task of the job, wherever it runs."""

    role: str
    rank: int
    host: str
    port: int | None = None


def tf_role(role: str) -> str:
    return _TF_ROLES.get(role.lower(), "worker")


def _members(binding: Binding, members: Sequence[Any] | None) -> list[Member]:
    source = members if members is not None else getattr(binding, "cluster", None) or []
    return sorted((Member(m.role, m.rank, m.host, getattr(m, "port", None)) for m in source),
                  key=lambda m: m.rank)


def tf_config(members: Sequence[Member], rank: int,
              tf_port_base: int = TF_PORT_BASE) -> dict[str, Any]:
    cluster: dict[str, list[str]] = {}
    me: dict[str, Any] = {}
    for position, m in enumerate(sorted(members, key=lambda m: m.rank)):
        kind = tf_role(m.role)
        addresses = cluster.setdefault(kind, [])
        if m.rank == rank:
            me = {"type": kind, "index": len(addresses)}
        addresses.append(f"{m.host}:{m.port or tf_port_base + position}")
    if not me:
        raise ValueError(f"rank {rank} is not in the cluster")
    return {"cluster": cluster, "task": me}


def rendezvous_env(binding: Binding, task: TaskBinding,
                   members: Sequence[Any] | None = None, *,
                   local_rank: int | None = None, use_tf_config: bool | None = None,
                   tf_port_base: int = TF_PORT_BASE,
                   host_of: Callable[[int], str] | None = None) -> dict[str, str]:
    """Environment for ``task`` of ``binding``.

    ``members``: every task of the job as (role, rank, host[, port]); defaults to
    ``binding.cluster`` where the binding has it. ``use_tf_config``: None sets TF_CONFIG
    when the job has parameter servers. ``local_rank``: defaults to ``task.local_rank``
    where present, else the task's position by rank among this node's tasks;
    ``LOCAL_WORLD_SIZE`` is ``task.local_world_size`` where present (a resize binding
    lists only the new tasks of a node), else the binding's task count. ``host_of``
    (rank -> host): the runtime names its tasks itself (Kubernetes: each Pod's DNS name);
    ``MASTER_ADDR`` and the ``TF_CONFIG`` hosts are then its names, not the nodes'.
    """
    cluster = _members(binding, members)
    if host_of is not None:
        cluster = [m._replace(host=host_of(m.rank)) for m in cluster]
    local_ranks = sorted(t.rank for t in binding.tasks) or [task.rank]
    if local_rank is None:
        local_rank = getattr(task, "local_rank", None)
    if local_rank is None:
        local_rank = local_ranks.index(task.rank) if task.rank in local_ranks else 0
    master = binding.master_addr
    if host_of is not None:  # the lowest rank is the master, as the scheduler chose it
        master = host_of(min((m.rank for m in cluster), default=0))
    if not master:
        rank0 = [m.host for m in cluster if m.rank == 0]
        master = rank0[0] if rank0 else "127.0.0.1"
    env = {
        "MASTER_ADDR": master,
        "MASTER_PORT": str(binding.master_port),
        "WORLD_SIZE": str(binding.world_size),
        "RANK": str(task.rank),
        "LOCAL_RANK": str(local_rank),
        "LOCAL_WORLD_SIZE": str(getattr(task, "local_world_size", None) or len(local_ranks)),
    }
    if use_tf_config is None:
        use_tf_config = any(tf_role(m.role) == "ps" for m in cluster) or tf_role(task.role) == "ps"
    if use_tf_config:
        if not cluster:
            raise ValueError("TF_CONFIG needs the job's cluster (members or binding.cluster)")
        env["TF_CONFIG"] = json.dumps(tf_config(cluster, task.rank, tf_port_base),
                                      separators=(",", ":"))
    return env
