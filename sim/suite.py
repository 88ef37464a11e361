"""The robustness suite: every policy on every case (public traces on several cluster
sizes, synthetic families), one table -> ``bench/results/sim_robust.json`` and plots.

Cases are named ``<trace>@<nodes>x8``. What is checked (issue 17): where queues form,
Kairos' average JCT against Tiresias' (and their geometric mean over those cases), and
Kairos' longest waits (before the first start; in total, with every requeue after a
preemption) against FIFO's in the same run.

Results merge into the existing file: a run of some cases or policies keeps the others.
"""

from __future__ import annotations

import fnmatch
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from sim.engine import SimSettings, Simulation
from sim.metrics import geomean, summarize
from sim.policies import ALIASES, POLICIES, policy_config, policy_settings
from sim.synthetic import ARRIVALS, LAWS, Family, generate
from sim.traces import MURI, PHILLY, TraceJob, load_muri, load_philly, uniform_cluster

OUT = Path("bench/results/sim_robust.json")
KEYS = ("avg_jct_s", "p99_jct_s", "max_first_wait_s", "max_total_wait_s", "preemptions", "lost_gpu_s",
        "avg_queue_s", "avg_total_wait_s", "avg_duration_s", "unfinished")
# the same simulator rules as the committed Philly and Muri runs
PHILLY_RULES = SimSettings(cycle_s=300.0, tick_s=600.0)
MURI_RULES = SimSettings(cycle_s=60.0, tick_s=1800.0)
SYN_RULES = SimSettings(cycle_s=60.0, tick_s=600.0)
QUEUES_FORM = 0.1  # a case "forms queues" when FIFO's mean first wait is >= this x the mean duration


@dataclass(frozen=True, slots=True)
class Case:
    name: str  # <trace>@<nodes>x8
    trace: str  # philly | muri-traceN | syn-<law>-<arrivals>-<k>t
    nodes: int
    rules: SimSettings
    family: Family | None = None


def _muri_path(trace: str) -> Path:
    """A Muri trace, from the repository's data (``data/traces/muri``)."""
    path = MURI / f"{trace}.csv"
    if not path.exists():
        raise FileNotFoundError(f"{trace}.csv not found in {MURI}")
    return path


def cases() -> list[Case]:
    out = [Case(f"philly@{n}x8", "philly", n, PHILLY_RULES) for n in (64, 80, 96)]
    for t in ("trace1", "trace2", "trace3", "trace4"):
        out += [Case(f"muri-{t}@{n}x8", f"muri-{t}", n, MURI_RULES) for n in (8, 16, *((32,) if t == "trace4" else ()))]
    fams = [Family(law, arr, 4) for law in LAWS for arr in ARRIVALS] + [Family(law, "steady", 1) for law in LAWS]
    out += [Case(f"{f.name}@8x8", f.name, 8, SYN_RULES, f) for f in fams]
    return out


def select(patterns: Sequence[str]) -> list[Case]:
    every = cases()
    if not patterns:
        return every
    chosen = [c for c in every if any(fnmatch.fnmatch(c.name, p) for p in patterns)]
    if not chosen:
        raise ValueError(f"no case matches {', '.join(patterns)}; cases: {', '.join(c.name for c in every)}")
    return chosen


def load(case: Case, limit: int | None = None) -> list[TraceJob]:
    if case.family is not None:
        jobs = generate(case.family)
    elif case.trace == "philly":
        jobs = load_philly(PHILLY)
    else:
        jobs = load_muri(_muri_path(case.trace.removeprefix("muri-")))
    return jobs[:limit] if limit else jobs


