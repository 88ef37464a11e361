"""Preemption: priority- and fairness-driven, checkpoint-aware, least lost work."""

from __future__ import annotations

import pytest

from scheduling import PendingReason, PreemptReason, ResizeReason, Scheduler
from tests.scheduling.builders import World, bound, cluster, config, job

PLUGINS = ("gang", "priority", "binpack")


def world(n: int = 1, *plugins: str | tuple, now: float = 1000.0) -> World:
    return World(cluster(n), Scheduler(config(*(plugins or PLUGINS))), now=now)


def test_high_priority_preempts_low_and_waits_for_it() -> None:
    w = world()
    w.start(job("low").klass("low").gpus(8), at=0, n0=list(range(8)))
    w.submit(job("hi").klass("high").gpus(4))
    plan = w.step()
    assert plan.binds == []
    assert plan.pending == {"hi": PendingReason.PREEMPTING}
    [p] = plan.preemptions
    assert (p.job_id, p.reason, p.preemptor, p.task_ids) == ("low", PreemptReason.PRIORITY, "hi", ("w-0",))
    # while the victim checkpoints, nothing more is preempted and nobody takes its GPUs
    w.submit(job("other").klass("low").gpus(1))
    plan = w.step(5)
    assert plan.preemptions == []
    assert plan.binds == []
    assert plan.pending["hi"] == PendingReason.PREEMPTING
    w.stop_terminating()
    plan = w.step(30)
    assert set(bound(plan)) == {"hi", "other"}


@pytest.mark.parametrize(
    ("name", "victims", "expected"),
    [
        ("least work lost since start", [("a", 0, None), ("b", 900, None)], "b"),
        ("a fresh checkpoint loses little", [("a", 0, 990), ("b", 900, None)], "a"),
        ("lower priority first", [("a", 990, None), ("b", 0, None)], "a"),
    ],
)
def test_victim_choice(name, victims, expected) -> None:
    w = world(2)
    for k, (jid, start, ckpt) in enumerate(victims):
        klass = "low" if name.startswith("lower") and jid == "a" else "normal"
        w.start(job(jid).klass(klass).gpus(8), at=start, checkpoint=ckpt, **{f"n{k}": list(range(8))})
    w.submit(job("hi").klass("urgent").gpus(8))
    plan = w.step()
    assert [p.job_id for p in plan.preemptions] == [expected], name


@pytest.mark.parametrize(
    ("name", "victim", "reason"),
    [
        ("not preemptible", job("v").gpus(8).not_preemptible(), PendingReason.NO_FIT),
        ("minimum runtime not reached", job("v").gpus(8).min_runtime(5000), PendingReason.NO_FIT),
        ("same class", job("v").klass("high").gpus(8), PendingReason.NO_FIT),
    ],
)
def test_protected_victims(name, victim, reason) -> None:
    w = world()
    w.start(victim, at=0, n0=list(range(8)))
    plan = w.submit(job("hi").klass("high").gpus(8)).step()
    assert plan.preemptions == [], name
    assert plan.pending == {"hi": reason}, name


def test_never_preempts_for_a_job_that_still_would_not_fit() -> None:
    w = world(2)
    w.start(job("low").klass("low").gpus(8), at=0, n0=list(range(8)))
    w.start(job("keep").gpus(8).not_preemptible(), at=0, n1=list(range(8)))
    plan = w.submit(job("hi").klass("urgent").gpus(8).gang(2)).step()
    assert plan.preemptions == []
    assert plan.pending == {"hi": PendingReason.NO_FIT}


def test_preempts_only_the_node_that_makes_room() -> None:
    w = world(2)
    w.start(job("a").klass("low").gpus(4), at=0, n0=[0, 1, 2, 3])
    w.start(job("b").klass("low").gpus(2), at=0, n0=[4, 5])
    w.start(job("c").klass("low").gpus(7), at=500, n1=list(range(7)))
    plan = w.submit(job("hi").klass("high").gpus(8)).step()
    # n0 needs a and b out (lost work 4*1000 + 2*1000); n1 needs c out (7*500): n1 wins
    assert [p.job_id for p in plan.preemptions] == ["c"]


