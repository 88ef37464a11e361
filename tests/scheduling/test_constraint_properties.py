"""Hypothesis: on a mixed cluster (three GPU models, labels, taints, a cordoned node), no
plan puts a task where its job's constraints forbid it: every bind (and every replica a
resize adds) is on a schedulable node whose labels match the job's nodeSelector, whose
hard taints the job tolerates, and, for a task with GPUs, on GPUs of a model it allows;
and a job that fits nowhere it may go is answered with the constraint's reason. Each
policy preset is tried. The same checks, written here without the core's predicate
code, are the oracle."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scheduling import JobRequest, Node, PendingReason, Scheduler, SchedulerConfig, Snapshot
from shared.node_constraints import Toleration, core_tolerations
from tests.scheduling.builders import job, node

MODELS = ["H100-80GB", "A100-80GB", "V100-32GB"]
TAINTS = ["dedicated=ml:NoSchedule", "spot=:NoExecute"]
CONFIGS = {"default": SchedulerConfig(), "tiresias": SchedulerConfig.preset("tiresias")}


@st.composite
def mixed(draw) -> Snapshot:  # type: ignore[no-untyped-def]
    nodes = []
    for i in range(draw(st.integers(2, 6))):
        b = node(f"n{i}").gpus(draw(st.sampled_from([2, 4, 8])), draw(st.sampled_from(MODELS)))
        b.label(zone=draw(st.sampled_from(["a", "b"])))
        if draw(st.integers(0, 2)) == 0:
            b.taint(draw(st.sampled_from(TAINTS)))
        if draw(st.integers(0, 6)) == 0:
            b.cordoned()
        nodes.append(b.build())
    pending = []
    for k in range(draw(st.integers(1, 8))):
        b = job(f"p{k}").submit(float(k)).gpus(draw(st.integers(1, 4)))
        if draw(st.booleans()):
            b.gang(draw(st.integers(2, 3)))
        if draw(st.booleans()):
            b.models(*draw(st.lists(st.sampled_from(MODELS), min_size=1, max_size=2, unique=True)))
        if draw(st.booleans()):
            b.selector(zone=draw(st.sampled_from(["a", "b"])))
        if draw(st.booleans()):
            key, value = draw(st.sampled_from([("dedicated", "ml"), ("spot", "")]))
            op = draw(st.sampled_from(["Equal", "Exists"]))
            t = Toleration(key=key, operator=op, value=value if op == "Equal" else "")
            b.tolerate(*core_tolerations([t]))
        pending.append(b.build())
    return Snapshot(0.0, tuple(nodes), (), tuple(pending))


def allowed(j: JobRequest, n: Node, gpu_index: int | None) -> bool:
    """The oracle: Kubernetes' rules, written apart from the core's predicate."""
    if not n.schedulable or any(n.labels.get(k) != v for k, v in j.node_selector.items()):
        return False
    for taint in n.taints:
        key = taint.split("=", 1)[0]
        if taint not in j.tolerations and key not in j.tolerations:
            return False
    if gpu_index is not None and j.gpu_models:
        return next(g.model for g in n.gpus if g.index == gpu_index) in j.gpu_models
    return True


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mixed(), st.sampled_from(sorted(CONFIGS)))
def test_no_plan_puts_a_task_where_its_constraints_forbid(snap: Snapshot, cfg: str) -> None:
    plan = Scheduler(CONFIGS[cfg]).schedule(snap)
    jobs = {j.job_id: j for j in snap.pending}
    nodes = {n.node_id: n for n in snap.nodes}
    binds = [*plan.binds, *(b for rz in plan.resizes for b in rz.binds)]
    for b in binds:
        j, n = jobs[b.job_id], nodes[b.node_id]
        assert allowed(j, n, None), (b, j)
        for g in b.gpus:
            assert allowed(j, n, g.index), (b, g, j.gpu_models)
    placed = {b.job_id for b in binds}
    for j in snap.pending:
        if j.job_id in placed:
            continue
        # a job no node it may use could hold waits for that reason, never for room
        can_go = [n for n in snap.nodes
                  if allowed(j, n, None) and any(allowed(j, n, g.index) for g in n.gpus)]
        if not can_go:
            assert plan.pending.get(j.job_id) in (
                PendingReason.GPU_MODEL, PendingReason.NO_MATCHING_NODE), (j, plan.pending)
