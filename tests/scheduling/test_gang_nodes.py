"""Gangs kept together (issue 17): a gang goes on the fewest nodes that can hold it now,
then the fewest racks (switches), whatever the placement plugins; and the lowest level
of the bound the property test checks is itself checked against brute force."""

from __future__ import annotations

from itertools import combinations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scheduling import Scheduler, SchedulerConfig
from scheduling.config import PRESETS
from scheduling.gangfit import fewest_nodes
from tests.scheduling.builders import World, bound, cluster, config, job, node

# every configuration the repository ships: the presets, and the Helm chart's policy
HELM = ("gang", ("priority", {"starvation_bound_s": 3600}), "fairshare", "nodeaffinity", "gpumodel", "affinity",
        ("topology", {}, 2.0), ("binpack", {"strategy": "binpack"}), ("kairos", {}, 2.0), ("loadaware", {}, 0.5),
        ("locality", {}, 0.5), "backfill", "elastic")
CONFIGS = [*PRESETS, "helm", "spread"]
# those with the topology plugin, which makes racks (switches) matter
TOPOLOGY = [c for c in CONFIGS if c not in ("random", "bestfit", "fgd")]


def scheduler(name: str) -> Scheduler:
    if name == "helm":
        return Scheduler(config(*HELM))
    if name == "spread":  # binpack's spread strategy spreads single replicas, never a gang
        return Scheduler(config("gang", "fifo", "topology", ("binpack", {"strategy": "spread"})))
    return Scheduler(SchedulerConfig.preset(name))


# (name, GPUs already used on n0..n3 of 4 x 8, gang replicas x GPUs, nodes expected)
CASES = [
    ("empty cluster", [0, 0, 0, 0], (2, 4), 1),
    ("the issue: n0 half used, three nodes empty", [4, 0, 0, 0], (2, 4), 1),
    ("n0 a quarter used", [2, 0, 0, 0], (2, 4), 1),
    ("n0 mostly used", [6, 0, 0, 0], (2, 4), 1),
    ("two nodes half used", [4, 4, 0, 0], (2, 4), 1),
    ("only half nodes left", [4, 4, 4, 4], (2, 4), 2),
    ("one half node and full ones", [8, 8, 4, 4], (2, 4), 2),
    ("one node has room for two", [4, 2, 4, 6], (2, 4), 2),
    ("a node holds three of four", [8, 2, 4, 6], (4, 2), 2),
    ("four single GPUs on a full node", [4, 0, 0, 0], (4, 1), 1),
    ("twelve GPUs: one node and a half", [0, 0, 0, 0], (3, 4), 2),
    ("twelve GPUs on holes", [4, 4, 4, 0], (3, 4), 2),
    ("sixteen GPUs: two nodes", [2, 0, 0, 0], (4, 4), 2),
]


@pytest.mark.parametrize("cfg", CONFIGS)
@pytest.mark.parametrize(("name", "used", "shape", "expected"), CASES, ids=[c[0] for c in CASES])
def test_a_gang_goes_on_the_fewest_nodes(cfg, name, used, shape, expected) -> None:
    w = World(cluster(4), scheduler(cfg))
    for k, g in enumerate(used):
        if g:
            w.start(job(f"x{k}").gpus(g), **{f"n{k}": list(range(g))})
    replicas, gpus = shape
    plan = w.submit(job("a").gpus(gpus).gang(replicas)).step()
    nodes = bound(plan)["a"]
    assert len(nodes) == replicas, name
    assert len(set(nodes)) == expected, (cfg, name, nodes)


@pytest.mark.parametrize("cfg", TOPOLOGY)
def test_a_gang_stays_in_one_rack_when_one_rack_holds_it_on_as_few_nodes(cfg) -> None:
    # r0 = n0, n1 (n1 half used), r1 = n2, n3 (empty): 2 x 8 GPUs need two empty nodes,
    # which r1 has and r0 has not: both in r1, not n0 and one of r1.
    nodes = (node("n0").rack("r0").build(), node("n1").rack("r0").build(),
             node("n2").rack("r1").build(), node("n3").rack("r1").build())
    w = World(nodes, scheduler(cfg))
    w.start(job("x").gpus(4), n1=[0, 1, 2, 3])
    plan = w.submit(job("a").gpus(8).gang(2)).step()
    assert sorted(bound(plan)["a"]) == ["n2", "n3"], cfg


@pytest.mark.parametrize("cfg", CONFIGS)
def test_fewer_nodes_come_before_one_rack(cfg) -> None:
    # r0: n0 (8 free); r1: n1, n2 (4 free each). 2 x 4 GPUs: one node (n0), not a rack
    # of two half nodes.
    nodes = (node("n0").rack("r0").build(), node("n1").rack("r1").build(), node("n2").rack("r1").build())
    w = World(nodes, scheduler(cfg))
    w.start(job("x").gpus(4), n1=[0, 1, 2, 3]).start(job("y").gpus(4), n2=[0, 1, 2, 3])
    plan = w.submit(job("a").gpus(4).gang(2)).step()
    assert bound(plan)["a"] == ["n0", "n0"], cfg


