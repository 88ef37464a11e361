"""JCT experiments (Philly, Muri): one trace, several cluster sizes, the five policies
side by side in one run; JSON table, per-run JSON, plots (JCT CDF, queue length and GPU
allocation over time)."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from sim.engine import SimResult, SimSettings, Simulation
from sim.metrics import series, summarize
from sim.policies import ALIASES, POLICIES, policy_config, policy_settings
from sim.progress import progress
from sim.traces import TraceJob, uniform_cluster

if TYPE_CHECKING:
    from matplotlib.figure import Figure

TABLE_KEYS = ("avg_jct_s", "p99_jct_s", "p99_queue_s", "makespan_s")


def run_policy(jobs: Sequence[TraceJob], nodes: int, gpus: int, policy: str, base: SimSettings) -> tuple[SimResult, float]:
    t0 = time.perf_counter()
    res = Simulation(uniform_cluster(nodes, gpus), jobs, policy_config(policy), policy_settings(policy, base)).run()
    return res, time.perf_counter() - t0


def run_mixed(jobs: Sequence[TraceJob], gpus: dict[str, int], per_node: int, policy: str, base: SimSettings
              ) -> tuple[SimResult, float, dict[str, Any]]:
    """One policy on a mixed cluster (``sim.gavel.mixed_cluster``); the GPU-hours each
    model gave beside the result."""
    from sim.gavel import mixed_cluster
    from sim.hetero_experiment import gpu_hours_by_model

    t0 = time.perf_counter()
    res = Simulation(mixed_cluster(gpus, per_node=per_node), jobs, policy_config(policy),
                     policy_settings(policy, base)).run()
    return res, time.perf_counter() - t0, {"gpu_hours_by_model": gpu_hours_by_model(res)}


def _one(jobs: Sequence[TraceJob], n: int, g: int, policy: str, base: SimSettings
         ) -> tuple[dict[str, Any], SimResult]:
    res, wall = run_policy(jobs, n, g, policy, base)
    m = summarize(res)
    m["wall_s"] = round(wall, 1)
    return m, res


def run(name: str, jobs: Sequence[TraceJob], clusters: Sequence[tuple[int, int]], out: Path,
        base: SimSettings, policies: Sequence[str] = POLICIES, note: str = "", workers: int = 1) -> dict[str, Any]:
    """Every policy on every cluster; ``workers`` > 1 runs that many at once in separate
    processes (each run is single-threaded; wall_s is then measured under that load)."""
    policies = [ALIASES.get(p, p) for p in policies]
    keys = [f"{n}x{g}" for n, g in clusters]
    doc: dict[str, Any] = {k: {} for k in keys}
    runs: dict[str, dict[str, SimResult]] = {k: {} for k in keys}
    detail: dict[str, Any] = {k: {} for k in keys}
    todo = [(f"{n}x{g}", n, g, policy) for n, g in clusters for policy in policies]

    def record(key: str, policy: str, m: dict[str, Any], res: SimResult) -> None:
        doc[key][policy] = {k: m[k] for k in TABLE_KEYS} | {
            "avg_jct_over_duration": m["avg_jct_over_duration"], "preemptions": m["preemptions"],
            "unfinished": m["unfinished"], "max_queue_s": m["max_queue_s"], "wall_s": m["wall_s"]}
        detail[key][policy] = m | {"series": series(res)}
        runs[key][policy] = res
        out.parent.mkdir(parents=True, exist_ok=True)  # partial results survive a cut-off run
        partial = {k: {p: doc[k][p] for p in policies if p in doc[k]} for k in keys}
        out.write_text(json.dumps(partial | {"protocol": {"partial": True, "note": note}}, indent=2) + "\n")

    with progress() as bar:
        task = bar.add_task(name, total=len(todo))
        if workers <= 1:
            for key, n, g, policy in todo:
                bar.update(task, description=f"{name} {key} {policy}")
                record(key, policy, *_one(jobs, n, g, policy, base))
                bar.advance(task)
        else:
            from concurrent.futures import ProcessPoolExecutor, as_completed

            with ProcessPoolExecutor(workers) as pool:
                futures = {pool.submit(_one, jobs, n, g, policy, base): (key, policy) for key, n, g, policy in todo}
                for f in as_completed(futures):
                    key, policy = futures[f]
                    record(key, policy, *f.result())
                    bar.update(task, description=f"{name} {key} {policy} done")
                    bar.advance(task)
    doc = {k: {p: doc[k][p] for p in policies} for k in keys}  # the table in policy order
    doc["protocol"] = {"trace": name, "jobs": len(jobs), "note": note, "rules": base.rules(),
                       "policies": {"FIFO": "fifo preset", "SJF-oracle": "sjf preset, oracle durations (a bound)",
                                    "Tiresias": "tiresias preset (2D-LAS, preemptive)", "DRF": "drf preset",
                                    "Kairos": "default preset; estimates from finished jobs' history only"},
                       "cluster": "N nodes x G GPUs, 4 cores and 32 GiB per GPU; jobs > 8 GPUs are gangs of 8-GPU tasks"}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=2) + "\n")
    out.with_name(out.stem + "_runs.json").write_text(json.dumps(detail) + "\n")
    try:
        plot(runs, out.parent / "plots", out.stem, name)
    except ImportError:
        pass
    print_table(doc, name)
    return doc


def plot(runs: dict[str, dict[str, SimResult]], folder: Path, stem: str, trace: str) -> None:
    """One PNG per cluster, ``<stem>_<cluster>.png``, titled by the trace and cluster."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    folder.mkdir(parents=True, exist_ok=True)
    for key, by_policy in runs.items():
        fig = figure(by_policy, trace, key)
        fig.savefig(folder / f"{stem}_{key}.png", dpi=100)
        plt.close(fig)


