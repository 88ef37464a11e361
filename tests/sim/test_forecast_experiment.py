"""The forecast benchmark's parts: the observer leaves the simulation as it was, the
baselines answer what they should by hand, and a small run scores every forecast."""

from __future__ import annotations

from scheduling import SchedulerConfig, Snapshot
from sim.engine import SimSettings, Simulation
from sim.forecast_experiment import naive_start, reservation_start, run, summary
from sim.policies import policy_config, policy_settings
from sim.traces import synthetic, uniform_cluster
from tests.scheduling.builders import World, cluster, job


def test_an_observer_changes_nothing() -> None:
    jobs = synthetic(150, rate_per_h=400.0)
    settings = policy_settings("Kairos", SimSettings(cycle_s=60.0))
    seen: list[float] = []

    def watch(t: float, sim: Simulation) -> None:
        seen.append(t)
        sim.snapshot(t)

    plain = Simulation(uniform_cluster(2, 8), jobs, policy_config("Kairos"), settings).run()
    watched = Simulation(uniform_cluster(2, 8), jobs, policy_config("Kairos"), settings, watch=watch,
                         probes=[1000.5, 2000.5]).run()
    assert [j.first_start for j in plain.jobs] == [j.first_start for j in watched.jobs]
    assert 1000.5 in seen and 2000.5 in seen
    assert seen == sorted(seen)


def _queue() -> Snapshot:
    w = World(cluster(2), now=100)
    w.start(job("a").gpus(8).estimate(400), at=0, n0=list(range(8)))  # ends at 400
    w.start(job("b").gpus(4).estimate(1100), at=100, n1=[0, 1, 2, 3])  # ends at 1200
    w.submit(job("big").gpus(16).estimate(100).submit(1), job("small").gpus(8).estimate(50).submit(2))
    return w.snapshot()


def test_the_reservation_baseline_reserves_in_queue_order() -> None:
    snap = _queue()
    order = ["big", "small"]
    assert reservation_start(snap, order, "big", 16) == 1200  # needs both nodes
    assert reservation_start(snap, order, "small", 16) == 400  # fits before big's reservation
    assert reservation_start(snap, ["small", "big"], "big", 16) == 1200


def test_the_naive_baseline_counts_the_work_ahead() -> None:
    from scheduling.estimates import DurationHistory

    h = DurationHistory()
    h.learn("t", 8, 200.0)
    h.learn("t", 2, 200.0)  # mean 1,000 GPU-seconds
    assert naive_start(h, _queue(), ["big", "small"], "small", 16) == 100 + 1000 / 16


def test_a_small_run_forecasts_every_sampled_job_twice() -> None:
    jobs = synthetic(120, rate_per_h=300.0)
    cfg: SchedulerConfig = policy_config("Kairos")
    settings = policy_settings("Kairos", SimSettings(cycle_s=60.0))
    records, protocol = run(jobs, 2, 8, cfg, settings, sample_size=6, seed=0, resolution=0.02)
    assert protocol["second_pass_reproduces_first"] is True
    assert protocol["sampled_jobs"] == 6
    assert sorted(r.when for r in records) == ["half"] * 6 + ["submit"] * 6
    assert all(r.forecast >= r.at and r.actual >= r.at for r in records)
    doc = summary(records)
    assert doc["forecasts"] == 12
    assert 0.0 <= doc["band_coverage"] <= 1.0
    assert doc["baseline_reservation"]["band_coverage"] is None
