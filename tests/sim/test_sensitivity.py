"""bench/sim_sensitivity.py's copies of a case: copy 0 is the case itself; a trace's
copy moves only submit times, each by less than a round; a synthetic copy is another
draw of the same family. And its summary counts what it says it counts."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

from bench.sim_sensitivity import JITTER_S, copy_of, over_cases, summarise
from sim.suite import load, select


def test_copy_zero_is_the_case_and_a_trace_copy_moves_only_submit_times() -> None:
    case = select(["muri-trace3@16x8"])[0]
    base = load(case)
    assert copy_of(case, 0) == base
    moved = copy_of(case, 3)
    assert [(j.job_id, j.duration_s, j.num_gpus, j.tenant) for j in moved] == \
        [(j.job_id, j.duration_s, j.num_gpus, j.tenant) for j in base]
    shifts = [m.submit_s - b.submit_s for m, b in zip(moved, base, strict=True)]
    assert all(0.0 <= s < JITTER_S for s in shifts)
    assert len(set(shifts)) > len(shifts) // 2  # jittered, not one offset for all
    assert copy_of(case, 3) == moved  # seeded: the same copy every time


def test_a_synthetic_copy_is_another_draw_of_the_family() -> None:
    case = select(["syn-bimodal-steady-1t@8x8"])[0]
    base, other = load(case), copy_of(case, 1)
    assert len(other) == len(base)
    assert [j.duration_s for j in other] != [j.duration_s for j in base]
    assert copy_of(case, 1) == other


def test_the_summary_counts_copies_above_tiresias() -> None:
    def run(k: float, t: float) -> dict[str, dict[str, float]]:
        return {"Kairos": {"avg_jct_s": k}, "Tiresias": {"avg_jct_s": t}}

    s = summarise({"a": {0: run(90, 100), 1: run(110, 100), 2: run(100, 100)},
                   "b": {0: run(50, 100), 1: {"Kairos": {"avg_jct_s": 1.0}}}})  # b's copy 1 is unfinished
    assert s["a"]["copies"] == 3 and s["a"]["copies_above_tiresias"] == 1  # equal is not above
    assert s["a"]["min"] == 0.9 and s["a"]["max"] == 1.1
    assert abs(s["a"]["geomean"] - (0.9 * 1.1 * 1.0) ** (1 / 3)) < 1e-4
    assert s["b"] == {"ratio_by_copy": {"0": 0.5}, "geomean": 0.5, "min": 0.5, "max": 0.5, "copies": 1,
                      "copies_above_tiresias": 0}


def test_an_unknown_case_is_refused_with_the_known_ones(tmp_path: Path) -> None:
    p = subprocess.run([sys.executable, "bench/sim_sensitivity.py", "--case", "no-such@1x8", "--out",
                        str(tmp_path / "x.json")], capture_output=True, text=True, timeout=120,
                       cwd=Path(__file__).resolve().parents[2])
    assert p.returncode == 2
    assert "no case matches no-such@1x8" in p.stderr and "muri-trace3@8x8" in p.stderr
    assert "Traceback" not in p.stderr
    assert not (tmp_path / "x.json").exists()


def test_a_variant_named_like_the_baseline_or_not_json_is_refused(tmp_path: Path) -> None:
    root = Path(__file__).resolve().parents[2]
    for bad, says in (('Tiresias={"srpt": {}}', "the name is taken"), ("x=not json", "not JSON")):
        p = subprocess.run([sys.executable, "bench/sim_sensitivity.py", "--variant", bad, "--out",
                            str(tmp_path / "x.json")], capture_output=True, text=True, timeout=120, cwd=root)
        assert p.returncode == 2, p.stderr
        assert says in p.stderr and "Traceback" not in p.stderr
    assert not (tmp_path / "x.json").exists()


def test_over_cases_gives_each_copys_geomean_and_count_over_the_cases() -> None:
    def row(*xs: float) -> dict[str, object]:
        return {"ratio_by_copy": {str(k): x for k, x in enumerate(xs)}, "geomean": math.prod(xs) ** (1 / len(xs))}

    o = over_cases({"a": row(0.5, 2.0), "b": row(2.0, 1.0), "c": row(1.0)})  # c has copy 0 only
    assert o["0"] == {"cases": 3, "geomean": 1.0, "cases_above_tiresias": 1}
    assert o["1"] == {"cases": 2, "geomean": round(math.sqrt(2.0), 4), "cases_above_tiresias": 1}
    assert o["geomean_of_case_geomeans"] == round((1.0 * math.sqrt(2.0) * 1.0) ** (1 / 3), 4)
    assert over_cases({}) == {}


def test_the_summary_gives_the_first_wait_against_fifos_where_fifo_ran() -> None:
    def run(k: float, wait: float) -> dict[str, float]:
        return {"avg_jct_s": k, "max_first_wait_s": wait}

    s = summarise({"a": {0: {"Kairos": run(90, 10), "Tiresias": run(100, 5), "FIFO": run(120, 20)},
                         1: {"Kairos": run(90, 30), "Tiresias": run(100, 5), "FIFO": run(120, 20)},
                         2: {"Kairos": run(90, 30), "Tiresias": run(100, 5)}}})  # copy 2: no FIFO run
    assert s["a"]["first_wait_over_fifo_by_copy"] == {"0": 0.5, "1": 1.5}
    assert s["a"]["copies_first_wait_above_fifo"] == 1
    assert "first_wait_over_fifo_by_copy" not in summarise({"b": {0: {"Kairos": run(1, 1), "Tiresias": run(1, 1)}}})["b"]


def test_resume_runs_only_what_the_file_lacks(tmp_path: Path) -> None:
    """A first invocation runs Tiresias, Kairos and a variant on one copy of a small case;
    --resume --fifo then adds FIFO's run, keeps the others as they were, and still names
    and summarises the variant it did not ask for; a variant of that name with other
    overrides is refused and the file left as it was."""
    root, out = Path(__file__).resolve().parents[2], tmp_path / "s.json"
    args = [sys.executable, "bench/sim_sensitivity.py", "--case", "muri-trace3@16x8", "--copies", "1", "--out", str(out)]
    first = subprocess.run([*args, "--variant", 'r6={"srpt": {"preempt_ratio": 6}}'], capture_output=True,
                           text=True, timeout=600, cwd=root)
    assert first.returncode == 0, first.stderr
    before = json.loads(out.read_text())
    assert set(before["runs"]["muri-trace3@16x8"]["0"]) == {"Kairos", "Tiresias", "r6"}
    again = subprocess.run([*args, "--resume", "--fifo"], capture_output=True, text=True, timeout=600, cwd=root)
    assert again.returncode == 0, again.stderr
    assert again.stdout.count(" copy 0 ") == 1 and "copy 0 FIFO" in again.stdout  # only FIFO ran
    after = json.loads(out.read_text())
    runs = after["runs"]["muri-trace3@16x8"]["0"]
    assert {k: runs[k] for k in ("Kairos", "Tiresias", "r6")} == before["runs"]["muri-trace3@16x8"]["0"]
    row = after["summary"]["muri-trace3@16x8"]
    assert row["first_wait_over_fifo_by_copy"]["0"] == round(
        runs["Kairos"]["max_first_wait_s"] / runs["FIFO"]["max_first_wait_s"], 3)
    assert row["copies_first_wait_above_fifo"] == 0  # 0.45 of FIFO's in sim_robust.json
    assert after["protocol"]["fifo"] is True and after["partial"] is False
    assert after["protocol"]["variants"] == {"Kairos": {}, "r6": {"srpt": {"preempt_ratio": 6}}}
    assert after["variant_summary"]["r6"]["muri-trace3@16x8"]["ratio_by_copy"]["0"] == round(
        runs["r6"]["avg_jct_s"] / runs["Tiresias"]["avg_jct_s"], 4)
    clash = subprocess.run([*args, "--resume", "--variant", 'r6={"srpt": {"preempt_ratio": 3}}'],
                           capture_output=True, text=True, timeout=120, cwd=root)
    assert clash.returncode == 2 and "the runs of 'r6'" in clash.stderr and "Traceback" not in clash.stderr
    assert json.loads(out.read_text()) == after
