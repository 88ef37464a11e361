"""The simulator's conservation laws, and tiny scenarios whose JCTs are computed by hand."""

from __future__ import annotations

import numpy as np
import pytest

from scheduling import SchedulerConfig
from sim.engine import SimSettings, Simulation
from sim.metrics import jain, summarize
from sim.policies import POLICIES, policy_config, policy_settings
from sim.traces import TraceJob, synthetic, uniform_cluster


def _run(policy: str, jobs, nodes=(1, 1), **kw):
    settings = policy_settings(policy, SimSettings(**kw))
    return Simulation(uniform_cluster(*nodes), jobs, policy_config(policy), settings).run()


def _jct(res) -> dict[str, float]:
    return {j.trace.job_id: j.finish - j.trace.submit_s for j in res.jobs}


@pytest.mark.parametrize("policy", POLICIES)
def test_conservation_laws(policy):
    jobs = synthetic(60, seed=7, rate_per_h=40, median_duration_s=900,
                     sizes=((1, 0.6), (2, 0.2), (4, 0.1), (8, 0.07), (16, 0.03)))
    res = _run(policy, jobs, nodes=(3, 8), tick_s=300.0)
    ids = [j.trace.job_id for j in res.jobs]
    assert sorted(ids) == sorted(j.job_id for j in jobs)  # every job once
    assert all(j.finish is not None for j in res.jobs)  # ... and it ended
    for j in res.jobs:
        assert j.finish - j.trace.submit_s >= j.trace.duration_s - 1e-6  # JCT >= duration
        assert j.first_start >= j.trace.submit_s
    s = np.asarray(res.samples)
    assert (s[:, 1] <= res.capacity_gpus).all()  # never more GPUs than exist
    m = summarize(res)
    span = s[-1, 0] - s[0, 0]
    assert m["allocated_gpu_s"] <= res.capacity_gpus * span + 1e-6
    need = sum(j.duration_s * j.num_gpus for j in jobs)
    assert m["allocated_gpu_s"] >= need - 1e-6  # the work was done (and maybe some twice)


HAND = [TraceJob("a", 0.0, 100.0, 1), TraceJob("b", 10.0, 50.0, 1), TraceJob("c", 20.0, 10.0, 1)]


@pytest.mark.parametrize(("policy", "expected"), [
    ("FIFO", {"a": 100.0, "b": 140.0, "c": 140.0}),  # a 0-100, b 100-150, c 150-160
    ("SJF-oracle", {"a": 100.0, "b": 150.0, "c": 90.0}),  # oracle: c (10 s) before b: c 100-110, b 110-160
    ("DRF", {"a": 100.0, "b": 140.0, "c": 140.0}),  # one tenant: FIFO
    ("Kairos", {"a": 100.0, "b": 140.0, "c": 140.0}),  # no history yet when b and c arrive: equal, FIFO
])
def test_hand_computed_one_gpu(policy, expected):
    assert _jct(_run(policy, HAND)) == pytest.approx(expected)


def test_hand_computed_tiresias_preempts_with_checkpoint_loss():
    # 1 GPU, LAS threshold 50 GPU-s, re-ranked every 10 s. a runs from 0; at 50 it has
    # attained 50 and drops a queue below b: preempted, it stops after its 30 s grace
    # (t=80) having checkpointed nothing (every 1,800 s), so 80 s are lost. b runs 80-130;
    # a restarts at 130, pays the 60 s restore and its full 100 s: ends at 290.
    cfg = SchedulerConfig.load({"plugins": [{"name": "gang"}, {"name": "tiresias", "args": {"thresholds_gpu_s": [50]}},
                                            {"name": "binpack"}]})
    res = Simulation(uniform_cluster(1, 1), HAND[:2], cfg, SimSettings(tick_s=10.0)).run()
    assert _jct(res) == pytest.approx({"a": 290.0, "b": 120.0})
    m = summarize(res)
    assert m["preemptions"] == 1 and m["lost_gpu_s"] == pytest.approx(80.0)


def test_checkpoint_keeps_work():
    # a (1 GPU, 3,000 s) is preempted at 2,000 s + 30 s grace by a job its LAS ranks first:
    # it keeps the 1,800 s checkpointed, redoes 230 s.
    jobs = [TraceJob("a", 0.0, 3000.0, 1), TraceJob("b", 2000.0, 100.0, 1)]
    cfg = SchedulerConfig.load({"plugins": [{"name": "gang"}, {"name": "tiresias", "args": {"thresholds_gpu_s": [1000]}},
                                            {"name": "binpack"}]})
    res = Simulation(uniform_cluster(1, 1), jobs, cfg, SimSettings()).run()
    # b: starts 2030, ends 2130; a: restarts 2130 + 60 restore + 1200 left = 3390
    assert _jct(res) == pytest.approx({"a": 3390.0, "b": 130.0})
    assert summarize(res)["lost_gpu_s"] == pytest.approx(230.0)


