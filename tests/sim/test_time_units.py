"""Loaders refuse what they cannot read right (issue 17): a CSV whose times look like
seconds where milliseconds are expected (or the reverse) is refused with a message that
says which unit it looks like and how to say so; ``--time-unit`` reads it as told."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from sim.cli import app
from sim.traces import MURI, PHILLY, TimeUnit, TraceError, load_muri, load_philly

MURI_HEAD = "job_id,num_gpu,submit_time,iterations,model_name,batch_size,duration,interval,iteration_time,priority\n"
# three jobs: submitted at 0 s, 60 s, 120 s, running 1 h, 30 min, 2 h
SUBMITS_S, DURATIONS_S = (0, 60, 120), (3600, 1800, 7200)


def muri_csv(tmp_path, per_second: float, name: str = "t.csv"):
    p = tmp_path / name
    rows = [f"{k},1,{int(s * per_second)},100,resnet18,32,{int(d * per_second)},0,1,0\n"
            for k, (s, d) in enumerate(zip(SUBMITS_S, DURATIONS_S, strict=True))]
    p.write_text(MURI_HEAD + "".join(rows))
    return p


def philly_csv(tmp_path, per_second: float, name: str = "p.csv"):
    p = tmp_path / name
    rows = [f"2017-10-09 07:0{k}:00,{d * per_second:.1f},1,{d:.1f},vc1\n" for k, d in enumerate(DURATIONS_S)]
    p.write_text("timestamp,duration,num_gpus,gpu_time,cluster\n" + "".join(rows))
    return p


def durations(jobs):
    return sorted(j.duration_s for j in jobs)


@pytest.mark.parametrize(
    ("loader", "make", "unit", "per_second", "looks"),
    [
        (load_muri, muri_csv, None, 1000, None),  # ms, as the format says
        (load_muri, muri_csv, None, 1, "seconds"),
        (load_muri, muri_csv, None, 1_000_000, "microseconds"),
        (load_muri, muri_csv, "s", 1, None),
        (load_muri, muri_csv, "us", 1_000_000, None),
        (load_philly, philly_csv, None, 1, None),  # s, as the format says
        (load_philly, philly_csv, None, 1000, "milliseconds"),
        (load_philly, philly_csv, TimeUnit.MS, 1000, None),
    ],
)
def test_a_file_is_read_in_its_unit_or_refused(tmp_path, loader, make, unit, per_second, looks) -> None:
    path = make(tmp_path, per_second)
    if looks is None:
        jobs = loader(path, time_unit=unit)
        assert durations(jobs) == sorted(map(float, DURATIONS_S))
        if loader is load_muri:
            assert sorted(j.submit_s for j in jobs) == list(map(float, SUBMITS_S))
        return
    with pytest.raises(TraceError) as err:
        loader(path, time_unit=unit)
    msg = str(err.value)
    assert str(path) in msg and f"look like {looks}" in msg
    told = {"seconds": "s", "milliseconds": "ms", "microseconds": "us"}[looks]
    assert f"--time-unit {told}" in msg
    assert "the median job runs" in msg


def test_an_explicit_unit_is_taken_at_its_word(tmp_path) -> None:
    # seconds read as milliseconds because the caller says so: 1,000x shorter, no refusal
    jobs = load_muri(muri_csv(tmp_path, 1), time_unit="ms")
    assert durations(jobs) == [1.8, 3.6, 7.2]


def test_an_unknown_unit_is_refused(tmp_path) -> None:
    with pytest.raises(TraceError, match="unknown time unit 'min'"):
        load_muri(muri_csv(tmp_path, 1000), time_unit="min")


def test_whole_seconds_in_milliseconds_are_milliseconds_whatever_the_median(tmp_path) -> None:
    # long jobs, whole seconds written in ms: 1,000x too long for seconds is still a
    # plausible median (30 days), but every duration is a whole number of seconds in ms
    p = tmp_path / "p.csv"
    p.write_text("timestamp,duration,num_gpus\n2017-10-09 07:00:00,2592000000,1\n2017-10-09 07:01:00,3000,2\n")
    with pytest.raises(TraceError, match="every duration is whole seconds in ms"):
        load_philly(p)
    assert durations(load_philly(p, time_unit="ms")) == [3.0, 2_592_000.0]


@pytest.mark.parametrize(("loader", "path"), [(load_muri, MURI / "trace1.csv"), (load_muri, MURI / "trace2.csv"),
                                              (load_philly, PHILLY)])
@pytest.mark.parametrize("rows", [1, 2, 20, 1000])
def test_the_committed_traces_pass_the_check(slice_file, loader, path, rows) -> None:
    # the first rows of Muri trace1 are jobs of weeks: whole seconds in ms say ms
    assert len(loader(slice_file(path, rows))) == rows


def test_cli_refuses_a_file_in_the_wrong_unit_and_reads_it_when_told(tmp_path) -> None:
    path = muri_csv(tmp_path, 1)  # seconds, in the Muri format (ms)
    r = CliRunner().invoke(app, ["run", str(path), "--nodes", "1", "--policy", "FIFO"])
    assert r.exit_code == 2
    text = " ".join(r.output.split())  # rich wraps the message in a box
    assert "look like seconds" in text and "--time-unit s" in text
    out = tmp_path / "r.json"
    r = CliRunner().invoke(app, ["run", str(path), "--nodes", "1", "--policy", "FIFO", "--time-unit", "s",
                                 "--out", str(out)])
    assert r.exit_code == 0, r.output
    assert json.loads(out.read_text())["finished"] == 3


def test_cli_time_unit_is_for_csv_files_only() -> None:
    r = CliRunner().invoke(app, ["run", "synthetic", "--limit", "5", "--time-unit", "ms"])
    assert r.exit_code == 2
