"""Forecasts replay the snapshot forward through the same core: answers known by hand."""

from __future__ import annotations

import pytest

from scheduling import SchedulerConfig
from scheduling.estimates import DurationHistory, Spread, remaining_by_rule
from scheduling.forecast import forecast, replay
from tests.scheduling.builders import World, cluster, config, job

FIFO = config("gang", "fifo", "binpack")


def test_a_job_behind_a_running_job_starts_when_it_ends() -> None:
    w = World(cluster(1), now=40).start(job("r").gpus(8), at=0, n0=list(range(8)))
    w.submit(job("w").gpus(8).submit(10))
    [f] = forecast(FIFO, w.snapshot(), {"r": Spread.exactly(60)}, {"w": Spread.exactly(500)}).values()
    assert (f.start, f.finish, f.nodes) == (100, 600, ("n0",))  # r ends at 40 + 60


def test_a_gang_waits_for_two_whole_nodes() -> None:
    w = World(cluster(2), now=0)
    w.start(job("a").gpus(8), n0=list(range(8))).start(job("b").gpus(4), n1=[0, 1, 2, 3])
    w.submit(job("g").gpus(8).replicas(2).gang(2).submit(1))
    starts = replay(FIFO, w.snapshot(), {"a": 300, "b": 100}, {"g": 50})
    assert starts["g"].start == 300  # b's end frees half a node: not enough
    assert starts["g"].nodes == ("n0", "n1")
    assert starts["g"].finish == 350


def test_priority_order_is_the_policys() -> None:
    cfg = config("gang", "priority", "fifo", "binpack")
    w = World(cluster(1), now=0).start(job("r").gpus(8), n0=list(range(8)))
    w.submit(job("low").gpus(8).submit(1), job("high").gpus(8).priority(100).submit(2))
    starts = replay(cfg, w.snapshot(), {"r": 100}, {"low": 1000, "high": 200})
    assert starts["high"].start == 100
    assert starts["low"].start == 300  # after high, though submitted first


def test_every_waiting_job_gets_a_forecast_and_the_band_holds_the_point() -> None:
    w = World(cluster(2), now=0)
    w.start(job("a").gpus(8), n0=list(range(8))).start(job("b").gpus(8), n1=list(range(8)))
    w.submit(*(job(f"w{i}").gpus(4 if i % 2 else 8).submit(i) for i in range(6)))
    spreads = {f"w{i}": Spread(50, 100 + 10 * i, 400) for i in range(6)}
    out = forecast(FIFO, w.snapshot(), {"a": Spread(20, 60, 300), "b": Spread(10, 90, 200)}, spreads)
    assert set(out) == {f"w{i}" for i in range(6)}
    for f in out.values():
        assert f.start is not None and f.start_low is not None and f.start_high is not None
        assert f.start_low <= f.start <= f.start_high
        assert f.finish is not None and f.finish > f.start
    assert out["w0"].start == 60  # a ends first; w0 is first in line
    assert out["w5"].start_high is not None and out["w5"].start_high > out["w5"].start_low  # type: ignore[operator]


def test_a_preempted_job_waits_again_and_its_preemptor_starts_after_the_grace() -> None:
    cfg = SchedulerConfig.preset("default")
    w = World(cluster(1), now=1000)
    w.start(job("long").gpus(8).estimate(100_000).grace(30), at=0, n0=list(range(8)))
    w.submit(job("short").gpus(8).estimate(60).submit(900))
    starts = replay(cfg, w.snapshot(), {"long": 99_000}, {"short": 60}, targets=["short"])
    assert starts["short"].start == 1030  # the long job stops after its 30 s grace
    assert starts["short"].finish == 1090


def test_targets_stop_the_replay_early_and_the_horizon_bounds_it() -> None:
    w = World(cluster(1), now=0).start(job("r").gpus(8), n0=list(range(8)))
    w.submit(job("a").gpus(8).submit(1), job("b").gpus(8).submit(2))
    assert set(replay(FIFO, w.snapshot(), {"r": 10}, {"a": 10, "b": 10}, targets=["a"])) == {"a"}
    out = forecast(FIFO, w.snapshot(), {"r": Spread.exactly(10)}, {"a": Spread(10, 10, 10_000),
                                                                      "b": Spread.exactly(10)}, horizon_s=1000)
    assert out["b"].start == 20 and out["b"].start_low == 20
    assert out["b"].start_high is None  # beyond the horizon when a runs at its high quantile