def test_node_failure_requeues_and_recovers():
    jobs = [TraceJob("a", 0.0, 100.0, 8)]
    res = Simulation(uniform_cluster(1, 8), jobs, policy_config("FIFO"),
                     SimSettings(node_failures=((40.0, "n0000", 200.0),))).run()
    # fails at 40 (nothing checkpointed), node back at 240, restore 60 + 100 s: ends 400
    assert _jct(res) == {"a": pytest.approx(400.0)}


def test_jain_index():
    assert jain([1.0, 1.0, 1.0]) == pytest.approx(1.0)
    assert jain([1.0, 0.0]) == pytest.approx(0.5)


def test_hand_computed_kairos_preempts_a_long_unknown_job_for_a_short_known_one():
    # 2 GPUs. a (2 GPUs, 100 s) ends at 100: the history now says 2-GPU jobs take 100 s,
    # and still knows nothing of 1-GPU jobs. x (1 GPU) arrived at 50 with no estimate
    # (expected 3,600 s) and runs from 100; y (2 GPUs) arrives at 120 with the estimate
    # 100 s and needs x's GPU: x is expected to hold it > 4x longer, so srpt preempts it.
    # x stops at 150 after its 30 s grace (nothing checkpointed: 50 s lost); y runs
    # 150-200; x restarts at 200, pays the 60 s restore and its 1,000 s: ends at 1,260.
    jobs = [TraceJob("a", 0.0, 100.0, 2), TraceJob("x", 50.0, 1000.0, 1), TraceJob("y", 120.0, 50.0, 2)]
    res = _run("Kairos", jobs, nodes=(1, 2))
    assert _jct(res) == pytest.approx({"a": 100.0, "x": 1210.0, "y": 80.0})
    m = summarize(res)
    assert m["preemptions"] == 1 and m["lost_gpu_s"] == pytest.approx(50.0)


@pytest.mark.parametrize("renew", [True, False])
def test_a_job_learns_what_the_history_learnt_since_it_arrived_at_each_start_and_stop(renew):
    # One node of 2 GPUs. a (100 s) and r (500 s) start at 0 knowing nothing; w arrives
    # at 50 and waits. a ends at 100 and w starts: it carries the history's 1-GPU
    # durations then, (100,). w ends at 110: the history holds (10, 100), but r, running,
    # keeps what it started with until the node fails at 200 and stops it: it queues
    # again with (10, 100) and their median, and restarts at 250 (60 s restore, no
    # checkpoint yet: its 500 s again), ending at 810. Without renewal every job keeps
    # what it arrived with, and the times are the same.
    jobs = [TraceJob("a", 0.0, 100.0, 1), TraceJob("r", 0.0, 500.0, 1), TraceJob("w", 50.0, 10.0, 1)]
    res = _run("Kairos", jobs, nodes=(1, 2), renew=renew, node_failures=((200.0, "n0000", 50.0),))
    got = {j.trace.job_id: (j.request.runtime_samples, j.request.runtime_estimate_s) for j in res.jobs}
    if renew:
        assert got == {"a": ((), None), "r": ((10.0, 100.0), 55.0), "w": ((100.0,), 100.0)}
    else:
        assert got == {"a": ((), None), "r": ((), None), "w": ((), None)}
    assert _jct(res) == pytest.approx({"a": 100.0, "r": 810.0, "w": 60.0})


@pytest.mark.timeout(60)
def test_a_checkpoint_due_at_a_rounded_time_does_not_stall_the_clock() -> None:
    """On this trace a cycle falls where (now - start - restore) / checkpoint_s computes
    as 4.999... for 5: the next checkpoint was due "now" again and the simulator looped
    for ever (found by bench/wait_bound.py). It must finish, every job with it."""
    from sim.suite import SYN_RULES
    from sim.wait_bound import trace

    jobs = trace(50.0, 0.7, "poisson", seed=1, span_h=100.0)
    res = Simulation(uniform_cluster(1, 8), jobs, policy_config("Tiresias"),
                     policy_settings("Tiresias", SYN_RULES)).run()
    assert all(j.finish is not None for j in res.jobs) and len(res.jobs) == len(jobs)
