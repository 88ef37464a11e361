"""What keeping every wait within FIFO's costs: the default policy beside the same policy
with the no-starvation guard (``priority.fifo_guard``: a job whose total wait reaches a
fraction of the peak drain time goes first, in arrival order, and is not preempted
again), at several fractions, with and without holding the line, on the robustness
suite's cases; FIFO and Tiresias in the same run -> bench/results/starvation_tradeoff.json.

    python bench/starvation_tradeoff.py                       # every case but Philly 80/96 x 8
    python bench/starvation_tradeoff.py --cases 'syn-*' -j 2  # a subset, two processes
    python bench/starvation_tradeoff.py --variant 'ratio 8={"srpt": {"preempt_ratio": 8}}' \
        --out /tmp/ratio8.json                                 # other overrides instead

Per variant: the geometric mean of Kairos/Tiresias average JCT over the cases where
queues form, and how many cases miss each target (average JCT above Tiresias', longest
first wait or longest total wait above FIFO's). The guard's fraction trades one for the
other; the table shows whether any setting meets both.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from scheduling import SchedulerConfig
from scheduling.config import DEFAULT_PLUGINS, PluginSpec
from sim.engine import Simulation
from sim.metrics import geomean, summarize
from sim.policies import policy_config, policy_settings
from sim.suite import KEYS, cases, load, queues_form, select
from sim.traces import uniform_cluster

OUT = Path("bench/results/starvation_tradeoff.json")
# Kairos variants: overrides of the default preset's plugin arguments, by plugin
VARIANTS: dict[str, dict[str, dict[str, Any]]] = {
    "Kairos": {},
    # hold_line stated both ways: the default preset's changed (True until priority.overtaken)
    "guard 1.0, hold": {"priority": {"fifo_guard": 1.0, "hold_line": True}},
    "guard 1.0, no hold": {"priority": {"fifo_guard": 1.0, "hold_line": False}},
    "guard 0.5, hold": {"priority": {"fifo_guard": 0.5, "hold_line": True}},
    "guard 0.5, no hold": {"priority": {"fifo_guard": 0.5, "hold_line": False}},
}
BASELINES = ("FIFO", "Tiresias")
DEFAULT_CASES = [c.name for c in cases() if c.name not in ("philly@80x8", "philly@96x8")]


def variant_config(overrides: dict[str, dict[str, Any]]) -> SchedulerConfig:
    unknown = set(overrides) - {p.name for p in DEFAULT_PLUGINS}
    if unknown:
        raise SystemExit(f"no such plugin in the default preset: {', '.join(sorted(unknown))}")
    plugins = tuple(PluginSpec(name=p.name, weight=p.weight, args={**p.args, **overrides.get(p.name, {})})
                    for p in DEFAULT_PLUGINS)
    return SchedulerConfig(plugins=plugins)


def parse_variant(text: str) -> tuple[str, dict[str, dict[str, Any]]]:
    """``NAME={"plugin": {"arg": value}}`` -> (NAME, overrides)."""
    name, sep, body = text.partition("=")
    try:
        overrides = json.loads(body) if sep else None
    except json.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(f"{text!r}: the overrides are not JSON ({e})") from e
    if not name or not isinstance(overrides, dict) or not all(isinstance(v, dict) for v in overrides.values()):
        raise argparse.ArgumentTypeError(f"{text!r}: expected NAME={{\"plugin\": {{\"arg\": value}}}}")
    return name, overrides


def run_one(job: tuple[str, str, dict[str, dict[str, Any]]]) -> tuple[str, str, dict[str, Any]]:
    case_name, who, overrides = job
    case = select([case_name])[0]
    cfg = policy_config(who) if who in BASELINES else variant_config(overrides)
    settings = policy_settings(who if who in BASELINES else "Kairos", case.rules)
    t0 = time.perf_counter()
    m = summarize(Simulation(uniform_cluster(case.nodes, 8), load(case), cfg, settings).run())
    return case_name, who, {k: m[k] for k in KEYS} | {"wall_s": round(time.perf_counter() - t0, 1)}


def summary(table: dict[str, dict[str, Any]], variants: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for v in variants:
        ratios, jct, first, total = [], [], [], []
        worst_first = worst_total = 0.0
        stops = 0
        for case, rows in table.items():
            if v not in rows or not all(b in rows for b in BASELINES):
                continue
            k, f, t = rows[v], rows["FIFO"], rows["Tiresias"]
            first_ratio = k["max_first_wait_s"] / max(f["max_first_wait_s"], 1.0)
            total_ratio = k["max_total_wait_s"] / max(f["max_total_wait_s"], 1.0)
            worst_first, worst_total = max(worst_first, first_ratio), max(worst_total, total_ratio)
            stops += k["preemptions"]
            r = k["avg_jct_s"] / t["avg_jct_s"]
            if queues_form(rows):
                ratios.append(r)
                if r > 1.0:
                    jct.append(f"{case} {r:.3f}")
            if k["max_first_wait_s"] > f["max_first_wait_s"]:
                first.append(f"{case} {first_ratio:.2f}x")
            if k["max_total_wait_s"] > f["max_total_wait_s"]:
                total.append(f"{case} {total_ratio:.2f}x")
        out[v] = {"geomean_kairos_over_tiresias": round(geomean(ratios), 3)
                  if ratios else None, "cases": len(ratios), "jct_above_tiresias": jct,
                  "first_wait_above_fifo": first, "total_wait_above_fifo": total,
                  "worst_first_wait_over_fifo": round(worst_first, 2),
                  "worst_total_wait_over_fifo": round(worst_total, 2), "preemptions": stops}
    return out


def document(variants: dict[str, dict[str, dict[str, Any]]], s: dict[str, Any],
             table: dict[str, dict[str, Any]], partial: bool) -> dict[str, Any]:
    return {"protocol": "sim/suite.py cases and rules; Kairos = the default preset; every other variant = the "
                        "default preset with the plugin arguments in 'variants' ('guard X': priority.fifo_guard "
                        "= X, a job whose total wait reaches X times the peak drain time goes first and is not "
                        "preempted again; 'hold': priority.hold_line true, a starved job that cannot start stops "
                        "every job after it; 'no hold': false, later jobs that fit still start, as in the default)",
            "partial": partial, "variants": variants, "summary": s, "cases": table}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", nargs="*", default=DEFAULT_CASES, help="case names or patterns")
    ap.add_argument("-j", "--jobs", type=int, default=2)
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--variant", type=parse_variant, action="append", default=None,
                    metavar='NAME={"plugin": {"arg": value}}',
                    help="run these overrides of the default preset instead of the guard variants "
                         "(repeatable; the default preset and the baselines always run)")
    a = ap.parse_args()
    variants = VARIANTS if a.variant is None else {"Kairos": {}, **dict(a.variant)}
    for overrides in variants.values():
        variant_config(overrides)  # a plugin not in the preset fails here, before any run
    chosen = [c.name for c in select(a.cases)]
    todo: list[tuple[str, str, dict[str, dict[str, Any]]]] = [(c, w, {}) for c in chosen for w in BASELINES] + [
        (c, v, o) for c in chosen for v, o in variants.items()]
    # Philly's runs last: the longest (guard 0.5 held, over half an hour), and a run
    # stopped then keeps every other case
    todo.sort(key=lambda job: job[0].startswith("philly"))
    table: dict[str, dict[str, Any]] = {c: {} for c in chosen}
    a.out.parent.mkdir(parents=True, exist_ok=True)
    with ProcessPoolExecutor(a.jobs) as pool:
        for fut in as_completed([pool.submit(run_one, job) for job in todo]):
            case, who, rec = fut.result()
            table[case][who] = rec
            print(f"{case} {who}: avg JCT {rec['avg_jct_s'] / 3600:.2f} h, max first wait "
                  f"{rec['max_first_wait_s'] / 3600:.1f} h, max total wait {rec['max_total_wait_s'] / 3600:.1f} h",
                  flush=True)
            # written as each run ends: a run stopped early keeps what it finished
            s = summary(table, list(variants))
            done = sum(len(rows) for rows in table.values())
            a.out.write_text(json.dumps(document(variants, s, table, done < len(todo)), indent=2) + "\n")
    for v, row in s.items():
        print(f"{v:22s} geomean K/T {row['geomean_kairos_over_tiresias']}  JCT>T {len(row['jct_above_tiresias'])}  "
              f"first>FIFO {len(row['first_wait_above_fifo'])} (worst {row['worst_first_wait_over_fifo']}x)  "
              f"total>FIFO {len(row['total_wait_above_fifo'])} (worst {row['worst_total_wait_over_fifo']}x)  "
              f"preemptions {row['preemptions']:,}")


if __name__ == "__main__":
    main()
