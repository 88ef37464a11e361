"""Combined priority: classes, user priority, aging, starvation bound, parallelism, roles."""

from __future__ import annotations

import pytest

from scheduling import AffinityRule, PendingReason, Scheduler
from tests.scheduling.builders import World, bound, cluster, config, job, node


def order(jobs, now=0.0, **prio):
    w = World(cluster(1), Scheduler(config("gang", ("priority", prio), "binpack")), now=now)
    return w.scheduler.order(w.submit(*jobs).snapshot())


@pytest.mark.parametrize(
    ("name", "jobs", "now", "args", "expected"),
    [
        ("class beats submit time", [job("n").submit(0), job("h").klass("high").submit(5)], 10, {},
         ["h", "n"]),
        ("user priority within a class", [job("a").priority(1), job("b").priority(5)], 0, {}, ["b", "a"]),
        ("class beats user priority", [job("a").priority(1000), job("b").klass("high").priority(-1000)],
         0, {}, ["b", "a"]),
        ("FIFO among equals", [job("b").submit(2), job("a").submit(1)], 5, {}, ["a", "b"]),
        ("aging lifts the old job", [job("old").submit(0), job("new").priority(100).submit(7000)], 7200,
         {"aging_per_hour": 100.0}, ["old", "new"]),
        ("starved low job goes first", [job("low").klass("low").submit(0), job("u").klass("urgent").submit(99)],
         100, {"starvation_bound_s": 50.0}, ["low", "u"]),
        ("parallelism favours the larger", [job("s").gpus(1), job("l").gpus(8)], 0,
         {"parallelism_weight": 10.0}, ["l", "s"]),
        ("negative parallelism favours the smaller", [job("l").gpus(8), job("s").gpus(1)], 0,
         {"parallelism_weight": -10.0}, ["s", "l"]),
    ],
)
def test_order(name, jobs, now, args, expected) -> None:
    assert [j.job_id for j in order(jobs, now, **args)] == expected, name


def test_starved_job_blocks_lower_work_without_backfill() -> None:
    w = World(cluster(1), Scheduler(config("gang", ("priority", {"starvation_bound_s": 60.0}), "binpack")),
              now=100)
    w.start(job("r").gpus(4), n0=[0, 1, 2, 3])
    w.submit(job("big").gpus(8).submit(0), job("small").gpus(1).submit(90))
    plan = w.step()
    assert plan.binds == []
    assert plan.pending == {"big": PendingReason.NO_FIT, "small": PendingReason.PRIORITY}
    assert plan.blocked_by == {"small": "big"}  # the starved job that holds the line


def test_parameter_servers_are_placed_before_workers() -> None:
    j = job("ps").named("worker").gpus(2).replicas(2).task("ps").cpu(4000)
    plan = World(cluster(1), Scheduler(config("gang", "priority"))).submit(j).step()
    assert [b.task_id for b in plan.binds] == ["ps-0", "worker-0", "worker-1"]


def test_workers_follow_their_parameter_server_when_affinity_is_required() -> None:
    rule = AffinityRule("worker", "ps", "node", required=True)
    j = (job("j").named("ps").cpu(1000).task("worker").gpus(2).replicas(3).affinity(rule))
    w = World(cluster(4), Scheduler(config("gang", "priority", "affinity", ("binpack", {"strategy": "spread"}))))
    plan = w.submit(j).step()
    nodes = {b.role: set() for b in plan.binds}
    for b in plan.binds:
        nodes[b.role].add(b.node_id)
    assert nodes["worker"] == nodes["ps"]
    assert len(nodes["ps"]) == 1


def test_worker_anti_affinity_spreads_workers() -> None:
    rule = AffinityRule("worker", "worker", "node", anti=True, required=True)
    w = World(cluster(3), Scheduler(config("gang", "priority", "affinity", "binpack")))
    plan = w.submit(job("j").gpus(1).replicas(3).affinity(rule)).step()
    assert len(set(bound(plan)["j"])) == 3
    plan = World(cluster(2), Scheduler(config("gang", "priority", "affinity", "binpack"))).submit(
        job("j").gpus(1).replicas(3).affinity(rule)).step()
    assert plan.pending == {"j": PendingReason.AFFINITY}


@pytest.mark.parametrize(("rules", "worker_node"), [((), "n0"), ((AffinityRule("worker", "ps", "rack"),), "n2")])
def test_preferred_affinity_is_a_score_not_a_filter(rules, worker_node) -> None:
    nodes = (node("n0").rack("r0").build(), node("n1").rack("r1").build(), node("n2").rack("r1").build())
    w = World(nodes, Scheduler(config("gang", "priority", "affinity", "binpack")))
    w.start(job("x").gpus(1), n0=[0])
    # the ps fills n1; bin-packing alone puts the worker on the fuller n0, affinity by rack on n2
    plan = w.submit(job("j").named("ps").gpus(8).task("worker").gpus(1).affinity(*rules)).step()
    assert bound(plan)["j"] == ["n1", worker_node]


