"""The simulator's plots say what they show, the trace and the cluster, in their title;
one legend names every curve (the allocation curves and the capacity line included) and
sits below the panels, not over them; its tables wrap to fit 80 columns, never cut."""

from __future__ import annotations

import matplotlib
import pytest

from sim.engine import SimSettings, Simulation
from sim.fill import FillResult
from sim.jct_experiment import figure, plot, print_table
from sim.openb_experiment import figure as openb_figure
from sim.policies import policy_config, policy_settings
from sim.traces import synthetic, uniform_cluster

matplotlib.use("Agg")
import matplotlib.pyplot as plt

POLICIES = ("FIFO", "Kairos")


@pytest.fixture(scope="module")
def tiny() -> dict[str, object]:
    jobs = synthetic(12, seed=3)
    return {p: Simulation(uniform_cluster(2, 8), jobs, policy_config(p),
                          policy_settings(p, SimSettings())).run() for p in POLICIES}


def legend_labels(fig: plt.Figure) -> list[str]:
    assert len(fig.legends) == 1 and not any(a.get_legend() for a in fig.axes)  # one, outside
    return [t.get_text() for t in fig.legends[0].get_texts()]


def test_the_jct_plot_is_titled_by_trace_and_cluster_and_names_every_curve(tiny) -> None:
    fig = figure(tiny, "muri-trace1", "2x8")
    try:
        assert fig.get_suptitle() == "muri-trace1 on 2\N{MULTIPLICATION SIGN}8 GPUs"
        labels = legend_labels(fig)
        assert labels == [*POLICIES, "capacity"]
        allocation = fig.axes[2]
        assert allocation.get_title() == "GPU allocation"
        drawn = {line.get_label() for a in fig.axes for line in a.get_lines()}
        assert drawn == set(labels)  # every curve, allocation's included, is in the legend
        assert {line.get_label() for line in allocation.get_lines()} == {*POLICIES, "capacity"}
        # the legend is below the panels, so it covers none of them
        fig.canvas.draw()
        box = fig.legends[0].get_window_extent()
        assert all(box.y1 <= a.get_window_extent().y0 for a in fig.axes)
    finally:
        plt.close(fig)


def test_a_csv_trace_is_named_by_its_file_and_the_png_is_written(tiny, tmp_path) -> None:
    plot({"2x8": tiny}, tmp_path, "sim_compare", "/data/traces/mine.csv")  # type: ignore[dict-item]
    assert (tmp_path / "sim_compare_2x8.png").stat().st_size > 0
    fig = figure(tiny, "/data/traces/mine.csv", "2x8")  # type: ignore[arg-type]
    assert fig.get_suptitle() == "mine.csv on 2\N{MULTIPLICATION SIGN}8 GPUs"
    plt.close(fig)


def test_the_openb_plot_names_its_cluster_and_every_curve() -> None:
    run = FillResult("FGD", 42, [0.0, 100.0, 130.0], [0.0, 90.0, 95.0], 3, 0)
    results = {"openb_pod_list_default": {"FGD": [run], "Random": [run]},
               "openb_pod_list_multigpu50": {"FGD": [run], "Random": [run]}}
    fig = openb_figure(results, "Alibaba openb on 3 nodes (24 GPUs)")
    try:
        assert fig.get_suptitle() == "Alibaba openb on 3 nodes (24 GPUs)"
        assert [a.get_title() for a in fig.axes] == ["default", "multigpu50"]
        assert legend_labels(fig) == ["FGD", "Random", "limit"]
    finally:
        plt.close(fig)


def test_the_table_wraps_to_80_columns(monkeypatch: pytest.MonkeyPatch,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    row = {"avg_jct_s": 123456.0, "p99_jct_s": 9999999.0, "p99_queue_s": 888888.0,
           "makespan_s": 12345678.0, "avg_jct_over_duration": 12.345, "preemptions": 12345,
           "wall_s": 1234.5}
    print_table({"64x8": {"SJF-oracle": row, "Tiresias": row}, "protocol": {}}, "muri-trace1")
    text = capsys.readouterr().out
    assert max(len(line) for line in text.splitlines()) <= 80
    assert "…" not in text and "SJF-oracle" in text and "Tiresias" in text
    header = [line.split("┃") for line in text.splitlines() if line.startswith("┃")]
    assert "".join("".join(c[5].split()) for c in header) == "makespan(d)"  # wraps, not cut