def plot_title(trace: str, cluster: str) -> str:
    """'muri-trace1 on 64\N{MULTIPLICATION SIGN}8 GPUs' for cluster '64x8' (a CSV path is
    named by its file)."""
    nodes, _, gpus = cluster.partition("x")
    return f"{Path(trace).name} on {nodes}\N{MULTIPLICATION SIGN}{gpus} GPUs"


def figure(by_policy: dict[str, SimResult], trace: str, cluster: str) -> Figure:
    """JCT CDF, queue length and GPU allocation over time, one curve per policy, under
    one legend below the panels that names every curve (none is hidden behind it)."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(1, 3, figsize=(16, 4.6))
    for policy, res in by_policy.items():
        jct = np.sort([j.finish - j.trace.submit_s for j in res.jobs if j.finish is not None])
        if jct.size:
            ax[0].plot(jct / 3600, np.arange(1, jct.size + 1) / jct.size, label=policy)
        s = np.asarray(res.samples)
        if len(s):
            ax[1].plot(s[:, 0] / 86400, s[:, 2], label=policy, lw=0.8)
            ax[2].plot(s[:, 0] / 86400, s[:, 1] / max(res.capacity_gpus, 1), label=policy, lw=0.8)
    ax[2].axhline(1.0, color="k", ls=":", lw=0.8, label="capacity")
    ax[0].set(xscale="log", xlabel="JCT (h)", ylabel="CDF", title="JCT CDF")
    ax[1].set(xlabel="time (days)", ylabel="jobs queued", title="queue length")
    ax[2].set(xlabel="time (days)", ylabel="GPUs allocated / capacity", title="GPU allocation", ylim=(0, 1.05))
    fig.suptitle(plot_title(trace, cluster))
    shared_legend(fig)
    return fig


def shared_legend(fig: Figure) -> None:
    """One legend under the panels with each label of every panel once: it covers no
    curve, and a curve drawn in one panel only is still named."""
    handles: dict[str, Any] = {}
    for a in fig.axes:
        for h, label in zip(*a.get_legend_handles_labels(), strict=True):
            handles.setdefault(label, h)
    fig.legend(list(handles.values()), list(handles), loc="lower center", ncol=max(len(handles), 1),
               frameon=False, fontsize=8)
    fig.tight_layout(rect=(0, 0.08, 1, 1))


def terminal_width() -> int:
    """$COLUMNS, else the terminal's width, else 80 (output to a pipe or a file)."""
    import shutil

    return shutil.get_terminal_size((80, 24)).columns


def print_table(doc: dict[str, Any], name: str) -> None:
    """The policies side by side per cluster; cells wrap (never end in '…') to fit."""
    from rich.console import Console
    from rich.table import Table

    for key, rows in doc.items():
        if key == "protocol":
            continue
        t = Table(title=f"{name} on {key}")
        t.add_column("policy", justify="right", no_wrap=True)  # names stay whole
        for c in ("avg JCT (h)", "p99 JCT (h)", "p99 queue (h)", "makespan (d)", "JCT/dur", "preempt", "wall s"):
            t.add_column(c, justify="right", overflow="fold")
        for policy, m in rows.items():
            t.add_row(policy, f"{m['avg_jct_s'] / 3600:.2f}", f"{m['p99_jct_s'] / 3600:.1f}",
                      f"{m['p99_queue_s'] / 3600:.1f}", f"{m['makespan_s'] / 86400:.2f}",
                      f"{m['avg_jct_over_duration']:.2f}", str(m["preemptions"]), str(m["wall_s"]))
        Console(width=terminal_width()).print(t)