def _starved_order(hours: float, backlog_factor: float) -> list[str]:
    """'old' (low class) has waited 100 s against a 50 s bound; both jobs are expected
    to run ``hours`` on the one 8-GPU node."""
    jobs = [job("old").klass("low").gpus(8).submit(0).estimate(hours * 3600),
            job("u").klass("urgent").gpus(8).submit(99).estimate(hours * 3600)]
    return [j.job_id for j in order(jobs, 100, starvation_bound_s=50.0, backlog_factor=backlog_factor)]


def test_backlog_factor_keeps_the_fixed_bound_while_the_backlog_is_short() -> None:
    # backlog: 2 jobs x 8 GPUs x 5 s on 8 GPUs = 10 s < 50 s: the fixed bound holds
    assert _starved_order(5 / 3600, backlog_factor=1.0) == ["old", "u"]


def test_backlog_factor_stretches_the_bound_under_overload() -> None:
    # backlog: 2 x 10 h of the whole node = 20 h >> 50 s: no fixed bound can be kept, so
    # 'old' is not starved yet and class order holds
    assert _starved_order(10, backlog_factor=1.0) == ["u", "old"]
    assert _starved_order(10, backlog_factor=0.0) == ["old", "u"]  # off: the fixed bound


def test_backlog_bound_counts_running_work() -> None:
    w = World(cluster(1), Scheduler(config("gang", ("priority", {"starvation_bound_s": 50.0,
                                                                 "backlog_factor": 1.0}), "binpack")),
              now=100)
    w.start(job("r").gpus(8).estimate(10 * 3600), n0=list(range(8)))  # 10 h of the node left
    w.submit(job("old").klass("low").gpus(1).submit(0).estimate(5),
             job("u").klass("urgent").gpus(1).submit(99).estimate(5))
    assert [j.job_id for j in w.scheduler.order(w.snapshot())] == ["u", "old"]
    w.finish("r")
    assert [j.job_id for j in w.scheduler.order(w.snapshot())] == ["old", "u"]


def _ahead_order(now: float, fifo_ahead: float) -> list[str]:
    """'old' (low class, submitted at 0) has 1 h of work of the one 8-GPU node before
    it ('first', submitted earlier, still queued); 'u' (urgent) came last."""
    jobs = [job("first").klass("low").gpus(8).submit(-1).estimate(3600),
            job("old").klass("low").gpus(8).submit(0).estimate(3600),
            job("u").klass("urgent").gpus(8).submit(now - 1).estimate(3600)]
    return [j.job_id for j in order(jobs, now, starvation_bound_s=1e9, fifo_ahead=fifo_ahead)]


def test_fifo_ahead_promotes_a_job_that_waited_as_long_as_the_work_before_it() -> None:
    # at 30 min 'old' has waited less than the 1 h of work submitted before it: class order
    # after 'first', which has nothing before it
    assert _ahead_order(1800, fifo_ahead=1.0) == ["first", "u", "old"]
    # at 2 h both low jobs waited longer than the work still before them: arrival order first
    assert _ahead_order(7200, fifo_ahead=1.0) == ["first", "old", "u"]
    assert _ahead_order(7200, fifo_ahead=0.0) == ["u", "first", "old"]  # off


def test_a_starved_job_lets_later_jobs_that_fit_start_without_hold_line() -> None:
    w = World(cluster(1), Scheduler(config("gang", ("priority", {"starvation_bound_s": 60.0, "hold_line": False}),
                                           "binpack")), now=100)
    w.start(job("r").gpus(4), n0=[0, 1, 2, 3])
    w.submit(job("big").gpus(8).submit(0), job("small").gpus(1).submit(90))
    plan = w.step()
    assert bound(plan) == {"small": ["n0"]}
    assert plan.pending == {"big": PendingReason.NO_FIT}


