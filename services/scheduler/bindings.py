"""The scheduler's orders to node agents: ``Binding`` messages, one per node touched.

Allocate a placement, resize an elastic job, stop tasks, reconcile what a node owns and
fence a node with a new leader's epoch. Each id is deterministic (job, attempt, node,
epoch), so a message sent again is the same message to the outbox and to the agent.
"""

from __future__ import annotations

from collections.abc import Mapping

from scheduling import GpuUse
from services.scheduler.model import SOURCE, Cluster, Output, Placed, SchedJob
from shared.events import (
    Binding,
    BindingAction,
    ClusterMember,
    EndCause,
    GpuAssignment,
    TaskBinding,
)
from shared.events.nodes import GpuInfo
from shared.jobspec import TaskSpec

HELD_S = 10 * 365 * 86400.0  # a simulated interactive session runs until returned / its limit


def duration(job: SchedJob) -> float | None:
    """How long a simulated task runs: an interactive session is held (until it is
    returned or reaches its time limit) unless the spec says otherwise."""
    assert job.ready is not None
    spec = job.ready.spec
    return HELD_S if spec.interactive and spec.duration is None else spec.duration


class Bindings:
    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self._reconciles = 0  # ids of reconcile bindings (a new one each time)

    def allocate(self, job: SchedJob, tasks: list[Placed], out: Output) -> None:
        """Start a placement: each node its tasks, every task the whole gang's layout."""
        assert job.ready is not None
        spec = job.ready.spec
        by_name = {t.name: t for t in spec.tasks}
        master = min(tasks, key=lambda p: p.rank)
        master_addr = self._address(master.node_id)
        by_node: dict[str, list[Placed]] = {}
        for p in tasks:
            by_node.setdefault(p.node_id, []).append(p)
        cluster = [ClusterMember(role=by_name[p.task_name].effective_role, rank=p.rank,
                                 host=self._address(p.node_id)) for p in tasks]
        epoch = self.cluster.epoch
        for node_id, placed in by_node.items():
            binding = Binding(
                binding_id=f"{job.job_id}-{job.attempt}-{node_id}",
                action=BindingAction.ALLOCATE, node_id=node_id, epoch=epoch,
                job_id=job.job_id, attempt=job.attempt, world_size=len(tasks),
                master_addr=master_addr, duration_s=duration(job), cluster=cluster,
                time_limit_s=spec.time_limit, interactive=spec.interactive,
                tasks=[self._task_binding(p, by_name, node_id, local, len(placed))
                       for local, p in enumerate(placed)])
            out.emit(binding, SOURCE, event_id=f"bind-{binding.binding_id}-e{epoch}")

    def resize(self, job: SchedJob, start: list[Placed], stop: list[Placed], reason: str,
               grace_s: float, out: Output) -> None:
        """One ``resize`` binding per node touched: the new replicas to start (with the
        job's membership after the change) and the replicas to stop."""
        assert job.ready is not None
        by_name = {t.name: t for t in job.ready.spec.tasks}
        members = sorted(job.active(), key=lambda p: p.rank)
        master_addr = self._address(members[0].node_id) if members else ""
        cluster = [ClusterMember(role=by_name[p.task_name].effective_role, rank=p.rank,
                                 host=self._address(p.node_id)) for p in members]
        epoch = self.cluster.epoch
        for node_id in sorted({p.node_id for p in start + stop}):
            on_node = [p for p in members if p.node_id == node_id]
            binding = Binding(
                binding_id=f"{job.job_id}-{job.attempt}-{node_id}-rz{job.resizes}",
                action=BindingAction.RESIZE, node_id=node_id, epoch=epoch,
                job_id=job.job_id, attempt=job.attempt, world_size=len(members),
                master_addr=master_addr, duration_s=job.ready.spec.duration, cluster=cluster,
                grace_period_s=grace_s, reason=reason, cause=EndCause.RESIZED,
                tasks=[self._task_binding(p, by_name, node_id, on_node.index(p), len(on_node))
                       for p in start if p.node_id == node_id],
                stop_task_ids=[p.task_id for p in stop if p.node_id == node_id])
            out.emit(binding, SOURCE, event_id=f"resize-{binding.binding_id}-e{epoch}")

    def stop(self, job: SchedJob, out: Output, reason: str, cause: EndCause,
             grace_s: float = 30.0, older_only: bool = False) -> None:
        """Stop the job's live tasks (or only those of older attempts), per node and
        attempt; ``cause`` is why, as the code the agents report their end with."""
        by_node: dict[tuple[str, int], list[Placed]] = {}
        for p in job.live():
            if older_only and p.attempt >= job.attempt:
                continue
            by_node.setdefault((p.node_id, p.attempt), []).append(p)
        epoch = self.cluster.epoch
        for (node_id, attempt), placed in by_node.items():
            out.emit(Binding(
                binding_id=f"{job.job_id}-{attempt}-{node_id}-stop",
                action=BindingAction.STOP, node_id=node_id, epoch=epoch,
                job_id=job.job_id, attempt=attempt, reason=reason, cause=cause,
                grace_period_s=grace_s,
                tasks=[TaskBinding(task_id=p.task_id, task_name=p.task_name, role="",
                                   replica=p.replica, rank=p.rank) for p in placed],
            ), SOURCE, event_id=f"stop-{job.job_id}-{attempt}-{node_id}-e{epoch}")

    def reconcile(self, node_id: str, out: Output, why: str) -> None:
        """Tell a node that (re)registers or comes back after it was declared lost which
        tasks it still owns: every task placed there and not yet ended. The agent stops
        any other it runs (a lost node's tasks were already requeued elsewhere). Bindings
        are ordered per node, so a task bound before this answer is listed and one bound
        after it arrives after it: neither is touched."""
        owned = sorted(f"{job.job_id}/{p.task_id}/{p.attempt}"
                       for job in self.cluster.jobs.values() for p in job.live()
                       if p.node_id == node_id)
        self._reconciles += 1
        epoch = self.cluster.epoch
        binding = Binding(binding_id=f"reconcile-{node_id}-e{epoch}-{self._reconciles}",
                          action=BindingAction.RECONCILE, node_id=node_id, epoch=epoch,
                          job_id="", reason=f"node {why}", owned=owned)
        out.emit(binding, SOURCE, event_id=binding.binding_id)

    def fence(self, node_id: str, out: Output) -> None:
        """A new leader's epoch: the agent refuses any later binding of a lower one."""
        epoch = self.cluster.epoch
        out.emit(Binding(binding_id=f"fence-{node_id}-e{epoch}", action=BindingAction.FENCE,
                         node_id=node_id, epoch=epoch, job_id="", reason="new leader"),
                 SOURCE, event_id=f"fence-{node_id}-e{epoch}")

    def _task_binding(self, p: Placed, by_name: Mapping[str, TaskSpec], node_id: str,
                      local_rank: int, local_world_size: int) -> TaskBinding:
        view = self.cluster.nodes.get(node_id)
        gpus = {g.index: g for g in view.inventory.gpus} if view else {}
        spec = by_name[p.task_name]
        return TaskBinding(
            task_id=p.task_id, task_name=p.task_name, role=spec.effective_role,
            replica=p.replica, rank=p.rank, local_rank=local_rank,
            local_world_size=local_world_size,
            gpus=[_assignment(g, gpus.get(g.index), spec.resources.mig or "") for g in p.gpus],
            cpu_milli=p.cpu_milli, memory_mib=p.memory_mib, image=spec.image,
            command=spec.command, env=spec.env)

    def _address(self, node_id: str) -> str:
        view = self.cluster.nodes.get(node_id)
        return (view.inventory.address or node_id) if view else node_id


def _assignment(use: GpuUse, gpu: GpuInfo | None, profile: str) -> GpuAssignment:
    """What the agent is to give the task of one GPU: the whole GPU, a share of it, or
    one MIG instance of the task's profile, named by its place (the agent checks that it
    has that instance there) and its UUID as the node reported it."""
    if not use.mig_slots:
        return GpuAssignment(index=use.index, uuid=gpu.uuid if gpu else "", memory_mib=use.memory_mib,
                             compute_pct=use.compute_pct)
    start = (use.mig_slots & -use.mig_slots).bit_length() - 1  # its lowest memory slice
    inst = next((m for m in gpu.mig_instances if m.start == start), None) if gpu else None
    return GpuAssignment(index=use.index, uuid=inst.uuid if inst else "", memory_mib=0, compute_pct=100,
                         mig_profile=profile, mig_start=start)
