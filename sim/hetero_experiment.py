"""Mixed clusters (issue 41): FIFO, Tiresias, Kairos blind to GPU models and Kairos told
each job's speed per model, on Gavel's 36 V100 + 36 P100 + 36 K80 GPUs.

Cases: Gavel's generator (``sim.gavel.poisson``) at several rates, from light load to
past saturation, three seeds each; and the fifteen MSR-derived traces. Every policy
sees the same cluster, whose nodes are listed in a seeded random order (a policy blind
to models takes them as they come, not the fastest by accident of listing).

Targets, over the cases where queues form (FIFO's average JCT above 1.1x the best
policy's): Kairos-aware's average JCT at most 0.6x Tiresias' as a geometric mean and at
most 0.8x on every case; never above Kairos blind to models; its longest first wait
within FIFO's.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sim.engine import SimResult, SimSettings, Simulation
from sim.gavel import GAVEL_CLUSTER, MSR, Loaded, load_msr, mixed_cluster, poisson
from sim.metrics import geomean, summarize
from sim.policies import AWARE, HETERO_POLICIES, LEARNED, policy_config, policy_settings

RATES = (1.5, 3.0, 4.5, 6.0, 8.0)  # jobs per hour: light load to past saturation (about 5/h)
SEEDS = (1, 2, 3)
JOBS = 500  # per Poisson case
RULES = SimSettings(cycle_s=60.0, tick_s=600.0, gpus_per_task=4)  # Gavel's 4-GPU servers
QUEUES_FORM = 1.1  # FIFO's average JCT above this x the best policy's
KEYS = ("avg_jct_s", "p99_jct_s", "makespan_s", "max_first_wait_s", "preemptions")


@dataclass(frozen=True, slots=True)
class Case:
    name: str
    rate: float | None = None  # Poisson cases
    seed: int = 0
    trace: str = ""  # MSR cases: the file's stem

    def load(self) -> Loaded:
        if self.trace:
            return load_msr(MSR / f"{self.trace}.trace")
        assert self.rate is not None
        return poisson(JOBS, self.rate, self.seed)


def cases(rates: Sequence[float] = RATES, seeds: Sequence[int] = SEEDS, msr: bool = True) -> list[Case]:
    out = [Case(f"poisson-{r:g}ph-s{s}", r, s) for r in rates for s in seeds]
    if msr:
        out += [Case(f"msr-{p.stem}", trace=p.stem) for p in sorted(MSR.glob("*.trace"))]
    return out


def gpu_hours_by_model(res: SimResult) -> dict[str, float]:
    out: dict[str, float] = {}
    for j in res.jobs:
        for m, s in j.gpu_s_by_model.items():
            out[m] = out.get(m, 0.0) + s / 3600.0
    return {m: round(v, 1) for m, v in sorted(out.items())}


def run_one(case: Case, policy: str) -> tuple[str, str, dict[str, Any], int]:
    loaded = case.load()
    nodes = mixed_cluster(GAVEL_CLUSTER, seed=case.seed or 1)
    t0 = time.perf_counter()
    res = Simulation(nodes, loaded.jobs, policy_config(policy), policy_settings(policy, RULES)).run()
    m = summarize(res)
    row = {k: m[k] for k in KEYS} | {"gpu_hours_by_model": gpu_hours_by_model(res), "jobs": m["jobs"],
                                     "unfinished": m["unfinished"], "wall_s": round(time.perf_counter() - t0, 1)}
    return case.name, policy, row, loaded.linear


def run(chosen: Sequence[Case], policies: Sequence[str] = HETERO_POLICIES, out: Path | None = None,
        workers: int = 1) -> dict[str, Any]:
    doc: dict[str, Any] = {c.name: {} for c in chosen}
    linear: dict[str, int] = {}
    todo = [(c, p) for c in chosen for p in policies]
    if workers > 1:
        with ProcessPoolExecutor(workers) as pool:
            results = list(pool.map(run_one, *zip(*todo, strict=True)))
    else:
        results = [run_one(c, p) for c, p in todo]
    for name, policy, row, lin in results:
        doc[name][policy] = row
        linear[name] = lin
    doc["summary"] = summary(doc)
    doc["protocol"] = {
        "cluster": "36 V100 + 36 P100 + 36 K80 GPUs, 4 per node, nodes in a seeded random order",
        "poisson": f"{JOBS} jobs per case, Gavel's generator (sim/gavel.py), rates {list(RATES)} jobs/h, "
                   f"seeds {list(SEEDS)}",
        "msr": "Gavel's msr-seed1 traces, every job",
        "linear_throughput_jobs": {k: v for k, v in linear.items() if v},
        "rules": RULES.rules(), "queues_form": f"FIFO avg JCT > {QUEUES_FORM} x the best policy's",
        "speeds": f"{AWARE}: each job's measured speed per model (Gavel's table), as a user's hint or a "
                  f"profile would give it; {LEARNED}: its class's (job type and GPUs) speeds on the models where "
                  "jobs of the class have started (scheduling/speeds.py); the others: none (models they cannot "
                  "run on are a constraint for all)",
    }
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(doc, indent=2) + "\n")
    return doc


def queues_form(rows: dict[str, Any]) -> bool:
    best = min(r["avg_jct_s"] for r in rows.values())
    return bool(rows["FIFO"]["avg_jct_s"] > QUEUES_FORM * best)


def summary(doc: dict[str, Any]) -> dict[str, Any]:
    over_tiresias, over_blind, learned, misses = {}, {}, {}, []
    for case, rows in doc.items():
        if case in ("summary", "protocol") or not {"FIFO", "Tiresias", "Kairos", AWARE} <= rows.keys():
            continue
        aware = rows[AWARE]
        r = aware["avg_jct_s"] / rows["Tiresias"]["avg_jct_s"]
        b = aware["avg_jct_s"] / rows["Kairos"]["avg_jct_s"]
        if not queues_form(rows):
            continue
        over_tiresias[case], over_blind[case] = round(r, 3), round(b, 3)
        if LEARNED in rows:
            learned[case] = round(rows[LEARNED]["avg_jct_s"] / rows["Tiresias"]["avg_jct_s"], 3)
        if r > 0.8:
            misses.append(f"{case}: {AWARE}/Tiresias {r:.3f} > 0.8")
        if b > 1.0:
            misses.append(f"{case}: {AWARE}/Kairos {b:.3f} > 1")
        if aware["max_first_wait_s"] > rows["FIFO"]["max_first_wait_s"]:
            misses.append(f"{case}: {AWARE} max first wait {aware['max_first_wait_s']:.0f} s > FIFO "
                          f"{rows['FIFO']['max_first_wait_s']:.0f} s")
    geo = geomean(list(over_tiresias.values())) if over_tiresias else None
    if geo is not None and geo > 0.6:
        misses.append(f"geometric mean {AWARE}/Tiresias {geo:.3f} > 0.6")
    return {"cases_where_queues_form": len(over_tiresias),
            "aware_over_tiresias": over_tiresias, "aware_over_tiresias_geomean": round(geo, 3) if geo else None,
            "aware_over_blind_kairos": over_blind,
            "aware_over_blind_geomean": round(geomean(list(over_blind.values())), 3) if over_blind else None,
            # informational: the same policy learning each class's speeds from the jobs that ran
            "learned_over_tiresias": learned,
            "learned_over_tiresias_geomean": round(geomean(list(learned.values())), 3) if learned else None,
            "targets_missed": misses}


def print_table(doc: dict[str, Any]) -> None:
    pols = [p for p in HETERO_POLICIES]
    print(f"{'case':24}" + "".join(f"{p:>14}" for p in pols) + "   aware/Tir  aware/Kairos")
    for case, rows in doc.items():
        if case in ("summary", "protocol"):
            continue
        cells = "".join(f"{rows[p]['avg_jct_s'] / 3600:>13.1f}h" if p in rows else f"{'-':>14}" for p in pols)
        s = doc["summary"]
        tail = (f"   {s['aware_over_tiresias'].get(case, '-'):>9}  {s['aware_over_blind_kairos'].get(case, '-'):>11}"
                if case in s["aware_over_tiresias"] else "   (no queues)")
        print(f"{case:24}{cells}{tail}")
    s = doc["summary"]
    print(f"geomean {AWARE}/Tiresias where queues form ({s['cases_where_queues_form']} cases): "
          f"{s['aware_over_tiresias_geomean']}; /Kairos blind: {s['aware_over_blind_geomean']}; "
          f"{LEARNED}/Tiresias: {s['learned_over_tiresias_geomean']}")
    print("targets missed:", "; ".join(s["targets_missed"]) or "none")