def test_fifo_guard_promotes_a_job_past_half_the_peak_drain_and_keeps_the_peak() -> None:
    """The guard's bound is a fraction of the longest drain seen (FIFO's worst wait so far),
    not of today's: once the backlog has cleared, a job that waited past it still goes first."""
    w = World(cluster(1), Scheduler(config("gang", ("priority", {"starvation_bound_s": 1e9, "fifo_guard": 0.5}),
                                           "binpack")), now=100)
    w.start(job("r").gpus(8).estimate(4 * 3600), n0=list(range(8)))  # ~4 h of the one node
    w.submit(job("old").klass("low").gpus(8).submit(0).estimate(3600),
             job("u").klass("urgent").gpus(8).submit(99).estimate(3600))
    # drain ~6 h: the guard is ~3 h; 'old' waited 100 s: class order
    assert [j.job_id for j in w.scheduler.order(w.snapshot())] == ["u", "old"]
    w.finish("r")
    w.now = 2.5 * 3600  # the drain is now 2 h, the guard still ~3 h of the peak
    assert [j.job_id for j in w.scheduler.order(w.snapshot())] == ["u", "old"]
    w.now = 3.5 * 3600  # 'old' waited past half the peak drain: it goes first
    assert [j.job_id for j in w.scheduler.order(w.snapshot())] == ["old", "u"]


def test_fifo_guard_off_keeps_class_order() -> None:
    w = World(cluster(1), Scheduler(config("gang", ("priority", {"starvation_bound_s": 1e9}), "binpack")),
              now=4 * 3600)
    w.submit(job("old").klass("low").gpus(8).submit(0).estimate(3600),
             job("u").klass("urgent").gpus(8).submit(99).estimate(3600))
    assert [j.job_id for j in w.scheduler.order(w.snapshot())] == ["u", "old"]


def _overtaken_order(overtaken: bool, narrow: bool = True) -> tuple[list[str], list[str]]:
    """One 8-GPU node, half of it held for 10 h by 'r' (urgent, submitted first). 'wide' (8 GPUs,
    high class) cannot start; 'narrow' (4 GPUs, low class, submitted later) fits and starts
    past it; then 'urgent' (8 GPUs) comes. The order at once and 6 h later, when 'wide' has
    waited longer than the 2 h of work still before it."""
    w = World(cluster(1), Scheduler(config("gang", ("priority", {
        "starvation_bound_s": 1e9, "hold_line": False, "overtaken": overtaken}), "binpack")), now=100)
    w.start(job("r").klass("urgent").gpus(4).submit(-100).estimate(10 * 3600), n0=[0, 1, 2, 3])
    w.submit(job("wide").klass("high").gpus(8).submit(0).estimate(3600))
    if narrow:
        w.submit(job("narrow").klass("low").gpus(4).submit(50).estimate(3600))
    assert bound(w.step()) == ({"narrow": ["n0"]} if narrow else {})
    w.submit(job("urgent").klass("urgent").gpus(8).submit(200).estimate(3600))
    first = [j.job_id for j in w.scheduler.order(w.snapshot())]
    w.now = 6 * 3600
    return first, [j.job_id for j in w.scheduler.order(w.snapshot())]


def test_a_job_overtaken_by_later_work_goes_first_once_it_has_waited_as_long_as_fifo_would() -> None:
    # 'narrow' started past 'wide' because it fitted: once 'wide' has waited the time the
    # work submitted before it needs of the node, it goes first, as FIFO would have it
    assert _overtaken_order(overtaken=True) == (["urgent", "wide"], ["wide", "urgent"])


def test_a_job_waits_its_turn_when_nothing_later_overtook_it_or_the_rule_is_off() -> None:
    assert _overtaken_order(overtaken=True, narrow=False) == (["urgent", "wide"], ["urgent", "wide"])
    assert _overtaken_order(overtaken=False) == (["urgent", "wide"], ["urgent", "wide"])


def _preempted_after_promotion(overtaken: bool) -> list[str]:
    """'wide' is overtaken by 'narrow', waits 6 h, then starts; a one-minute 'quick' job
    comes a minute later. Which jobs srpt stops for it."""
    w = World(cluster(1), Scheduler(config("gang", ("priority", {
        "starvation_bound_s": 1e9, "hold_line": False, "overtaken": overtaken}), ("srpt", {"by": "time"}),
        "binpack")), now=100)
    w.start(job("r").gpus(4).submit(-100).estimate(10 * 3600).not_preemptible(), n0=[0, 1, 2, 3])
    w.submit(job("wide").gpus(8).submit(0).estimate(3600), job("narrow").gpus(4).submit(50).estimate(7200))
    assert bound(w.step()) == {"narrow": ["n0"]}
    w.now = 6 * 3600
    w.step()
    w.finish("r")
    w.finish("narrow")
    assert bound(w.step()) == {"wide": ["n0"]}
    w.submit(job("quick").gpus(8).submit(w.now + 60).estimate(60))
    return [p.job_id for p in w.step(60).preemptions]


def test_a_job_that_went_first_for_being_overtaken_is_not_stopped_for_shorter_work() -> None:
    # it would queue again, be overtaken again and go first again, round and round
    assert _preempted_after_promotion(overtaken=True) == []
    assert _preempted_after_promotion(overtaken=False) == ["wide"]
