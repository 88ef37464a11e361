"""Traces on which no schedule, even one that knows every duration, keeps both an
average JCT no worse than Tiresias' and every job's total wait within FIFO's longest
(issue 17's two targets), and the lower bound that shows it (``bench/wait_bound.py``
runs them; with evenly spaced arrivals the bound exceeds Tiresias' JCT).

The traces: one node of 8 GPUs and only 8-GPU jobs, so the cluster is one server. A long
job of ``long_h`` hours arrives first; short jobs of one hour follow at a load ``rho`` of
the node (evenly spaced, or Poisson) for ``span_h`` hours.

FIFO runs the long job first: nothing waits much longer than ``long_h``. Least attained
service (Tiresias) runs each short job as it comes (evenly spaced: none stops another),
so they barely wait, and the long job runs in the gaps: it waits about
``rho / (1 - rho)`` times ``long_h``. A schedule that keeps
the long job's total wait within ``W`` must finish it by ``C = long_h + W``, so the short
jobs lose the node for ``long_h`` hours before ``C`` while they keep arriving.
"""

from __future__ import annotations

import numpy as np

from sim.traces import TraceJob

H = 3600.0
SHORT_H = 1.0  # each short job's duration
SPAN_H = 400.0  # short jobs arrive over this span
STEP_H = 0.01  # the bound's time grid


def trace(long_h: float, rho: float, arrivals: str = "even", seed: int = 0, span_h: float = SPAN_H) -> list[TraceJob]:
    """The long job at 0, then short jobs at load ``rho`` ("even" or "poisson")."""
    gap = SHORT_H / rho
    if arrivals == "even":
        times = np.arange(gap, span_h, gap)
    elif arrivals == "poisson":
        rng = np.random.default_rng(seed)
        times = np.cumsum(rng.exponential(gap, int(3 * span_h / gap)))
        times = times[times < span_h]
    else:
        raise ValueError(f"arrivals must be 'even' or 'poisson', not {arrivals!r}")
    jobs = [TraceJob("long", 0.0, long_h * H, 8)]
    return jobs + [TraceJob(f"short-{i}", float(t) * H, SHORT_H * H, 8) for i, t in enumerate(times)]


def jct_lower_bound(jobs: list[TraceJob], long_h: float, max_wait_h: float) -> float:
    """Hours: the least average JCT of any schedule of ``trace``'s jobs on one 8-GPU
    node in which the long job (submitted at 0) waits at most ``max_wait_h`` in total.

    Short jobs arriving in ``[u, t]`` get at most ``t - u`` hours of service there, less
    what the long job must get there (``long_h - u - max(0, C - t)``: it can have had at
    most ``u`` hours before ``u`` and have at most ``C - t`` left after ``t``); what
    exceeds it is still in the system at ``t``. A short job holds at most one hour of
    work, so at least that many are in the system, and the integral over time of the
    number in the system is their total JCT."""
    arrive = np.sort([j.submit_s / H for j in jobs if j.job_id != "long"])
    finish_by = long_h + max_wait_h
    t = np.arange(0.0, arrive[-1] + finish_by + SHORT_H * len(arrive) + 1.0, STEP_H)
    came = SHORT_H * np.searchsorted(arrive, t, side="right")  # short work arrived by t
    before = SHORT_H * np.searchsorted(arrive, t, side="left")  # ... strictly before t
    # the excess over u splits into the long job's part (largest at u = 0: its must-do
    # work by t) and the rest (u - work arrived before u, its running maximum)
    best_u = np.maximum.accumulate(t - before)
    must = long_h - np.maximum(0.0, finish_by - t)
    backlog = np.maximum(0.0, came - t + np.maximum(best_u, must))
    # between grid points the backlog falls by at most one hour of work an hour
    area = float(np.maximum(0.0, backlog * STEP_H - STEP_H**2 / 2).sum())
    shorts = max(area / SHORT_H, SHORT_H * len(arrive))
    return (shorts + long_h) / (len(arrive) + 1)