def test_a_gang_on_one_node_shares_an_nvlink_domain_when_one_holds_it() -> None:
    # one node, domains 0 (GPUs 0-3) and 1 (4-7); GPUs 0-1 used: domain 0 has 2 free,
    # domain 1 has 4. 2 x 2 GPUs: both replicas in domain 1 (a single replica would
    # take the tightest domain, 0).
    n = node("n0").nvlink(0, 0, 0, 0, 1, 1, 1, 1).build()
    w = World((n,), Scheduler(SchedulerConfig.preset("default")))
    w.start(job("x").gpus(2), n0=[0, 1])
    plan = w.submit(job("a").gpus(2).gang(2)).step()
    gpus = sorted(u.index for b in plan.binds for u in b.gpus)
    assert gpus == [4, 5, 6, 7]
    w2 = World((n,), Scheduler(SchedulerConfig.preset("default")))
    w2.start(job("x").gpus(2), n0=[0, 1])
    plan = w2.submit(job("b").gpus(2)).step()
    assert sorted(u.index for b in plan.binds for u in b.gpus) == [2, 3]


def test_without_the_topology_plugin_racks_are_left_to_the_scores() -> None:
    # a ps fills n1 (r1); its worker needs one more node, n0 (r0, fuller) or n2 (r1):
    # bin-packing alone takes the fuller n0, with topology the gang keeps to r1
    nodes = (node("n0").rack("r0").build(), node("n1").rack("r1").build(), node("n2").rack("r1").build())
    j = job("j").named("ps").gpus(8).task("worker").gpus(1)
    for plugins, worker in ((("gang", "binpack"), "n0"), (("gang", "topology", "binpack"), "n2")):
        w = World(nodes, Scheduler(config(*plugins)))
        w.start(job("x").gpus(1), n0=[0])
        assert bound(w.submit(j).step())["j"] == ["n1", worker], plugins


def test_a_gang_that_cannot_keep_to_the_fewest_nodes_still_starts() -> None:
    # required anti-affinity of the workers (one per node): the fewest-nodes budget
    # cannot hold, and the gang is placed as the plugins alone would place it
    from scheduling import AffinityRule

    w = World(cluster(4), Scheduler(SchedulerConfig.preset("default")))
    rule = AffinityRule("worker", "worker", "node", anti=True, required=True)
    plan = w.submit(job("a").gpus(2).gang(3).affinity(rule)).step()
    assert len(set(bound(plan)["a"])) == 3


# --- the property: no placement uses more nodes than the free capacity needs -------------
def _min_nodes_brute(free: list[int], gpus: int, replicas: int) -> int | None:
    per = [f // gpus for f in free]
    for k in range(1, len(per) + 1):
        if any(sum(c) >= replicas for c in combinations(per, k)):
            return k
    return None


@given(st.lists(st.integers(0, 6), min_size=1, max_size=7), st.integers(1, 6))
def test_fewest_nodes_equals_brute_force(caps, need) -> None:
    cap = np.asarray(caps, dtype=np.int64)
    used = np.zeros(cap.size, dtype=bool)
    assert fewest_nodes(cap, used, need) == _min_nodes_brute(caps, 1, need)


@st.composite
def gang_world(draw):  # type: ignore[no-untyped-def]
    n = draw(st.integers(1, 8))
    sizes = [draw(st.sampled_from([2, 4, 8])) for _ in range(n)]
    per_rack = draw(st.sampled_from([0, 2, 3]))
    used = [draw(st.integers(0, s)) for s in sizes]
    gpus = draw(st.sampled_from([1, 2, 3, 4, 8]))
    replicas = draw(st.integers(2, 6))
    cfg = draw(st.sampled_from(CONFIGS))
    return sizes, per_rack, used, gpus, replicas, cfg


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(gang_world())
def test_no_gang_uses_more_nodes_than_the_free_capacity_needs(world) -> None:
    sizes, per_rack, used, gpus, replicas, cfg = world
    nodes = []
    for i, s in enumerate(sizes):
        b = node(f"n{i}").gpus(s).cpu(8_000 * s)
        if per_rack:
            b.rack(f"r{i // per_rack}")
        nodes.append(b.build())
    w = World(tuple(nodes), scheduler(cfg))
    for i, u in enumerate(used):
        if u:
            w.start(job(f"x{i}").gpus(u).cpu(1000 * u), **{f"n{i}": list(range(u))})
    plan = w.submit(job("a").gpus(gpus).cpu(1000 * gpus).gang(replicas)).step()
    k = _min_nodes_brute([s - u for s, u in zip(sizes, used, strict=True)], gpus, replicas)
    placed = bound(plan).get("a")
    if k is None:
        assert placed is None
    else:
        assert placed is not None and len(placed) == replicas
        assert len(set(placed)) <= k, (k, placed)
