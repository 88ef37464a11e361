"""Fair share over decayed past use (issue 41): each tenant's waits and JCTs with the
fairshare plugin's ``half_life_s`` off, one hour and one day (and the priority plugin's
``fairshare_weight`` at 100 with it), everything else the default policy.

Cases:
- ``return-after-burst`` (seeds 1-3): on 4 x 8 GPUs tenant ``heavy`` runs a burst of
  sixteen 8-GPU jobs alone; then both tenants submit one 8-GPU job each every 15 min
  for 4 h (twice what the cluster holds), ``heavy`` a second before ``light``. With
  current shares only, the two alternate from the start; with a half-life, ``light``
  goes first until ``heavy``'s past has decayed, so ``light`` waits less.
- ``philly-3000``: the first 3,000 Philly jobs on 48 x 8 GPUs, its virtual clusters as
  tenants (the figures of every tenant, however it comes out).
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from scheduling import SchedulerConfig
from sim.engine import SimResult, SimSettings, Simulation
from sim.traces import TraceJob, load_philly, uniform_cluster

HALF_LIVES = {"off": 0.0, "1h": 3600.0, "1d": 86400.0}
HOUR = 3600.0


FAIRSHARE_WEIGHT = 100.0  # priority points per unit of past share: 2 h of aging at 50/h


def config(half_life_s: float) -> SchedulerConfig:
    """The default policy; with a half-life, past use counts in fair share's key and in
    the combined priority (``fairshare_weight``)."""
    cfg = SchedulerConfig.preset("default")
    if not half_life_s:
        return cfg
    extra = {"fairshare": {"half_life_s": half_life_s},
             "priority": {"fairshare_weight": FAIRSHARE_WEIGHT}}
    plugins = [p.model_copy(update={"args": {**p.args, **extra.get(p.name, {})}})
               for p in cfg.plugins]
    return cfg.model_copy(update={"plugins": plugins})


def return_after_burst(seed: int) -> list[TraceJob]:
    rng = random.Random(seed)

    def dur() -> float:
        return HOUR * rng.uniform(0.8, 1.2)
    jobs = [TraceJob(f"burst-{i}", 0.0, dur(), 8, "heavy") for i in range(16)]
    t = 4 * HOUR
    for k in range(16):
        jobs.append(TraceJob(f"heavy-{k}", t + k * 900.0, dur(), 8, "heavy"))
        jobs.append(TraceJob(f"light-{k}", t + k * 900.0 + 1.0, dur(), 8, "light"))
    return jobs


def per_tenant(res: SimResult, only: str = "") -> dict[str, dict[str, float]]:
    """Each tenant's jobs (those whose id starts with ``only``'s tenants' phase): mean
    and worst first wait, mean JCT."""
    out: dict[str, list[tuple[float, float]]] = {}
    for j in res.jobs:
        if j.first_start is None or j.finish is None or (only and j.trace.job_id.startswith(only)):
            continue
        out.setdefault(j.trace.tenant, []).append(
            (j.first_start - j.trace.submit_s, j.finish - j.trace.submit_s))
    return {t: {"jobs": len(v), "avg_wait_s": round(sum(w for w, _ in v) / len(v), 1),
                "max_wait_s": round(max(w for w, _ in v), 1),
                "avg_jct_s": round(sum(c for _, c in v) / len(v), 1)}
            for t, v in sorted(out.items())}


def run(seeds: Sequence[int] = (1, 2, 3), philly: bool = True, out: Path | None = None
        ) -> dict[str, Any]:
    doc: dict[str, Any] = {}
    rules = SimSettings(cycle_s=60.0)
    for seed in seeds:
        jobs = return_after_burst(seed)
        doc[f"return-after-burst-s{seed}"] = {
            name: per_tenant(Simulation(uniform_cluster(4, 8), jobs, config(h), rules).run(),
                             only="burst-")
            for name, h in HALF_LIVES.items()}
    if philly:
        jobs = load_philly(limit=3000)
        doc["philly-3000"] = {
            name: per_tenant(Simulation(uniform_cluster(48, 8), jobs, config(h), rules).run())
            for name, h in HALF_LIVES.items()}
    if out is not None:
        out.write_text(json.dumps(doc, indent=1) + "\n")
    return doc


def print_table(doc: dict[str, Any]) -> None:
    for case, by_h in doc.items():
        print(case)
        tenants = sorted({t for rows in by_h.values() for t in rows})
        for t in tenants:
            cells = "  ".join(f"{h}: wait {rows[t]['avg_wait_s'] / 60:7.1f} min, "
                              f"JCT {rows[t]['avg_jct_s'] / 60:7.1f} min"
                              for h, rows in by_h.items() if t in rows)
            print(f"  {t:>12}  {cells}")
