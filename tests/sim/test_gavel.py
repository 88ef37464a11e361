"""Gavel's data, mixed clusters, and the simulator's speeds per GPU model."""

from __future__ import annotations

import pytest

from scheduling import SchedulerConfig
from sim.engine import SimSettings, Simulation
from sim.gavel import (
    GAVEL_CLUSTER,
    MSR,
    gpu_counts,
    job_types,
    load_msr,
    make_job,
    mixed_cluster,
    parse_cluster,
    poisson,
    throughputs,
)
from sim.hetero_experiment import Case, queues_form, run_one, summary
from sim.traces import TraceError, TraceJob


def test_the_table_reads_every_model_and_job_type() -> None:
    table = throughputs()
    assert set(table) == {"V100", "P100", "K80"}
    assert len(job_types(table)) == 26  # Gavel's job types
    assert table["V100"][("ResNet-18 (batch size 256)", 1)] > table["K80"][("ResNet-18 (batch size 256)", 1)]


def test_a_job_keeps_its_fastest_duration_and_relative_speeds() -> None:
    table = throughputs()
    j, linear = make_job("x", 0.0, "Recommendation (batch size 512)", 1, 48_880.0, table)
    speeds = dict(j.speeds)
    assert not linear and speeds["P100"] == 1.0  # Recommendation is fastest on a P100
    assert j.duration_s == pytest.approx(48_880.0 / table["P100"][("Recommendation (batch size 512)", 1)])
    assert 0 < speeds["V100"] < 1 and 0 < speeds["K80"] < 1


def test_sizes_without_a_figure_take_the_linear_model_and_are_counted() -> None:
    table = throughputs()
    j, linear = make_job("x", 0.0, "A3C", 16, 1000.0, table)
    assert linear and j.duration_s == pytest.approx(1000.0 / (16 * table["V100"][("A3C", 1)]))


def test_a_model_with_no_figure_is_one_the_job_cannot_run_on() -> None:
    table = throughputs()
    j, _ = make_job("x", 0.0, "ResNet-50 (batch size 128)", 2, 1000.0, table)  # 0 steps/s on a K80
    assert "K80" not in dict(j.speeds)


def test_msr_traces_load_and_bad_rows_are_refused(tmp_path) -> None:  # type: ignore[no-untyped-def]
    loaded = load_msr(MSR / "103959.trace")
    assert len(loaded.jobs) == 986 and loaded.linear > 0
    assert all(j.speeds for j in loaded.jobs)
    bad = tmp_path / "bad.trace"
    bad.write_text("A3C\tcmd\t--steps\t1\tmany\t0.0\t1\n")
    with pytest.raises(TraceError, match=r"bad\.trace:1"):
        load_msr(bad)


def test_poisson_is_seeded_and_follows_gavels_sizes() -> None:
    a, b = poisson(400, 3.0, 7), poisson(400, 3.0, 7)
    assert [j.duration_s for j in a.jobs] == [j.duration_s for j in b.jobs]
    sizes = [j.num_gpus for j in a.jobs]
    assert set(sizes) <= {1, 2, 4, 8} and sizes.count(1) > len(sizes) / 2


def test_mixed_clusters_are_parsed_and_shuffled() -> None:
    assert parse_cluster("v100:36,p100:36,k80:36") == GAVEL_CLUSTER
    with pytest.raises(ValueError, match="MODEL:GPUS"):
        parse_cluster("v100")
    nodes = mixed_cluster(GAVEL_CLUSTER, seed=3)
    assert gpu_counts(nodes) == GAVEL_CLUSTER
    order = [n.gpus[0].model for n in nodes]
    assert order != sorted(order, key=list(GAVEL_CLUSTER).index)  # not listed model by model
    assert order == [n.gpus[0].model for n in mixed_cluster(GAVEL_CLUSTER, seed=3)]


