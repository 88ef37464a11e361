"""A job that waits behind earlier or higher-priority work says ``priority`` and names
that job; one that waits for room held by running work says ``no_fit`` (Slurm's
``Priority`` beside ``Resources``). Only reasons change: the plans are the same."""

from __future__ import annotations

from scheduling import PendingReason, Scheduler
from scheduling.diagnosis import MAX_RELEASED, MAX_TRIALS
from tests.scheduling.builders import World, bound, cluster, config, job

PLUGINS = ("gang", "priority", "binpack")


def world(n: int = 1, now: float = 1000.0) -> World:
    return World(cluster(n), Scheduler(config(*PLUGINS)), now=now)


def test_b_waits_behind_a_of_higher_priority_that_took_the_room() -> None:
    w = world().submit(job("b").klass("low").gpus(4).submit(0),
                       job("a").klass("high").gpus(6).submit(10))
    plan = w.step()
    assert set(bound(plan)) == {"a"}  # a goes first, though submitted later
    assert (plan.pending, plan.blocked_by) == ({"b": PendingReason.PRIORITY}, {"b": "a"})
    # a runs now: b waits for room like any job, and no order would help
    plan = w.step(5)
    assert (plan.pending, plan.blocked_by) == ({"b": PendingReason.NO_FIT}, {})


def test_room_held_by_running_work_is_no_fit_and_a_job_too_large_never_fits() -> None:
    w = world()
    w.start(job("r").gpus(6), at=0, n0=list(range(6)))
    w.submit(job("s").gpus(1), job("w").gpus(4), job("huge").gpus(16))
    plan = w.step()
    assert set(bound(plan)) == {"s"}
    # w would not fit even without s (r holds 6 of 8): it waits for room, not behind s
    assert plan.pending == {"w": PendingReason.NO_FIT, "huge": PendingReason.NEVER_FITS}
    assert plan.blocked_by == {}


def test_a_job_kept_off_a_preemptors_claim_names_the_preemptor() -> None:
    w = world()
    w.start(job("low").klass("low").gpus(6), at=0, n0=list(range(6)))
    w.submit(job("hi").klass("urgent").gpus(8), job("mid").klass("normal").gpus(2))
    plan = w.step()
    assert [p.preemptor for p in plan.preemptions] == ["hi"]
    # mid would fit in n0's two free GPUs, which hi has claimed
    assert plan.pending == {"hi": PendingReason.PREEMPTING, "mid": PendingReason.PRIORITY}
    assert plan.blocked_by == {"mid": "hi"}


def test_every_job_of_a_shape_names_the_job_ahead_in_bulk() -> None:
    w = world(2)
    w.submit(job("a").klass("high").gpus(8).replicas(2).gang(2),
             *(job(f"b{i}").gpus(4).submit(i) for i in range(50)))
    plan = w.step()
    assert set(bound(plan)) == {"a"}
    assert set(plan.pending.values()) == {PendingReason.PRIORITY}
    assert plan.blocked_by == {f"b{i}": "a" for i in range(50)}


def test_the_trials_a_cycle_spends_on_naming_are_bounded() -> None:
    # more distinct shapes than trials: the first MAX_TRIALS say priority, the rest no_fit
    n = MAX_TRIALS + 4
    w = world(1).submit(job("a").klass("high").gpus(8),
                        *(job(f"b{i}").cpu(1000 + i).gpus(1).submit(i) for i in range(n)))
    plan = w.step()
    reasons = [plan.pending[f"b{i}"] for i in range(n)]
    assert reasons == [PendingReason.PRIORITY] * MAX_TRIALS + [PendingReason.NO_FIT] * 4


def test_a_cycle_that_placed_more_than_it_may_release_leaves_no_fit() -> None:
    n = MAX_RELEASED + 1  # one-GPU jobs ahead, then one that needs a whole node
    nodes = n // 8 + 1
    w = World(cluster(nodes), Scheduler(config(*PLUGINS)), now=1000.0).submit(
        *(job(f"a{i}").klass("high").gpus(1) for i in range(n)), job("b").gpus(8))
    plan = w.step()
    assert len(plan.binds) == n
    assert (plan.pending, plan.blocked_by) == ({"b": PendingReason.NO_FIT}, {})
