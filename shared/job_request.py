"""A job spec as the scheduling core takes it (``JobRequest``): the one conversion that
queueing, the scheduler and the gateway's quota check all use, so the three cannot
disagree on what a job asks for."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime

from scheduling import JobRequest, TaskRequest
from shared.billing import prices
from shared.jobspec import JobSpec, TaskSpec
from shared.task_affinity import core_rules


def task_request(t: TaskSpec, target: int | None = None, cap: int | None = None) -> TaskRequest:
    """An elastic group starts with ``replicas`` (or the user's resize ``target``), at
    least its minimum, and grows up to its maximum, capped by the target and by ``cap``
    (a group that is finishing never grows again). A group that cannot change size is
    plain: the core sees no range."""
    replicas, lo, hi = t.replicas, None, None
    if t.elastic:
        lo, hi = t.least_replicas, t.most_replicas
        if target is not None:
            replicas = hi = max(lo, min(hi, target))
        if cap is not None:
            hi = min(hi, cap)
            replicas = min(replicas, hi)
            lo = min(lo, hi)
    return TaskRequest(name=t.name, role=t.effective_role, replicas=replicas,
                       gpu=t.resources.gpu, gpu_memory_mib=t.resources.gpu_memory,
                       gpu_compute_pct=t.resources.gpu_compute, cpu_milli=t.resources.cpu,
                       memory_mib=t.resources.memory, mig_profile=t.resources.mig or "",
                       min_replicas=lo, max_replicas=hi)


def task_requests(spec: JobSpec, targets: Mapping[str, int] | None = None,
                  caps: Mapping[str, int] | None = None) -> tuple[TaskRequest, ...]:
    """The spec's task groups, each with its resize target and cap if it has one."""
    targets, caps = targets or {}, caps or {}
    return tuple(task_request(t, targets.get(t.name), caps.get(t.name)) for t in spec.tasks)


def job_request(spec: JobSpec, *, job_id: str, queue: str, tenant: str, user: str,
                submitted_at: datetime, attempt: int,
                targets: Mapping[str, int] | None = None,
                caps: Mapping[str, int] | None = None,
                admitted_models: Sequence[str] = (),
                billing_weights: Mapping[str, float] | None = None) -> JobRequest:
    """The whole job: its tasks, who submitted it where, and what the policy ranks by.
    ``admitted_models``: the GPU models its queue's quota admitted it for (``JobReady``);
    it may run on those only. ``billing_weights``: its queue's, what one GPU-hour of a
    model counts as in fair share (``shared/billing.py``)."""
    models, ranks = _models(spec, admitted_models)
    by_model = bool(spec.total_gpus or spec.mig_profiles)  # whole GPUs and MIG: gpuModel binds
    return JobRequest(
        job_id=job_id,
        tasks=task_requests(spec, targets, caps),
        queue=queue,
        tenant=tenant,
        user=user,
        priority=spec.priority,
        priority_class=spec.priority_class.value,
        submit_time=submitted_at.timestamp(),
        min_available=spec.min_available,
        runtime_estimate_s=spec.runtime_estimate,
        dataset=spec.dataset or "",
        preemptible=spec.preemptible,
        attempt=attempt,
        gpu_models=models if by_model else (),
        gpu_model_ranks=ranks if by_model else (),
        gpu_speeds=spec.gpu_speeds if by_model else (),
        gpu_prices=prices(billing_weights) if by_model and billing_weights else (),
        node_selector=dict(spec.node_selector),
        labels=dict(spec.labels),
        tolerations=spec.core_tolerations,
        affinity=core_rules([(t.effective_role, t.affinity, t.anti_affinity) for t in spec.tasks],
                            {t.name: t.effective_role for t in spec.tasks}),
    )


def _models(spec: JobSpec, admitted: Sequence[str]) -> tuple[tuple[str, ...], tuple[int, ...]]:
    """The GPU models a job may run on and their preference ranks: its spec's, narrowed
    to those its quota admitted it for."""
    models, ranks = spec.gpu_models, spec.gpu_model_ranks
    if not admitted:
        return models, ranks
    rank = dict(zip(models, ranks, strict=True)) if ranks else {}
    narrowed = tuple(admitted)
    return narrowed, tuple(rank[m] for m in narrowed) if all(m in rank for m in narrowed) \
        and rank else ()
