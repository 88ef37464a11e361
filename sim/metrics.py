"""What the research and the operators measure, from a ``SimResult``.

JCT (avg, median, p99), JCT / duration (1.0 is the physical limit), queueing delay,
makespan, GPU allocation over time (and its mean as a ratio of capacity), fairness
(Jain's index over tenants' mean slowdown; Themis' finish-time fairness rho = JCT /
the JCT the job would get alone on a 1/N share of the cluster, N = tenants), preemptions
and lost GPU-seconds; waits: before the first start, and in total (the first wait plus
every wait in the queue again after a preemption).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from sim.engine import SimResult


def geomean(xs: list[float]) -> float:
    """The geometric mean (of ratios such as Kairos/Tiresias over cases)."""
    return math.exp(sum(map(math.log, xs)) / len(xs))


def jain(xs: list[float]) -> float:
    a = np.asarray(xs, dtype=float)
    return float(a.sum() ** 2 / (len(a) * (a**2).sum())) if len(a) and (a**2).sum() > 0 else 1.0


def _pct(a: np.ndarray, q: float) -> float:
    return float(np.percentile(a, q)) if a.size else 0.0


def summarize(res: SimResult) -> dict[str, Any]:
    fin = [j for j in res.jobs if j.finish is not None]
    jct = np.asarray([j.finish - j.trace.submit_s for j in fin])  # type: ignore[operator]
    dur = np.asarray([j.trace.duration_s for j in fin])
    queue = np.asarray([j.first_start - j.trace.submit_s for j in fin])  # type: ignore[operator]
    total_wait = queue + np.asarray([j.requeue_wait_s for j in fin]) if fin else np.zeros(0)
    slow = jct / np.maximum(dur, 1e-9) if fin else np.zeros(0)
    tenants = sorted({j.trace.tenant for j in fin})
    n_t = max(len(tenants), 1)
    ideal = np.asarray([j.trace.duration_s * max(1.0, n_t * j.gpus / max(res.capacity_gpus, 1)) for j in fin])
    rho = jct / np.maximum(ideal, 1e-9) if fin else np.zeros(0)
    by_tenant_slow = [float(np.mean([s for s, j in zip(slow, fin, strict=True) if j.trace.tenant == t]))
                      for t in tenants]
    by_tenant_rho = {t: round(float(np.mean([r for r, j in zip(rho, fin, strict=True) if j.trace.tenant == t])), 3)
                     for t in tenants}
    t0 = min((j.trace.submit_s for j in res.jobs), default=0.0)
    ends = [j.finish for j in fin if j.finish is not None]
    makespan = max(ends) - t0 if ends else 0.0
    s = np.asarray(res.samples) if res.samples else np.zeros((0, 4))
    if len(s) > 1:
        dt = np.diff(s[:, 0])
        gpu_s = float((s[:-1, 1] * dt).sum())
        span = float(s[-1, 0] - s[0, 0])
        alloc_ratio = gpu_s / (res.capacity_gpus * span) if span > 0 else 0.0
    else:
        gpu_s, alloc_ratio = 0.0, 0.0
    return {
        "jobs": len(res.jobs), "finished": len(fin), "unfinished": len(res.jobs) - len(fin),
        "avg_jct_s": round(float(jct.mean()), 1) if fin else None,
        "median_jct_s": round(_pct(jct, 50), 1), "p99_jct_s": round(_pct(jct, 99), 1),
        "avg_jct_over_duration": round(float(slow.mean()), 3) if fin else None,
        "median_jct_over_duration": round(_pct(slow, 50), 3),
        "avg_queue_s": round(float(queue.mean()), 1) if fin else None,
        "p99_queue_s": round(_pct(queue, 99), 1), "max_queue_s": round(float(queue.max()), 1) if fin else None,
        # both wait measures: before the first start, and that plus every wait after a preemption
        "max_first_wait_s": round(float(queue.max()), 1) if fin else None,
        "max_total_wait_s": round(float(total_wait.max()), 1) if fin else None,
        "avg_total_wait_s": round(float(total_wait.mean()), 1) if fin else None,
        "avg_duration_s": round(float(dur.mean()), 1) if fin else None,
        "makespan_s": round(float(makespan), 1),
        "gpu_allocation_ratio": round(alloc_ratio, 4), "allocated_gpu_s": round(gpu_s, 1),
        "jain_index_tenant_slowdown": round(jain(by_tenant_slow), 4),
        "finish_time_fairness_rho": {"max": round(float(rho.max()), 3) if fin else None,
                                     "mean": round(float(rho.mean()), 3) if fin else None,
                                     "by_tenant": by_tenant_rho},
        "preemptions": int(sum(j.preemptions for j in res.jobs)),
        "lost_gpu_s": round(float(sum(j.lost_work_s for j in res.jobs)), 1),
        "cycles": res.cycles, "rules": res.settings.rules(),
    }


def series(res: SimResult, points: int = 400) -> dict[str, list[float]]:
    """GPU allocation and queue length over time, thinned to about ``points`` samples."""
    s = np.asarray(res.samples) if res.samples else np.zeros((0, 4))
    step = max(1, len(s) // points)
    s = s[::step]
    return {"t_s": s[:, 0].round(1).tolist(), "gpus_allocated": s[:, 1].tolist(),
            "queued": s[:, 2].astype(int).tolist(), "running": s[:, 3].astype(int).tolist()}