def test_missing_times_fall_back_to_the_cores_rule() -> None:
    w = World(cluster(1), now=100).start(job("r").gpus(8).estimate(150), at=0, n0=list(range(8)))
    w.submit(job("w").gpus(8).estimate(70).submit(5))
    starts = replay(FIFO, w.snapshot(), {}, {})
    assert (starts["w"].start, starts["w"].finish) == (150, 220)


def test_cycle_interval_delays_starts_to_the_next_cycle() -> None:
    w = World(cluster(1), now=0).start(job("r").gpus(8), n0=list(range(8)))
    w.submit(job("w").gpus(8).submit(0))
    assert replay(FIFO, w.snapshot(), {"r": 10}, {"w": 5}, cycle_s=60)["w"].start == 60


def test_history_point_is_the_median_of_the_last_jobs_and_quantiles_condition_on_service() -> None:
    h = DurationHistory(quantiles=(0.1, 0.9))
    assert h.estimate("t", 1) is None and h.spread("t", 1) is None
    for d in range(1, 101):
        h.learn("t", 1, float(d * 10))
    assert h.estimate("t", 1) == pytest.approx(855.0)  # median of 710..1000
    fresh = h.spread("t", 1, point=500.0)
    assert fresh is not None and fresh.mid == 500.0
    assert fresh.low == pytest.approx(109.0) and fresh.high == pytest.approx(901.0)
    old = h.spread("t", 1, ran_s=900.0)  # only jobs that ran longer than 900 s count
    assert old is not None and old.low > 0 and old.high <= 100.0
    beyond = h.spread("t", 1, ran_s=5000.0)  # outlived every job: as long again
    assert beyond is not None and beyond.mid == 5000.0
    assert h.estimate("u", 1) == h.estimate("t", 1)  # a new tenant: jobs of its size anywhere


def test_remaining_by_rule() -> None:
    assert remaining_by_rule(100.0, 30.0) == 70.0
    assert remaining_by_rule(100.0, 300.0) == 300.0  # past it: as long again
    assert remaining_by_rule(None, 0.0) == 3600.0


def test_the_first_cycle_may_come_later_than_now() -> None:
    w = World(cluster(1), now=0).start(job("r").gpus(8), n0=list(range(8)))
    w.submit(job("w").gpus(8).submit(0))
    assert replay(FIFO, w.snapshot(), {"r": 10}, {"w": 5}, first_cycle=45)["w"].start == 45
    assert replay(FIFO, w.snapshot(), {"r": 50}, {"w": 5}, first_cycle=45)["w"].start == 50


def test_a_job_held_for_quota_starts_once_admit_lets_it_in() -> None:
    """A quota of 8 GPUs for tenant t: its held job is admitted only once t's running job
    ends, though the cluster has room now; a job of another tenant is admitted at once."""
    w = World(cluster(2), now=0).start(job("r").gpus(8).tenant("t"), n0=list(range(8)))
    held = [job("h").gpus(8).tenant("t").submit(1).build(), job("o").gpus(8).tenant("u").submit(2).build()]

    def admit(admitted, waiting):  # type: ignore[no-untyped-def]
        used = sum(j.total_gpus for j in admitted if j.tenant == "t")
        return [j.job_id for j in waiting if j.tenant != "t" or used + j.total_gpus <= 8]

    out = forecast(FIFO, w.snapshot(), {"r": Spread.exactly(300)}, {"h": Spread.exactly(50), "o": Spread.exactly(50)},
                   held=held, admit=admit)
    assert out["o"].start == 0 and out["o"].nodes == ("n1",)
    assert out["h"].start == 300 and out["h"].finish == 350
    # without the rule nothing admits them: asked about, with no start
    blind = forecast(FIFO, w.snapshot(), {"r": Spread.exactly(300)}, {}, held=held)
    assert {k: f.start for k, f in blind.items()} == {"h": None, "o": None}