def test_elastic_job_shrinks_instead_of_being_preempted() -> None:
    w = world(1, "gang", "priority", "binpack", "elastic")
    el = job("el").gpus(1).replicas(6).elastic(2, 8)
    w.start(el, at=0, n0=[0], n1=[1], n2=[2], n3=[3], n4=[4], n5=[5])
    # start() names nodes by key only: put every replica on n0
    w.allocations = [a.__class__(a.job_id, a.task_id, "n0", a.gpus, a.cpu_milli, a.memory_mib, a.task_name,
                                 a.role) for a in w.allocations]
    plan = w.submit(job("hi").gpus(4)).step()
    assert plan.preemptions == []
    [rz] = plan.resizes
    assert (rz.job_id, rz.reason, rz.replicas_from, rz.replicas_to) == ("el", ResizeReason.SHRINK, 6, 4)
    assert rz.stop_task_ids == ("w-5", "w-4")
    assert plan.pending == {"hi": PendingReason.PREEMPTING}


def test_tiresias_preempts_the_job_with_more_attained_service() -> None:
    w = world(1, "gang", "tiresias", "binpack")
    w.start(job("old").gpus(8), at=0, n0=list(range(8)))  # 8 GPUs x 1000 s: queue 1
    plan = w.submit(job("new").gpus(8)).step()
    assert [(p.job_id, p.reason) for p in plan.preemptions] == [("old", PreemptReason.LAS)]


def test_srtf_preempts_the_job_with_more_time_left() -> None:
    w = world(1, "gang", ("srtf", {"preempt": True}), "binpack")
    w.start(job("long").gpus(8).estimate(10_000), at=0, n0=list(range(8)))
    plan = w.submit(job("short").gpus(8).estimate(100)).step()
    assert [(p.job_id, p.reason) for p in plan.preemptions] == [("long", PreemptReason.SRTF)]
    w2 = world(1, "gang", ("srtf", {"preempt": True}), "binpack")
    w2.start(job("long").gpus(8).estimate(1100), at=0, n0=list(range(8)))
    assert w2.submit(job("short").gpus(8).estimate(500)).step().preemptions == []


def test_allocations_without_running_jobs_are_never_victims() -> None:
    """A snapshot may list allocations but no RunningJob (the scheduler service before it
    tracks run metadata): the preemption phase must treat them as untouchable, not crash."""
    from scheduling import Allocation, GpuUse, Scheduler, SchedulerConfig, Snapshot

    nodes = cluster(1, gpus=8)
    held = tuple(Allocation("OLD", f"w-{i}", nodes[0].node_id, (GpuUse(i),), 0, 0)
                 for i in range(8))
    urgent = job("URGENT").gpus(8).build()
    plan = Scheduler(SchedulerConfig.preset("default")).schedule(
        Snapshot(now=0.0, nodes=nodes, allocations=held, pending=(urgent,)))
    assert plan.binds == [] and plan.preemptions == []
    assert "URGENT" in plan.pending


@pytest.mark.parametrize(
    ("started", "estimate", "checkpoint", "stopped"),
    [
        (900.0, 100_000.0, None, True),  # loses 100 s (+ the restore); short waits ~28 h else
        (-49_000.0, 60_000.0, None, False),  # would lose 14 h of work to save short 2.8 h
        (-49_000.0, 60_000.0, 900.0, True),  # checkpointed 100 s ago: loses little
    ],
    ids=["fresh-victim", "no-checkpoint-for-hours", "checkpointed"],
)
def test_srpt_stops_a_job_only_when_the_stop_pays_for_itself(
        started: float, estimate: float, checkpoint: float | None, stopped: bool) -> None:
    """srpt ``pay``: the victim's loss (work since its checkpoint, the restore) must be
    less than the preemptor's wait for running jobs to end, else it runs on."""
    w = world(1, "gang", ("srpt", {"pay": True}), "binpack")
    w.start(job("long").gpus(8).estimate(estimate), at=started, checkpoint=checkpoint,
            n0=list(range(8)))
    plan = w.submit(job("short").gpus(8).estimate(100)).step()
    assert [(p.job_id, p.reason) for p in plan.preemptions] == (
        [("long", PreemptReason.SRTF)] if stopped else [])


@pytest.mark.parametrize(("ran_h", "stopped"), [(5.0, True), (2.0, False)], ids=["ran-5h", "ran-2h"])
def test_srpt_with_no_history_gives_way_by_attained_service(ran_h: float, stopped: bool) -> None:
    """No similar job has finished, so neither job has an estimate: srpt falls back to
    least attained service, as Tiresias does. A fresh job is expected to run ``unknown_s``
    (1 h) and a job that has run ``ran_h`` as long again; a stop needs ``preempt_ratio``
    (4) times. Before, a job with no estimate never preempted: on a cluster with no history
    a long job held its GPUs while every later job queued (bench/wait_bound.py: 60 h
    average JCT against Tiresias' 2.6 h)."""
    w = world(1, "gang", "srpt", "binpack")
    w.start(job("old").gpus(8), at=-ran_h * 3600, n0=list(range(8)))
    plan = w.submit(job("new").gpus(8)).step()
    assert [(p.job_id, p.reason) for p in plan.preemptions] == (
        [("old", PreemptReason.SRTF)] if stopped else [])


