"""How good are start-time forecasts? Philly on 64 x 8 in the simulator, the default
policy (Kairos) with history estimates: a sample of the jobs that waited is forecast when
the scheduler first sees them and again at half their actual wait; each forecast start
is held against the actual start, beside Slurm's reservation estimate and a naive one
(sim/forecast_experiment.py) -> bench/results/forecast_accuracy.json.

    python bench/forecast_accuracy.py --limit 2000 --sample 100   # a quick look
    python bench/forecast_accuracy.py                             # 10,000 jobs, 500 sampled
    python bench/forecast_accuracy.py --scale-only                # only the cost at 5,000 nodes

``--scale`` (on by default) also times one whole forecast round (every waiting job, three
replays) on a synthetic 5,000 nodes x 8 GPUs, full, with 8,000 jobs waiting.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np

from scheduling import SchedulerConfig
from scheduling.forecast import forecast
from sim.engine import SimSettings
from sim.forecast_experiment import run, summary, synthetic_snapshot
from sim.policies import policy_config, policy_settings
from sim.traces import PHILLY, load_philly

# forecasts by how far ahead the actual start was (the hard ones are the long waits)
WAITS = (("under 5 min", 0.0, 300.0), ("5 min to 1 h", 300.0, 3600.0), ("over 1 h", 3600.0, float("inf")))


def scale(nodes: int, waiting: int, resolution: float, cycle_s: float) -> dict[str, Any]:
    snap, remaining, durations = synthetic_snapshot(nodes, 8, waiting)
    t0 = time.perf_counter()
    out = forecast(SchedulerConfig.preset("default"), snap, remaining, durations, cycle_s=cycle_s,
                   resolution=resolution)
    wall = time.perf_counter() - t0
    started = sum(1 for f in out.values() if f.start is not None)
    return {"nodes": nodes, "gpus_per_node": 8, "waiting_jobs": waiting, "running_jobs": len(snap.running),
            "forecast_round_s": round(wall, 2), "jobs_with_a_forecast": started,
            "replays": 3, "resolution": resolution, "cycle_s": cycle_s}


def table(doc: dict[str, Any]) -> str:
    rows = [("forecast (replay through the core)", doc), ("baseline: reservation (Slurm)", doc["baseline_reservation"]),
            ("baseline: naive", doc["baseline_naive"])]
    lines = [f"{'':38} {'median |err|':>13} {'p90 |err|':>11} {'in band':>8}"]
    for name, d in rows:
        cov = "-" if d["band_coverage"] is None else f"{100 * d['band_coverage']:.0f}%"
        lines.append(f"{name:38} {d['median_abs_error_s']:>12.0f}s {d['p90_abs_error_s']:>10.0f}s {cov:>8}")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--limit", type=int, default=10_000, help="first N Philly jobs by submit time")
    p.add_argument("--nodes", type=int, default=64)
    p.add_argument("--sample", type=int, default=500, help="jobs forecast (twice each)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--cycle-s", type=float, default=60.0, help="the simulated scheduler's cycle interval")
    p.add_argument("--resolution", type=float, default=0.02, help="replay steps at least this fraction of "
                   "the time replayed apart")
    p.add_argument("--scale", action=argparse.BooleanOptionalAction, default=True,
                   help="also time a round at 5,000 nodes x 8 GPUs with 8,000 waiting")
    p.add_argument("--scale-only", action="store_true")
    p.add_argument("--out", default="bench/results/forecast_accuracy.json")
    a = p.parse_args()
    out = Path(a.out)
    doc: dict[str, Any] = json.loads(out.read_text()) if a.scale_only and out.exists() else {}
    if not a.scale_only:
        settings = policy_settings("Kairos", SimSettings(cycle_s=a.cycle_s, tick_s=600.0))
        records, protocol = run(load_philly(PHILLY, a.limit), a.nodes, 8, policy_config("Kairos"), settings,
                                a.sample, a.seed, a.resolution)
        rounds = np.asarray([r.round_s for r in records])
        doc = summary(records) | {
            "by_time": {w: summary([r for r in records if r.when == w]) for w in ("submit", "half")},
            "by_time_left": {name: summary(rs) for name, lo, hi in WAITS
                             if (rs := [r for r in records if lo <= r.actual - r.at < hi])},
            "forecast_s": {"median": round(float(np.median(rounds)), 4),
                           "p90": round(float(np.percentile(rounds, 90)), 4), "max": round(float(rounds.max()), 4),
                           "what": "one job's forecast (three replays until it starts) on 64 x 8"},
            "sampled_jobs": protocol["sampled_jobs"],
            "protocol": protocol | {
                "trace": f"philly, first {a.limit} jobs by submit time", "cluster": f"{a.nodes}x8",
                "policy": "Kairos (default preset), history estimates", "cycle_s": a.cycle_s,
                "resolution": a.resolution, "seed": a.seed,
                "sample": "jobs that waited longer than one cycle, uniformly; each forecast when the scheduler "
                          "first sees it and at half its actual wait",
                "band": "min..max start over replays with every duration at its 10%, 50%, 90% quantile "
                        "(scheduling.estimates: similar finished jobs, conditioned on attained service)",
                "baseline_reservation": "queue in the policy's order; each job reserved at the earliest time "
                                        "enough GPUs are free for its estimate (running jobs end at start + "
                                        "estimate, past it: as long again); no band",
                "baseline_naive": "now + jobs ahead x mean GPU-seconds of a finished job / cluster GPUs; "
                                  "no band"}}
        print(table(doc))
    if a.scale or a.scale_only:
        doc["scale"] = scale(5000, 8000, a.resolution, a.cycle_s)
        print(json.dumps(doc["scale"]))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=2) + "\n")


if __name__ == "__main__":
    main()
