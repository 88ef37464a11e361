"""A binding's GPU assignments as the runtime's grants, MIG instances resolved.

An assignment naming a MIG profile gets the MIG instance at its memory slice
(``mig_start``) of GPU ``index``, found in the device backend's inventory; the grant
carries that instance's UUID, so the task sees that instance and nothing else of the GPU.
An instance the node does not have there (a placement from a stale view of the node, a
GPU not in MIG mode, another profile at that slice) refuses the binding: the task never
starts on the whole GPU instead. The agent checks no conflict between its own tasks: the
scheduler owns placement (a preempted task may still be in its grace period when its
successor on the same instance starts, as with whole GPUs).
"""

from __future__ import annotations

from collections.abc import Sequence

from services.node_agent.devices.base import GpuDevice
from services.node_agent.runtimes.base import GpuGrant
from services.node_agent.tasks import task_key
from shared.events import (
    Binding,
    BindingRefused,
    EndCause,
    GpuAssignment,
    JobState,
    JobStatus,
    TaskBinding,
)


class MigRefused(ValueError):
    """A MIG assignment this node cannot honour; the message says which and why."""


def mig_grant(node_id: str, devices: Sequence[GpuDevice], g: GpuAssignment) -> GpuGrant:
    """The grant of one MIG assignment; MigRefused if the instance is not there."""
    gpu = next((d for d in devices if d.index == g.index), None)
    inst = gpu.mig_instance(g.mig_start) if gpu is not None and gpu.mig_mode else None
    if inst is None or inst.profile != g.mig_profile or not inst.uuid:
        there = f" (it has {inst.profile} there)" if inst is not None and inst.uuid else ""
        raise MigRefused(f"no MIG instance {g.mig_profile} at memory slice {g.mig_start} of "
                         f"GPU {g.index} on {node_id}{there}")
    # memory and compute are the instance's, not a share of the GPU: 0 / 100
    return GpuGrant(g.index, inst.uuid, mig_profile=inst.profile, mig_start=inst.start)


def task_grants(node_id: str, devices: Sequence[GpuDevice], t: TaskBinding
                ) -> tuple[GpuGrant, ...]:
    """The task's grants; MigRefused if one of its MIG instances is not on this node."""
    return tuple(mig_grant(node_id, devices, g) if g.mig_profile else
                 GpuGrant(g.index, g.uuid, g.memory_mib, g.compute_pct) for g in t.gpus)


def refusal(b: Binding, node_id: str, max_epoch: int, tasks: Sequence[TaskBinding],
            why: str) -> tuple[BindingRefused, list[tuple[str, JobStatus]]]:
    """The refusal of a binding, and each of its tasks' end: failed to start (the
    scheduler acts on the task reports: it frees their place, then retries or fails)."""
    notice = BindingRefused(job_id=b.job_id, node_id=node_id, binding_id=b.binding_id,
                            reason=why, epoch=b.epoch, current_epoch=max_epoch)
    return notice, [(task_key(b.job_id, t.task_id, b.attempt), JobStatus(
        job_id=b.job_id, state=JobState.FAILED, attempt=b.attempt, task=t.task_id,
        reason=f"binding refused: {why}", cause=EndCause.START_FAILED, node_id=node_id,
        epoch=b.epoch)) for t in tasks]
