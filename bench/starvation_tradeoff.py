"""What keeping every wait within FIFO's costs: the default policy beside the same policy
with the no-starvation guard (``priority.fifo_guard``: a job whose total wait reaches a
fraction of the peak drain time goes first, in arrival order, and is not preempted
again), at several fractions, with and without holding the line, on the robustness
suite's cases; FIFO and Tiresias in the same run -> bench/results/starvation_tradeoff.json.

    python bench/starvation_tradeoff.py                       # every case but Philly 80/96 x 8
    python bench/starvation_tradeoff.py --cases 'syn-*' -j 2  # a subset, two processes

Per variant: the geometric mean of Kairos/Tiresias average JCT over the cases where
queues form, and how many cases miss each target (average JCT above Tiresias', longest
first wait or longest total wait above FIFO's). The guard's fraction trades one for the
other; the table shows whether any setting meets both.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from scheduling import SchedulerConfig
from scheduling.config import DEFAULT_PLUGINS, PluginSpec
from sim.engine import Simulation
from sim.metrics import summarize
from sim.policies import policy_config, policy_settings
from sim.suite import KEYS, cases, load, queues_form, select
from sim.traces import uniform_cluster

OUT = Path("bench/results/starvation_tradeoff.json")
# Kairos variants: overrides of the default preset's priority plugin
VARIANTS: dict[str, dict[str, Any]] = {
    "Kairos": {},
    "guard 1.0": {"fifo_guard": 1.0},
    "guard 1.0, no hold": {"fifo_guard": 1.0, "hold_line": False},
    "guard 0.5": {"fifo_guard": 0.5},
    "guard 0.5, no hold": {"fifo_guard": 0.5, "hold_line": False},
}
BASELINES = ("FIFO", "Tiresias")
DEFAULT_CASES = [c.name for c in cases() if c.name not in ("philly@80x8", "philly@96x8")]


def variant_config(priority: dict[str, Any]) -> SchedulerConfig:
    plugins = tuple(PluginSpec(name=p.name, weight=p.weight, args={**p.args, **priority})
                    if p.name == "priority" else p for p in DEFAULT_PLUGINS)
    return SchedulerConfig(plugins=plugins)


def run_one(job: tuple[str, str]) -> tuple[str, str, dict[str, Any]]:
    case_name, who = job
    case = select([case_name])[0]
    cfg = policy_config(who) if who in BASELINES else variant_config(VARIANTS[who])
    settings = policy_settings(who if who in BASELINES else "Kairos", case.rules)
    t0 = time.perf_counter()
    m = summarize(Simulation(uniform_cluster(case.nodes, 8), load(case), cfg, settings).run())
    return case_name, who, {k: m[k] for k in KEYS} | {"wall_s": round(time.perf_counter() - t0, 1)}


def summary(table: dict[str, dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for v in VARIANTS:
        ratios, jct, first, total = [], [], [], []
        for case, rows in table.items():
            if v not in rows or not all(b in rows for b in BASELINES):
                continue
            k, f, t = rows[v], rows["FIFO"], rows["Tiresias"]
            r = k["avg_jct_s"] / t["avg_jct_s"]
            if queues_form(rows):
                ratios.append(r)
                if r > 1.0:
                    jct.append(f"{case} {r:.3f}")
            if k["max_first_wait_s"] > f["max_first_wait_s"]:
                first.append(f"{case} {k['max_first_wait_s'] / max(f['max_first_wait_s'], 1.0):.2f}x")
            if k["max_total_wait_s"] > f["max_total_wait_s"]:
                total.append(f"{case} {k['max_total_wait_s'] / max(f['max_total_wait_s'], 1.0):.2f}x")
        out[v] = {"geomean_kairos_over_tiresias": round(math.exp(sum(map(math.log, ratios)) / len(ratios)), 3)
                  if ratios else None, "cases": len(ratios), "jct_above_tiresias": jct,
                  "first_wait_above_fifo": first, "total_wait_above_fifo": total}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", nargs="*", default=DEFAULT_CASES, help="case names or patterns")
    ap.add_argument("-j", "--jobs", type=int, default=2)
    ap.add_argument("--out", type=Path, default=OUT)
    a = ap.parse_args()
    chosen = [c.name for c in select(a.cases)]
    todo = [(c, w) for c in chosen for w in (*BASELINES, *VARIANTS)]
    table: dict[str, dict[str, Any]] = {c: {} for c in chosen}
    with ProcessPoolExecutor(a.jobs) as pool:
        for case, who, rec in pool.map(run_one, todo):
            table[case][who] = rec
            print(f"{case} {who}: avg JCT {rec['avg_jct_s'] / 3600:.2f} h, max first wait "
                  f"{rec['max_first_wait_s'] / 3600:.1f} h, max total wait {rec['max_total_wait_s'] / 3600:.1f} h",
                  flush=True)
    s = summary(table)
    doc = {"protocol": "sim/suite.py cases and rules; Kairos = the default preset; 'guard X' = the default "
                       "preset with priority.fifo_guard = X (a job whose total wait reaches X times the peak "
                       "drain time goes first and is not preempted again); 'no hold' = priority.hold_line "
                       "false (later jobs that fit still start)", "variants": VARIANTS,
           "summary": s, "cases": table}
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(doc, indent=2) + "\n")
    for v, row in s.items():
        print(f"{v:22s} geomean K/T {row['geomean_kairos_over_tiresias']}  JCT>T {len(row['jct_above_tiresias'])}  "
              f"first>FIFO {len(row['first_wait_above_fifo'])}  total>FIFO {len(row['total_wait_above_fifo'])}")


if __name__ == "__main__":
    main()
