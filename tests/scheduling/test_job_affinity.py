"""Affinity towards other jobs by their labels (Kubernetes' pod affinity with a label
selector), at node, rack, NVLink-domain or any node-label scope."""

from __future__ import annotations

from scheduling import AffinityRule, PendingReason, Scheduler
from scheduling.node_table import NVLINK_DOMAIN
from tests.scheduling.builders import World, bound, cluster, config, job, node

PLUGINS = ("gang", "priority", "nodeaffinity", "affinity", "binpack")


def near(scope: str = "node", anti: bool = False, required: bool = True, **labels: str) -> AffinityRule:
    return AffinityRule("worker", "", scope, anti=anti, required=required, to_jobs=tuple(sorted(labels.items())))


def world(nodes=None) -> World:
    return World(nodes or cluster(4), Scheduler(config(*PLUGINS)))


def test_required_affinity_follows_a_running_job_with_the_labels() -> None:
    w = world()
    w.start(job("cache").labels(app="cache").gpus(1), n2=[0])
    w.start(job("other").labels(app="web").gpus(1), n0=[0])  # bin-packing alone would pick n0
    plan = w.submit(job("train").gpus(2).affinity(near(app="cache"))).step()
    assert bound(plan) == {"train": ["n2"]}


def test_required_affinity_to_a_job_that_does_not_run_waits_for_it() -> None:
    plan = world().submit(job("train").gpus(1).affinity(near(app="cache"))).step()
    assert plan.pending == {"train": PendingReason.AFFINITY}


def test_anti_affinity_keeps_apart_from_running_jobs_and_from_jobs_placed_in_the_same_cycle() -> None:
    w = world(cluster(3))
    w.start(job("web0").labels(app="web").gpus(1), n0=[0])
    rule = near(anti=True, app="web")
    plan = w.submit(*(job(f"web{k}").labels(app="web").gpus(1).affinity(rule) for k in (1, 2))).step()
    nodes = [n for ns in bound(plan).values() for n in ns]
    assert sorted(nodes) == ["n1", "n2"]  # one per node, none beside web0
    plan = w.submit(job("web3").labels(app="web").gpus(1).affinity(rule)).step()
    assert plan.pending == {"web3": PendingReason.AFFINITY}  # every node has a web job


def test_an_nvlink_domain_spans_the_nodes_labelled_with_it_and_defaults_to_the_node() -> None:
    nodes = tuple(node(f"n{i}").label(**{NVLINK_DOMAIN: f"nvl{i // 2}"}).build() for i in range(4))
    w = world(nodes)
    w.start(job("a").labels(app="a").gpus(8), n2=list(range(8)))  # n2 full: its domain-mate is n3
    plan = w.submit(job("b").gpus(1).affinity(near(NVLINK_DOMAIN, app="a"))).step()
    assert bound(plan) == {"b": ["n3"]}
    plain = cluster(2)  # no label: NVLink ends at the node, so near means on n1 itself
    w = world(plain)
    w.start(job("a").labels(app="a").gpus(1), n1=[0])
    assert bound(w.submit(job("b").gpus(1).affinity(near(NVLINK_DOMAIN, app="a"))).step()) == {"b": ["n1"]}


def test_a_node_label_scope_and_a_node_without_the_label() -> None:
    nodes = (node("n0").label(zone="a").build(), node("n1").label(zone="b").build(), node("n2").build())
    w = world(nodes)
    w.start(job("db").labels(app="db").gpus(1), n0=[0])
    plan = w.submit(job("x").gpus(8).affinity(near("zone", anti=True, app="db"))).step()
    assert bound(plan)["x"][0] in ("n1", "n2")  # n2 has no zone: in no domain, so not near
    plan = world(nodes).submit(job("y").gpus(1).affinity(near("zone", app="db"))).step()
    assert plan.pending == {"y": PendingReason.AFFINITY}


def test_preferred_affinity_to_a_job_is_a_score_not_a_filter() -> None:
    w = world()
    w.start(job("other").gpus(1), n0=[0])
    w.start(job("cache").labels(app="cache").gpus(8), n3=list(range(8)))  # its node is full
    w.start(job("cache2").labels(app="cache").gpus(1), n1=[0])
    plan = w.submit(job("train").gpus(1).affinity(near(required=False, app="cache"))).step()
    assert bound(plan) == {"train": ["n1"]}


def test_a_selector_sees_only_its_own_tenants_jobs() -> None:
    """Another tenant's job with the labels is neither followed nor kept apart from."""
    w = world(cluster(2))
    w.start(job("theirs").tenant("b").labels(app="cache").gpus(1), n1=[0])
    plan = w.submit(job("mine").tenant("a").gpus(1).affinity(near(app="cache"))).step()
    assert plan.pending == {"mine": PendingReason.AFFINITY}
    w = world(cluster(2))
    w.start(job("theirs").tenant("b").labels(app="web").gpus(1), n0=[0])
    plan = w.submit(job("mine").tenant("a").gpus(1).affinity(near(anti=True, app="web"))).step()
    assert bound(plan) == {"mine": ["n0"]}  # bin-packing's choice: the other tenant's job does not count
