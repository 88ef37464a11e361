"""The replay's side-by-side table, its JSON and its plots.

Figures per policy (from ``sim.metrics.summarize`` where it has them, so a replay and a
``kairos sim run`` of the same jobs read the same): average and p99 JCT, queueing delay
(first start - submit) per tenant, GPU allocation as a share of capacity, preemptions,
unfinished jobs, and two fairness figures over tenants' mean slowdown (JCT / duration):
Jain's index (1.0 = every tenant slowed alike; summarize's ``jain_index_tenant_slowdown``)
and the max/min ratio (1.0 = equal; the worst-served tenant's slowdown over the best's).
The ``recorded`` column is what the history itself shows for the same jobs.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from sim.engine import SimResult
from sim.history_trace import HistoryJob
from sim.metrics import summarize


def _by_tenant(pairs: Sequence[tuple[str, float]], digits: int = 3) -> dict[str, float]:
    out: dict[str, list[float]] = {}
    for t, x in pairs:
        out.setdefault(t, []).append(x)
    return {t: round(float(np.mean(xs)), digits) for t, xs in sorted(out.items())}


def _ratio(by_tenant: Mapping[str, float]) -> float | None:
    xs = [x for x in by_tenant.values() if x > 0]
    return round(max(xs) / min(xs), 3) if xs else None


def figures(res: SimResult) -> dict[str, Any]:
    m = summarize(res)
    fin = [j for j in res.jobs if j.finish is not None]
    slow = _by_tenant([(j.trace.tenant, (j.finish - j.trace.submit_s) / max(j.trace.duration_s, 1e-9))  # type: ignore[operator]
                       for j in fin])
    queue = _by_tenant([(j.trace.tenant, j.first_start - j.trace.submit_s) for j in res.jobs
                        if j.first_start is not None], 1)
    return {"jobs": m["jobs"], "unfinished": m["unfinished"], "avg_jct_s": m["avg_jct_s"],
            "p99_jct_s": m["p99_jct_s"], "avg_queue_s": m["avg_queue_s"], "queue_s_by_tenant": queue,
            "gpu_allocation_ratio": m["gpu_allocation_ratio"], "preemptions": m["preemptions"],
            "jain_tenant_slowdown": m["jain_index_tenant_slowdown"], "max_min_tenant_slowdown": _ratio(slow),
            "slowdown_by_tenant": slow}


def recorded(jobs: Sequence[HistoryJob]) -> dict[str, Any]:
    """The same figures from the history (JCT of the jobs that ended; allocation and
    Jain's index are left to the replays: the history has no per-second samples)."""
    ended = [j for j in jobs if j.end_s is not None]
    jct = np.asarray([j.end_s - j.submit_s for j in ended])  # type: ignore[operator]
    started = [j for j in jobs if j.first_start_s is not None]
    slow = _by_tenant([(j.tenant, (j.end_s - j.submit_s) / max(j.duration_s, 1e-9)) for j in ended])  # type: ignore[operator]
    return {"jobs": len(jobs), "unfinished": len(jobs) - len(ended),
            "avg_jct_s": round(float(jct.mean()), 1) if ended else None,
            "p99_jct_s": round(float(np.percentile(jct, 99)), 1) if ended else None,
            "avg_queue_s": round(float(np.mean([j.first_start_s - j.submit_s for j in started])), 1)  # type: ignore[operator]
            if started else None,
            "queue_s_by_tenant": _by_tenant([(j.tenant, j.first_start_s - j.submit_s) for j in started], 1),  # type: ignore[operator]
            "gpu_allocation_ratio": None, "preemptions": sum(max(j.attempts - 1, 0) for j in jobs),
            "jain_tenant_slowdown": None, "max_min_tenant_slowdown": _ratio(slow), "slowdown_by_tenant": slow}


ROWS: tuple[tuple[str, str], ...] = (
    ("jobs", "jobs replayed"), ("unfinished", "unfinished"), ("avg_jct_s", "avg JCT (s)"),
    ("p99_jct_s", "p99 JCT (s)"), ("avg_queue_s", "avg queueing delay (s)"),
    ("gpu_allocation_ratio", "GPU allocation / capacity"), ("preemptions", "preemptions"),
    ("jain_tenant_slowdown", "fairness: Jain over tenants' slowdown"),
    ("max_min_tenant_slowdown", "fairness: max/min tenant slowdown"))


def table_rows(cols: Mapping[str, Mapping[str, Any]]) -> list[tuple[str, list[str]]]:
    """(label, one cell per column): the figures, then queueing delay per tenant."""
    def cell(v: Any) -> str:
        if v is None:
            return "-"
        if isinstance(v, float):  # no exponent: 2,862,930 s, not 2.86293e+06
            return f"{v:,.0f}" if abs(v) >= 1000 else f"{v:g}"
        return str(v)

    rows = [(label, [cell(c.get(key)) for c in cols.values()]) for key, label in ROWS]
    tenants = sorted({t for c in cols.values() for t in c["queue_s_by_tenant"]})
    rows += [(f"queueing delay (s): {t}", [cell(c["queue_s_by_tenant"].get(t)) for c in cols.values()])
             for t in tenants]
    return rows


def print_table(cols: Mapping[str, Mapping[str, Any]], title: str) -> None:
    from rich.console import Console
    from rich.table import Table

    from sim.jct_experiment import terminal_width

    t = Table(title=title)
    t.add_column("", no_wrap=True)
    for name in cols:
        t.add_column(name, justify="right", overflow="fold")
    for label, cells in table_rows(cols):
        t.add_row(label, *cells)
    Console(width=terminal_width()).print(t)


def write(out: Path, doc: dict[str, Any], runs: Mapping[str, SimResult], source: str, cluster: str) -> Path | None:
    """The JSON at ``out``; the plot beside it (``<stem>_<cluster>.png``), titled by the
    source and the cluster (None when matplotlib is missing)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=2) + "\n")
    try:
        import matplotlib
    except ImportError:
        return None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from sim.jct_experiment import figure, plot_title

    fig = figure(dict(runs), source, cluster)
    fig.suptitle(f"shadow replay: {plot_title(source, cluster)}")
    png = out.with_name(f"{out.stem}_{cluster}.png")
    fig.savefig(png, dpi=100)
    plt.close(fig)
    return png