@pytest.mark.parametrize(
    ("stop_width", "wide_stops_narrow", "narrow_stops_wide"),
    [(None, True, False), (0.0, True, False), (0.5, False, True), (1.0, False, True)],
    ids=["as-by-time", "time", "sqrt-gpus", "gpu-seconds"],
)
def test_srpt_stop_rule_weighs_time_left_by_a_power_of_the_gpus(
        stop_width: float | None, wide_stops_narrow: bool, narrow_stops_wide: bool) -> None:
    """srpt ``stop_width``: a victim must have ``preempt_ratio`` (4) times the preemptor's
    time left x GPUs ** stop_width. An 8-GPU job expected to run 1.5 h against eight
    1-GPU jobs with ~10 h left: by time 10 > 4 x 1.5, so it stops them; with the square
    root 10 < 4 x 1.5 x 2.83, so it waits. A 1-GPU job with 3 h against an 8-GPU job
    with ~10 h: by time 10 < 12; with the square root 28 > 12. The order is by time
    throughout (``by``)."""
    args = {"by": "time", **({"stop_width": stop_width} if stop_width is not None else {})}
    w = world(1, "gang", ("srpt", args), "binpack")
    for i in range(8):
        w.start(job(f"narrow{i}").gpus(1).estimate(36_000), at=0, n0=[i])
    plan = w.submit(job("wide").gpus(8).estimate(5_400)).step()
    assert sorted(p.job_id for p in plan.preemptions) == (
        [f"narrow{i}" for i in range(8)] if wide_stops_narrow else [])

    w = world(1, "gang", ("srpt", args), "binpack")
    w.start(job("wide").gpus(8).estimate(36_000), at=0, n0=list(range(8)))
    plan = w.submit(job("narrow").gpus(1).estimate(10_800)).step()
    assert [p.job_id for p in plan.preemptions] == (["wide"] if narrow_stops_wide else [])


@pytest.mark.parametrize(
    ("idle", "resume_wait_h", "stopped"),
    [
        (0, None, True),  # no job waits to resume: a stop costs its victims nothing known
        (0, 2.0, False),  # 8 victims x the 1.5 h run: 4 x 1.5 x 8 = 48 h > 20 h left
        (0, 0.5, True),  # the count scaled by 0.5 h / 1.5 h: 4 x 1.5 x 2.7 = 16 h < 20 h
        (6, 2.0, True),  # 6 GPUs idle: it takes 2 (4 x 1.5 x 2 = 12 h < 20 h)
    ],
    ids=["no-resume-wait", "full-node", "short-resume-wait", "two-to-take"],
)
def test_srpt_stop_need_counts_the_victims_a_wide_job_must_stop(
        idle: int, resume_wait_h: float | None, stopped: bool) -> None:
    """srpt ``stop_need``: a victim must have ``preempt_ratio`` (4) times the preemptor's
    time left x (GPUs it must take from running jobs / the victim's GPUs), the count of
    victims like it, scaled by how long stopped jobs wait to resume here (the mean wait
    of queued jobs that have run) over the preemptor's time left. An 8-GPU job of 1.5 h
    against one-GPU jobs with ~20 h left: by time alone it stops them (20 > 6)."""
    w = world(1, "gang", ("srpt", {"by": "time", "stop_need": 1.0}), "binpack", now=100_000.0)
    for i in range(8 - idle):
        w.start(job(f"narrow{i}").gpus(1).estimate(72_000), at=w.now, n0=[i])
    if resume_wait_h is not None:
        # a stopped job that waits to resume, on a GPU model no node has
        w.submit(job("resumer").gpus(1).models("H100").attained(600)
                 .submit(w.now - 600 - resume_wait_h * 3600).estimate(1e7))
    plan = w.submit(job("wide").gpus(8).estimate(5_400)).step()
    victims = sorted(p.job_id for p in plan.preemptions)
    assert victims == ([f"narrow{i}" for i in range(8 - idle)] if stopped else [])