def run_one(case: Case, policy: str, limit: int | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
    """One policy on one case: the table's record and what its plot needs."""
    jobs = load(case, limit)
    t0 = time.perf_counter()
    res = Simulation(uniform_cluster(case.nodes, 8), jobs, policy_config(policy),
                     policy_settings(policy, case.rules)).run()
    m = summarize(res)
    rec = {k: m[k] for k in KEYS} | {"lost_work_gpu_s": m["lost_gpu_s"], "wall_s": round(time.perf_counter() - t0, 1)}
    jct = np.sort([j.finish - j.trace.submit_s for j in res.jobs if j.finish is not None])
    s = np.asarray(res.samples) if res.samples else np.zeros((0, 4))
    s = s[:: max(1, len(s) // 600)]
    return rec, {"jct": jct[:: max(1, len(jct) // 2000)], "t": s[:, 0], "queued": s[:, 2]}


def run(patterns: Sequence[str], policies: Sequence[str], out: Path = OUT, jobs: int = 1,
        limit: int | None = None, plots: bool = True) -> dict[str, Any]:
    chosen = select(patterns)
    policies = [ALIASES.get(p, p) for p in (policies or POLICIES)]
    mine: dict[str, dict[str, Any]] = {}  # this run's records (the file may gain others' meanwhile)
    curves: dict[str, dict[str, dict[str, Any]]] = {}
    todo = [(c, p) for c in chosen for p in policies]

    def record(c: Case, p: str, rec: dict[str, Any], curve: dict[str, Any]) -> None:
        mine.setdefault(c.name, {})[p] = rec
        curves.setdefault(c.name, {})[p] = curve
        _write(mine, out, limit)  # partial results survive a cut-off run
        print(f"{c.name} {p}: avg JCT {rec['avg_jct_s'] / 3600:.2f} h, max wait {rec['max_first_wait_s'] / 3600:.1f} h "
              f"({rec['wall_s']} s)", flush=True)

    if jobs <= 1:
        for c, p in todo:
            record(c, p, *run_one(c, p, limit))
    else:
        from concurrent.futures import ProcessPoolExecutor, as_completed

        with ProcessPoolExecutor(jobs) as pool:
            futures = {pool.submit(run_one, c, p, limit): (c, p) for c, p in todo}
            for f in as_completed(futures):
                record(*futures[f], *f.result())
    doc = _write(mine, out, limit)
    if plots:
        try:
            plot(doc, curves, out.parent / "plots")
        except ImportError:
            pass
    print_table(doc)
    return doc


def _write(mine: dict[str, dict[str, Any]], out: Path, limit: int | None) -> dict[str, Any]:
    """Merge this run's records into the file as it is now; returns the whole table."""
    doc: dict[str, Any] = json.loads(out.read_text()) if out.exists() else {}
    for case, rows in mine.items():
        doc.setdefault(case, {}).update(rows)
    doc["protocol"] = {
        "cases": "philly: the whole trace, cycle 300 s, tick 600 s; muri: the whole trace, cycle 60 s, "
                 "tick 1800 s; syn-<law>-<arrivals>-<tenants>t: sim/synthetic.py, 2000 jobs, offered "
                 "load 1.0 of 8 x 8 GPUs, cycle 60 s, tick 600 s" + (f"; first {limit} jobs only" if limit else ""),
        "policies": {"FIFO": "fifo preset", "SJF-oracle": "sjf preset, true durations (a bound)",
                     "Tiresias": "tiresias preset (2D-LAS, preemptive)", "DRF": "drf preset",
                     "Kairos": "default preset; only what is known at submit and finished jobs' history"},
        "queues_form": f"FIFO's mean first wait >= {QUEUES_FORM} x the mean duration",
        "summary": summary(doc)}
    out.parent.mkdir(parents=True, exist_ok=True)
    ordered = {c.name: doc[c.name] for c in cases() if c.name in doc} | {k: v for k, v in doc.items()
                                                                         if k not in {c.name for c in cases()}}
    out.write_text(json.dumps(ordered, indent=2) + "\n")
    return ordered


def queues_form(rows: dict[str, Any]) -> bool | None:
    ref = rows.get("FIFO")
    if ref is None or not ref.get("avg_duration_s"):
        return None
    return bool(ref["avg_queue_s"] >= QUEUES_FORM * ref["avg_duration_s"])


def summary(doc: dict[str, Any]) -> dict[str, Any]:
    """Kairos / Tiresias per case, their geometric mean where queues form, and every
    case where a target is missed."""
    ratios, misses = {}, []
    for case, rows in doc.items():
        if case == "protocol" or "Kairos" not in rows:
            continue
        k = rows["Kairos"]
        if "Tiresias" in rows:
            ratios[case] = round(k["avg_jct_s"] / rows["Tiresias"]["avg_jct_s"], 3)
            if queues_form(rows) and ratios[case] > 1.0:
                misses.append(f"{case}: Kairos/Tiresias {ratios[case]}")
        if "FIFO" in rows:
            for w in ("max_first_wait_s", "max_total_wait_s"):
                if k[w] > rows["FIFO"][w]:
                    misses.append(f"{case}: Kairos {w} {k[w]:.0f} > FIFO {rows['FIFO'][w]:.0f}")
    queued = [r for c, r in ratios.items() if queues_form(doc[c])]
    geo = geomean(queued) if queued else None
    return {"kairos_over_tiresias": ratios, "geomean_where_queues_form": round(geo, 3) if geo else None,
            "cases_where_queues_form": len(queued), "targets_missed": misses}


def print_table(doc: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title="robustness suite (avg JCT h; waits h)")
    for col in ("case", "queues", *POLICIES, "K/T", "K max 1st", "FIFO max 1st", "K max tot", "FIFO max tot",
                "K preempt", "T preempt"):
        t.add_column(col, justify="right")
    for case, rows in doc.items():
        if case == "protocol":
            continue
        k, f, ti = rows.get("Kairos"), rows.get("FIFO"), rows.get("Tiresias")

        def h(m: dict[str, Any] | None, key: str) -> str:
            return f"{m[key] / 3600:.2f}" if m and m.get(key) is not None else "-"

        ratio = f"{k['avg_jct_s'] / ti['avg_jct_s']:.2f}" if k and ti else "-"
        q = queues_form(rows)
        t.add_row(case, "-" if q is None else ("yes" if q else "no"), *(h(rows.get(p), "avg_jct_s") for p in POLICIES),
                  ratio, h(k, "max_first_wait_s"), h(f, "max_first_wait_s"), h(k, "max_total_wait_s"),
                  h(f, "max_total_wait_s"), str(k["preemptions"]) if k else "-",
                  str(ti["preemptions"]) if ti else "-")
    con = Console(width=220)
    con.print(t)
    s = summary(doc)
    con.print(f"geometric mean Kairos/Tiresias over {s['cases_where_queues_form']} cases where queues form: "
              f"{s['geomean_where_queues_form']}")
    for m in s["targets_missed"]:
        con.print(f"  target missed: {m}")


def plot(doc: dict[str, Any], curves: dict[str, dict[str, dict[str, Any]]], folder: Path) -> None:
    """Per case run now with every policy the file has for it: JCT CDF and queue length
    per policy; and over every case in the file, Kairos/Tiresias avg JCT and Kairos/FIFO
    max waits (``robust_summary.png``)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    folder.mkdir(parents=True, exist_ok=True)
    for case, by_policy in curves.items():
        if not set(doc.get(case, {})) <= set(by_policy):
            continue  # a run of some policies: the case's plot of every policy stays as it was
        fig, ax = plt.subplots(1, 2, figsize=(12, 4.2))
        for p, c in by_policy.items():
            if len(c["jct"]):
                ax[0].plot(c["jct"] / 3600, np.linspace(0, 1, len(c["jct"])), label=p)
            ax[1].plot(c["t"] / 86400, c["queued"], label=p, lw=0.8)
        ax[0].set(xscale="log", xlabel="JCT (h)", ylabel="CDF", title="JCT CDF")
        ax[1].set(xlabel="time (days)", ylabel="jobs queued", title="queue length")
        ax[0].legend(fontsize=8)
        fig.suptitle(case)
        fig.tight_layout()
        fig.savefig(folder / f"robust_{case.replace('@', '_')}.png", dpi=90)
        plt.close(fig)
    rows = [(c, r) for c, r in doc.items() if c != "protocol" and {"Kairos", "Tiresias", "FIFO"} <= set(r)]
    if not rows:
        return
    names = [c for c, _ in rows]
    x = np.arange(len(rows))
    fig, ax = plt.subplots(2, 1, figsize=(max(10, len(rows) * 0.45), 8), sharex=True)
    ax[0].bar(x, [r["Kairos"]["avg_jct_s"] / r["Tiresias"]["avg_jct_s"] for _, r in rows],
              color=["C0" if queues_form(r) else "0.7" for _, r in rows])
    ax[0].axhline(1.0, color="k", lw=0.8)
    ax[0].axhline(0.85, color="k", ls=":", lw=0.8)
    ax[0].set(ylabel="Kairos / Tiresias avg JCT", title="grey: no queue forms under FIFO")
    for i, w in enumerate(("max_first_wait_s", "max_total_wait_s")):
        ax[1].bar(x + (i - 0.5) * 0.4, [r["Kairos"][w] / max(r["FIFO"][w], 1.0) for _, r in rows], 0.4,
                  label=w.replace("_s", "").replace("_", " "))
    ax[1].axhline(1.0, color="k", lw=0.8)
    ax[1].set(ylabel="Kairos / FIFO", yscale="log")
    ax[1].legend(fontsize=8)
    ax[1].set_xticks(x, names, rotation=70, ha="right", fontsize=7)
    fig.tight_layout()
    fig.savefig(folder / "robust_summary.png", dpi=90)
    plt.close(fig)
