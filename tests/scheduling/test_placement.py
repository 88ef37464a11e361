"""Placement: topology, bin-packing vs spread, models, telemetry, locality, selectors, MIG."""

from __future__ import annotations

import pytest

from scheduling import GpuStats, PendingReason, Scheduler
from tests.scheduling.builders import World, bound, cluster, config, job, node

PLACE = ("gang", "priority", "nodeaffinity", "gpumodel", "topology", "binpack")


def place(nodes, *jobs, plugins=PLACE, **kw):
    w = World(tuple(nodes), Scheduler(config(*plugins)), **kw)
    return w.submit(*jobs).step()


def test_multi_gpu_task_stays_inside_one_nvlink_domain() -> None:
    n = node("n0").nvlink(0, 0, 0, 0, 1, 1, 1, 1).build()
    w = World((n,), Scheduler(config(*PLACE)))
    w.start(job("x").gpus(1), n0=[0])  # domain 0 has 3 idle, domain 1 has 4
    plan = w.submit(job("a").gpus(4)).step()
    assert [u.index for u in plan.binds[0].gpus] == [4, 5, 6, 7]


def test_nvlink_domain_makes_the_node_preferable() -> None:
    split = node("n0").nvlink(0, 0, 1, 1, 2, 2, 3, 3).build()
    whole = node("n1").nvlink(0, 0, 0, 0, 1, 1, 1, 1).build()
    plan = place([split, whole], job("a").gpus(4))
    assert bound(plan) == {"a": ["n1"]}


def test_gang_prefers_one_rack() -> None:
    nodes = cluster(6, per_rack=3)
    w = World(nodes, Scheduler(config(*PLACE)))
    w.start(job("x").gpus(8), n0=list(range(8)))
    plan = w.submit(job("g").gpus(8).gang(3)).step()
    assert bound(plan) == {"g": ["n3", "n4", "n5"]}  # rack r0 has only two free nodes left


@pytest.mark.parametrize(("strategy", "expected"), [("binpack", "n0"), ("spread", "n1")])
def test_binpack_or_spread(strategy, expected) -> None:
    w = World(cluster(2), Scheduler(config("gang", ("binpack", {"strategy": strategy}))))
    w.start(job("x").gpus(2), n0=[0, 1])
    assert bound(w.submit(job("a").gpus(1)).step()) == {"a": [expected]}


def test_gpu_model_constraint() -> None:
    nodes = [node("n0").gpus(8, "V100").build(), node("n1").gpus(8, "H100").build()]
    assert bound(place(nodes, job("a").gpus(2).models("H100"))) == {"a": ["n1"]}
    plan = place(nodes, job("a").gpus(2).models("B200"))
    assert plan.pending == {"a": PendingReason.GPU_MODEL}


def test_load_aware_avoids_hot_and_degraded_gpus() -> None:
    nodes = cluster(2)
    hot = tuple(GpuStats(i, 95.0, 0, 85.0) for i in range(8))
    plan = place(nodes, job("a").gpus(1), plugins=(*PLACE, "loadaware"), telemetry={"n0": hot})
    assert bound(plan) == {"a": ["n1"]}
    degraded = {"n0": tuple(GpuStats(i, degraded=i < 2) for i in range(8))}
    plan = place(nodes[:1], job("a").gpus(2), plugins=(*PLACE, "loadaware"), telemetry=degraded)
    assert [u.index for u in plan.binds[0].gpus] == [2, 3]


def test_dataset_locality() -> None:
    nodes = [node("n0").build(), node("n1").datasets("imagenet").build()]
    plan = place(nodes, job("a").gpus(1).dataset("imagenet"), plugins=(*PLACE, ("locality", {}, 2.0)))
    assert bound(plan) == {"a": ["n1"]}


def test_selectors_taints_and_cordons() -> None:
    nodes = [node("n0").cordoned().build(), node("n1").taint("dedicated=infer:NoSchedule").build(),
             node("n2").label(zone="b").build()]
    assert bound(place(nodes, job("a").gpus(1))) == {"a": ["n2"]}
    assert bound(place(nodes, job("a").gpus(1).tolerate("dedicated").selector(zone="a"))) == {}
    assert place(nodes, job("a").gpus(1).selector(zone="a")).pending == {"a": PendingReason.NO_MATCHING_NODE}
    assert bound(place(nodes, job("a").gpus(2).tolerate("dedicated=infer:NoSchedule"),
                       plugins=(*PLACE[:-1], ("binpack", {"strategy": "spread"})))) in (
        {"a": ["n1"]}, {"a": ["n2"]})


def test_unhealthy_gpus_are_never_used() -> None:
    plan = place([node("n0").unhealthy(0, 1, 2).build()], job("a").gpus(5), job("b").gpus(1))
    assert [u.index for u in plan.binds[0].gpus] == [3, 4, 5, 6, 7]
    assert plan.pending == {"b": PendingReason.PRIORITY}  # a took the last healthy GPUs


def test_mig_instances() -> None:
    nodes = [node("n0").gpus(2).mig("3g.40gb", "3g.40gb").build()]
    plan = place(nodes, job("a").mig("3g.40gb").replicas(4), job("b").gpus(1))
    assert [(b.gpus[0].index, b.gpus[0].mig_slices, b.gpus[0].mig_slots) for b in plan.binds] == [
        (0, 3, 0x0F), (0, 3, 0xF0), (1, 3, 0x0F), (1, 3, 0xF0)]  # each instance once, where it is
    assert plan.pending == {"b": PendingReason.NEVER_FITS}  # MIG GPUs serve only their instances


def test_mig_profile_takes_only_its_own_instances() -> None:
    """A 1g.10gb asks for a 1g.10gb instance: the free 2g.20gb beside it is not one."""
    nodes = [node("n0").gpus(1).mig("4g.40gb", "2g.20gb", "1g.10gb").build()]
    plan = place(nodes, job("a").mig("1g.10gb").replicas(2), job("c").mig("2g.20gb"))
    assert plan.pending == {"a": PendingReason.NEVER_FITS}  # two replicas, one 1g.10gb instance
    assert [(b.job_id, b.gpus[0].mig_slots) for b in plan.binds] == [("c", 0x30)]
    plan = place(nodes, job("a").mig("1g.10gb"), job("b").mig("4g.40gb"))
    assert sorted((b.job_id, b.gpus[0].mig_slots) for b in plan.binds) == [("a", 0x40), ("b", 0x0F)]


@pytest.mark.parametrize("preset", ["default", "fifo", "tiresias", "fgd"])
def test_no_nodes_places_nothing_and_says_why(preset) -> None:
    """Before any node has registered, every job waits (the kept-scores path included)."""
    from scheduling import SchedulerConfig, Snapshot

    jobs = (job("a").gpus(1).build(), job("b").share(10_000, 30).build(), job("c").cpu(1000).build())
    plan = Scheduler(SchedulerConfig.preset(preset)).schedule(Snapshot(0.0, (), (), jobs, ()))
    assert plan.binds == [] and set(plan.pending) == {"a", "b", "c"}
