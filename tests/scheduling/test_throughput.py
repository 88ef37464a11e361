"""Heterogeneity-aware placement: the throughput plugin and the migrate action."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from scheduling import (
    Allocation,
    GpuSlot,
    GpuUse,
    JobRequest,
    Node,
    PreemptReason,
    RunningJob,
    Scheduler,
    SchedulerConfig,
    Snapshot,
    TaskRequest,
)

MODELS = ("V100", "P100", "K80")


def node(nid: str, model: str, gpus: int = 4) -> Node:
    return Node(nid, 64_000, 512_000, [GpuSlot(g, f"{nid}-{g}", model) for g in range(gpus)])


def job(jid: str, gpus: int = 1, speeds: dict[str, float] | None = None, models: tuple[str, ...] = (),
        submit: float = 0.0, estimate: float | None = None) -> JobRequest:
    return JobRequest(jid, (TaskRequest("w", "worker", 1, gpu=gpus),), submit_time=submit,
                      gpu_speeds=tuple(sorted((speeds or {}).items())), gpu_models=models,
                      runtime_estimate_s=estimate)


def models_of(plan, nodes) -> dict[str, str]:  # type: ignore[no-untyped-def]
    by_id = {n.node_id: n.gpus[0].model for n in nodes}
    return {b.job_id: by_id[b.node_id] for b in plan.binds}


def _running_on(nid: str, j: JobRequest, start: float = 0.0) -> tuple[Allocation, RunningJob]:
    a = Allocation(j.job_id, f"{j.job_id}-w-0", nid, (GpuUse(0),), 0, 0, "w", "worker")
    return a, RunningJob(j, start, None)


def test_a_job_with_speeds_takes_its_fastest_free_model_whatever_the_node_order() -> None:
    nodes = (node("a", "K80"), node("b", "P100"), node("c", "V100"))
    rec = job("rec", speeds={"V100": 0.4, "P100": 1.0, "K80": 0.6})  # Recommendation: fastest on a P100
    cnn = job("cnn", speeds={"V100": 1.0, "P100": 0.6, "K80": 0.1})
    plan = Scheduler().schedule(Snapshot(0.0, nodes, (), (rec, cnn)))
    assert models_of(plan, nodes) == {"rec": "P100", "cnn": "V100"}


def test_jobs_without_speeds_are_placed_as_before() -> None:
    """The plugin scores nothing for them: the same plan with and without it."""
    nodes = (node("a", "K80"), node("b", "P100"), node("c", "V100"))
    jobs = tuple(job(f"j{k}", gpus=1 + k % 2) for k in range(5))
    without = SchedulerConfig.load({"plugins": [p.model_dump() for p in SchedulerConfig().plugins
                                                if p.name != "throughput"]})
    a = Scheduler().schedule(Snapshot(0.0, nodes, (), jobs))
    b = Scheduler(without).schedule(Snapshot(0.0, nodes, (), jobs))
    assert [(x.job_id, x.node_id, x.gpus) for x in a.binds] == [(x.job_id, x.node_id, x.gpus) for x in b.binds]
    assert a.binds  # it placed something


def test_under_competition_a_slow_model_goes_to_the_jobs_that_lose_least_there() -> None:
    """One K80 node free, and more waiting than it holds: a job 10x slower on a K80
    waits for a better GPU; jobs about as fast there as anywhere take it."""
    nodes = (node("k", "K80", 2), node("v", "V100", 1))
    busy = JobRequest("busy", (TaskRequest("w", "worker", 1, gpu=1),), preemptible=False)
    alloc, run = _running_on("v", busy)  # the V100 is taken
    slow = job("slow", speeds={"V100": 1.0, "K80": 0.1}, submit=0.0)  # first in line
    ok = [job(f"ok{i}", speeds={"V100": 1.0, "K80": 0.8}, submit=1.0 + i) for i in range(3)]
    plan = Scheduler().schedule(Snapshot(10.0, nodes, (alloc,), (slow, *ok), (run,)))
    placed = {b.job_id for b in plan.binds}
    assert "slow" not in placed and len(placed) == 2
    assert plan.pending["slow"].value in ("no_fit", "gpu_model", "no_matching_node")


def test_with_room_for_everyone_nothing_is_refused() -> None:
    nodes = (node("k", "K80", 4), node("v", "V100", 1))
    busy = JobRequest("busy", (TaskRequest("w", "worker", 1, gpu=1),), preemptible=False)
    alloc, run = _running_on("v", busy)
    slow = job("slow", speeds={"V100": 1.0, "K80": 0.1})
    plan = Scheduler().schedule(Snapshot(0.0, nodes, (alloc,), (slow,), (run,)))
    assert [b.job_id for b in plan.binds] == ["slow"]  # better slow than idle GPUs and a job waiting


def test_a_job_on_a_slow_model_moves_to_a_faster_one_left_free() -> None:
    nodes = (node("k", "K80", 1), node("v", "V100", 1))
    long = job("long", speeds={"V100": 1.0, "K80": 0.2}, estimate=100 * 3600.0)
    alloc, run = _running_on("k", long)
    plan = Scheduler().schedule(Snapshot(3600.0, nodes, (alloc,), (), (run,)))
    assert [(p.job_id, p.reason) for p in plan.preemptions] == [("long", PreemptReason.FASTER_GPU)]


def test_no_move_when_it_would_not_pay_or_a_waiting_job_may_use_the_gpu() -> None:
    nodes = (node("k", "K80", 1), node("v", "V100", 1))
    short = job("short", speeds={"V100": 1.0, "K80": 0.9}, estimate=1200.0)  # 10% faster, 20 min
    alloc, run = _running_on("k", short)
    plan = Scheduler().schedule(Snapshot(60.0, nodes, (alloc,), (), (run,)))
    assert not plan.preemptions
    nodes = (node("k", "K80", 1), node("v", "V100", 2))
    long = job("long", speeds={"V100": 1.0, "K80": 0.2}, estimate=100 * 3600.0)
    alloc, run = _running_on("k", long)
    busy = JobRequest("busy", (TaskRequest("w", "worker", 1, gpu=1),), preemptible=False)
    b_alloc, b_run = _running_on("v", busy)  # one of the two V100s is taken
    waiting = job("w8", gpus=2, speeds={"V100": 1.0, "K80": 0.5})  # asks for 2: waits for room on the V100s
    plan = Scheduler().schedule(Snapshot(3600.0, nodes, (alloc, b_alloc), (waiting,), (run, b_run)))
    assert plan.pending["w8"].value == "no_fit"
    assert not plan.preemptions  # the V100 is what the waiting job may run on


def test_migration_can_be_switched_off() -> None:
    cfg = SchedulerConfig.load({"plugins": [
        p.model_dump() | ({"args": {"migrate": False}} if p.name == "throughput" else {})
        for p in SchedulerConfig().plugins]})
    assert "migrate" not in cfg.actions()
    assert "migrate" in SchedulerConfig().actions()
    assert "migrate" not in SchedulerConfig.preset("default", preemption={"enabled": False}).actions()


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 4), st.sampled_from(MODELS),
                          st.lists(st.floats(0.05, 1.0), min_size=3, max_size=3),
                          st.sets(st.sampled_from(MODELS), min_size=1)), min_size=1, max_size=10),
       st.lists(st.sampled_from(MODELS), min_size=1, max_size=6))
def test_no_job_is_placed_on_a_model_it_cannot_run_on(specs, node_models) -> None:  # type: ignore[no-untyped-def]
    """Whatever the speeds and the queue, a job lands only on its allowed models, and on
    one model (a node of one model per node here)."""
    nodes = tuple(node(f"n{i}", m) for i, m in enumerate(node_models))
    jobs = tuple(job(f"j{k}", g, dict(zip(MODELS, sp, strict=True)), tuple(sorted(allowed)), submit=float(k))
                 for k, (g, _, sp, allowed) in enumerate(specs))
    plan = Scheduler().schedule(Snapshot(0.0, nodes, (), jobs))
    model = {n.node_id: n.gpus[0].model for n in nodes}
    allowed = {j.job_id: set(j.gpu_models) for j in jobs}
    for b in plan.binds:
        assert model[b.node_id] in allowed[b.job_id]


def test_a_list_of_models_is_an_order_of_preference() -> None:
    nodes = (node("a", "K80"), node("b", "V100"), node("c", "P100"))
    pref = JobRequest("pref", (TaskRequest("w", "worker", 1, gpu=1),), gpu_models=("P100", "V100"),
                      gpu_model_ranks=(0, 1))
    plan = Scheduler().schedule(Snapshot(0.0, nodes, (), (pref,)))
    assert models_of(plan, nodes) == {"pref": "P100"}
    flipped = JobRequest("pref", pref.tasks, gpu_models=("V100", "P100"), gpu_model_ranks=(0, 1))
    plan = Scheduler().schedule(Snapshot(0.0, nodes, (), (flipped,)))
    assert models_of(plan, nodes) == {"pref": "V100"}
    busy = JobRequest("busy", (TaskRequest("w", "worker", 1, gpu=4),), preemptible=False)
    a = Allocation("busy", "busy-w-0", "b", tuple(GpuUse(g) for g in range(4)), 0, 0, "w", "worker")
    plan = Scheduler().schedule(Snapshot(0.0, nodes, (a,), (flipped,), (RunningJob(busy, 0.0, None),)))
    assert models_of(plan, nodes) == {"pref": "P100"}  # the first choice is full: the next
