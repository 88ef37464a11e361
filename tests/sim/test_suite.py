"""The robustness suite's pieces: synthetic families, the wait measures, case
selection, and the no-starvation rule against FIFO on generated workloads."""

from __future__ import annotations

import pytest

from sim.engine import Simulation
from sim.metrics import summarize
from sim.policies import policy_config, policy_settings
from sim.suite import SYN_RULES, select, summary
from sim.synthetic import Family, generate
from sim.traces import uniform_cluster


def _run(jobs, policy: str, nodes: int = 2):  # type: ignore[no-untyped-def]
    res = Simulation(uniform_cluster(nodes, 8), jobs, policy_config(policy),
                     policy_settings(policy, SYN_RULES)).run()
    return res, summarize(res)


def test_families_hit_their_offered_load() -> None:
    for law in ("exp", "pareto", "bimodal", "uncorrelated"):
        jobs = generate(Family(law, "steady", 4, jobs=3000, gpus=16, load=0.8))
        work = sum(j.num_gpus * j.duration_s for j in jobs)
        offered = work / (jobs[-1].submit_s - jobs[0].submit_s) / 16
        assert 0.5 < offered < 1.3, (law, offered)  # heavy tails: a finite sample is noisy


def test_uncorrelated_durations_say_nothing_by_class() -> None:
    import statistics

    jobs = generate(Family("uncorrelated", "steady", 4, jobs=4000))
    by = {}
    for j in jobs:
        by.setdefault((j.tenant, j.num_gpus), []).append(j.duration_s)
    meds = [statistics.median(v) for v in by.values() if len(v) > 500]
    assert len(meds) == 4 and max(meds) / min(meds) < 1.5
    per_class = generate(Family("exp", "steady", 4, jobs=4000))
    by = {}
    for j in per_class:
        by.setdefault((j.tenant, j.num_gpus), []).append(j.duration_s)
    meds = [statistics.median(v) for v in by.values() if len(v) > 100]
    assert max(meds) / min(meds) > 3.0


def test_bad_family_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown duration law"):
        Family("weibull", "steady", 1)
    with pytest.raises(ValueError, match="unknown arrival pattern"):
        Family("exp", "weekly", 1)


def test_case_selection_by_glob() -> None:
    names = [c.name for c in select(["muri-trace4@*"])]
    assert names == ["muri-trace4@8x8", "muri-trace4@16x8", "muri-trace4@32x8"]
    with pytest.raises(ValueError, match="no case matches"):
        select(["nope@*"])


def test_total_wait_adds_every_requeue_wait() -> None:
    jobs = generate(Family("pareto", "bursts", 2, jobs=300, gpus=16))
    res, m = _run(jobs, "Tiresias")
    assert m["preemptions"] > 0
    requeued = [j for j in res.jobs if j.requeue_wait_s > 0]
    assert requeued
    j = max(requeued, key=lambda j: j.requeue_wait_s)
    # the job's time in the system = waits + service + restores + the grace periods it ran on
    first = j.first_start - j.trace.submit_s
    assert m["max_total_wait_s"] >= first + j.requeue_wait_s - 0.1
    assert m["max_total_wait_s"] >= m["max_first_wait_s"]
    _, fifo = _run(jobs, "FIFO")
    assert fifo["max_total_wait_s"] == fifo["max_first_wait_s"]  # never preempted


def test_summary_flags_missed_targets() -> None:
    row = {"avg_jct_s": 100.0, "avg_queue_s": 50.0, "avg_duration_s": 100.0,
           "max_first_wait_s": 10.0, "max_total_wait_s": 10.0}
    doc = {"a@8x8": {"FIFO": row, "Tiresias": row | {"avg_jct_s": 80.0},
                     "Kairos": row | {"max_total_wait_s": 11.0}}}
    s = summary(doc)
    assert s["kairos_over_tiresias"] == {"a@8x8": 1.25}
    assert len(s["targets_missed"]) == 2


def test_a_run_of_some_policies_keeps_the_plot_of_every_policy(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Results merge into the file, so a rerun of one policy must not redraw a case's
    plot with that policy's curve alone (it did: every per-case plot lost its baselines)."""
    pytest.importorskip("matplotlib")
    from sim.suite import run

    out = tmp_path / "robust.json"
    run(["syn-exp-steady-1t@8x8"], ["FIFO", "Tiresias"], out=out, limit=60)
    png = tmp_path / "plots" / "robust_syn-exp-steady-1t_8x8.png"
    both = png.read_bytes()
    run(["syn-exp-steady-1t@8x8"], ["Tiresias"], out=out, limit=60)
    assert png.read_bytes() == both
