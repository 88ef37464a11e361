"""Where Kairos loses to Tiresias on the cases it still loses, and what other sources of
its runtime samples or preemption rules would do there: per case, each job's JCT in both
runs summed by duration and by GPU count (a share of the average), the 8-GPU jobs'
history (samples carried, Gittins rank before the start, first wait), how well the
class median predicts the duration, and Kairos/Tiresias for variants of the default
preset -> bench/results/estimate_gap.json.

    python bench/estimate_gap.py                   # muri-trace1@8x8 and @16x8, muri-trace3@16x8
    python bench/estimate_gap.py --cases 'muri-*' -j 2

Variants: the default; no estimates (LAS order); Gittins samples from every finished
job, from jobs of the same size, or the class widened to size then all while it has
under 5 / 20 samples; no starvation bound; srpt preempt_ratio 2; srpt without pay.
"""

from __future__ import annotations

import argparse
import json
import sys
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.starvation_tradeoff import variant_config
from scheduling.estimates import SAMPLES, DurationHistory, gittins_rank
from sim.engine import SimResult, Simulation
from sim.metrics import summarize
from sim.policies import policy_config, policy_settings
from sim.suite import load, select
from sim.traces import uniform_cluster

OUT = Path("bench/results/estimate_gap.json")
H = 3600.0


class PooledHistory(DurationHistory):
    """Gittins samples from every finished job, whatever its tenant and size."""

    def samples(self, tenant: str, gpus: int) -> tuple[float, ...]:
        return tuple(sorted(self.every[-SAMPLES:]))


class SizeHistory(DurationHistory):
    """Gittins samples from finished jobs of the same size (any tenant)."""

    def samples(self, tenant: str, gpus: int) -> tuple[float, ...]:
        xs = self.by_size.get(gpus) or self.every
        return tuple(sorted(xs[-SAMPLES:]))


def widened(least: int) -> type[DurationHistory]:
    class Widened(DurationHistory):
        """The class's samples, widened to the size, then to every job, while under ``least``."""

        def samples(self, tenant: str, gpus: int) -> tuple[float, ...]:
            for xs in (self.by_key.get((tenant, gpus)), self.by_size.get(gpus), self.every):
                if xs and len(xs) >= least:
                    return tuple(sorted(xs[-SAMPLES:]))
            return super().samples(tenant, gpus)
    return Widened


# name -> (overrides of the default preset, estimates setting or None, history class)
VARIANTS: dict[str, tuple[dict[str, dict[str, Any]], str | None, type[DurationHistory]]] = {
    "Kairos": ({}, None, DurationHistory),
    "no estimates": ({}, "none", DurationHistory),
    "samples: every job": ({}, None, PooledHistory),
    "samples: same size": ({}, None, SizeHistory),
    "samples: widened under 5": ({}, None, widened(5)),
    "samples: widened under 20": ({}, None, widened(20)),
    "no starvation bound": ({"priority": {"starvation_bound_s": 1e12, "backlog_factor": 0.0}}, None,
                            DurationHistory),
    "preempt_ratio 2": ({"srpt": {"preempt_ratio": 2.0}}, None, DurationHistory),
    "no pay": ({"srpt": {"pay": False}}, None, DurationHistory),
}


def simulate(case_name: str, who: str) -> SimResult:
    case = select([case_name])[0]
    if who == "Tiresias":
        return Simulation(uniform_cluster(case.nodes, 8), load(case), policy_config(who),
                          policy_settings(who, case.rules)).run()
    overrides, estimates, history = VARIANTS[who]
    settings = policy_settings("Kairos", case.rules)
    if estimates is not None:
        settings = replace(settings, estimates=estimates)  # type: ignore[arg-type]
    sim = Simulation(uniform_cluster(case.nodes, 8), load(case), variant_config(overrides), settings)
    sim.history = history()
    return sim.run()