def _one_job_on(model: str, speeds: tuple[tuple[str, float], ...]) -> Simulation:
    from scheduling import GpuSlot, Node

    nodes = (Node("n0", 96_000, 1_048_576, [GpuSlot(0, "g0", model)]),)
    jobs = [TraceJob("j", 0.0, 1000.0, 1, speeds=speeds)]
    return Simulation(nodes, jobs, SchedulerConfig(), SimSettings(gpus_per_task=4))


def test_a_job_runs_at_its_speed_on_the_model_it_holds() -> None:
    sim = _one_job_on("K80", (("K80", 0.25), ("V100", 1.0)))
    res = sim.run()
    assert res.jobs[0].finish == pytest.approx(4000.0)
    assert res.jobs[0].gpu_s_by_model == {"K80": pytest.approx(4000.0)}
    plain = _one_job_on("K80", ()).run()  # no speeds: full speed anywhere, as before
    assert plain.jobs[0].finish == pytest.approx(1000.0) and not plain.jobs[0].gpu_s_by_model


def test_the_benchmark_rows_and_summary() -> None:
    _, _, row, _ = run_one(Case("tiny", trace="795a4c"), "Kairos-aware")
    assert set(row) >= {"avg_jct_s", "p99_jct_s", "makespan_s", "max_first_wait_s", "preemptions",
                        "gpu_hours_by_model"}
    rows = {"FIFO": {"avg_jct_s": 30.0, "max_first_wait_s": 9.0}, "Tiresias": {"avg_jct_s": 20.0},
            "Kairos": {"avg_jct_s": 18.0}, "Kairos-aware": {"avg_jct_s": 17.0, "max_first_wait_s": 10.0}}
    assert queues_form(rows)
    s = summary({"c": rows})
    assert s["aware_over_tiresias"] == {"c": 0.85}
    assert any("0.850 > 0.8" in m for m in s["targets_missed"])
    assert any("max first wait" in m for m in s["targets_missed"])


def test_speeds_are_learned_per_class_from_the_jobs_that_started() -> None:
    from scheduling.speeds import SpeedHistory

    h = SpeedHistory()
    h.learn(("A3C", 1), "V100", 7.0)
    assert h.speeds(("A3C", 1)) == ()  # one model measured: nothing to choose between yet
    h.learn(("A3C", 1), "K80", 3.5)
    got = h.speeds(("A3C", 1))
    assert got == (("K80", 0.5), ("V100", 1.0)) and h.speeds(("A3C", 1)) is got  # kept while unchanged
    h.learn(("A3C", 1), "P100", 0.0)  # no rate: nothing learned
    assert h.speeds(("A3C", 1)) is got
    assert h.speeds(("LM", 1)) == got  # a class not measured yet takes the typical class's
    h.learn(("LM", 1), "V100", 4.0)
    h.learn(("LM", 1), "K80", 1.0)
    h.learn(("CNN", 1), "V100", 9.0)  # one model only: still the typical class's
    assert h.speeds(("CNN", 1)) == (("K80", pytest.approx(0.375)), ("V100", 1.0))  # median of 0.5 and 0.25


def test_a_learning_policy_ends_up_knowing_the_speeds_of_its_classes() -> None:
    from sim.policies import LEARNED, policy_config, policy_settings

    loaded = poisson(120, 3.0, 5)
    sim = Simulation(mixed_cluster(GAVEL_CLUSTER, seed=5), loaded.jobs, policy_config(LEARNED),
                     policy_settings(LEARNED, SimSettings(cycle_s=60.0, gpus_per_task=4)))
    sim.run()
    learned = [(j.kind, j.num_gpus) for j in loaded.jobs if sim.speeds.measured((j.kind, j.num_gpus))]
    assert learned  # some classes ran on two models or more
    kind = learned[0]
    truth = dict(next(j.speeds for j in loaded.jobs if (j.kind, j.num_gpus) == kind))
    for model, v in sim.speeds.measured(kind):
        assert v == pytest.approx(truth[model] / max(truth[m] for m, _ in sim.speeds.measured(kind)))
