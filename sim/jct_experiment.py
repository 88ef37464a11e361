"""JCT experiments (Philly, Muri): one trace, several cluster sizes, the five policies
side by side in one run; JSON table, per-run JSON, plots (JCT CDF, queue length and GPU
allocation over time)."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from sim.engine import SimResult, SimSettings, Simulation
from sim.metrics import series, summarize
from sim.policies import POLICIES, policy_config, policy_settings
from sim.progress import progress
from sim.traces import TraceJob, uniform_cluster

TABLE_KEYS = ("avg_jct_s", "p99_jct_s", "p99_queue_s", "makespan_s")


def run_policy(jobs: Sequence[TraceJob], nodes: int, gpus: int, policy: str, base: SimSettings) -> tuple[SimResult, float]:
    t0 = time.perf_counter()
    res = Simulation(uniform_cluster(nodes, gpus), jobs, policy_config(policy), policy_settings(policy, base)).run()
    return res, time.perf_counter() - t0


def run(name: str, jobs: Sequence[TraceJob], clusters: Sequence[tuple[int, int]], out: Path,
        base: SimSettings, policies: Sequence[str] = POLICIES, note: str = "") -> dict[str, Any]:
    doc: dict[str, Any] = {}
    runs: dict[str, dict[str, SimResult]] = {}
    detail: dict[str, Any] = {}
    with progress() as bar:
        task = bar.add_task(name, total=len(clusters) * len(policies))
        for n, g in clusters:
            key = f"{n}x{g}"
            doc[key], runs[key], detail[key] = {}, {}, {}
            for policy in policies:
                bar.update(task, description=f"{name} {key} {policy}")
                res, wall = run_policy(jobs, n, g, policy, base)
                m = summarize(res)
                m["wall_s"] = round(wall, 1)
                doc[key][policy] = {k: m[k] for k in TABLE_KEYS} | {
                    "avg_jct_over_duration": m["avg_jct_over_duration"], "preemptions": m["preemptions"],
                    "unfinished": m["unfinished"], "wall_s": m["wall_s"]}
                detail[key][policy] = m | {"series": series(res)}
                runs[key][policy] = res
                bar.advance(task)
                out.parent.mkdir(parents=True, exist_ok=True)  # partial results survive a cut-off run
                out.write_text(json.dumps(doc | {"protocol": {"partial": True, "note": note}}, indent=2) + "\n")
    doc["protocol"] = {"trace": name, "jobs": len(jobs), "note": note, "rules": base.rules(),
                       "policies": {"FIFO": "fifo preset", "SJF": "sjf preset, oracle durations (a bound)",
                                    "Tiresias": "tiresias preset (2D-LAS, preemptive)", "DRF": "drf preset",
                                    "Kairos": "default preset; estimates from finished jobs' history only"},
                       "cluster": "N nodes x G GPUs, 4 cores and 32 GiB per GPU; jobs > 8 GPUs are gangs of 8-GPU tasks"}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=2) + "\n")
    out.with_name(out.stem + "_runs.json").write_text(json.dumps(detail) + "\n")
    try:
        plot(runs, out.parent / "plots", out.stem)
    except ImportError:
        pass
    print_table(doc, name)
    return doc


def plot(runs: dict[str, dict[str, SimResult]], folder: Path, stem: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    folder.mkdir(parents=True, exist_ok=True)
    for key, by_policy in runs.items():
        fig, ax = plt.subplots(1, 3, figsize=(16, 4))
        for policy, res in by_policy.items():
            jct = np.sort([j.finish - j.trace.submit_s for j in res.jobs if j.finish is not None])
            if jct.size:
                ax[0].plot(jct / 3600, np.arange(1, jct.size + 1) / jct.size, label=policy)
            s = np.asarray(res.samples)
            if len(s):
                ax[1].plot(s[:, 0] / 86400, s[:, 2], label=policy, lw=0.8)
                ax[2].plot(s[:, 0] / 86400, s[:, 1] / max(res.capacity_gpus, 1), label=policy, lw=0.8)
        ax[0].set(xscale="log", xlabel="JCT (h)", ylabel="CDF", title=f"{stem} {key}: JCT CDF")
        ax[1].set(xlabel="time (days)", ylabel="jobs queued", title="queue length")
        ax[2].set(xlabel="time (days)", ylabel="GPUs allocated / capacity", title="GPU allocation", ylim=(0, 1.05))
        for a in ax:
            a.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(folder / f"{stem}_{key}.png", dpi=100)
        plt.close(fig)


def print_table(doc: dict[str, Any], name: str) -> None:
    from rich.console import Console
    from rich.table import Table

    for key, rows in doc.items():
        if key == "protocol":
            continue
        t = Table(title=f"{name} on {key}")
        for c in ("policy", "avg JCT (h)", "p99 JCT (h)", "p99 queue (h)", "makespan (d)", "JCT/dur", "preempt", "wall s"):
            t.add_column(c, justify="right")
        for policy, m in rows.items():
            t.add_row(policy, f"{m['avg_jct_s'] / 3600:.2f}", f"{m['p99_jct_s'] / 3600:.1f}",
                      f"{m['p99_queue_s'] / 3600:.1f}", f"{m['makespan_s'] / 86400:.2f}",
                      f"{m['avg_jct_over_duration']:.2f}", str(m["preemptions"]), str(m["wall_s"]))
        Console().print(t)