def breakdown(kairos: SimResult, tiresias: SimResult) -> dict[str, Any]:
    """Each group's share of the average JCT (h), Kairos beside Tiresias, and the 8-GPU
    jobs' history under Kairos."""
    t_jct = {j.trace.job_id: j.finish - j.trace.submit_s for j in tiresias.jobs if j.finish is not None}
    rows = [(j.trace.duration_s / H, j.trace.num_gpus, (j.finish - j.trace.submit_s) / H,
             t_jct[j.trace.job_id] / H) for j in kairos.jobs if j.finish is not None]
    n = len(rows)
    out: dict[str, Any] = {"jobs": n, "by_duration_h": {}, "by_gpus": {}}
    for lo, hi in [(0, 1), (1, 4), (4, 16), (16, 64), (64, 256), (256, float("inf"))]:
        part = [r for r in rows if lo <= r[0] < hi]
        out["by_duration_h"][f"{lo}-{hi}"] = {"jobs": len(part), "kairos_h": round(sum(r[2] for r in part) / n, 1),
                                              "tiresias_h": round(sum(r[3] for r in part) / n, 1)}
    for g in sorted({r[1] for r in rows}):
        part = [r for r in rows if r[1] == g]
        out["by_gpus"][str(g)] = {"jobs": len(part), "kairos_h": round(sum(r[2] for r in part) / n, 1),
                                  "tiresias_h": round(sum(r[3] for r in part) / n, 1)}
    wide = [j for j in kairos.jobs if j.trace.num_gpus == 8]
    ranks = [gittins_rank(j.request.runtime_samples, 0.0) for j in wide if j.request.runtime_samples]
    waits = [j.first_start - j.trace.submit_s for j in wide if j.first_start is not None]
    out["8_gpu_jobs"] = {
        "median_samples": float(np.median([len(j.request.runtime_samples) for j in wide])) if wide else None,
        "median_rank_before_start_h": round(float(np.median([r for r in ranks if r is not None])) / H, 1)
        if ranks else None,
        "median_first_wait_h": round(float(np.median(waits)) / H, 1) if waits else None}
    known = [(np.median(j.request.runtime_samples), j.trace.duration_s) for j in kairos.jobs
             if len(j.request.runtime_samples) >= 5]
    if known:
        med, dur = np.log1p(np.array(known)).T
        out["corr_log_class_median_log_duration"] = round(float(np.corrcoef(med, dur)[0, 1]), 2)
    return out


def run_case(job: tuple[str, list[str]]) -> tuple[str, dict[str, Any]]:
    case_name, variants = job
    tiresias = simulate(case_name, "Tiresias")
    t_avg = float(summarize(tiresias)["avg_jct_s"])
    rec: dict[str, Any] = {"tiresias_avg_jct_h": round(t_avg / H, 2), "kairos_over_tiresias": {}}
    for v in variants:
        res = simulate(case_name, v)
        avg = float(summarize(res)["avg_jct_s"])
        rec["kairos_over_tiresias"][v] = round(avg / t_avg, 3)
        if v == "Kairos":
            rec["breakdown"] = breakdown(res, tiresias)
        print(f"{case_name} {v}: {avg / t_avg:.3f} x Tiresias", flush=True)
    return case_name, rec


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", nargs="*", default=["muri-trace1@8x8", "muri-trace1@16x8", "muri-trace3@16x8"])
    ap.add_argument("-j", "--jobs", type=int, default=2)
    ap.add_argument("--out", type=Path, default=OUT)
    a = ap.parse_args()
    chosen = [c.name for c in select(a.cases)]
    with ProcessPoolExecutor(a.jobs) as pool:
        table = dict(pool.map(run_case, [(c, list(VARIANTS)) for c in chosen]))
    doc = {"protocol": "sim/suite.py cases and rules; Kairos = the default preset; variants as in "
                       "bench/estimate_gap.py; shares of the average JCT in hours", "cases": table}
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(doc, indent=2) + "\n")
    print(json.dumps({c: r["kairos_over_tiresias"] for c, r in table.items()}, indent=1))


if __name__ == "__main__":
    main()
